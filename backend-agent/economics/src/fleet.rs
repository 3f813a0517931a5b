//! The replay's fleet description (TOML): the hardware, as in `serve --fleet`, and the
//! teams with their quotas. Validated whole before anything runs; each refusal names the
//! file, line and column of the value at fault. Guarantees are checked with the control
//! plane's own rule (`scheduling::guarantees`).
//!
//! ```toml
//! [[pool]]                      # nodes every team may hold, up to its quota
//! gpu_type = "H100-80GB"
//! nodes = 4
//! gpus_per_node = 8             # default 8
//! mig_profiles = ["1g.10gb"]    # MIG profiles `replay-synthetic` may ask for (default none)
//!
//! [[on_demand]]                 # paid overflow, for teams that allow it
//! gpu_type = "H100-80GB"
//! nodes = 2
//!
//! [[team]]
//! name = "vision"
//! allow_on_demand = true        # default false
//! quota = [{ gpu_type = "H100-80GB", gpus = 16, burst_gpus = 16,
//!           weight = 3, lending_limit_gpus = 8 }]   # as gpufleet_gpu_quota's
//!
//! [alibaba]                     # only for Alibaba pod lists: which model a gpu_spec means
//! default_gpu_type = "H100-80GB"  # rows without a gpu_spec (default: the first pool model)
//! gpu_spec = { V100M16 = "A100-40GB", V100M32 = "A100-80GB" }
//! gpu_milli_as_mig = true       # a GPU-sharing pod takes a MIG instance (default: a GPU)
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use gpufleet_control::catalog;
use gpufleet_control::scheduling::guarantees::{self, Promised};
use gpufleet_proto::limits::{DEFAULT_QUOTA_WEIGHT, MAX_QUOTA_WEIGHT};
use serde::Deserialize;
use toml::Spanned;

use crate::located::{read_bounded, Refusal};
use crate::mig::Slices;

/// A fleet file larger than this is not a fleet description.
const MAX_BYTES: u64 = 1 << 20;
/// Bounds on what one file may declare (each well past any real fleet).
const MAX_NODES: i64 = 100_000;
const MAX_GPUS_PER_NODE: i64 = 64;
const MAX_TEAMS: usize = 1_000;
const MAX_QUOTA_GPUS: i64 = 1_000_000;

/// One GPU model of the fleet.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Model {
    pub gpu_type: String,
    pub pool_nodes: i64,
    pub on_demand_nodes: i64,
    pub gpus_per_node: i64,
    /// MIG profiles a synthetic trace asks for on this model (the fleet's `mig_profiles`).
    pub mig_profiles: Vec<String>,
}

impl Model {
    pub fn pool_gpus(&self) -> i64 {
        self.pool_nodes * self.gpus_per_node
    }
}

/// A team's quota for one model: `gpus` guaranteed, `burst_gpus` more when the pool
/// has them; `weight` and `lending_limit_gpus` as a `gpufleet_gpu_quota`'s (fair sharing
/// of idle capacity, `scheduling::sharing`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Quota {
    pub gpu_type: String,
    pub gpus: i64,
    pub burst_gpus: i64,
    /// 1 to 1000 (default 1).
    pub weight: i64,
    /// Idle guaranteed GPUs other teams may take; None: no limit.
    pub lending_limit_gpus: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Team {
    pub name: String,
    pub allow_on_demand: bool,
    pub quotas: Vec<Quota>,
}

impl Team {
    pub fn quota(&self, gpu_type: &str) -> Option<&Quota> {
        self.quotas.iter().find(|q| q.gpu_type == gpu_type)
    }

    pub fn guaranteed(&self, gpu_type: &str) -> i64 {
        self.quota(gpu_type).map_or(0, |q| q.gpus)
    }
}

/// Which fleet model an Alibaba row's `gpu_spec` means.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AlibabaModels {
    /// For rows without a spec.
    pub default_gpu_type: String,
    pub by_spec: BTreeMap<String, String>,
    /// A GPU-sharing pod (`gpu_milli` under 1000) on a MIG model takes one MIG instance
    /// per GPU covering its share instead of a whole GPU.
    pub gpu_milli_as_mig: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fleet {
    pub models: Vec<Model>,
    pub teams: Vec<Team>,
    pub alibaba: AlibabaModels,
}

impl Fleet {
    pub fn model(&self, gpu_type: &str) -> Option<&Model> {
        self.models.iter().find(|m| m.gpu_type == gpu_type)
    }

    pub fn team_index(&self, name: &str) -> Option<usize> {
        self.teams.iter().position(|t| t.name == name)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFleet {
    #[serde(default)]
    pool: Vec<RawGroup>,
    #[serde(default)]
    on_demand: Vec<RawGroup>,
    #[serde(default)]
    team: Vec<RawTeam>,
    #[serde(default)]
    alibaba: Option<RawAlibaba>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGroup {
    gpu_type: Spanned<String>,
    nodes: Spanned<i64>,
    gpus_per_node: Option<Spanned<i64>>,
    #[serde(default)]
    mig_profiles: Vec<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTeam {
    name: Spanned<String>,
    #[serde(default)]
    allow_on_demand: bool,
    #[serde(default)]
    quota: Vec<RawQuota>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawQuota {
    gpu_type: Spanned<String>,
    gpus: Spanned<i64>,
    burst_gpus: Option<Spanned<i64>>,
    weight: Option<Spanned<i64>>,
    lending_limit_gpus: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAlibaba {
    default_gpu_type: Option<Spanned<String>>,
    #[serde(default)]
    gpu_spec: BTreeMap<String, Spanned<String>>,
    #[serde(default)]
    gpu_milli_as_mig: bool,
}

/// Reads and validates a fleet description.
pub fn load(file: &Path) -> Result<Fleet, Refusal> {
    parse(file, &read_bounded(file, MAX_BYTES)?)
}

/// Validates `text`, the contents of `file` (named in refusals).
pub fn parse(file: &Path, text: &str) -> Result<Fleet, Refusal> {
    let raw: RawFleet = toml::from_str(text).map_err(|e| {
        let offset = e.span().map_or(0, |s| s.start);
        Refusal::at_offset(file, text, offset, e.message().trim().to_string())
    })?;
    let at = |offset: usize, message: String| Refusal::at_offset(file, text, offset, message);
    let models = models(&raw, &at)?;
    if raw.team.is_empty() {
        return Err(Refusal::at(file, 1, 1, "team: the fleet has no [[team]]"));
    }
    if raw.team.len() > MAX_TEAMS {
        return Err(at(
            raw.team[MAX_TEAMS].name.span().start,
            format!("team: at most {MAX_TEAMS} teams"),
        ));
    }
    let mut teams: Vec<Team> = Vec::new();
    for t in &raw.team {
        teams.push(team(t, &teams, &models, &at)?);
    }
    check_guarantees(&raw, &models, &at)?;
    let alibaba = alibaba_models(raw.alibaba.as_ref(), &models, &at)?;
    Ok(Fleet {
        models,
        teams,
        alibaba,
    })
}

type At<'a> = dyn Fn(usize, String) -> Refusal + 'a;

fn models(raw: &RawFleet, at: &At) -> Result<Vec<Model>, Refusal> {
    let mut models: Vec<Model> = Vec::new();
    for (table, groups) in [("pool", &raw.pool), ("on_demand", &raw.on_demand)] {
        for g in groups {
            let gpu_type = g.gpu_type.get_ref();
            catalog::require_known(&format!("{table}.gpu_type"), gpu_type)
                .map_err(|m| at(g.gpu_type.span().start, m))?;
            let nodes = *g.nodes.get_ref();
            if !(1..=MAX_NODES).contains(&nodes) {
                return Err(at(
                    g.nodes.span().start,
                    format!("{table}.nodes: 1 to {MAX_NODES} (got {nodes})"),
                ));
            }
            let (gpn, gpn_at) = g
                .gpus_per_node
                .as_ref()
                .map_or((8, g.gpu_type.span().start), |s| {
                    (*s.get_ref(), s.span().start)
                });
            if !(1..=MAX_GPUS_PER_NODE).contains(&gpn) {
                return Err(at(
                    gpn_at,
                    format!("{table}.gpus_per_node: 1 to {MAX_GPUS_PER_NODE} (got {gpn})"),
                ));
            }
            let model = match models.iter_mut().find(|m| &m.gpu_type == gpu_type) {
                Some(m) => m,
                None => {
                    models.push(Model {
                        gpu_type: gpu_type.clone(),
                        pool_nodes: 0,
                        on_demand_nodes: 0,
                        gpus_per_node: gpn,
                        mig_profiles: Vec::new(),
                    });
                    models.last_mut().expect("just pushed")
                }
            };
            if model.gpus_per_node != gpn {
                return Err(at(
                    gpn_at,
                    format!(
                        "{table}.gpus_per_node: all {gpu_type} nodes must have the same GPU count (got {} and {gpn})",
                        model.gpus_per_node
                    ),
                ));
            }
            for p in &g.mig_profiles {
                Slices::ask(gpu_type, p.get_ref(), 1)
                    .map_err(|m| at(p.span().start, format!("{table}.{m}")))?;
                if !model.mig_profiles.contains(p.get_ref()) {
                    model.mig_profiles.push(p.get_ref().clone());
                }
            }
            let count = if table == "pool" {
                &mut model.pool_nodes
            } else {
                &mut model.on_demand_nodes
            };
            *count += nodes;
        }
    }
    if models.is_empty() {
        return Err(at(
            0,
            "pool: the fleet has no [[pool]] or [[on_demand]] nodes".into(),
        ));
    }
    Ok(models)
}

fn team(raw: &RawTeam, before: &[Team], models: &[Model], at: &At) -> Result<Team, Refusal> {
    let name = raw.name.get_ref();
    let name_at = raw.name.span().start;
    let valid = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if !valid {
        return Err(at(
            name_at,
            format!("team.name: 1 to 63 of a-z, 0-9, '-' and '_' (got '{name}')"),
        ));
    }
    if before.iter().any(|t| &t.name == name) {
        return Err(at(
            name_at,
            format!("team.name: '{name}' is declared twice"),
        ));
    }
    let mut quotas: Vec<Quota> = Vec::new();
    for q in &raw.quota {
        let gpu_type = q.gpu_type.get_ref();
        if !models.iter().any(|m| &m.gpu_type == gpu_type) {
            return Err(at(
                q.gpu_type.span().start,
                format!("team.quota.gpu_type: the fleet has no {gpu_type} nodes (team '{name}')"),
            ));
        }
        if quotas.iter().any(|o| &o.gpu_type == gpu_type) {
            return Err(at(
                q.gpu_type.span().start,
                format!("team.quota.gpu_type: team '{name}' has two quotas for {gpu_type}"),
            ));
        }
        let gpus = bounded("team.quota.gpus", &q.gpus, at)?;
        let burst_gpus = match &q.burst_gpus {
            Some(b) => bounded("team.quota.burst_gpus", b, at)?,
            None => 0,
        };
        let weight = match &q.weight {
            Some(w) if !(1..=MAX_QUOTA_WEIGHT).contains(w.get_ref()) => {
                return Err(at(
                    w.span().start,
                    format!(
                        "team.quota.weight: 1 to {MAX_QUOTA_WEIGHT} (got {})",
                        w.get_ref()
                    ),
                ))
            }
            Some(w) => *w.get_ref(),
            None => DEFAULT_QUOTA_WEIGHT,
        };
        let lending_limit_gpus = match &q.lending_limit_gpus {
            Some(l) if !(0..=gpus).contains(l.get_ref()) => {
                return Err(at(
                    l.span().start,
                    format!(
                        "team.quota.lending_limit_gpus: 0 to the quota's gpus, {gpus} (got {}): it lends guaranteed GPUs only",
                        l.get_ref()
                    ),
                ))
            }
            l => l.as_ref().map(|l| *l.get_ref()),
        };
        quotas.push(Quota {
            gpu_type: gpu_type.clone(),
            gpus,
            burst_gpus,
            weight,
            lending_limit_gpus,
        });
    }
    Ok(Team {
        name: name.clone(),
        allow_on_demand: raw.allow_on_demand,
        quotas,
    })
}

fn bounded(field: &str, value: &Spanned<i64>, at: &At) -> Result<i64, Refusal> {
    let v = *value.get_ref();
    if !(0..=MAX_QUOTA_GPUS).contains(&v) {
        return Err(at(
            value.span().start,
            format!("{field}: 0 to {MAX_QUOTA_GPUS} (got {v})"),
        ));
    }
    Ok(v)
}

/// The control plane's rule, quota by quota in file order: guarantees of a model summed
/// over teams fit its pool's GPUs.
fn check_guarantees(raw: &RawFleet, models: &[Model], at: &At) -> Result<(), Refusal> {
    let mut promised: BTreeMap<&str, i64> = BTreeMap::new();
    for q in raw.team.iter().flat_map(|t| &t.quota) {
        let model = models
            .iter()
            .find(|m| &m.gpu_type == q.gpu_type.get_ref())
            .expect("checked by team()");
        let others = promised.entry(&model.gpu_type).or_insert(0);
        guarantees::check(
            &model.gpu_type,
            *q.gpus.get_ref(),
            Promised {
                others: *others,
                pool_nodes: model.pool_nodes,
                gpus_per_node: model.gpus_per_node,
            },
        )
        .map_err(|m| at(q.gpus.span().start, format!("team.quota.{m}")))?;
        *others += *q.gpus.get_ref();
    }
    Ok(())
}

fn alibaba_models(
    raw: Option<&RawAlibaba>,
    models: &[Model],
    at: &At,
) -> Result<AlibabaModels, Refusal> {
    let in_fleet = |field: &str, s: &Spanned<String>| {
        if models.iter().any(|m| &m.gpu_type == s.get_ref()) {
            Ok(s.get_ref().clone())
        } else {
            Err(at(
                s.span().start,
                format!("alibaba.{field}: the fleet has no {} nodes", s.get_ref()),
            ))
        }
    };
    let first_pool = models
        .iter()
        .find(|m| m.pool_nodes > 0)
        .unwrap_or(&models[0])
        .gpu_type
        .clone();
    let Some(raw) = raw else {
        return Ok(AlibabaModels {
            default_gpu_type: first_pool,
            by_spec: BTreeMap::new(),
            gpu_milli_as_mig: false,
        });
    };
    let default_gpu_type = match &raw.default_gpu_type {
        Some(s) => in_fleet("default_gpu_type", s)?,
        None => first_pool,
    };
    let mut by_spec = BTreeMap::new();
    for (spec, model) in &raw.gpu_spec {
        by_spec.insert(spec.clone(), in_fleet(&format!("gpu_spec.{spec}"), model)?);
    }
    Ok(AlibabaModels {
        default_gpu_type,
        by_spec,
        gpu_milli_as_mig: raw.gpu_milli_as_mig,
    })
}

/// The guide's worked fleet (docs/guides/replay.md), for tests: 4 pool H100 nodes of 8
/// GPUs and 1 on-demand node; team a is guaranteed 16 GPUs with 24 burst and may use
/// on-demand, team b is guaranteed 16.
#[cfg(test)]
pub(crate) const TWO_TEAMS: &str = r#"
[[pool]]
gpu_type = "H100-80GB"
nodes = 4

[[on_demand]]
gpu_type = "H100-80GB"
nodes = 1

[[team]]
name = "a"
allow_on_demand = true
quota = [{ gpu_type = "H100-80GB", gpus = 16, burst_gpus = 24 }]

[[team]]
name = "b"
quota = [{ gpu_type = "H100-80GB", gpus = 16 }]
"#;

/// [`TWO_TEAMS`] with b weighing 3 and lending none of its idle guarantee, and a
/// borrowing 8 more.
#[cfg(test)]
pub(crate) const WEIGHTED: &str = r#"
[[pool]]
gpu_type = "H100-80GB"
nodes = 4

[[on_demand]]
gpu_type = "H100-80GB"
nodes = 1

[[team]]
name = "a"
allow_on_demand = true
quota = [{ gpu_type = "H100-80GB", gpus = 16, burst_gpus = 24 }]

[[team]]
name = "b"
quota = [{ gpu_type = "H100-80GB", gpus = 16, burst_gpus = 8, weight = 3, lending_limit_gpus = 0 }]
"#;

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(text: &str) -> String {
        parse(Path::new("fleet.toml"), text)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_fleet_with_two_teams() {
        let fleet = parse(Path::new("fleet.toml"), TWO_TEAMS).unwrap();
        assert_eq!(
            fleet.models,
            [Model {
                gpu_type: "H100-80GB".into(),
                pool_nodes: 4,
                on_demand_nodes: 1,
                gpus_per_node: 8,
                mig_profiles: Vec::new(),
            }]
        );
        assert_eq!(fleet.teams[0].quota("H100-80GB").unwrap().burst_gpus, 24);
        assert!(fleet.teams[0].allow_on_demand && !fleet.teams[1].allow_on_demand);
        assert_eq!(fleet.alibaba.default_gpu_type, "H100-80GB");
    }

    #[test]
    fn syntax_errors_name_line_and_column() {
        assert_eq!(
            refused("[[pool]]\ngpu_type = \"H100-80GB\"\nnodes = four\n"),
            "fleet.toml:3:9: invalid string\nexpected `\"`, `'`"
        );
        assert!(refused("[[pool]]\ngpu_typo = 1\n")
            .starts_with("fleet.toml:2:1: unknown field `gpu_typo`"));
    }

    #[test]
    fn bad_values_name_their_place() {
        let unknown = TWO_TEAMS.replacen(
            "gpu_type = \"H100-80GB\"\nnodes = 4",
            "gpu_type = \"H101\"\nnodes = 4",
            1,
        );
        assert!(refused(&unknown)
            .starts_with("fleet.toml:3:12: pool.gpu_type: unknown GPU model 'H101'"));
        let zero = TWO_TEAMS.replacen("nodes = 4", "nodes = 0", 1);
        assert_eq!(
            refused(&zero),
            "fleet.toml:4:9: pool.nodes: 1 to 100000 (got 0)"
        );
        let twice = TWO_TEAMS.replace("name = \"b\"", "name = \"a\"");
        assert_eq!(
            refused(&twice),
            "fleet.toml:16:8: team.name: 'a' is declared twice"
        );
        let over = TWO_TEAMS.replace("gpus = 16 }", "gpus = 17 }");
        assert!(
            refused(&over).starts_with("fleet.toml:17:43: team.quota.gpus: 33 guaranteed H100-80GB GPUs across tenants would exceed the pool's 32"),
            "{}",
            refused(&over)
        );
        let elsewhere = TWO_TEAMS.replace(
            "gpus = 16 }",
            "gpus = 16 }, { gpu_type = \"A100-80GB\", gpus = 1 }",
        );
        assert!(
            refused(&elsewhere).contains("team.quota.gpu_type: the fleet has no A100-80GB nodes")
        );
        assert_eq!(
            refused("[[pool]]\ngpu_type = \"H100-80GB\"\nnodes = 1\n"),
            "fleet.toml:1:1: team: the fleet has no [[team]]"
        );
    }

    #[test]
    fn weights_and_lending_limits_are_read_and_bounded() {
        let fleet = parse(Path::new("fleet.toml"), WEIGHTED).unwrap();
        let q = |team: usize| fleet.teams[team].quota("H100-80GB").unwrap();
        assert_eq!((q(0).weight, q(0).lending_limit_gpus), (1, None));
        assert_eq!((q(1).weight, q(1).lending_limit_gpus), (3, Some(0)));
        let heavy = WEIGHTED.replace("weight = 3", "weight = 1001");
        assert_eq!(
            refused(&heavy),
            "fleet.toml:17:72: team.quota.weight: 1 to 1000 (got 1001)"
        );
        let light = WEIGHTED.replace("weight = 3", "weight = 0");
        assert_eq!(
            refused(&light),
            "fleet.toml:17:72: team.quota.weight: 1 to 1000 (got 0)"
        );
        let lends_more = WEIGHTED.replace("lending_limit_gpus = 0", "lending_limit_gpus = 17");
        assert_eq!(
            refused(&lends_more),
            "fleet.toml:17:96: team.quota.lending_limit_gpus: 0 to the quota's gpus, 16 (got 17): it lends guaranteed GPUs only"
        );
    }
}
