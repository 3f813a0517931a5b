//! The provider's own framework: values, schemas, diagnostics and the resource and data
//! source contracts. Nothing here knows the Terraform plugin protocol (see `protocol`).

pub mod action;
pub mod diagnostics;
pub mod ephemeral;
pub mod identity;
pub mod list;
pub mod path;
pub mod plan;
pub mod schema;
pub mod traits;
pub mod value;

pub use action::{ActionType, Progress};
pub use diagnostics::{Diagnostic, Diagnostics, Severity};
pub use ephemeral::{EphemeralResourceType, Opened};
pub use identity::{IdentityAttribute, IdentitySchema, ResourceIdentity};
pub use list::{ListResourceType, Listed};
pub use path::{AttrPath, PathStep};
pub use plan::{changed, default_when_unset, mark_unknown, requires_replace_if_changed};
pub use schema::{Attribute, Block, Mode, Schema, Type};
pub use traits::{DataSourceType, PlannedChange, ProviderType, ResourceType};
pub use value::Value;
