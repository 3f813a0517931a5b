//! Our own value model: what a resource sees of Terraform's configuration, plan and state.
//!
//! It mirrors Terraform's type system for the types this provider uses (numbers are
//! integers only). Every accessor that can meet the wrong type returns an error carrying the
//! attribute path, so a malformed value becomes a diagnostic, never a panic.

use std::collections::BTreeMap;

use super::diagnostics::Diagnostic;
use super::path::AttrPath;

/// A Terraform value. `Object` and `Map` are both string-keyed; the schema says which one
/// an attribute is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Value {
    #[default]
    Null,
    Unknown,
    Bool(bool),
    Number(i64),
    String(String),
    List(Vec<Value>),
    Map(BTreeMap<String, Value>),
    Object(BTreeMap<String, Value>),
}

static NULL: Value = Value::Null;

impl Value {
    /// An object from `(name, value)` pairs.
    pub fn object<I, K>(fields: I) -> Self
    where
        I: IntoIterator<Item = (K, Value)>,
        K: Into<String>,
    {
        Value::Object(fields.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }

    pub fn string(s: impl Into<String>) -> Self {
        Value::String(s.into())
    }

    pub fn string_map(map: &std::collections::HashMap<String, String>) -> Self {
        Value::Map(
            map.iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect(),
        )
    }

    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    pub fn is_unknown(&self) -> bool {
        matches!(self, Value::Unknown)
    }

    /// True when neither this value nor anything inside it is unknown.
    pub fn is_fully_known(&self) -> bool {
        match self {
            Value::Unknown => false,
            Value::List(items) => items.iter().all(Value::is_fully_known),
            Value::Map(entries) | Value::Object(entries) => {
                entries.values().all(Value::is_fully_known)
            }
            _ => true,
        }
    }

    /// The attribute `name` of an object; `Null` for a missing attribute or a non-object.
    pub fn get(&self, name: &str) -> &Value {
        match self {
            Value::Object(fields) => fields.get(name).unwrap_or(&NULL),
            _ => &NULL,
        }
    }

    /// Sets attribute `name` of an object (no-op on anything else).
    pub fn set(&mut self, name: &str, value: Value) {
        if let Value::Object(fields) = self {
            fields.insert(name.to_string(), value);
        }
    }

    fn type_error(&self, path: &AttrPath, expected: &str) -> Diagnostic {
        Diagnostic::error_at(
            path.clone(),
            format!("{path}: expected {expected}, got {}", self.kind()),
            "",
        )
    }

    fn kind(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Unknown => "an unknown value",
            Value::Bool(_) => "a bool",
            Value::Number(_) => "a number",
            Value::String(_) => "a string",
            Value::List(_) => "a list",
            Value::Map(_) => "a map",
            Value::Object(_) => "an object",
        }
    }

    /// The string, `None` when null or unknown.
    pub fn as_str(&self, path: &AttrPath) -> Result<Option<&str>, Diagnostic> {
        match self {
            Value::String(s) => Ok(Some(s)),
            Value::Null | Value::Unknown => Ok(None),
            other => Err(other.type_error(path, "a string")),
        }
    }

    /// The number, `None` when null or unknown.
    pub fn as_i64(&self, path: &AttrPath) -> Result<Option<i64>, Diagnostic> {
        match self {
            Value::Number(n) => Ok(Some(*n)),
            Value::Null | Value::Unknown => Ok(None),
            other => Err(other.type_error(path, "a number")),
        }
    }

    /// The bool, `None` when null or unknown.
    pub fn as_bool(&self, path: &AttrPath) -> Result<Option<bool>, Diagnostic> {
        match self {
            Value::Bool(b) => Ok(Some(*b)),
            Value::Null | Value::Unknown => Ok(None),
            other => Err(other.type_error(path, "a bool")),
        }
    }

    /// The map entries, `None` when null or unknown.
    pub fn as_map(&self, path: &AttrPath) -> Result<Option<&BTreeMap<String, Value>>, Diagnostic> {
        match self {
            Value::Map(m) | Value::Object(m) => Ok(Some(m)),
            Value::Null | Value::Unknown => Ok(None),
            other => Err(other.type_error(path, "a map")),
        }
    }

    /// Attribute `name` of this object as a string (`None` when null or unknown).
    pub fn str_attr(&self, name: &str) -> Result<Option<&str>, Diagnostic> {
        self.get(name).as_str(&AttrPath::attr(name))
    }

    /// Attribute `name` of this object as a number (`None` when null or unknown).
    pub fn i64_attr(&self, name: &str) -> Result<Option<i64>, Diagnostic> {
        self.get(name).as_i64(&AttrPath::attr(name))
    }

    /// Attribute `name` of this object as a bool (`None` when null or unknown).
    pub fn bool_attr(&self, name: &str) -> Result<Option<bool>, Diagnostic> {
        self.get(name).as_bool(&AttrPath::attr(name))
    }

    /// Attribute `name` of this object, a map of strings.
    pub fn string_map_attr(
        &self,
        name: &str,
    ) -> Result<Option<std::collections::HashMap<String, String>>, Diagnostic> {
        let path = AttrPath::attr(name);
        let Some(entries) = self.get(name).as_map(&path)? else {
            return Ok(None);
        };
        let mut out = std::collections::HashMap::new();
        for (key, value) in entries {
            if let Some(s) = value.as_str(&path.key(key))? {
                out.insert(key.clone(), s.to_string());
            }
        }
        Ok(Some(out))
    }

    /// Attribute `name` of this object, a map of numbers.
    pub fn number_map_attr(&self, name: &str) -> Result<Option<BTreeMap<String, i64>>, Diagnostic> {
        let path = AttrPath::attr(name);
        let Some(entries) = self.get(name).as_map(&path)? else {
            return Ok(None);
        };
        let mut out = BTreeMap::new();
        for (key, value) in entries {
            if let Some(n) = value.as_i64(&path.key(key))? {
                out.insert(key.clone(), n);
            }
        }
        Ok(Some(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_render_like_terraform_addresses() {
        let path = AttrPath::attr("nodes").index(0).child("gpus").key("a");
        assert_eq!(path.to_string(), "nodes[0].gpus[\"a\"]");
    }

    #[test]
    fn accessors_report_type_errors_with_the_path() {
        let v = Value::object([("gpus", Value::string("many"))]);
        let err = v.i64_attr("gpus").unwrap_err();
        assert_eq!(err.path, Some(AttrPath::attr("gpus")));
        assert!(err
            .summary
            .contains("gpus: expected a number, got a string"));
    }

    #[test]
    fn null_and_unknown_read_as_none() {
        let v = Value::object([("a", Value::Null), ("b", Value::Unknown)]);
        assert_eq!(v.str_attr("a").unwrap(), None);
        assert_eq!(v.str_attr("b").unwrap(), None);
        assert_eq!(v.str_attr("missing").unwrap(), None);
    }

    #[test]
    fn full_knownness_looks_inside_collections() {
        let v = Value::List(vec![Value::object([("x", Value::Unknown)])]);
        assert!(!v.is_fully_known());
        assert!(Value::List(vec![Value::Number(1)]).is_fully_known());
    }
}
