//! Conversions between tf-provider's types and the framework's.
//!
//! tf-provider's `ValueAny` has no object/map distinction and no schema, so values are
//! converted guided by the attribute type; objects always carry every attribute of their
//! type (Terraform rejects objects with missing attributes).

use std::collections::{BTreeMap, HashMap};

use tf_provider::schema::{
    Attribute as TfAttribute, AttributeConstraint, AttributeType, Block, Description, NestedBlock,
    Schema as TfSchema,
};
use tf_provider::value::ValueAny;
use tf_provider::{AttributePath, AttributePathStep};

use crate::framework::{
    AttrPath, Diagnostic, Diagnostics, Mode, PathStep, Schema, Severity, Type, Value,
};

/// Decodes a value Terraform sent, following `ty`.
pub fn from_tf(value: ValueAny, ty: &Type, path: &AttrPath) -> Result<Value, Diagnostic> {
    let mismatch = |got: &str| {
        Diagnostic::error_at(
            path.clone(),
            format!("{path}: unexpected {got} for type {ty:?}"),
            "",
        )
    };
    Ok(match (value, ty) {
        (ValueAny::Null, _) => Value::Null,
        (ValueAny::Unknown, _) => Value::Unknown,
        (ValueAny::String(s), Type::String) => Value::String(s),
        (ValueAny::Number(n), Type::Number) => Value::Number(n),
        (ValueAny::Bool(b), Type::Bool) => Value::Bool(b),
        (ValueAny::List(items), Type::List(elem)) => Value::List(
            items
                .into_iter()
                .enumerate()
                .map(|(i, item)| from_tf(item, elem, &path.index(i)))
                .collect::<Result<_, _>>()?,
        ),
        (ValueAny::Map(entries), Type::Map(elem)) => Value::Map(
            entries
                .into_iter()
                .map(|(k, v)| {
                    let decoded = from_tf(v, elem, &path.key(&k))?;
                    Ok((k, decoded))
                })
                .collect::<Result<_, Diagnostic>>()?,
        ),
        (ValueAny::Map(mut entries), Type::Object(fields)) => Value::Object(
            fields
                .iter()
                .map(|(name, field_ty)| {
                    let raw = entries.remove(name).unwrap_or(ValueAny::Null);
                    Ok((name.clone(), from_tf(raw, field_ty, &path.child(name))?))
                })
                .collect::<Result<_, Diagnostic>>()?,
        ),
        (ValueAny::String(_), _) => return Err(mismatch("string")),
        (ValueAny::Number(_), _) => return Err(mismatch("number")),
        (ValueAny::Bool(_), _) => return Err(mismatch("bool")),
        (ValueAny::List(_), _) => return Err(mismatch("list")),
        (ValueAny::Map(_), _) => return Err(mismatch("map")),
    })
}

/// Encodes a value for Terraform, following `ty` (objects get every attribute of their
/// type, null where the value lacks one).
pub fn to_tf(value: &Value, ty: &Type) -> ValueAny {
    match (value, ty) {
        (Value::Null, _) => ValueAny::Null,
        (Value::Unknown, _) => ValueAny::Unknown,
        (Value::Bool(b), _) => ValueAny::Bool(*b),
        (Value::Number(n), _) => ValueAny::Number(*n),
        (Value::String(s), _) => ValueAny::String(s.clone()),
        (Value::List(items), Type::List(elem)) => {
            ValueAny::List(items.iter().map(|i| to_tf(i, elem)).collect())
        }
        (Value::Map(entries) | Value::Object(entries), Type::Map(elem)) => ValueAny::Map(
            entries
                .iter()
                .map(|(k, v)| (k.clone(), to_tf(v, elem)))
                .collect(),
        ),
        (Value::Map(entries) | Value::Object(entries), Type::Object(fields)) => ValueAny::Map(
            fields
                .iter()
                .map(|(name, field_ty)| {
                    let v = entries.get(name).unwrap_or(&Value::Null);
                    (name.clone(), to_tf(v, field_ty))
                })
                .collect(),
        ),
        // A value that does not match its type: a provider bug; encode it as is so
        // Terraform reports the mismatch rather than this layer hiding it.
        (Value::List(items), _) => ValueAny::List(items.iter().map(untyped).collect()),
        (Value::Map(entries) | Value::Object(entries), _) => ValueAny::Map(
            entries
                .iter()
                .map(|(k, v)| (k.clone(), untyped(v)))
                .collect::<BTreeMap<_, _>>(),
        ),
    }
}

fn untyped(value: &Value) -> ValueAny {
    match value {
        Value::Null => ValueAny::Null,
        Value::Unknown => ValueAny::Unknown,
        Value::Bool(b) => ValueAny::Bool(*b),
        Value::Number(n) => ValueAny::Number(*n),
        Value::String(s) => ValueAny::String(s.clone()),
        Value::List(items) => ValueAny::List(items.iter().map(untyped).collect()),
        Value::Map(entries) | Value::Object(entries) => ValueAny::Map(
            entries
                .iter()
                .map(|(k, v)| (k.clone(), untyped(v)))
                .collect(),
        ),
    }
}

fn attribute_type(ty: &Type) -> AttributeType {
    match ty {
        Type::String => AttributeType::String,
        Type::Number => AttributeType::Number,
        Type::Bool => AttributeType::Bool,
        Type::List(elem) => AttributeType::List(Box::new(attribute_type(elem))),
        Type::Map(elem) => AttributeType::Map(Box::new(attribute_type(elem))),
        // Plain object types, never tf-provider's nested attribute types: Terraform
        // rejects the latter as the crate encodes them.
        Type::Object(fields) => AttributeType::Object(
            fields
                .iter()
                .map(|(name, t)| (name.clone(), attribute_type(t)))
                .collect::<HashMap<_, _>>(),
        ),
    }
}

fn tf_attributes(attributes: &[crate::framework::Attribute]) -> HashMap<String, TfAttribute> {
    attributes
        .iter()
        .map(|a| {
            let constraint = match a.mode {
                Mode::Required => AttributeConstraint::Required,
                Mode::Optional => AttributeConstraint::Optional,
                Mode::Computed => AttributeConstraint::Computed,
                Mode::OptionalComputed => AttributeConstraint::OptionalComputed,
            };
            let attribute = TfAttribute {
                attr_type: attribute_type(&a.ty),
                description: Description::markdown(a.description),
                constraint,
                sensitive: a.sensitive,
                deprecated: false,
            };
            (a.name.to_string(), attribute)
        })
        .collect()
}

pub fn to_tf_schema(schema: &Schema) -> TfSchema {
    let attributes = tf_attributes(&schema.attributes);
    // Group nesting: at most one block, its value an object of nulls when absent.
    let blocks = schema
        .blocks
        .iter()
        .map(|b| {
            let block = Block {
                version: schema.version,
                attributes: tf_attributes(&b.attributes),
                blocks: HashMap::new(),
                description: Description::markdown(b.description),
                deprecated: false,
            };
            (b.name.to_string(), NestedBlock::Group(block))
        })
        .collect();
    TfSchema {
        version: schema.version,
        block: Block {
            version: schema.version,
            attributes,
            blocks,
            description: Description::markdown(schema.description),
            deprecated: false,
        },
    }
}

pub fn attribute_path(path: &AttrPath) -> AttributePath {
    AttributePath {
        steps: path
            .0
            .iter()
            .map(|step| match step {
                PathStep::Attribute(name) => AttributePathStep::Attribute(name.clone().into()),
                PathStep::Key(key) => AttributePathStep::Key(key.clone().into()),
                PathStep::Index(i) => AttributePathStep::Index(*i),
            })
            .collect(),
    }
}

/// Appends our diagnostics to tf-provider's (built field by field: its constructors
/// append a backtrace to the detail when RUST_BACKTRACE is set).
pub fn push_diagnostics(target: &mut tf_provider::Diagnostics, diagnostics: Diagnostics) {
    for d in diagnostics.0 {
        let converted = tf_provider::Diagnostic {
            summary: d.summary.into(),
            detail: d.detail.into(),
            attribute: d.path.as_ref().map(attribute_path).unwrap_or_default(),
        };
        match d.severity {
            Severity::Error => target.add_error(converted),
            Severity::Warning => target.add_warning(converted),
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
    fn objects_and_maps_are_told_apart_by_type() {
        let raw = ValueAny::Map(BTreeMap::from([
            ("name".to_string(), ValueAny::String("a".into())),
            (
                "mig_layout".to_string(),
                ValueAny::Map(BTreeMap::from([(
                    "3g.40gb".to_string(),
                    ValueAny::Number(2),
                )])),
            ),
            (
                "nodes".to_string(),
                ValueAny::List(vec![ValueAny::Map(BTreeMap::from([(
                    "id".to_string(),
                    ValueAny::String("n1".into()),
                )]))]),
            ),
        ]));
        let v = from_tf(raw, &cluster_type(), &AttrPath::root()).unwrap();
        assert_eq!(
            v.get("node_count"),
            &Value::Null,
            "missing attribute reads as null"
        );
        assert!(matches!(v.get("mig_layout"), Value::Map(_)));
        let Value::List(nodes) = v.get("nodes") else {
            panic!("nodes is a list")
        };
        assert!(matches!(nodes[0], Value::Object(_)));
        assert_eq!(nodes[0].get("gpu_count"), &Value::Null);
    }

    #[test]
    fn encoding_fills_every_object_attribute() {
        let v = Value::object([("name", Value::string("a")), ("nodes", Value::Unknown)]);
        let ValueAny::Map(out) = to_tf(&v, &cluster_type()) else {
            panic!("object encodes as map")
        };
        assert_eq!(out.len(), 4);
        assert_eq!(out["node_count"], ValueAny::Null);
        assert_eq!(out["nodes"], ValueAny::Unknown);
    }

    #[test]
    fn type_mismatch_names_the_path() {
        let raw = ValueAny::Map(BTreeMap::from([(
            "node_count".to_string(),
            ValueAny::String("x".into()),
        )]));
        let err = from_tf(raw, &cluster_type(), &AttrPath::root()).unwrap_err();
        assert_eq!(err.path, Some(AttrPath::attr("node_count")));
    }

    #[test]
    fn unknown_survives_the_msgpack_round_trip() {
        let value = ValueAny::Map(BTreeMap::from([
            ("id".to_string(), ValueAny::Unknown),
            ("n".to_string(), ValueAny::Number(3)),
        ]));
        let raw = rmp_serde::to_vec_named(&value).expect("serializes");
        let back: ValueAny = rmp_serde::from_slice(&raw).expect("deserializes");
        assert!(back == value, "round trip keeps unknown and number");
    }

    #[test]
    fn diagnostics_keep_their_path() {
        let mut target = tf_provider::Diagnostics::default();
        let mut ours = Diagnostics::default();
        ours.attr_error("node_count", "must be at least 1 (got 0)");
        push_diagnostics(&mut target, ours);
        assert_eq!(target.errors.len(), 1);
        assert_eq!(
            target.errors[0].summary,
            "node_count: must be at least 1 (got 0)"
        );
        assert_eq!(target.errors[0].attribute, AttributePath::new("node_count"));
    }
}

#[cfg(test)]
mod block_tests {
    use super::*;
    use crate::framework::{Attribute, Block as FwBlock};

    #[test]
    fn a_block_is_a_group_whose_value_is_an_object() {
        let schema = Schema::new("r", vec![Attribute::required("name", Type::String, "n")])
            .with_block(FwBlock {
                name: "timeouts",
                description: "t",
                attributes: vec![Attribute::optional("create", Type::String, "c")],
            });
        let tf = to_tf_schema(&schema);
        assert!(!tf.block.attributes.contains_key("timeouts"));
        match tf.block.blocks.get("timeouts") {
            Some(NestedBlock::Group(b)) => assert!(b.attributes.contains_key("create")),
            other => panic!("timeouts is not a group block: {other:?}"),
        }
        // Absent from the configuration, Terraform sends an object of nulls.
        let raw = ValueAny::Map(BTreeMap::from([
            ("name".to_string(), ValueAny::String("a".into())),
            (
                "timeouts".to_string(),
                ValueAny::Map(BTreeMap::from([("create".to_string(), ValueAny::Null)])),
            ),
        ]));
        let v = from_tf(raw, &schema.object_type(), &AttrPath::root()).unwrap();
        assert_eq!(v.get("timeouts").get("create"), &Value::Null);
        assert!(matches!(v.get("timeouts"), Value::Object(_)));
    }
}
