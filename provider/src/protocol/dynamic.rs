//! DynamicValue, the wire form of every value: decoded with the schema's type (MessagePack
//! or JSON, absent as null) and encoded as MessagePack.

use super::tfplugin6 as tf;
use super::values::{from_json, from_msgpack, to_msgpack};
use crate::framework::{Diagnostics, Type, Value};

/// Decodes a DynamicValue (absent reads as null).
pub fn decode(value: Option<&tf::DynamicValue>, ty: &Type) -> Result<Value, Diagnostics> {
    let Some(value) = value else {
        return Ok(Value::Null);
    };
    let decoded = if !value.msgpack.is_empty() {
        from_msgpack(&value.msgpack, ty)
    } else if !value.json.is_empty() {
        from_json(&value.json, ty)
    } else {
        Ok(Value::Null)
    };
    decoded.map_err(Diagnostics::from)
}

pub fn encode(value: &Value, ty: &Type) -> Option<tf::DynamicValue> {
    Some(tf::DynamicValue {
        msgpack: to_msgpack(value, ty),
        json: Vec::new(),
    })
}
