//! DynamicValue: the framework's `Value` to and from Terraform's wire encodings, guided by
//! the schema's type (MessagePack has no object/map distinction and no schema).
//!
//! MessagePack is what Terraform sends and what the provider answers; JSON arrives in a
//! stored state to upgrade (`RawState.json`) and is accepted in any DynamicValue. An
//! unknown value is the extension type 0; Terraform 1.6 and later may send a *refined*
//! unknown (extension 12, carrying what is known of it: not null, a string prefix, number
//! bounds, a collection's length), which reads as plain unknown here. Numbers are integers
//! in this provider: an integral float or a decimal string (how cty writes a number that
//! does not fit an integer encoding) is accepted, anything else is an error naming the
//! attribute.

use std::collections::BTreeMap;

use rmp::Marker;

use crate::framework::{AttrPath, Diagnostic, Type, Value};

/// MessagePack extension type of an unknown value.
const EXT_UNKNOWN: i8 = 0;
/// MessagePack extension type of a refined unknown value (Terraform 1.6+).
const EXT_REFINED_UNKNOWN: i8 = 12;
/// Collections nested deeper than this are refused (the types here nest 4 deep at most).
const MAX_DEPTH: usize = 64;

fn error(path: &AttrPath, message: impl std::fmt::Display) -> Diagnostic {
    let at = if path.0.is_empty() {
        "value".to_string()
    } else {
        path.to_string()
    };
    Diagnostic::error_at(
        path.clone(),
        format!("{at}: {message}"),
        "Terraform sent a value this provider cannot read.",
    )
}

/// Encodes `value` as MessagePack following `ty` (objects get every attribute of their
/// type, null where the value lacks one).
pub fn to_msgpack(value: &Value, ty: &Type) -> Vec<u8> {
    let mut out = Vec::new();
    write(&mut out, value, Some(ty));
    out
}

fn write(out: &mut Vec<u8>, value: &Value, ty: Option<&Type>) {
    // Writing into a Vec cannot fail.
    match value {
        Value::Null => {
            let _ = rmp::encode::write_nil(out);
        }
        Value::Unknown => {
            let _ = rmp::encode::write_ext_meta(out, 1, EXT_UNKNOWN);
            out.push(0);
        }
        Value::Bool(b) => {
            let _ = rmp::encode::write_bool(out, *b);
        }
        Value::Number(n) => {
            let _ = rmp::encode::write_sint(out, *n);
        }
        Value::String(s) => {
            let _ = rmp::encode::write_str(out, s);
        }
        Value::List(items) => {
            let elem = match ty {
                Some(Type::List(elem)) => Some(elem.as_ref()),
                _ => None,
            };
            let _ = rmp::encode::write_array_len(out, items.len() as u32);
            for item in items {
                write(out, item, elem);
            }
        }
        Value::Map(entries) | Value::Object(entries) => match ty {
            Some(Type::Object(fields)) => {
                let _ = rmp::encode::write_map_len(out, fields.len() as u32);
                for (name, field_ty) in fields {
                    let _ = rmp::encode::write_str(out, name);
                    write(
                        out,
                        entries.get(name).unwrap_or(&Value::Null),
                        Some(field_ty),
                    );
                }
            }
            // A map, or a value that does not match its type (a provider bug): written as
            // it is so that Terraform reports the mismatch rather than this layer hiding it.
            _ => {
                let elem = match ty {
                    Some(Type::Map(elem)) => Some(elem.as_ref()),
                    _ => None,
                };
                let _ = rmp::encode::write_map_len(out, entries.len() as u32);
                for (key, item) in entries {
                    let _ = rmp::encode::write_str(out, key);
                    write(out, item, elem);
                }
            }
        },
    }
}

/// Decodes MessagePack that Terraform sent, following `ty`.
pub fn from_msgpack(bytes: &[u8], ty: &Type) -> Result<Value, Diagnostic> {
    let mut reader = Reader { bytes, at: 0 };
    let value = reader.value(ty, &AttrPath::root(), 0)?;
    if reader.at != bytes.len() {
        return Err(error(&AttrPath::root(), "trailing bytes after the value"));
    }
    Ok(value)
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize, path: &AttrPath) -> Result<&[u8], Diagnostic> {
        let end = self
            .at
            .checked_add(n)
            .filter(|end| *end <= self.bytes.len())
            .ok_or_else(|| error(path, "truncated MessagePack"))?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn uint(&mut self, n: usize, path: &AttrPath) -> Result<u64, Diagnostic> {
        Ok(self
            .take(n, path)?
            .iter()
            .fold(0u64, |acc, b| (acc << 8) | u64::from(*b)))
    }

    fn int(&mut self, n: usize, path: &AttrPath) -> Result<i64, Diagnostic> {
        let raw = self.uint(n, path)?;
        let shift = 64 - 8 * n as u32;
        // Sign-extend from n bytes.
        Ok(((raw << shift) as i64) >> shift)
    }

    fn string(&mut self, len: usize, path: &AttrPath) -> Result<String, Diagnostic> {
        let raw = self.take(len, path)?;
        String::from_utf8(raw.to_vec()).map_err(|_| error(path, "a string that is not UTF-8"))
    }

    /// Reads a map key (always a string in Terraform's encoding).
    fn key(&mut self, path: &AttrPath) -> Result<String, Diagnostic> {
        let marker = Marker::from_u8(self.take(1, path)?[0]);
        let len = match marker {
            Marker::FixStr(n) => usize::from(n),
            Marker::Str8 => self.uint(1, path)? as usize,
            Marker::Str16 => self.uint(2, path)? as usize,
            Marker::Str32 => self.uint(4, path)? as usize,
            other => return Err(error(path, format!("a map key that is {other:?}"))),
        };
        self.string(len, path)
    }

    fn value(&mut self, ty: &Type, path: &AttrPath, depth: usize) -> Result<Value, Diagnostic> {
        if depth > MAX_DEPTH {
            return Err(error(path, "values nested too deep"));
        }
        let marker = Marker::from_u8(self.take(1, path)?[0]);
        let number = |n: i64| match ty {
            Type::Number => Ok(Value::Number(n)),
            other => Err(error(path, format!("a number where {other:?} belongs"))),
        };
        match marker {
            Marker::Null => Ok(Value::Null),
            Marker::True | Marker::False => match ty {
                Type::Bool => Ok(Value::Bool(marker == Marker::True)),
                other => Err(error(path, format!("a bool where {other:?} belongs"))),
            },
            Marker::FixPos(n) => number(i64::from(n)),
            Marker::FixNeg(n) => number(i64::from(n)),
            Marker::U8 => number(self.uint(1, path)? as i64),
            Marker::U16 => number(self.uint(2, path)? as i64),
            Marker::U32 => number(self.uint(4, path)? as i64),
            Marker::U64 => {
                let n = self.uint(8, path)?;
                let n = i64::try_from(n).map_err(|_| error(path, format!("{n} is too large")))?;
                number(n)
            }
            Marker::I8 => number(self.int(1, path)?),
            Marker::I16 => number(self.int(2, path)?),
            Marker::I32 => number(self.int(4, path)?),
            Marker::I64 => number(self.int(8, path)?),
            Marker::F32 => {
                let f = f32::from_bits(self.uint(4, path)? as u32);
                number(integral(f64::from(f), path)?)
            }
            Marker::F64 => {
                let f = f64::from_bits(self.uint(8, path)?);
                number(integral(f, path)?)
            }
            Marker::FixStr(_) | Marker::Str8 | Marker::Str16 | Marker::Str32 => {
                let len = match marker {
                    Marker::FixStr(n) => usize::from(n),
                    Marker::Str8 => self.uint(1, path)? as usize,
                    Marker::Str16 => self.uint(2, path)? as usize,
                    _ => self.uint(4, path)? as usize,
                };
                let s = self.string(len, path)?;
                match ty {
                    Type::String => Ok(Value::String(s)),
                    // cty writes a number that fits no integer encoding as its decimal text.
                    Type::Number => s
                        .parse::<i64>()
                        .map(Value::Number)
                        .map_err(|_| error(path, format!("{s:?} is not a whole number"))),
                    other => Err(error(path, format!("a string where {other:?} belongs"))),
                }
            }
            Marker::FixArray(_) | Marker::Array16 | Marker::Array32 => {
                let len = match marker {
                    Marker::FixArray(n) => usize::from(n),
                    Marker::Array16 => self.uint(2, path)? as usize,
                    _ => self.uint(4, path)? as usize,
                };
                let Type::List(elem) = ty else {
                    return Err(error(path, format!("a list where {ty:?} belongs")));
                };
                let mut items = Vec::with_capacity(len.min(1024));
                for i in 0..len {
                    items.push(self.value(elem, &path.index(i), depth + 1)?);
                }
                Ok(Value::List(items))
            }
            Marker::FixMap(_) | Marker::Map16 | Marker::Map32 => {
                let len = match marker {
                    Marker::FixMap(n) => usize::from(n),
                    Marker::Map16 => self.uint(2, path)? as usize,
                    _ => self.uint(4, path)? as usize,
                };
                self.map(len, ty, path, depth)
            }
            Marker::FixExt1
            | Marker::FixExt2
            | Marker::FixExt4
            | Marker::FixExt8
            | Marker::FixExt16
            | Marker::Ext8
            | Marker::Ext16
            | Marker::Ext32 => {
                let len = match marker {
                    Marker::FixExt1 => 1,
                    Marker::FixExt2 => 2,
                    Marker::FixExt4 => 4,
                    Marker::FixExt8 => 8,
                    Marker::FixExt16 => 16,
                    Marker::Ext8 => self.uint(1, path)? as usize,
                    Marker::Ext16 => self.uint(2, path)? as usize,
                    _ => self.uint(4, path)? as usize,
                };
                let kind = self.take(1, path)?[0] as i8;
                // The refinements are skipped: the provider plans with plain unknowns.
                self.take(len, path)?;
                match kind {
                    EXT_UNKNOWN | EXT_REFINED_UNKNOWN => Ok(Value::Unknown),
                    other => Err(error(path, format!("MessagePack extension type {other}"))),
                }
            }
            other => Err(error(path, format!("unexpected MessagePack {other:?}"))),
        }
    }

    fn map(
        &mut self,
        len: usize,
        ty: &Type,
        path: &AttrPath,
        depth: usize,
    ) -> Result<Value, Diagnostic> {
        match ty {
            Type::Map(elem) => {
                let mut entries = BTreeMap::new();
                for _ in 0..len {
                    let key = self.key(path)?;
                    let item = self.value(elem, &path.key(&key), depth + 1)?;
                    entries.insert(key, item);
                }
                Ok(Value::Map(entries))
            }
            Type::Object(fields) => {
                let mut entries = BTreeMap::new();
                for _ in 0..len {
                    let key = self.key(path)?;
                    let Some(field_ty) = fields.get(&key) else {
                        return Err(error(path, format!("unsupported attribute {key:?}")));
                    };
                    let item = self.value(field_ty, &path.child(&key), depth + 1)?;
                    entries.insert(key, item);
                }
                Ok(Value::Object(complete(entries, fields)))
            }
            other => Err(error(path, format!("a map where {other:?} belongs"))),
        }
    }
}

/// An object with every attribute of its type: a missing one reads as null.
fn complete(
    mut entries: BTreeMap<String, Value>,
    fields: &BTreeMap<String, Type>,
) -> BTreeMap<String, Value> {
    for name in fields.keys() {
        entries.entry(name.clone()).or_insert(Value::Null);
    }
    entries
}

fn integral(f: f64, path: &AttrPath) -> Result<i64, Diagnostic> {
    if f.fract() == 0.0 && f >= i64::MIN as f64 && f < i64::MAX as f64 {
        Ok(f as i64)
    } else {
        Err(error(path, format!("{f} is not a whole number")))
    }
}

/// Decodes JSON (a stored state, or a DynamicValue's `json`), following `ty`. JSON has no
/// unknown values; attributes the type lacks are dropped (a stored state may hold one that
/// the current schema removed), missing ones read as null.
pub fn from_json(bytes: &[u8], ty: &Type) -> Result<Value, Diagnostic> {
    let raw: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| error(&AttrPath::root(), format!("invalid JSON: {e}")))?;
    json_value(raw, ty, &AttrPath::root())
}

fn json_value(raw: serde_json::Value, ty: &Type, path: &AttrPath) -> Result<Value, Diagnostic> {
    use serde_json::Value as J;
    Ok(match (raw, ty) {
        (J::Null, _) => Value::Null,
        (J::Bool(b), Type::Bool) => Value::Bool(b),
        (J::Number(n), Type::Number) => match n.as_i64() {
            Some(i) => Value::Number(i),
            None => Value::Number(integral(n.as_f64().unwrap_or(f64::NAN), path)?),
        },
        (J::String(s), Type::String) => Value::String(s),
        (J::String(s), Type::Number) => Value::Number(
            s.parse()
                .map_err(|_| error(path, format!("{s:?} is not a whole number")))?,
        ),
        (J::Array(items), Type::List(elem)) => Value::List(
            items
                .into_iter()
                .enumerate()
                .map(|(i, item)| json_value(item, elem, &path.index(i)))
                .collect::<Result<_, _>>()?,
        ),
        (J::Object(entries), Type::Map(elem)) => Value::Map(
            entries
                .into_iter()
                .map(|(k, v)| {
                    let item = json_value(v, elem, &path.key(&k))?;
                    Ok((k, item))
                })
                .collect::<Result<_, Diagnostic>>()?,
        ),
        (J::Object(mut entries), Type::Object(fields)) => Value::Object(
            fields
                .iter()
                .map(|(name, field_ty)| {
                    let raw = entries.remove(name).unwrap_or(J::Null);
                    Ok((name.clone(), json_value(raw, field_ty, &path.child(name))?))
                })
                .collect::<Result<_, Diagnostic>>()?,
        ),
        (other, ty) => return Err(error(path, format!("{other} where {ty:?} belongs"))),
    })
}

/// Terraform's JSON notation of a type, as schemas carry it: `"string"`,
/// `["list","number"]`, `["object",{"name":"string"}]`.
pub fn type_json(ty: &Type) -> serde_json::Value {
    use serde_json::json;
    match ty {
        Type::String => json!("string"),
        Type::Number => json!("number"),
        Type::Bool => json!("bool"),
        Type::List(elem) => json!(["list", type_json(elem)]),
        Type::Map(elem) => json!(["map", type_json(elem)]),
        Type::Object(fields) => {
            let fields: serde_json::Map<String, serde_json::Value> = fields
                .iter()
                .map(|(name, t)| (name.clone(), type_json(t)))
                .collect();
            json!(["object", fields])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster_type() -> Type {
        Type::object([
            ("name", Type::String),
            ("node_count", Type::Number),
            ("mig_layout", Type::map(Type::Number)),
            (
                "nodes",
                Type::list(Type::object([
                    ("id", Type::String),
                    ("gpu_count", Type::Number),
                ])),
            ),
        ])
    }

    #[test]
    fn values_round_trip_with_unknowns_objects_and_maps_told_apart() {
        let value = Value::object([
            ("name", Value::string("a")),
            ("node_count", Value::Unknown),
            (
                "mig_layout",
                Value::Map(BTreeMap::from([("3g.40gb".to_string(), Value::Number(-2))])),
            ),
            (
                "nodes",
                Value::List(vec![Value::object([
                    ("id", Value::string("n1")),
                    ("gpu_count", Value::Number(1 << 40)),
                ])]),
            ),
        ]);
        let bytes = to_msgpack(&value, &cluster_type());
        assert_eq!(from_msgpack(&bytes, &cluster_type()).unwrap(), value);
    }

    #[test]
    fn encoding_fills_every_object_attribute_with_null() {
        let value = Value::object([("name", Value::string("a"))]);
        let back = from_msgpack(&to_msgpack(&value, &cluster_type()), &cluster_type()).unwrap();
        assert_eq!(back.get("node_count"), &Value::Null);
        let Value::Object(fields) = back else {
            panic!("an object")
        };
        assert_eq!(fields.len(), 4);
    }

    #[test]
    fn unknown_is_extension_zero_and_a_refined_unknown_reads_as_unknown() {
        assert_eq!(to_msgpack(&Value::Unknown, &Type::String), vec![0xd4, 0, 0]);
        // ext 12 with a payload (a refinement: "not null", as cty writes it).
        let refined = [0xc7, 3, 12, 0x81, 0x01, 0xc3];
        assert_eq!(
            from_msgpack(&refined, &Type::String).unwrap(),
            Value::Unknown
        );
        let other_ext = [0xd4, 5, 0];
        assert!(from_msgpack(&other_ext, &Type::String).is_err());
    }

    #[test]
    fn numbers_accept_integral_floats_and_decimal_text_only() {
        let mut f = vec![0xcb];
        f.extend_from_slice(&3.0f64.to_bits().to_be_bytes());
        assert_eq!(from_msgpack(&f, &Type::Number).unwrap(), Value::Number(3));
        let mut half = vec![0xcb];
        half.extend_from_slice(&2.5f64.to_bits().to_be_bytes());
        assert!(from_msgpack(&half, &Type::Number).is_err());
        let text = [0xa2, b'4', b'2'];
        assert_eq!(
            from_msgpack(&text, &Type::Number).unwrap(),
            Value::Number(42)
        );
        // Negative fixint and int8 sign-extend.
        assert_eq!(
            from_msgpack(&[0xff], &Type::Number).unwrap(),
            Value::Number(-1)
        );
        assert_eq!(
            from_msgpack(&[0xd0, 0x80], &Type::Number).unwrap(),
            Value::Number(-128)
        );
    }

    #[test]
    fn type_errors_and_truncation_name_the_attribute() {
        let ty = Type::object([("node_count", Type::Number)]);
        let bytes = to_msgpack(
            &Value::object([("node_count", Value::string("x"))]),
            &Type::object([("node_count", Type::String)]),
        );
        let err = from_msgpack(&bytes, &ty).unwrap_err();
        assert_eq!(err.path, Some(AttrPath::attr("node_count")));
        assert!(err.summary.starts_with("node_count: "), "{}", err.summary);
        let truncated = &bytes[..bytes.len() - 1];
        assert!(from_msgpack(truncated, &ty).is_err());
    }

    #[test]
    fn json_state_drops_removed_attributes_and_fills_new_ones() {
        let state =
            br#"{"name":"a","node_count":2,"gone":true,"nodes":[{"id":"n1","gpu_count":8}]}"#;
        let v = from_json(state, &cluster_type()).unwrap();
        assert_eq!(v.get("name"), &Value::string("a"));
        assert_eq!(v.get("node_count"), &Value::Number(2));
        assert_eq!(v.get("mig_layout"), &Value::Null);
        assert_eq!(v.get("gone"), &Value::Null);
    }

    #[test]
    fn types_are_written_in_terraform_notation() {
        let ty = Type::object([
            ("a", Type::list(Type::String)),
            ("b", Type::map(Type::Bool)),
        ]);
        assert_eq!(
            type_json(&ty).to_string(),
            r#"["object",{"a":["list","string"],"b":["map","bool"]}]"#
        );
    }
}
