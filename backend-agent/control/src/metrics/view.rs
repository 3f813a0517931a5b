//! Whose metrics a scrape gets, decided by its bearer token: the operator's metrics token
//! (or an admin token, of either scope) sees everything ([`super::control`]); a tenant's
//! token, of either scope, sees its own tenant's view ([`super::team`]); any other token
//! (unknown, revoked, expired, rotated past its overlap) is refused (401, nothing
//! rendered).

use std::sync::Arc;

use rusqlite::Connection;

use crate::auth::Caller;
use crate::state::AppState;

/// Renders the view `token` may see; `Ok(None)` when it may see none.
pub async fn render(
    state: Arc<AppState>,
    tenant_names: bool,
    operator_token: Arc<str>,
    token: String,
) -> gpufleet_process::metrics_endpoint::Rendered {
    if crate::auth::same_token(&token, &operator_token) {
        return super::control::render(state, tenant_names).await.map(Some);
    }
    let s = state.clone();
    let caller = state
        .read(move |conn| caller_of(&s, conn, &token))
        .await
        .map_err(|e| e.to_string())?;
    match caller {
        Some(Caller::Admin) => super::control::render(state, tenant_names).await.map(Some),
        Some(Caller::Tenant(tenant_id)) => {
            super::team::render(state, tenant_id, tenant_names).await
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
    conn: &Connection,
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
