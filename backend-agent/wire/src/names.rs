//! The name rule both ends of the API hold names to (tenants, clusters, node agents).

/// A DNS label: 1..63 characters of `[a-z0-9-]`, not starting or ending with '-'.
pub fn dns_label(field: &str, value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err(format!("{field}: must not be empty"));
    }
    if value.len() > 63 {
        return Err(format!(
            "{field}: must be at most 63 characters (got {})",
            value.len()
        ));
    }
    if let Some(bad) = value
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
    {
        return Err(format!(
            "{field}: '{value}' may contain only lowercase letters, digits and '-' (found '{bad}')"
        ));
    }
    if value.starts_with('-') || value.ends_with('-') {
        return Err(format!("{field}: '{value}' must not start or end with '-'"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels() {
        assert!(dns_label("name", "team-a1").is_ok());
        assert!(dns_label("name", &"a".repeat(63)).is_ok());
        assert_eq!(
            dns_label("name", "").unwrap_err(),
            "name: must not be empty"
        );
        assert!(dns_label("name", &"a".repeat(64))
            .unwrap_err()
            .contains("at most 63"));
        assert!(dns_label("name", "Team").unwrap_err().contains("found 'T'"));
        assert!(dns_label("name", "-a")
            .unwrap_err()
            .contains("start or end"));
        assert!(dns_label("name", "a-")
            .unwrap_err()
            .contains("start or end"));
    }
}
