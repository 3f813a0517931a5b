//! Whose metrics a scrape gets, decided by its bearer token: the operator's metrics token
//! (or an admin token, of either scope) sees everything ([`super::control`]); a tenant's
//! token, of either scope, sees its own tenant's view ([`super::team`]); any other token
//! (unknown, revoked, expired, rotated past its overlap) is refused (401, nothing
//! rendered).
//!
//! Renders are bounded by whom ([`Slots`]): the operator's have slots of their own, so a
//! team's scrape flood cannot turn the operator's view into 503s; every other token
//! shares the rest, at most [`PER_TENANT_SLOTS`] of them per tenant.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use gpufleet_process::metrics_endpoint::{Rendered, Unrendered};
use gpufleet_sql::AsConn;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::auth::Caller;
use crate::state::AppState;

/// Renders at once of the operator (its metrics token, or an admin token once looked up
/// in a shared slot) ...
pub const OPERATOR_SLOTS: usize = 4;
/// ... of every other token together (a token is resolved in one of these) ...
pub const SHARED_SLOTS: usize = 8;
/// ... and of one tenant's tokens: one team's flood leaves the other teams room.
pub const PER_TENANT_SLOTS: usize = 2;

/// Renders per tenant (at most [`SHARED_SLOTS`] entries: each holds a shared slot).
type PerTenant = Arc<Mutex<HashMap<String, usize>>>;

/// The scrapes rendering now, by whom.
pub struct Slots {
    operator: Arc<Semaphore>,
    shared: Arc<Semaphore>,
    tenants: PerTenant,
}

impl Default for Slots {
    fn default() -> Self {
        Self {
            operator: Arc::new(Semaphore::new(OPERATOR_SLOTS)),
            shared: Arc::new(Semaphore::new(SHARED_SLOTS)),
            tenants: Arc::default(),
        }
    }
}

/// A render's place; given back when dropped.
pub struct Slot {
    _permit: OwnedSemaphorePermit,
    tenant: Option<(String, PerTenant)>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some((id, tenants)) = &self.tenant {
            let mut t = tenants.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(n) = t.get_mut(id) {
                *n -= 1;
                if *n == 0 {
                    t.remove(id);
                }
            }
        }
    }
}

fn busy(who: &str, slots: usize) -> Unrendered {
    Unrendered::Busy(format!(
        "{who} has {slots} scrapes rendering already; try again"
    ))
}

impl Slots {
    /// One of the operator's own.
    pub fn operator(&self) -> Result<Slot, Unrendered> {
        let permit = self
            .operator
            .clone()
            .try_acquire_owned()
            .map_err(|_| busy("the operator", OPERATOR_SLOTS))?;
        Ok(Slot {
            _permit: permit,
            tenant: None,
        })
    }

    /// One of the shared ones, for a token yet to be resolved.
    pub fn shared(&self) -> Result<Slot, Unrendered> {
        let permit = self
            .shared
            .clone()
            .try_acquire_owned()
            .map_err(|_| busy("every token but the operator's", SHARED_SLOTS))?;
        Ok(Slot {
            _permit: permit,
            tenant: None,
        })
    }

    /// `slot` (a shared one) counted against `tenant_id`, within its own bound.
    pub fn for_tenant(&self, mut slot: Slot, tenant_id: &str) -> Result<Slot, Unrendered> {
        let mut t = self.tenants.lock().unwrap_or_else(|p| p.into_inner());
        let n = t.entry(tenant_id.to_string()).or_insert(0);
        if *n >= PER_TENANT_SLOTS {
            return Err(busy("this tenant", PER_TENANT_SLOTS));
        }
        *n += 1;
        slot.tenant = Some((tenant_id.to_string(), self.tenants.clone()));
        Ok(slot)
    }
}

/// Renders the view `token` may see; `Ok(None)` when it may see none.
pub async fn render(
    state: Arc<AppState>,
    tenant_names: bool,
    operator_token: Arc<str>,
    slots: Arc<Slots>,
    token: String,
) -> Rendered {
    if crate::auth::same_token(&token, &operator_token) {
        let _slot = slots.operator()?;
        return Ok(Some(super::control::render(state, tenant_names).await?));
    }
    let shared = slots.shared()?;
    let s = state.clone();
    let caller = state
        .read(move |conn| caller_of(&s, conn, &token))
        .await
        .map_err(|e| e.to_string())?;
    match caller {
        Some(Caller::Admin) => {
            drop(shared);
            let _slot = slots.operator()?;
            Ok(Some(super::control::render(state, tenant_names).await?))
        }
        Some(Caller::Tenant(tenant_id)) => {
            let _slot = slots.for_tenant(shared, &tenant_id)?;
            Ok(super::team::render(state, tenant_id, tenant_names).await?)
        }
        None => Ok(None),
    }
}

/// Who `token` is, the one place a scrape's token is resolved: as the API resolves it
/// (`auth::resolve_bearer`: a revoked, expired or rotated-out token is refused like an
/// unknown one; either scope may scrape). `None`: not a token the API takes; a failure to
/// read the store is an error.
fn caller_of(
    state: &AppState,
    conn: &impl AsConn,
    token: &str,
) -> crate::error::Result<Option<Caller>> {
    match crate::auth::resolve_bearer(state, conn, token) {
        Ok(grant) => Ok(Some(grant.caller)),
        Err(s)
            if matches!(
                s.code(),
                tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
            ) =>
        {
            Ok(None)
        }
        Err(s) => Err(crate::error::Error::Internal(format!(
            "resolving a scrape's token: {}",
            s.message()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_teams_flood_takes_neither_the_operators_slots_nor_another_teams() {
        let slots = Slots::default();
        // Team a holds its own bound; one more of its scrapes is busy.
        let a: Vec<Slot> = (0..PER_TENANT_SLOTS)
            .map(|_| slots.for_tenant(slots.shared().unwrap(), "a").unwrap())
            .collect();
        let more = slots.for_tenant(slots.shared().unwrap(), "a");
        assert!(matches!(more, Err(Unrendered::Busy(_))));
        // Team b is still served, and so is the operator, every slot of it.
        let b = slots.for_tenant(slots.shared().unwrap(), "b").unwrap();
        let operator: Vec<Slot> = (0..OPERATOR_SLOTS)
            .map(|_| slots.operator().unwrap())
            .collect();
        assert!(matches!(slots.operator(), Err(Unrendered::Busy(_))));
        // Slots come back when their renders end.
        drop((a, b, operator));
        assert!(slots.tenants.lock().unwrap().is_empty());
        assert_eq!(slots.shared.available_permits(), SHARED_SLOTS);
        assert!(slots.operator().is_ok());
    }

    #[test]
    fn tokens_being_resolved_share_a_bounded_pool() {
        let slots = Slots::default();
        let held: Vec<Slot> = (0..SHARED_SLOTS).map(|_| slots.shared().unwrap()).collect();
        assert!(matches!(slots.shared(), Err(Unrendered::Busy(_))));
        assert!(slots.operator().is_ok());
        drop(held);
    }
}
