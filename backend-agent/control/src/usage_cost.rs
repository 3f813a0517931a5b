//! What the operator's price list (serve's `--prices FILE`) makes of usage (issue 42): a
//! GetUsage row grouped by GPU model and capacity class gets its price per GPU-hour and its
//! cost, so that a team reads its cost with only its own token (`gpufleet_usage`). The
//! file is parsed by the binary (`gpufleet_economics::prices`, which `replay` and `usage
//! --prices` read too) and handed here already keyed by the control plane's four classes.

use std::collections::BTreeMap;

use gpufleet_proto::money::cents;
use gpufleet_proto::v1;

/// Price per GPU-hour by (GPU model, usage class: `guaranteed`, `burst`,
/// `borrowed-preemptible`, `on-demand`), in the list's currency.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PriceBook {
    per_gpu_hour: BTreeMap<(String, String), f64>,
}

impl PriceBook {
    pub fn new(entries: impl IntoIterator<Item = ((String, String), f64)>) -> Self {
        Self {
            per_gpu_hour: entries.into_iter().collect(),
        }
    }

    pub fn per_gpu_hour(&self, gpu_type: &str, class: &str) -> Option<f64> {
        self.per_gpu_hour
            .get(&(gpu_type.to_string(), class.to_string()))
            .copied()
    }
}

/// Prices `rows` in place; returns why some or all of them have no cost (empty when
/// every row has one). A price is per model and class, so rows not grouped by both have
/// none.
pub fn price(book: Option<&PriceBook>, by: &[String], rows: &mut [v1::UsageRow]) -> String {
    let Some(book) = book else {
        return "the control plane has no price list (serve --prices)".into();
    };
    if !["gpu_type", "class"]
        .iter()
        .all(|g| by.iter().any(|b| b == g))
    {
        return "a price is per GPU model and class: group by gpu_type and class".into();
    }
    let mut unpriced = Vec::new();
    for row in rows.iter_mut() {
        match book.per_gpu_hour(&row.gpu_type, &row.class) {
            Some(p) => {
                row.price_per_gpu_hour = Some(p);
                row.cost_cents = Some(cents(row.gpu_seconds, p));
            }
            None => {
                let missing = format!("{} {}", row.gpu_type, row.class);
                if !unpriced.contains(&missing) {
                    unpriced.push(missing);
                }
            }
        }
    }
    if unpriced.is_empty() {
        String::new()
    } else {
        format!("the price list has no price for {}", unpriced.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(gpu_type: &str, class: &str, gpu_seconds: i64) -> v1::UsageRow {
        v1::UsageRow {
            tenant: "vision".into(),
            gpu_type: gpu_type.into(),
            class: class.into(),
            gpu_seconds,
            ..Default::default()
        }
    }

    fn by(groups: &[&str]) -> Vec<String> {
        groups.iter().map(|g| g.to_string()).collect()
    }

    fn book() -> PriceBook {
        PriceBook::new([
            (("H100-80GB".into(), "guaranteed".into()), 2.5),
            (("H100-80GB".into(), "burst".into()), 4.0),
        ])
    }

    /// 8 GPUs for 1000 s at 2.5 an hour: 5.555…, 5.56; a class without a price has no
    /// cost, and the answer says which.
    #[test]
    fn rows_by_model_and_class_are_priced_and_the_unpriced_are_named() {
        let mut rows = vec![
            row("H100-80GB", "guaranteed", 8000),
            row("H100-80GB", "on-demand", 3600),
            row("H100-80GB", "on-demand", 7200),
        ];
        let why = price(
            Some(&book()),
            &by(&["tenant", "gpu_type", "class"]),
            &mut rows,
        );
        assert_eq!(rows[0].cost_cents, Some(556));
        assert_eq!(rows[0].price_per_gpu_hour, Some(2.5));
        assert_eq!((rows[1].cost_cents, rows[2].cost_cents), (None, None));
        assert_eq!(why, "the price list has no price for H100-80GB on-demand");
    }

    /// Without both groupings, or without a price list, nothing is priced, and the
    /// answer says why.
    #[test]
    fn no_cost_without_model_and_class_or_without_a_list() {
        let mut rows = vec![row("", "guaranteed", 8000)];
        assert_eq!(
            price(Some(&book()), &by(&["tenant", "class"]), &mut rows),
            "a price is per GPU model and class: group by gpu_type and class"
        );
        assert_eq!(
            price(None, &by(&["gpu_type", "class"]), &mut rows),
            "the control plane has no price list (serve --prices)"
        );
        assert_eq!(rows[0].cost_cents, None);
    }
}
