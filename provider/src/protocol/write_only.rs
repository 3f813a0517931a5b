//! Write-only attributes (protocol 6.8, Terraform 1.11+): a value the configuration sends
//! to plan and apply that no state or plan keeps. Terraform expects them null in every
//! state the provider answers. A client without the capability (Terraform before 1.11)
//! would keep the value as an ordinary attribute, so a value for one from such a client is
//! refused at validation, naming the attribute.

use super::tfplugin6 as tf;
use crate::framework::{AttrPath, Diagnostic, Diagnostics, Schema, Value};

/// Refuses a configured write-only attribute from a client that would store it.
pub fn refuse_without_support(
    schema: &Schema,
    config: &Value,
    capabilities: Option<&tf::ClientCapabilities>,
) -> Result<(), Diagnostics> {
    if capabilities.is_some_and(|c| c.write_only_attributes_allowed) {
        return Ok(());
    }
    let mut diagnostics = Diagnostics::default();
    for a in schema.attributes.iter().filter(|a| a.write_only) {
        if !config.get(a.name).is_null() {
            diagnostics.push(Diagnostic::error_at(
                AttrPath::attr(a.name),
                format!(
                    "{}: a write-only attribute needs Terraform 1.11 or later",
                    a.name
                ),
                "This Terraform would keep its value in state. Upgrade Terraform, or leave the attribute out.",
            ));
        }
    }
    diagnostics.into_result()
}

/// `state` with every write-only attribute null.
pub fn nulled(schema: &Schema, mut state: Value) -> Value {
    if state.is_null() || state.is_unknown() {
        return state;
    }
    for a in schema.attributes.iter().filter(|a| a.write_only) {
        state.set(a.name, Value::Null);
    }
    state
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::{Attribute, Type};

    fn schema() -> Schema {
        Schema::new(
            "s",
            vec![
                Attribute::required("name", Type::String, "n"),
                Attribute::optional("secret_wo", Type::String, "s").write_only(),
            ],
        )
    }

    fn config() -> Value {
        Value::object([
            ("name", Value::string("a")),
            ("secret_wo", Value::string("x")),
        ])
    }

    #[test]
    fn a_client_without_the_capability_is_refused_a_write_only_value_by_name() {
        let refused = refuse_without_support(&schema(), &config(), None).unwrap_err();
        assert!(
            refused.0[0].summary.starts_with("secret_wo: "),
            "{refused:?}"
        );
        let able = tf::ClientCapabilities {
            deferral_allowed: false,
            write_only_attributes_allowed: true,
        };
        assert!(refuse_without_support(&schema(), &config(), Some(&able)).is_ok());
        let mut unset = config();
        unset.set("secret_wo", Value::Null);
        assert!(refuse_without_support(&schema(), &unset, None).is_ok());
    }

    #[test]
    fn answered_states_hold_no_write_only_value() {
        let state = nulled(&schema(), config());
        assert!(state.get("secret_wo").is_null());
        assert_eq!(state.get("name"), &Value::string("a"));
    }
}
