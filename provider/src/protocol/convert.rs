//! The framework's schemas, diagnostics and attribute paths as `tfplugin6` messages.

use super::tfplugin6 as tf;
use super::values::type_json;
use crate::framework::{AttrPath, Attribute, Diagnostics, Mode, PathStep, Schema, Severity};

fn attribute(a: &Attribute) -> tf::schema::Attribute {
    tf::schema::Attribute {
        name: a.name.to_string(),
        // Plain object types, never nested attribute types: values nest as objects.
        r#type: type_json(&a.ty).to_string().into_bytes(),
        description: a.description.to_string(),
        required: a.mode == Mode::Required,
        optional: matches!(a.mode, Mode::Optional | Mode::OptionalComputed),
        computed: matches!(a.mode, Mode::Computed | Mode::OptionalComputed),
        sensitive: a.sensitive,
        description_kind: tf::StringKind::Markdown as i32,
        deprecated: a.deprecated,
        write_only: a.write_only,
    }
}

/// A schema as Terraform reads it. Blocks nest as GROUP: written at most once, their value
/// an object of nulls when absent.
pub fn schema(schema: &Schema) -> tf::Schema {
    let block_types = schema
        .blocks
        .iter()
        .map(|b| tf::schema::NestedBlock {
            type_name: b.name.to_string(),
            block: Some(tf::schema::Block {
                version: schema.version,
                attributes: b.attributes.iter().map(attribute).collect(),
                block_types: Vec::new(),
                description: b.description.to_string(),
                description_kind: tf::StringKind::Markdown as i32,
                deprecated: false,
            }),
            nesting: tf::schema::nested_block::NestingMode::Group as i32,
            min_items: 0,
            max_items: 0,
        })
        .collect();
    tf::Schema {
        version: schema.version,
        block: Some(tf::schema::Block {
            version: schema.version,
            attributes: schema.attributes.iter().map(attribute).collect(),
            block_types,
            description: schema.description.to_string(),
            description_kind: tf::StringKind::Markdown as i32,
            deprecated: false,
        }),
    }
}

pub fn attribute_path(path: &AttrPath) -> tf::AttributePath {
    use tf::attribute_path::step::Selector;
    tf::AttributePath {
        steps: path
            .0
            .iter()
            .map(|step| tf::attribute_path::Step {
                selector: Some(match step {
                    PathStep::Attribute(name) => Selector::AttributeName(name.clone()),
                    PathStep::Key(key) => Selector::ElementKeyString(key.clone()),
                    PathStep::Index(i) => Selector::ElementKeyInt(*i),
                }),
            })
            .collect(),
    }
}

pub fn diagnostics(diagnostics: Diagnostics) -> Vec<tf::Diagnostic> {
    diagnostics
        .0
        .into_iter()
        .map(|d| tf::Diagnostic {
            severity: match d.severity {
                Severity::Error => tf::diagnostic::Severity::Error,
                Severity::Warning => tf::diagnostic::Severity::Warning,
            } as i32,
            summary: d.summary,
            detail: d.detail,
            // A diagnostic about the whole object carries no path at all.
            attribute: d
                .path
                .filter(|p| !p.0.is_empty())
                .as_ref()
                .map(attribute_path),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::{Block, Diagnostics, Type};

    #[test]
    fn attributes_carry_mode_type_and_sensitivity() {
        let s = Schema::new(
            "r",
            vec![
                Attribute::required("name", Type::String, "n"),
                Attribute::optional_computed("n", Type::map(Type::Number), "m"),
                Attribute::computed("token", Type::String, "t").sensitive(),
            ],
        );
        let block = schema(&s).block.unwrap();
        let by_name = |n: &str| block.attributes.iter().find(|a| a.name == n).unwrap();
        assert!(by_name("name").required && !by_name("name").optional);
        assert!(by_name("n").optional && by_name("n").computed);
        assert_eq!(by_name("n").r#type, br#"["map","number"]"#);
        assert!(by_name("token").sensitive && by_name("token").computed);
        assert_eq!(
            by_name("token").description_kind,
            tf::StringKind::Markdown as i32
        );
    }

    #[test]
    fn a_block_nests_as_a_group() {
        let s = Schema::new("r", vec![]).with_block(Block {
            name: "timeouts",
            description: "t",
            attributes: vec![Attribute::optional("create", Type::String, "c")],
        });
        let block = schema(&s).block.unwrap();
        assert!(block.attributes.is_empty());
        let nested = &block.block_types[0];
        assert_eq!(nested.type_name, "timeouts");
        assert_eq!(
            nested.nesting,
            tf::schema::nested_block::NestingMode::Group as i32
        );
        assert_eq!(nested.block.as_ref().unwrap().attributes[0].name, "create");
    }

    #[test]
    fn diagnostics_keep_their_path() {
        let mut ours = Diagnostics::default();
        ours.attr_error("node_count", "must be at least 1 (got 0)");
        let out = diagnostics(ours);
        assert_eq!(out[0].summary, "node_count: must be at least 1 (got 0)");
        assert_eq!(out[0].severity, tf::diagnostic::Severity::Error as i32);
        let step = &out[0].attribute.as_ref().unwrap().steps[0];
        assert_eq!(
            step.selector,
            Some(tf::attribute_path::step::Selector::AttributeName(
                "node_count".into()
            ))
        );
    }
}
