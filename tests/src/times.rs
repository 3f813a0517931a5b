//! RFC 3339 timestamps relative to now, as Terraform configurations take them.

use time::format_description::well_known::Rfc3339;
use time::{Duration, OffsetDateTime};

/// Now plus `hours` (may be negative), whole seconds, UTC, RFC 3339 (e.g. `2030-01-02T03:04:05Z`).
pub fn rfc3339_in_hours(hours: i64) -> String {
    let at = OffsetDateTime::now_utc() + Duration::hours(hours);
    let at = at.replace_nanosecond(0).expect("0 ns is valid");
    at.format(&Rfc3339).expect("UTC formats as RFC 3339")
}

/// Parses an RFC 3339 timestamp into Unix seconds.
pub fn unix_seconds(rfc3339: &str) -> i64 {
    OffsetDateTime::parse(rfc3339, &Rfc3339)
        .unwrap_or_else(|e| panic!("{rfc3339:?} is not RFC 3339: {e}"))
        .unix_timestamp()
}
