//! Keys of the `google.rpc.ErrorInfo.metadata` that refusals carry, shared by the
//! backend that sets them and the clients that read them.

/// ALREADY_EXISTS: the id of the object that already holds the name (or model).
pub const EXISTING_ID: &str = "existing_id";
/// ALREADY_EXISTS: the request field the taken value is in (`name`, `gpu_type`).
pub const EXISTING_FIELD: &str = "existing_field";
/// A delete refused for what still uses the object: their ids, comma-separated.
pub const USED_BY: &str = "used_by";
