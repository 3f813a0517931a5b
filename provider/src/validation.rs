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

/// The names of the known models, for "unknown model" messages.
pub fn unknown_gpu_type(name: &str, known: &[&str]) -> String {
    format!(
        "unknown GPU model {name:?}; known models: {}",
        known.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn minimums_say_what_they_got() {
        assert_eq!(at_least(0, 1).unwrap_err(), "must be at least 1 (got 0)");
    }
}
