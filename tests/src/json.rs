//! Reading attributes out of Terraform's JSON with messages that show the whole object.

use serde_json::Value;

/// `object[key]` as a string; panics (showing `object`) when it is not one.
pub fn str_of(object: &Value, key: &str) -> String {
    object[key]
        .as_str()
        .unwrap_or_else(|| panic!("{key} is not a string in {object:#}"))
        .to_string()
}

/// `object[key]` as an integer; panics (showing `object`) when it is not one.
pub fn i64_of(object: &Value, key: &str) -> i64 {
    object[key]
        .as_i64()
        .or_else(|| object[key].as_f64().map(|f| f as i64))
        .unwrap_or_else(|| panic!("{key} is not a number in {object:#}"))
}

/// `object[key]` as an array; panics (showing `object`) when it is not one.
pub fn array_of<'a>(object: &'a Value, key: &str) -> &'a Vec<Value> {
    object[key]
        .as_array()
        .unwrap_or_else(|| panic!("{key} is not a list in {object:#}"))
}
