//! FleetService's automatic-quarantine breakers (admin only): each model's breaker, and
//! an operator's reset. The rules are `scheduling::breaker`'s; this is their API edge.

use gpufleet_proto::v1;
use gpufleet_sql::Conn;
use gpufleet_sql::Savepoint;
use tonic::{Request, Status};

use super::fleet::Fleet;
use crate::scheduling::breaker::{self, View};
use crate::state::db_error;
use crate::store;

fn message(v: View) -> v1::QuarantineBreaker {
    v1::QuarantineBreaker {
        gpu_type: v.gpu_type,
        open: v.open.is_some(),
        opened_at: v
            .open
            .as_ref()
            .and_then(|o| super::to_timestamp(o.opened_at)),
        reason: v
            .open
            .as_ref()
            .map(|o| o.reason.clone())
            .unwrap_or_default(),
        quarantines_in_window: v.quarantines_in_window,
        cap: v.cap,
        window_seconds: v.window_seconds,
        held: v.open.map(|o| o.held).unwrap_or(0),
    }
}

impl Fleet {
    pub(super) fn list_quarantine_breakers(
        &self,
        conn: Conn<'_>,
        request: Request<v1::ListQuarantineBreakersRequest>,
    ) -> Result<v1::ListQuarantineBreakersResponse, Status> {
        let (caller, _) = super::enter(&self.state, &conn, request)?;
        caller.require_admin("listing the quarantine breakers")?;
        let views = breaker::views(&conn, &self.state.breaker, self.state.now())?;
        Ok(v1::ListQuarantineBreakersResponse {
            breakers: views.into_iter().map(message).collect(),
        })
    }

    /// Closes the model's breaker: automatic quarantines count afresh from now.
    pub(super) fn reset_quarantine_breaker(
        &self,
        tx: Savepoint<'_>,
        request: Request<v1::ResetQuarantineBreakerRequest>,
    ) -> Result<v1::QuarantineBreaker, Status> {
        let (caller, req) = super::enter(&self.state, &tx, request)?;
        caller.require_admin("resetting a quarantine breaker")?;
        crate::rules::required("gpu_type", &req.gpu_type).map_err(super::invalid)?;
        let now = self.state.now();
        let (view, was_open) = breaker::reset(&tx, &self.state.breaker, &req.gpu_type, now)?;
        if was_open {
            store::events::record(
                &tx,
                now,
                &breaker::event_object(&req.gpu_type),
                "",
                "breaker_reset",
                "",
                "reset by an operator: automatic quarantines count afresh",
            )
            .map_err(db_error)?;
            tracing::info!(gpu_type = %req.gpu_type, "quarantine breaker reset by an operator");
        }
        tx.commit().map_err(db_error)?;
        Ok(message(view))
    }
}
