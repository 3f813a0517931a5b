//! The baseline: the fleet cut into fixed per-team partitions. Each team gets its
//! guarantee of each model as its own pool (whole nodes: `gpus / gpus_per_node`, rounded
//! down; a guarantee's part short of a node goes to its burst), keeps its burst quota but
//! nothing to borrow it from, and a share of the model's on-demand nodes among the teams
//! that allow on-demand, in proportion to their guarantees (largest remainders; equal
//! shares when none is guaranteed any). Pool nodes no guarantee covers stay idle. Each
//! partition is replayed through its own store by the same admission.

use crate::fleet::{Fleet, Model, Quota, Team};

/// Team `team`'s partition of `fleet`: a fleet of one team.
pub fn of(fleet: &Fleet, team: usize) -> Fleet {
    let t = &fleet.teams[team];
    let mut models = Vec::new();
    let mut quotas = Vec::new();
    for q in &t.quotas {
        let m = fleet
            .model(&q.gpu_type)
            .expect("validated: quotas name fleet models");
        let pool_nodes = q.gpus / m.gpus_per_node;
        let gpus = pool_nodes * m.gpus_per_node;
        models.push(Model {
            gpu_type: m.gpu_type.clone(),
            pool_nodes,
            on_demand_nodes: on_demand_share(fleet, m, team),
            gpus_per_node: m.gpus_per_node,
            mig_profiles: m.mig_profiles.clone(),
        });
        quotas.push(Quota {
            gpu_type: q.gpu_type.clone(),
            gpus,
            burst_gpus: q.burst_gpus + (q.gpus - gpus),
            // A partition has no other team to share with.
            weight: q.weight,
            lending_limit_gpus: None,
        });
    }
    Fleet {
        models,
        teams: vec![Team {
            name: t.name.clone(),
            allow_on_demand: t.allow_on_demand,
            quotas,
        }],
        alibaba: fleet.alibaba.clone(),
    }
}

/// Team `team`'s on-demand nodes of `model`.
fn on_demand_share(fleet: &Fleet, model: &Model, team: usize) -> i64 {
    let takers: Vec<(usize, i64)> = fleet
        .teams
        .iter()
        .enumerate()
        .filter(|(_, t)| t.allow_on_demand && t.quota(&model.gpu_type).is_some())
        .map(|(i, t)| (i, t.guaranteed(&model.gpu_type)))
        .collect();
    if !takers.iter().any(|&(i, _)| i == team) {
        return 0;
    }
    let total: i64 = takers.iter().map(|&(_, g)| g).sum();
    let weight = |g: i64| if total == 0 { 1 } else { g };
    let denominator = if total == 0 {
        takers.len() as i64
    } else {
        total
    };
    let nodes = model.on_demand_nodes;
    // Whole shares first, then one more node each by largest remainder (ties: file order).
    let mut shares: Vec<(usize, i64, i64)> = takers
        .iter()
        .map(|&(i, g)| {
            (
                i,
                nodes * weight(g) / denominator,
                nodes * weight(g) % denominator,
            )
        })
        .collect();
    let left = nodes - shares.iter().map(|s| s.1).sum::<i64>();
    let mut by_remainder: Vec<usize> = (0..shares.len()).collect();
    by_remainder.sort_by_key(|&k| (std::cmp::Reverse(shares[k].2), shares[k].0));
    for &k in by_remainder.iter().take(left as usize) {
        shares[k].1 += 1;
    }
    shares.iter().find(|s| s.0 == team).map_or(0, |s| s.1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn guarantees_become_pools_and_on_demand_is_shared_by_guarantee() {
        let fleet = crate::fleet::parse(
            Path::new("fleet.toml"),
            r#"
[[pool]]
gpu_type = "H100-80GB"
nodes = 5
[[on_demand]]
gpu_type = "H100-80GB"
nodes = 3
[[team]]
name = "a"
allow_on_demand = true
quota = [{ gpu_type = "H100-80GB", gpus = 20, burst_gpus = 4 }]
[[team]]
name = "b"
allow_on_demand = true
quota = [{ gpu_type = "H100-80GB", gpus = 8 }]
[[team]]
name = "c"
quota = [{ gpu_type = "H100-80GB", gpus = 8 }]
"#,
        )
        .unwrap();
        let a = of(&fleet, 0);
        // 20 guaranteed: 2 nodes, the 4 GPUs short of a third go to burst.
        assert_eq!(
            (a.models[0].pool_nodes, a.models[0].on_demand_nodes),
            (2, 2)
        );
        assert_eq!(
            (a.teams[0].quotas[0].gpus, a.teams[0].quotas[0].burst_gpus),
            (16, 8)
        );
        // 3 on-demand nodes by 20:8 → 2.14 and 0.86: a gets 2, b the remaining 1.
        assert_eq!(of(&fleet, 1).models[0].on_demand_nodes, 1);
        assert_eq!(of(&fleet, 2).models[0].on_demand_nodes, 0);
    }
}
