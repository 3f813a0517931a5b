//! Attribute paths: where a value lives inside a resource's object, as Terraform
//! addresses it (`nodes[0].gpus["a"]`). Below both values and diagnostics, which use it.

use std::fmt;

/// One step of an attribute path: `.name`, `["key"]` or `[index]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathStep {
    Attribute(String),
    Key(String),
    Index(i64),
}

/// Where a value lives inside a resource's object, e.g. `nodes[0].gpus`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AttrPath(pub Vec<PathStep>);

impl AttrPath {
    pub fn root() -> Self {
        Self(Vec::new())
    }

    pub fn attr(name: &str) -> Self {
        Self(vec![PathStep::Attribute(name.to_string())])
    }

    pub fn child(&self, name: &str) -> Self {
        let mut steps = self.0.clone();
        steps.push(PathStep::Attribute(name.to_string()));
        Self(steps)
    }

    pub fn key(&self, key: &str) -> Self {
        let mut steps = self.0.clone();
        steps.push(PathStep::Key(key.to_string()));
        Self(steps)
    }

    pub fn index(&self, index: usize) -> Self {
        let mut steps = self.0.clone();
        steps.push(PathStep::Index(index as i64));
        Self(steps)
    }
}

impl fmt::Display for AttrPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, step) in self.0.iter().enumerate() {
            match step {
                PathStep::Attribute(name) if i == 0 => write!(f, "{name}")?,
                PathStep::Attribute(name) => write!(f, ".{name}")?,
                PathStep::Key(key) => write!(f, "[{key:?}]")?,
                PathStep::Index(index) => write!(f, "[{index}]")?,
            }
        }
        Ok(())
    }
}
