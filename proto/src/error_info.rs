//! Keys of the `google.rpc.ErrorInfo.metadata` that refusals carry, shared by the
//! backend that sets them and the clients that read them.

/// ALREADY_EXISTS: the id of the object that already holds the name (or model).
pub const EXISTING_ID: &str = "existing_id";
/// ALREADY_EXISTS: the request field the taken value is in (`name`, `gpu_type`).
pub const EXISTING_FIELD: &str = "existing_field";
/// A delete refused for what still uses the object: their ids, comma-separated.
pub const USED_BY: &str = "used_by";
/// A tenant delete refused for what the tenant still has: which of the `USED_BY` ids are
/// gpu quotas (the rest are reservations and clusters), comma-separated.
pub const QUOTA_IDS: &str = "quota_ids";
/// FAILED_PRECONDITION: a quota's guarantee that the pool of its model (the value) cannot
/// keep beside the other quotas' (a lowering of another quota may make room).
pub const OVER_POOL: &str = "over_pool";
