//! Per-tenant limits that keep one tenant's volume from slowing the others: how many
//! reservations that have not ended one tenant may hold (`serve --max-open-reservations`).

use gpufleet_sql::AsConn;
use tonic::Status;

use crate::state::db_error;
use crate::store::{self, tenants::TenantRow};

/// FAILED_PRECONDITION when `tenant` already holds `max` reservations that end after `now`.
pub fn room_for_reservation(
    conn: &impl AsConn,
    tenant: &TenantRow,
    max: u32,
    now: i64,
) -> Result<(), Status> {
    // Ended reservations count towards what it holds, never towards the limit: only a
    // tenant holding `max` or more needs its open ones counted.
    if store::reservations::count_held(conn, &tenant.id).map_err(db_error)? < i64::from(max) {
        return Ok(());
    }
    let under = store::reservations::count_open_up_to(conn, &tenant.id, now, i64::from(max))
        .map_err(db_error)?;
    if under < i64::from(max) {
        return Ok(());
    }
    let open = store::reservations::count_open(conn, &tenant.id, now).map_err(db_error)?;
    Err(Status::failed_precondition(format!(
        "tenant '{}' already holds {open} reservations that have not ended, the limit of open reservations per tenant ({max}, serve --max-open-reservations); delete some or wait until they end",
        tenant.name
    )))
}
