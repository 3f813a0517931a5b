//! Bearer-token authentication and scopes. Tokens of the store (every tenant's, the
//! admin-scoped ones, a rotated admin token) are kept only as SHA-256 hashes and looked up
//! by hash; the admin token `serve` started with is compared in constant time.

use gpufleet_sql::AsConn;
use tonic::Status;

// The secrets' own primitives live apart (the join token uses them too, without auth).
pub use crate::secrets::{hash_token, new_token, replace_secret_file, same_token};
use crate::state::{db_error, AppState};
use crate::store;

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    Admin,
    /// A tenant token: only that tenant's objects exist for it.
    Tenant(String),
}

impl Caller {
    /// PERMISSION_DENIED unless the caller is the admin.
    pub fn require_admin(&self, action: &str) -> Result<(), Status> {
        match self {
            Caller::Admin => Ok(()),
            Caller::Tenant(_) => Err(Status::permission_denied(format!(
                "{action} needs the admin token; a tenant token cannot do it"
            ))),
        }
    }

    /// Whether the caller may see objects of `tenant_id`.
    pub fn sees(&self, tenant_id: &str) -> bool {
        match self {
            Caller::Admin => true,
            Caller::Tenant(own) => own == tenant_id,
        }
    }
}

const UNAUTHENTICATED: &str = "missing or invalid bearer token: set GPUFLEET_TOKEN (CLI) or the provider's `token` attribute to the admin token or a tenant token";

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Get, List and plan-time dry runs of the owner's objects; never a change.
    Read,
    /// Also changes.
    Write,
}

impl Scope {
    pub fn parse(field: &str, value: &str) -> Result<Scope, String> {
        match value {
            "read" => Ok(Scope::Read),
            "write" => Ok(Scope::Write),
            other => Err(format!(
                "{field}: '{}' is not a scope; use \"read\" (plan and read, never change) or \"write\"",
                crate::limits::quote(other)
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Write => "write",
        }
    }
}

/// A token that was accepted: whom it acts for, its name and its scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub caller: Caller,
    pub name: String,
    pub scope: Scope,
}

/// The name of the admin token (the one `serve` was started with, or its rotation).
pub const ADMIN_TOKEN_NAME: &str = "admin";
/// The name of the token a tenant was created with.
pub const TENANT_TOKEN_NAME: &str = "default";

/// Who calls, from the request's bearer token, and whether its scope allows the call.
/// Fills the request's audit note (see `crate::audit`) whatever the outcome.
pub fn authenticate<T: crate::intent::Intent>(
    state: &AppState,
    conn: &impl AsConn,
    request: &tonic::Request<T>,
) -> Result<Caller, Status> {
    let intent = request.get_ref();
    let mut seen = crate::audit::Caller {
        object: intent.object(),
        changes: intent.changes(),
        ..Default::default()
    };
    let token = bearer(request);
    let grant = token
        .clone()
        .and_then(|token| resolve_bearer(state, conn, token));
    match &grant {
        Ok(grant) => {
            seen.authenticated = true;
            match &grant.caller {
                Caller::Tenant(id) => seen.tenant_id = id.clone(),
                // The admin's change to a team's objects is in the team's view too.
                Caller::Admin if intent.changes() => {
                    seen.by_admin = true;
                    seen.tenant_id = owner_of(conn, intent.owner()).unwrap_or_default();
                }
                Caller::Admin => seen.by_admin = true,
            }
            seen.token_name = grant.name.clone();
            seen.token_scope = grant.scope.as_str().to_string();
        }
        // A token of the store refused (expired, revoked, rotated past its overlap): the
        // refusal is in its owner's view.
        Err(_) => {
            let known = token
                .ok()
                .filter(|t| malformed(t).is_ok())
                .and_then(|t| store::tokens::by_hash(conn, &hash_token(t)).ok().flatten());
            if let Some(row) = known {
                seen.by_admin = row.tenant_id.is_none();
                seen.tenant_id = row.tenant_id.unwrap_or_default();
                seen.token_name = row.name;
                seen.token_scope = row.scope;
            }
        }
    }
    if let Some(note) = request.extensions().get::<crate::audit::Note>() {
        note.fill(seen);
    }
    let grant = grant?;
    // A valid token: its connection is kept and never evicted for a newcomer.
    crate::connections::mark_proven(request.extensions());
    if intent.changes() && grant.scope == Scope::Read {
        let method = request
            .extensions()
            .get::<tonic::GrpcMethod>()
            .map(|m| m.method().to_string())
            .unwrap_or_else(|| "this call".into());
        return Err(Status::permission_denied(format!(
            "token '{}' has scope read: it can read and plan (validate_only), never change anything, and {method} changes something; use a token with scope write",
            grant.name
        )));
    }
    Ok(grant.caller)
}

/// The tenant whose object `owner` names, when it exists.
fn owner_of(conn: &impl AsConn, owner: crate::intent::Owner) -> Option<String> {
    use crate::intent::Owner;
    // Each arm to an Option: the store's modules return either engine's error type while
    // they move onto the engine seam, and an error here reads as no owner.
    match owner {
        Owner::None => None,
        Owner::Tenant(t) => store::tenants::get(conn, t)
            .and_then(|row| match row {
                Some(row) => Ok(Some(row)),
                None => store::tenants::by_name(conn, t),
            })
            .ok()
            .flatten()
            .map(|t| t.id),
        Owner::Quota(id) => store::quotas::get(conn, id)
            .ok()
            .flatten()
            .map(|q| q.tenant_id),
        Owner::Reservation(id) => store::reservations::get(conn, id)
            .ok()
            .flatten()
            .map(|r| r.tenant_id),
        Owner::Cluster(id) => store::clusters::get(conn, id)
            .ok()
            .flatten()
            .map(|c| c.tenant_id),
    }
}

fn bearer<T>(request: &tonic::Request<T>) -> Result<&str, Status> {
    request
        .metadata()
        .get(gpufleet_proto::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .filter(|t| !t.is_empty())
        .ok_or_else(|| Status::unauthenticated(UNAUTHENTICATED))
}

/// The grant of a bearer token's secret: a token of the store that is neither revoked,
/// rotated past its overlap nor expired (each refused saying which), or the admin token
/// `serve` was started with while it has not been rotated.
pub fn resolve_bearer(state: &AppState, conn: &impl AsConn, token: &str) -> Result<Grant, Status> {
    malformed(token).map_err(Status::unauthenticated)?;
    let now = state.now();
    if let Some(row) = store::tokens::by_hash(conn, &hash_token(token)).map_err(db_error)? {
        refused(conn, &row, now)?;
        let scope = Scope::parse("scope", &row.scope).map_err(Status::internal)?;
        return Ok(Grant {
            caller: match row.tenant_id {
                Some(id) => Caller::Tenant(id),
                None => Caller::Admin,
            },
            name: row.name,
            scope,
        });
    }
    if same_token(token, &state.admin_token) {
        return Ok(Grant {
            caller: Caller::Admin,
            name: ADMIN_TOKEN_NAME.into(),
            scope: Scope::Write,
        });
    }
    Err(Status::unauthenticated(UNAUTHENTICATED))
}

/// UNAUTHENTICATED naming why a known token no longer works.
fn refused(conn: &impl AsConn, row: &store::tokens::TokenRow, now: i64) -> Result<(), Status> {
    let whose = || match &row.tenant_id {
        None => format!("token '{}'", row.name),
        Some(id) => {
            let tenant = store::tenants::get(conn, id)
                .ok()
                .flatten()
                .map(|t| t.name)
                .unwrap_or_else(|| id.clone());
            format!("token '{}' of tenant '{tenant}'", row.name)
        }
    };
    let at = crate::clock::rfc3339;
    if let Some(revoked) = row.revoked_at {
        return Err(Status::unauthenticated(format!(
            "{} was revoked at {}; ask for a new one",
            whose(),
            at(revoked)
        )));
    }
    if let (Some(rotated), Some(retire)) = (row.rotated_at, row.retire_at) {
        if now >= retire {
            return Err(Status::unauthenticated(format!(
                "{} was rotated at {} and its overlap ended at {}; use the new token",
                whose(),
                at(rotated),
                at(retire)
            )));
        }
    }
    if let Some(expires) = row.expires_at.filter(|&e| now >= e) {
        return Err(Status::unauthenticated(format!(
            "{} expired at {}; ask for a new one",
            whose(),
            at(expires)
        )));
    }
    Ok(())
}

/// A token no issued token can equal, said plainly: a copy-paste with a trailing newline
/// or space would otherwise read as "invalid token" (tokens have no whitespace).
fn malformed(token: &str) -> Result<(), String> {
    let max = gpufleet_proto::limits::MAX_TOKEN_CHARS;
    if token.len() > max {
        return Err(format!(
            "the bearer token is {} characters long, longer than any token ({max} at most)",
            token.len()
        ));
    }
    if token.trim() != token {
        return Err(
            "the bearer token has leading or trailing whitespace; remove it (tokens never contain spaces or newlines)".into(),
        );
    }
    if token.contains(char::is_whitespace) {
        return Err("the bearer token contains whitespace, which no token does".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_with_whitespace_or_too_long_are_refused_by_name() {
        assert!(malformed("gft_abc").is_ok());
        assert!(malformed("gft_abc ")
            .unwrap_err()
            .contains("trailing whitespace"));
        assert!(malformed(" gft_abc").is_err());
        assert!(malformed("gft a").is_err());
        assert!(malformed(&"a".repeat(100_000))
            .unwrap_err()
            .contains("512 at most"));
    }

    #[test]
    fn tenants_see_only_their_own() {
        let t = Caller::Tenant("a".into());
        assert!(t.sees("a") && !t.sees("b"));
        assert!(Caller::Admin.sees("b"));
        assert_eq!(
            t.require_admin("x").unwrap_err().code(),
            tonic::Code::PermissionDenied
        );
    }
}
