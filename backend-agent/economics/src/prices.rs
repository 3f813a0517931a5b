//! The operator's price list: a CSV `gpu_type,class,per_gpu_hour` (a header, then one row
//! per GPU model and capacity class), in whatever currency the operator counts.
//! Classes: `guaranteed` (pool GPUs within the team's guarantee), `burst` (pool GPUs
//! beyond it: capacity borrowed from the pool) and `on-demand` (paid overflow). In a
//! replay a class with no row costs nothing, and the report says which held GPU-hours were
//! unpriced.
//!
//! The same file prices `gpufleet-agent usage --prices` ([`load_any`]: any GPU model, no
//! fleet description), whose rows carry the control plane's four capacity classes. The
//! one mapping from those to this file's three is [`Class::of_usage`]:
//! `borrowed-preemptible` (a preemptible cluster's pool nodes: idle capacity borrowed from
//! the pool) is priced as `burst`; the others by their own name.

use std::collections::BTreeMap;
use std::path::Path;

use crate::csv;
use crate::fleet::Fleet;
use crate::located::{read_bounded, Refusal};

const MAX_BYTES: u64 = 1 << 20;
pub const COLUMNS: [&str; 3] = ["gpu_type", "class", "per_gpu_hour"];

/// What a held GPU was, for its price.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Class {
    Guaranteed,
    Burst,
    OnDemand,
}

impl Class {
    pub const ALL: [Class; 3] = [Class::Guaranteed, Class::Burst, Class::OnDemand];

    pub fn name(self) -> &'static str {
        match self {
            Class::Guaranteed => "guaranteed",
            Class::Burst => "burst",
            Class::OnDemand => "on-demand",
        }
    }

    /// The price-list class of a usage row's capacity class (`gpufleet-agent usage`'s
    /// `guaranteed`, `burst`, `borrowed-preemptible`, `on-demand`); `None` for a class
    /// this list cannot price. The only place the two vocabularies meet.
    pub fn of_usage(class: &str) -> Option<Class> {
        match class {
            "guaranteed" => Some(Class::Guaranteed),
            "burst" | "borrowed-preemptible" => Some(Class::Burst),
            "on-demand" => Some(Class::OnDemand),
            _ => None,
        }
    }
}

/// Price per GPU-hour by (model, class).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Prices(BTreeMap<(String, Class), f64>);

impl Prices {
    pub fn per_gpu_hour(&self, gpu_type: &str, class: Class) -> Option<f64> {
        self.0.get(&(gpu_type.to_string(), class)).copied()
    }

    /// The GPU models with at least one price.
    pub fn models(&self) -> impl Iterator<Item = &str> {
        let mut models: Vec<&str> = self.0.keys().map(|(m, _)| m.as_str()).collect();
        models.dedup();
        models.into_iter()
    }
}

pub fn load(file: &Path, fleet: &Fleet) -> Result<Prices, Refusal> {
    parse(file, &read_bounded(file, MAX_BYTES)?, fleet)
}

pub fn parse(file: &Path, text: &str, fleet: &Fleet) -> Result<Prices, Refusal> {
    parse_models(file, text, Some(fleet))
}

/// The price list without a fleet description (`gpufleet-agent usage --prices`): any GPU
/// model may have a row; everything else is checked as [`load`] checks it.
pub fn load_any(file: &Path) -> Result<Prices, Refusal> {
    parse_models(file, &read_bounded(file, MAX_BYTES)?, None)
}

/// [`load_any`] of `text`.
pub fn parse_any(file: &Path, text: &str) -> Result<Prices, Refusal> {
    parse_models(file, text, None)
}

fn parse_models(file: &Path, text: &str, fleet: Option<&Fleet>) -> Result<Prices, Refusal> {
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l));
    let header = lines.next().map(|(_, h)| csv::fields(h));
    if header != Some(Ok(COLUMNS.iter().map(|c| c.to_string()).collect())) {
        return Err(Refusal::at(
            file,
            1,
            1,
            format!("header: expected `{}`", COLUMNS.join(",")),
        ));
    }
    let mut prices = BTreeMap::new();
    for (line, text) in lines {
        if text.trim().is_empty() {
            continue;
        }
        let f = csv::fields(text).map_err(|c| Refusal::at(file, line, c, "unclosed quote"))?;
        if f.len() != COLUMNS.len() {
            return Err(Refusal::at(
                file,
                line,
                f.len().min(COLUMNS.len()) + 1,
                format!("{} fields, the header has {}", f.len(), COLUMNS.len()),
            ));
        }
        if f[0].is_empty() {
            return Err(Refusal::at(file, line, 1, "gpu_type: empty"));
        }
        if fleet.is_some_and(|fleet| fleet.model(&f[0]).is_none()) {
            return Err(Refusal::at(
                file,
                line,
                1,
                format!("gpu_type: the fleet has no '{}' nodes", f[0]),
            ));
        }
        let class = Class::ALL
            .into_iter()
            .find(|c| c.name() == f[1])
            .ok_or_else(|| {
                Refusal::at(
                    file,
                    line,
                    2,
                    format!(
                        "class: one of guaranteed, burst, on-demand (got '{}')",
                        f[1]
                    ),
                )
            })?;
        let price: f64 = f[2]
            .parse()
            .ok()
            .filter(|p: &f64| p.is_finite() && *p >= 0.0 && *p <= 1e6)
            .ok_or_else(|| {
                Refusal::at(
                    file,
                    line,
                    3,
                    format!("per_gpu_hour: a price from 0 to 1000000 (got '{}')", f[2]),
                )
            })?;
        if prices.insert((f[0].clone(), class), price).is_some() {
            return Err(Refusal::at(
                file,
                line,
                1,
                format!("{} {} is priced twice", f[0], f[1]),
            ));
        }
    }
    Ok(Prices(prices))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fleet() -> Fleet {
        crate::fleet::parse(
            Path::new("fleet.toml"),
            "[[pool]]\ngpu_type = \"H100-80GB\"\nnodes = 1\n[[team]]\nname = \"a\"\n",
        )
        .unwrap()
    }

    fn refused(text: &str) -> String {
        parse(Path::new("prices.csv"), text, &fleet())
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_price_per_model_and_class() {
        let p = parse(
            Path::new("prices.csv"),
            "gpu_type,class,per_gpu_hour\nH100-80GB,guaranteed,2.5\nH100-80GB,on-demand,6\n",
            &fleet(),
        )
        .unwrap();
        assert_eq!(p.per_gpu_hour("H100-80GB", Class::Guaranteed), Some(2.5));
        assert_eq!(p.per_gpu_hour("H100-80GB", Class::OnDemand), Some(6.0));
        assert_eq!(p.per_gpu_hour("H100-80GB", Class::Burst), None);
    }

    #[test]
    fn malformed_price_lists_name_line_and_column() {
        let h = "gpu_type,class,per_gpu_hour\n";
        assert_eq!(
            refused("model,price\n"),
            "prices.csv:1:1: header: expected `gpu_type,class,per_gpu_hour`"
        );
        assert_eq!(
            refused(&format!("{h}A100-80GB,burst,1\n")),
            "prices.csv:2:1: gpu_type: the fleet has no 'A100-80GB' nodes"
        );
        assert_eq!(
            refused(&format!("{h}H100-80GB,spot,1\n")),
            "prices.csv:2:2: class: one of guaranteed, burst, on-demand (got 'spot')"
        );
        assert_eq!(
            refused(&format!("{h}H100-80GB,burst,-1\n")),
            "prices.csv:2:3: per_gpu_hour: a price from 0 to 1000000 (got '-1')"
        );
        assert_eq!(
            refused(&format!("{h}H100-80GB,burst\n")),
            "prices.csv:2:3: 2 fields, the header has 3"
        );
        assert_eq!(
            refused(&format!("{h}H100-80GB,burst,1\nH100-80GB,burst,2\n")),
            "prices.csv:3:1: H100-80GB burst is priced twice"
        );
    }

    /// Without a fleet any model may be priced; the rest is checked the same.
    #[test]
    fn usage_reads_any_model_and_maps_its_classes() {
        let p = parse_any(
            Path::new("prices.csv"),
            "gpu_type,class,per_gpu_hour\nA100-80GB,burst,1.5\n",
        )
        .unwrap();
        assert_eq!(p.per_gpu_hour("A100-80GB", Class::Burst), Some(1.5));
        assert_eq!(
            parse_any(
                Path::new("p.csv"),
                "gpu_type,class,per_gpu_hour\nA100-80GB,spot,1\n"
            )
            .unwrap_err()
            .to_string(),
            "p.csv:2:2: class: one of guaranteed, burst, on-demand (got 'spot')"
        );
        assert_eq!(Class::of_usage("guaranteed"), Some(Class::Guaranteed));
        assert_eq!(Class::of_usage("burst"), Some(Class::Burst));
        assert_eq!(Class::of_usage("borrowed-preemptible"), Some(Class::Burst));
        assert_eq!(Class::of_usage("on-demand"), Some(Class::OnDemand));
        assert_eq!(Class::of_usage(""), None);
    }
}
