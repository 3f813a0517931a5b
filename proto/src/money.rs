//! Money as every gpufleet surface shows it (GetUsage's `cost_cents`, `gpufleet-agent usage
//! --prices`, the `gpufleet_usage` data source): whole hundredths of the price list's
//! currency, so that rows add up to their totals exactly.

/// `gpu_seconds / 3600 × per_gpu_hour`, in hundredths, rounded half away from zero.
pub fn cents(gpu_seconds: i64, per_gpu_hour: f64) -> i64 {
    (gpu_seconds as f64 * per_gpu_hour / 36.0).round() as i64
}

/// Hundredths as a decimal: `556` is `5.56`.
pub fn decimal(cents: i64) -> String {
    let sign = if cents < 0 { "-" } else { "" };
    format!("{sign}{}.{:02}", cents.abs() / 100, cents.abs() % 100)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cents_round_half_away_from_zero() {
        assert_eq!(cents(8000, 2.5), 556); // 2.2222 h x 2.5 = 5.5555
        assert_eq!(cents(4800, 2.5), 333);
        assert_eq!(cents(18, 1.0), 1); // 0.5 hundredths
        assert_eq!(cents(0, 6.0), 0);
    }

    #[test]
    fn decimals_keep_two_places_and_the_sign() {
        assert_eq!(decimal(556), "5.56");
        assert_eq!(decimal(7), "0.07");
        assert_eq!(decimal(-1205), "-12.05");
    }
}
