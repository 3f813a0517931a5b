//! How a resource or data source describes its attributes to Terraform.

use std::collections::BTreeMap;

/// Attribute types (Terraform's, restricted to what this provider uses).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Type {
    String,
    Number,
    Bool,
    List(Box<Type>),
    Map(Box<Type>),
    Object(BTreeMap<String, Type>),
}

impl Type {
    pub fn list(of: Type) -> Self {
        Type::List(Box::new(of))
    }

    pub fn map(of: Type) -> Self {
        Type::Map(Box::new(of))
    }

    pub fn object<'a>(fields: impl IntoIterator<Item = (&'a str, Type)>) -> Self {
        Type::Object(
            fields
                .into_iter()
                .map(|(k, t)| (k.to_string(), t))
                .collect(),
        )
    }
}

/// Who sets an attribute: the configuration, the provider, or either.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Required,
    Optional,
    /// Set by the provider only.
    Computed,
    /// Set by the configuration, or defaulted by the provider when absent.
    OptionalComputed,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attribute {
    pub name: &'static str,
    pub ty: Type,
    pub mode: Mode,
    pub sensitive: bool,
    /// Terraform warns where a configuration refers to it; the description says what to
    /// use instead.
    pub deprecated: bool,
    /// Sent by the configuration to plan and apply, never kept in state or plan (protocol
    /// 6.8, Terraform 1.11+). The protocol layer refuses a value for one from an older
    /// client, which would keep it.
    pub write_only: bool,
    /// Markdown.
    pub description: &'static str,
}

impl Attribute {
    fn new(name: &'static str, ty: Type, mode: Mode, description: &'static str) -> Self {
        Self {
            name,
            ty,
            mode,
            sensitive: false,
            deprecated: false,
            write_only: false,
            description,
        }
    }

    pub fn required(name: &'static str, ty: Type, description: &'static str) -> Self {
        Self::new(name, ty, Mode::Required, description)
    }

    pub fn optional(name: &'static str, ty: Type, description: &'static str) -> Self {
        Self::new(name, ty, Mode::Optional, description)
    }

    pub fn computed(name: &'static str, ty: Type, description: &'static str) -> Self {
        Self::new(name, ty, Mode::Computed, description)
    }

    pub fn optional_computed(name: &'static str, ty: Type, description: &'static str) -> Self {
        Self::new(name, ty, Mode::OptionalComputed, description)
    }

    pub fn sensitive(mut self) -> Self {
        self.sensitive = true;
        self
    }

    // No attribute is write-only yet: no input of this provider is a secret the user
    // supplies (docs/guides/credentials.md says why); the protocol layer supports them.
    #[allow(dead_code)]
    pub fn write_only(mut self) -> Self {
        self.write_only = true;
        self
    }
}

/// A nested block written at most once, e.g. `timeouts { create = "45m" }`. Its value is
/// always an object (Terraform's "group" nesting): every attribute null when the block is
/// absent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    pub name: &'static str,
    /// Markdown.
    pub description: &'static str,
    pub attributes: Vec<Attribute>,
}

impl Block {
    /// The block's value type.
    pub fn object_type(&self) -> Type {
        Type::Object(
            self.attributes
                .iter()
                .map(|a| (a.name.to_string(), a.ty.clone()))
                .collect(),
        )
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schema {
    pub version: i64,
    /// Markdown.
    pub description: &'static str,
    pub attributes: Vec<Attribute>,
    pub blocks: Vec<Block>,
}

impl Schema {
    pub fn new(description: &'static str, attributes: Vec<Attribute>) -> Self {
        Self {
            version: 0,
            description,
            attributes,
            blocks: Vec::new(),
        }
    }

    /// The schema with a nested block.
    pub fn with_block(mut self, block: Block) -> Self {
        self.blocks.push(block);
        self
    }

    /// The object type of the whole resource (its blocks included).
    pub fn object_type(&self) -> Type {
        Type::Object(
            self.attributes
                .iter()
                .map(|a| (a.name.to_string(), a.ty.clone()))
                .chain(
                    self.blocks
                        .iter()
                        .map(|b| (b.name.to_string(), b.object_type())),
                )
                .collect(),
        )
    }
}
