//! RFC 3339 times in configuration and state, protobuf timestamps on the wire.
//!
//! The state keeps the user's spelling of a time whenever it denotes the instant the
//! backend holds (so `2027-01-01T01:00:00+01:00` does not diff against the backend's UTC);
//! imported objects get the canonical `YYYY-MM-DDTHH:MM:SSZ`.

use prost_types::Timestamp;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Parses an RFC 3339 time, with the reason on failure.
pub fn parse(text: &str) -> Result<OffsetDateTime, String> {
    OffsetDateTime::parse(text, &Rfc3339)
        .map_err(|e| format!("{text:?} is not an RFC 3339 time such as 2027-01-04T00:00:00Z ({e})"))
}

/// Unix seconds of an RFC 3339 time (the API has one-second resolution).
pub fn unix(text: &str) -> Result<i64, String> {
    parse(text).map(|t| t.unix_timestamp())
}

pub fn to_proto(unix_seconds: i64) -> Timestamp {
    Timestamp {
        seconds: unix_seconds,
        nanos: 0,
    }
}

/// `YYYY-MM-DDTHH:MM:SSZ`.
pub fn canonical(unix_seconds: i64) -> String {
    match OffsetDateTime::from_unix_timestamp(unix_seconds) {
        Ok(t) => format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second()
        ),
        Err(_) => unix_seconds.to_string(),
    }
}

pub fn now() -> i64 {
    OffsetDateTime::now_utc().unix_timestamp()
}

/// The string to keep in state for a time the backend reports as `backend`: the user's
/// `prior` spelling when it denotes that instant, the canonical form otherwise.
pub fn keep_spelling(prior: Option<&str>, backend: i64) -> String {
    match prior {
        Some(p) if unix(p) == Ok(backend) => p.to_string(),
        _ => canonical(backend),
    }
}

/// Like [`keep_spelling`] for a reservation's start: the backend starts a window that
/// began in the past at the moment it was created, so a requested start before the
/// backend's start, both in the past, denotes the same reservation.
pub fn keep_start_spelling(prior: Option<&str>, backend: i64, now: i64) -> String {
    match prior.map(|p| (p, unix(p))) {
        Some((p, Ok(requested))) if same_start(requested, backend, now) => p.to_string(),
        _ => canonical(backend),
    }
}

/// Whether a requested start and the backend's start denote the same window start.
pub fn same_start(requested: i64, backend: i64, now: i64) -> bool {
    requested == backend || (requested < backend && backend <= now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_form_is_utc_seconds() {
        assert_eq!(canonical(0), "1970-01-01T00:00:00Z");
        assert_eq!(canonical(1_798_761_600), "2027-01-01T00:00:00Z");
    }

    #[test]
    fn user_spelling_is_kept_for_the_same_instant() {
        let t = unix("2027-01-01T00:00:00Z").unwrap();
        assert_eq!(
            keep_spelling(Some("2027-01-01T01:00:00+01:00"), t),
            "2027-01-01T01:00:00+01:00"
        );
        assert_eq!(
            keep_spelling(Some("2027-01-02T00:00:00Z"), t),
            "2027-01-01T00:00:00Z"
        );
        assert_eq!(keep_spelling(None, t), "2027-01-01T00:00:00Z");
    }

    #[test]
    fn a_past_start_matches_the_clamped_backend_start() {
        let created = 2_000;
        assert!(same_start(1_000, created, 3_000));
        assert!(
            !same_start(1_000, created, 1_500),
            "backend start still ahead"
        );
        assert_eq!(
            keep_start_spelling(Some("1970-01-01T00:16:40Z"), created, 3_000),
            "1970-01-01T00:16:40Z"
        );
    }

    #[test]
    fn parse_errors_explain_the_format() {
        assert!(parse("tomorrow")
            .unwrap_err()
            .contains("is not an RFC 3339 time"));
    }
}
