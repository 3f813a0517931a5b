//! Checks on single inputs that need no backend. Each returns the reason in words.

/// A DNS label: 1..63 of lowercase letters, digits and '-', not starting or ending in '-'.
pub fn dns_label(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 63 {
        return Err(format!("must be 1 to 63 characters (got {})", name.len()));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
    {
        return Err(format!(
            "{name:?} is not a DNS label: {c:?} is not allowed (use lowercase letters, digits and '-')"
        ));
    }
    if name.starts_with('-') || name.ends_with('-') {
        return Err(format!(
            "{name:?} is not a DNS label: it may not start or end with '-'"
        ));
    }
    Ok(())
}

/// At least `min`.
pub fn at_least(value: i64, min: i64) -> Result<(), String> {
    if value < min {
        Err(format!("must be at least {min} (got {value})"))
    } else {
        Ok(())
    }
}

/// The API's largest value of a number attribute (`gpufleet_proto::limits`), if bounded.
pub fn maximum(attribute: &str) -> Option<i64> {
    use gpufleet_proto::limits::*;
    match attribute {
        "gpus" | "burst_gpus" | "lending_limit_gpus" => Some(MAX_GPUS),
        "weight" => Some(MAX_QUOTA_WEIGHT),
        "node_count" => Some(MAX_NODE_COUNT),
        "storage_gib" => Some(MAX_STORAGE_GIB),
        "max_unavailable" => Some(MAX_UNAVAILABLE),
        _ => None,
    }
}

/// At most `max`.
pub fn at_most(value: i64, max: i64) -> Result<(), String> {
    if value > max {
        Err(format!("must be at most {max} (got {value})"))
    } else {
        Ok(())
    }
}

/// At most `max` characters (the value is quoted by its first 40).
pub fn max_chars(value: &str, max: usize) -> Result<(), String> {
    let len = value.chars().count();
    if len <= max {
        return Ok(());
    }
    let prefix: String = value.chars().take(40).collect();
    Err(format!(
        "must be at most {max} characters (got {len}): {prefix:?}…"
    ))
}

/// A time the API accepts: 2000-01-01T00:00:00Z to 2200-12-31T23:59:59Z.
pub fn time_in_range(unix: i64) -> Result<(), String> {
    use gpufleet_proto::limits::{MAX_TIME_SECONDS, MIN_TIME_SECONDS};
    if (MIN_TIME_SECONDS..=MAX_TIME_SECONDS).contains(&unix) {
        Ok(())
    } else {
        Err("must be between 2000-01-01T00:00:00Z and 2200-12-31T23:59:59Z".into())
    }
}

/// A tenant's labels: at most 64, keys of at most 128 and values of at most 256 characters.
/// Each problem as (label key or None for the map, reason).
pub fn labels<'a>(
    labels: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Vec<(Option<String>, String)> {
    use gpufleet_proto::limits::{MAX_LABELS, MAX_LABEL_KEY_CHARS, MAX_LABEL_VALUE_CHARS};
    let labels: Vec<(&str, &str)> = labels.into_iter().collect();
    let mut problems = Vec::new();
    if labels.len() > MAX_LABELS {
        problems.push((
            None,
            format!("at most {MAX_LABELS} labels (got {})", labels.len()),
        ));
        return problems;
    }
    for (key, value) in labels {
        if let Err(reason) = max_chars(key, MAX_LABEL_KEY_CHARS) {
            problems.push((None, format!("a key {reason}")));
        } else if let Err(reason) = max_chars(value, MAX_LABEL_VALUE_CHARS) {
            problems.push((Some(key.to_string()), reason));
        }
    }
    problems
}

/// The names of the known models, for "unknown model" messages.
pub fn unknown_gpu_type(name: &str, known: &[&str]) -> String {
    // Model names are case-sensitive; a name that differs only in case is surely meant.
    let meant = known.iter().find(|k| k.eq_ignore_ascii_case(name));
    let hint = meant.map_or(String::new(), |m| format!(" (did you mean {m:?}?)"));
    format!(
        "unknown GPU model {name:?}{hint}; known models: {}",
        known.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_model_in_the_wrong_case_gets_the_right_one() {
        let known = ["A100-80GB", "H100-80GB"];
        assert_eq!(
            unknown_gpu_type("h100-80gb", &known),
            "unknown GPU model \"h100-80gb\" (did you mean \"H100-80GB\"?); known models: A100-80GB, H100-80GB"
        );
        assert!(!unknown_gpu_type("V100", &known).contains("did you mean"));
    }

    #[test]
    fn dns_labels() {
        assert!(dns_label("team-a").is_ok());
        assert!(dns_label("Team_A")
            .unwrap_err()
            .contains("'T' is not allowed"));
        assert!(dns_label("-a").unwrap_err().contains("start or end"));
        assert!(dns_label("").unwrap_err().contains("1 to 63"));
        assert!(dns_label(&"a".repeat(64)).unwrap_err().contains("got 64"));
    }

    #[test]
    fn bounds_of_the_api() {
        assert_eq!(maximum("gpus"), Some(1_000_000));
        assert_eq!(maximum("name"), None);
        assert_eq!(
            at_most(i64::MAX, 1_000_000).unwrap_err(),
            format!("must be at most 1000000 (got {})", i64::MAX)
        );
        let long = "x".repeat(1 << 20);
        let err = max_chars(&long, 256).unwrap_err();
        assert!(
            err.starts_with("must be at most 256 characters (got 1048576"),
            "{err}"
        );
        assert!(err.len() < 120);
        assert!(time_in_range(946_684_800).is_ok());
        assert!(time_in_range(i64::MAX / 2).is_err());
        let many: Vec<(String, String)> = (0..65).map(|i| (format!("k{i}"), "v".into())).collect();
        let problems = labels(many.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        assert_eq!(problems, [(None, "at most 64 labels (got 65)".to_string())]);
        let problems = labels([("team", long.as_str())]);
        assert_eq!(problems[0].0.as_deref(), Some("team"));
    }

    #[test]
    fn minimums_say_what_they_got() {
        assert_eq!(at_least(0, 1).unwrap_err(), "must be at least 1 (got 0)");
    }
}
