//! Building blocks for plans: which attributes become unknown, which force replacement,
//! and which optional attributes get a concrete default.

use super::path::AttrPath;
use super::value::Value;

/// Sets each named attribute of `state` to unknown: the apply will compute it.
pub fn mark_unknown(state: &mut Value, attrs: &[&str]) {
    for name in attrs {
        state.set(name, Value::Unknown);
    }
}

/// The attributes among `attrs` whose planned value differs from the prior one (an
/// unknown planned value counts as a change).
pub fn requires_replace_if_changed(
    prior: &Value,
    planned: &Value,
    attrs: &[&str],
) -> Vec<AttrPath> {
    attrs
        .iter()
        .filter(|name| changed(prior, planned, name))
        .map(|name| AttrPath::attr(name))
        .collect()
}

/// Whether attribute `name` differs between prior and planned state.
pub fn changed(prior: &Value, planned: &Value, name: &str) -> bool {
    let after = planned.get(name);
    after.is_unknown() || prior.get(name) != after
}

/// Where the configuration leaves an optional+computed attribute out, plans `default`
/// (so the plan shows the value the provider will send and there is no perpetual diff).
pub fn default_when_unset(planned: &mut Value, config: &Value, name: &str, default: Value) {
    if config.get(name).is_null() {
        planned.set(name, default);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(pairs: &[(&str, Value)]) -> Value {
        Value::object(pairs.iter().cloned())
    }

    #[test]
    fn replace_only_for_changed_or_unknown_attributes() {
        let prior = obj(&[("a", Value::string("x")), ("b", Value::string("y"))]);
        let planned = obj(&[("a", Value::string("x")), ("b", Value::string("z"))]);
        assert_eq!(
            requires_replace_if_changed(&prior, &planned, &["a", "b"]),
            vec![AttrPath::attr("b")]
        );
        let planned = obj(&[("a", Value::Unknown), ("b", Value::string("y"))]);
        assert_eq!(
            requires_replace_if_changed(&prior, &planned, &["a", "b"]),
            vec![AttrPath::attr("a")]
        );
    }

    #[test]
    fn defaults_apply_only_when_the_config_leaves_the_attribute_out() {
        let mut planned = obj(&[("burst_gpus", Value::Number(4))]);
        default_when_unset(
            &mut planned,
            &obj(&[("burst_gpus", Value::Number(4))]),
            "burst_gpus",
            Value::Number(0),
        );
        assert_eq!(planned.get("burst_gpus"), &Value::Number(4));
        default_when_unset(&mut planned, &obj(&[]), "burst_gpus", Value::Number(0));
        assert_eq!(planned.get("burst_gpus"), &Value::Number(0));
    }

    #[test]
    fn mark_unknown_sets_only_the_named_attributes() {
        let mut state = obj(&[("id", Value::string("1")), ("name", Value::string("n"))]);
        mark_unknown(&mut state, &["id"]);
        assert!(state.get("id").is_unknown());
        assert_eq!(state.get("name"), &Value::string("n"));
    }
}
