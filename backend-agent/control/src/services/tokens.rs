//! AccessService: a tenant's named tokens (issued, rotated with an overlap, revoked),
//! the admin token's rotation, admin-scoped read tokens, and the audit log.
//!
//! Who may: the admin anything; a tenant's write token the tokens of its own tenant; a
//! read token only reads (its scope, checked at authentication).

use std::sync::Arc;

use gpufleet_proto::v1::{self, access_service_server::AccessService};
use gpufleet_sql::Savepoint;
use gpufleet_sql::{AsConn, Conn};
use tonic::{Request, Response, Status};

use super::{invalid, request_id_conflict, target_tenant, to_timestamp};
use crate::auth::{self, Caller, Scope, ADMIN_TOKEN_NAME, TENANT_TOKEN_NAME};
use crate::fingerprint::Fingerprint;
use crate::join_tokens::JOIN_TOKEN_NAME;
use crate::rules;
use crate::state::{db_error, AppState};
use crate::store::{self, idempotency::Prior, tokens::TokenRow};

/// A rotation's overlap when the request gives none, and the longest one.
pub const DEFAULT_OVERLAP_SECONDS: i64 = 3600;
pub const MAX_OVERLAP_SECONDS: i64 = 7 * 24 * 3600;
/// The longest a token may live (ten years of 366 days): an expiry past it is a mistake
/// (2^62 s once passed and read as none); a token that should not expire gives none.
pub const MAX_LIFETIME_SECONDS: i64 = gpufleet_proto::limits::MAX_DURATION_SECONDS;
/// Live tokens one owner may hold ...
pub const MAX_LIVE_TOKENS: usize = 64;
/// ... and rows in all, refused ones kept for their refusal's message included: a loop
/// of rotations cannot grow the store without end.
pub const MAX_ROWS: usize = 1024;

/// Forgets refused tokens past their keeping time, then refuses when the owner's rows
/// are at [`MAX_ROWS`]. Run before anything adds a row.
fn make_room(tx: &impl AsConn, owner: &Owner, now: i64) -> Result<(), Status> {
    store::tokens::forget_old(tx, now).map_err(db_error)?;
    let rows = store::tokens::list(tx, owner.tenant_id.as_deref())
        .map_err(db_error)?
        .len();
    if rows >= MAX_ROWS {
        return Err(Status::resource_exhausted(format!(
            "{} has {rows} tokens on record (refused ones are kept {} days), the most one may; revoke unused ones and retry later",
            owner.label,
            store::tokens::KEEP_REFUSED_SECONDS / 86_400
        )));
    }
    Ok(())
}

#[derive(Clone)]
pub struct Access {
    pub state: Arc<AppState>,
}

/// Issues the token a tenant is created with ("default", write).
pub fn issue_default(
    tx: &impl AsConn,
    tenant_id: &str,
    secret: &str,
    now: i64,
) -> Result<(), Status> {
    let row = TokenRow {
        id: uuid::Uuid::new_v4().to_string(),
        tenant_id: Some(tenant_id.to_string()),
        name: TENANT_TOKEN_NAME.into(),
        scope: Scope::Write.as_str().into(),
        created_at: now,
        expires_at: None,
        rotated_at: None,
        retire_at: None,
        revoked_at: None,
    };
    store::tokens::insert(tx, &row, &auth::hash_token(secret)).map_err(db_error)
}

/// A retried tenant create: a fresh secret for its "default" token (only hashes are kept,
/// so the first secret cannot be answered again).
pub fn reissue_default(
    tx: &impl AsConn,
    tenant_id: &str,
    secret: &str,
    now: i64,
) -> Result<(), Status> {
    match store::tokens::live(tx, Some(tenant_id), TENANT_TOKEN_NAME).map_err(db_error)? {
        Some(row) => {
            store::tokens::set_hash(tx, &row.id, &auth::hash_token(secret)).map_err(db_error)
        }
        None => issue_default(tx, tenant_id, secret, now),
    }
}

/// Whose tokens a request names: a tenant's, or None for the admin-scoped ones.
struct Owner {
    tenant_id: Option<String>,
    /// For messages: "tenant 'a'" or "the admin".
    label: String,
}

impl Owner {
    fn of(conn: &impl AsConn, caller: &Caller, tenant_id: &str) -> Result<Owner, Status> {
        if tenant_id.is_empty() && *caller == Caller::Admin {
            return Ok(Owner {
                tenant_id: None,
                label: "the admin".into(),
            });
        }
        let t = target_tenant(conn, caller, tenant_id)?;
        Ok(Owner {
            label: format!("tenant '{}'", t.name),
            tenant_id: Some(t.id),
        })
    }

    /// The idempotency scope of its requests.
    fn scope(&self) -> &str {
        self.tenant_id.as_deref().unwrap_or("admin")
    }
}

fn state_of(t: &TokenRow, now: i64) -> &'static str {
    if t.revoked_at.is_some() {
        "revoked"
    } else if t.rotated_at.is_some() {
        if t.retire_at.is_some_and(|r| now < r) {
            "retiring"
        } else {
            "rotated"
        }
    } else if t.expires_at.is_some_and(|e| now >= e) {
        "expired"
    } else {
        "active"
    }
}

fn message(t: TokenRow, now: i64) -> v1::Token {
    v1::Token {
        state: state_of(&t, now).into(),
        tenant_id: t.tenant_id.unwrap_or_default(),
        name: t.name,
        scope: t.scope,
        created_at: to_timestamp(t.created_at),
        expires_at: t.expires_at.and_then(to_timestamp),
        rotated_at: t.rotated_at.and_then(to_timestamp),
        retire_at: t.retire_at.and_then(to_timestamp),
        revoked_at: t.revoked_at.and_then(to_timestamp),
    }
}

/// A retried request whose answer was lost: a fresh secret for the live token it made
/// (only hashes are kept, so the first secret cannot be answered again).
fn reissue(
    tx: &impl AsConn,
    owner: &Owner,
    id: &str,
    name: &str,
    secret: &str,
) -> Result<TokenRow, Status> {
    let row = store::tokens::by_id(tx, id)
        .map_err(db_error)?
        .filter(|r| r.revoked_at.is_none() && r.rotated_at.is_none())
        .ok_or_else(|| unknown_token(owner, name))?;
    store::tokens::set_hash(tx, &row.id, &auth::hash_token(secret)).map_err(db_error)?;
    Ok(row)
}

fn unknown_token(owner: &Owner, name: &str) -> Status {
    Status::not_found(format!(
        "name: {} has no live token named '{}'",
        owner.label,
        crate::limits::quote(name)
    ))
}

impl Access {
    fn create(
        &self,
        tx: Savepoint<'_>,
        request: Request<v1::CreateTokenRequest>,
    ) -> Result<v1::IssuedToken, Status> {
        let (caller, req) = super::enter(&self.state, &tx, request)?;
        let now = self.state.now();
        if !req.validate_only {
            rules::required("request_id", &req.request_id).map_err(invalid)?;
        }
        let owner = Owner::of(&tx, &caller, &req.tenant_id)?;
        gpufleet_wire::names::dns_label("name", &req.name).map_err(invalid)?;
        if [TENANT_TOKEN_NAME, ADMIN_TOKEN_NAME, JOIN_TOKEN_NAME].contains(&req.name.as_str()) {
            return Err(invalid(format!(
                "name: '{}' is taken by the token {} given; choose another name",
                req.name,
                match req.name.as_str() {
                    ADMIN_TOKEN_NAME => "serve was",
                    JOIN_TOKEN_NAME => "node agents are",
                    _ => "the tenant was",
                }
            )));
        }
        let scope = Scope::parse("scope", &req.scope).map_err(invalid)?;
        if owner.tenant_id.is_none() && scope == Scope::Write {
            return Err(invalid(
                "scope: an admin-scoped token can only be \"read\" (for dashboards and audits); the admin token itself is rotated, not issued",
            ));
        }
        let expires_at = req
            .expires_at
            .as_ref()
            .map(gpufleet_proto::timestamp::to_unix);
        check_expiry(expires_at, now).map_err(invalid)?;
        let row = TokenRow {
            id: uuid::Uuid::new_v4().to_string(),
            tenant_id: owner.tenant_id.clone(),
            name: req.name.clone(),
            scope: scope.as_str().into(),
            created_at: now,
            expires_at,
            rotated_at: None,
            retire_at: None,
            revoked_at: None,
        };
        let print = Fingerprint::of(&[&req.name, &req.scope, &expires_at]);
        let secret = auth::new_token("gft_");
        let prior = if req.validate_only {
            Prior::New
        } else {
            store::idempotency::lookup(&tx, "token", owner.scope(), &req.request_id, &print)
                .map_err(db_error)?
        };
        let issued = match prior {
            Prior::Conflict => return Err(request_id_conflict(&req.request_id, "token")),
            Prior::Same(id) => reissue(&tx, &owner, &id, &req.name, &secret)?,
            Prior::New => {
                let existing = store::tokens::live(&tx, owner.tenant_id.as_deref(), &req.name)
                    .map_err(db_error)?;
                // An expired token's name is free again: it is revoked as it is reissued.
                if existing
                    .as_ref()
                    .is_some_and(|t| state_of(t, now) == "expired")
                    && !req.validate_only
                {
                    store::tokens::revoke(&tx, owner.tenant_id.as_deref(), &req.name, now)
                        .map_err(db_error)?;
                } else if existing.is_some_and(|t| state_of(&t, now) != "expired") {
                    // The id as the provider names a token, so that a plan replacing it
                    // knows the name is its own.
                    return Err(super::error_details::already_exists(
                        "name",
                        format!(
                            "name: {} already has a token named '{}'; revoke it first or choose another name",
                            owner.label, req.name
                        ),
                        &format!("{}/{}", owner.tenant_id.as_deref().unwrap_or_default(), req.name),
                    ));
                }
                make_room(&tx, &owner, now)?;
                let live = store::tokens::list(&tx, owner.tenant_id.as_deref())
                    .map_err(db_error)?
                    .iter()
                    .filter(|t| state_of(t, now) == "active" || state_of(t, now) == "retiring")
                    .count();
                if live >= MAX_LIVE_TOKENS {
                    return Err(Status::resource_exhausted(format!(
                        "{} already holds {live} live tokens, the most one may; revoke one first",
                        owner.label
                    )));
                }
                if req.validate_only {
                    return Ok(v1::IssuedToken {
                        token: Some(message(row, now)),
                        secret: String::new(),
                    });
                }
                store::tokens::insert(&tx, &row, &auth::hash_token(&secret)).map_err(db_error)?;
                store::idempotency::record(
                    &tx,
                    "token",
                    owner.scope(),
                    &req.request_id,
                    &print,
                    &row.id,
                )
                .map_err(db_error)?;
                tracing::info!(owner = %owner.label, name = %row.name, scope = %row.scope, "issued a token");
                row
            }
        };
        tx.commit().map_err(db_error)?;
        Ok(v1::IssuedToken {
            token: Some(message(issued, now)),
            secret,
        })
    }

    fn get(
        &self,
        conn: Conn<'_>,
        request: Request<v1::GetTokenRequest>,
    ) -> Result<v1::Token, Status> {
        let (caller, req) = super::enter(&self.state, &conn, request)?;
        let owner = Owner::of(&conn, &caller, &req.tenant_id)?;
        let now = self.state.now();
        // The live one, else the newest refused one (so its state says why).
        let rows = store::tokens::list(&conn, owner.tenant_id.as_deref()).map_err(db_error)?;
        let mut named: Vec<TokenRow> = rows.into_iter().filter(|t| t.name == req.name).collect();
        named.sort_by_key(|t| {
            (
                t.rotated_at.is_none() && t.revoked_at.is_none(),
                t.created_at,
            )
        });
        named
            .pop()
            .map(|t| message(t, now))
            .ok_or_else(|| unknown_token(&owner, &req.name))
    }

    fn list(
        &self,
        conn: Conn<'_>,
        request: Request<v1::ListTokensRequest>,
    ) -> Result<v1::ListTokensResponse, Status> {
        let (caller, req) = super::enter(&self.state, &conn, request)?;
        let page = super::paging::parse(req.page_size, &req.page_token)?;
        let owner = Owner::of(&conn, &caller, &req.tenant_id)?;
        let now = self.state.now();
        let rows = store::tokens::list(&conn, owner.tenant_id.as_deref()).map_err(db_error)?;
        // A short-lived token once revoked (a run's ephemeral token after its close) is as
        // good as forgotten (the next issue forgets it): runs do not pile up in the list.
        let rows = rows
            .into_iter()
            .filter(|t| !(t.revoked_at.is_some() && store::tokens::is_short_lived(t)))
            .collect();
        let (tokens, next_page_token) = super::paging::page(
            rows,
            &page,
            // By name, oldest first; a rotated secret before its successor of the same second.
            |t| {
                let live = t.rotated_at.is_none() && t.revoked_at.is_none();
                format!(
                    "{}\u{1}{:020}\u{1}{}\u{1}{}",
                    t.name, t.created_at, live as u8, t.id
                )
            },
            |t| Ok(message(t, now)),
        )?;
        Ok(v1::ListTokensResponse {
            tokens,
            next_page_token,
        })
    }

    fn rotate(
        &self,
        tx: Savepoint<'_>,
        request: Request<v1::RotateTokenRequest>,
    ) -> Result<v1::IssuedToken, Status> {
        let (caller, req) = super::enter(&self.state, &tx, request)?;
        let now = self.state.now();
        rules::required("request_id", &req.request_id).map_err(invalid)?;
        rules::required("name", &req.name).map_err(invalid)?;
        let owner = Owner::of(&tx, &caller, &req.tenant_id)?;
        let overlap = req.overlap_seconds.unwrap_or(DEFAULT_OVERLAP_SECONDS);
        if !(0..=MAX_OVERLAP_SECONDS).contains(&overlap) {
            return Err(invalid(format!(
                "overlap_seconds: {overlap} is out of range; give 0 (none) to {MAX_OVERLAP_SECONDS} (7 days)"
            )));
        }
        if owner.tenant_id.is_none() && req.name == JOIN_TOKEN_NAME {
            // Not a bearer token of the API: it lives beside the store, not in it.
            drop(tx);
            let secret = self
                .state
                .join_tokens
                .rotate(now, overlap)
                .map_err(Status::failed_precondition)?;
            tracing::info!(overlap, "rotated the join token");
            return Ok(v1::IssuedToken {
                token: Some(v1::Token {
                    name: JOIN_TOKEN_NAME.into(),
                    scope: "join".into(),
                    created_at: to_timestamp(now),
                    state: "active".into(),
                    ..Default::default()
                }),
                secret,
            });
        }
        let admin = owner.tenant_id.is_none() && req.name == ADMIN_TOKEN_NAME;
        let print = Fingerprint::of(&[&req.name, &overlap]);
        let secret = auth::new_token(if admin { "gfa_" } else { "gft_" });
        let prior = store::idempotency::lookup(
            &tx,
            "token_rotation",
            owner.scope(),
            &req.request_id,
            &print,
        )
        .map_err(db_error)?;
        let issued = match prior {
            Prior::Conflict => return Err(request_id_conflict(&req.request_id, "token rotation")),
            // The rotation's answer was lost: the secret it issued is replaced, the token
            // it rotated keeps its overlap.
            Prior::Same(id) => reissue(&tx, &owner, &id, &req.name, &secret)?,
            Prior::New => {
                make_room(&tx, &owner, now)?;
                let old = store::tokens::live(&tx, owner.tenant_id.as_deref(), &req.name)
                    .map_err(db_error)?;
                let old = match (old, admin) {
                    (Some(old), _) => old,
                    // The admin token serve started with is not in the store until its
                    // first rotation: it goes in as the token rotated.
                    (None, true) => {
                        let boot = TokenRow {
                            id: uuid::Uuid::new_v4().to_string(),
                            tenant_id: None,
                            name: ADMIN_TOKEN_NAME.into(),
                            scope: Scope::Write.as_str().into(),
                            created_at: now,
                            expires_at: None,
                            rotated_at: None,
                            retire_at: None,
                            revoked_at: None,
                        };
                        store::tokens::insert(
                            &tx,
                            &boot,
                            &auth::hash_token(&self.state.admin_token),
                        )
                        .map_err(db_error)?;
                        boot
                    }
                    (None, false) => return Err(unknown_token(&owner, &req.name)),
                };
                store::tokens::mark_rotated(&tx, &old.id, now, now + overlap).map_err(db_error)?;
                let new = TokenRow {
                    id: uuid::Uuid::new_v4().to_string(),
                    created_at: now,
                    rotated_at: None,
                    retire_at: None,
                    revoked_at: None,
                    ..old
                };
                store::tokens::insert(&tx, &new, &auth::hash_token(&secret)).map_err(db_error)?;
                store::idempotency::record(
                    &tx,
                    "token_rotation",
                    owner.scope(),
                    &req.request_id,
                    &print,
                    &new.id,
                )
                .map_err(db_error)?;
                new
            }
        };
        if admin {
            // The next start must read the new secret: it replaces the data dir's file
            // before the rotation commits.
            let file = self.state.admin_token_file.as_ref().ok_or_else(|| {
                Status::failed_precondition(
                    "name: serve was given the admin token from outside its data dir (GPUFLEET_ADMIN_TOKEN or --admin-token); change it there and restart serve instead",
                )
            })?;
            auth::replace_secret_file(file, &secret).map_err(|e| {
                Status::internal(format!(
                    "could not write the new admin token to {}: {e}",
                    file.display()
                ))
            })?;
        }
        tx.commit().map_err(db_error)?;
        tracing::info!(owner = %owner.label, name = %issued.name, overlap, "rotated a token");
        Ok(v1::IssuedToken {
            token: Some(message(issued, now)),
            secret,
        })
    }

    fn revoke(
        &self,
        tx: Savepoint<'_>,
        request: Request<v1::RevokeTokenRequest>,
    ) -> Result<v1::Token, Status> {
        let (caller, req) = super::enter(&self.state, &tx, request)?;
        let owner = Owner::of(&tx, &caller, &req.tenant_id)?;
        if owner.tenant_id.is_none() && req.name == ADMIN_TOKEN_NAME {
            return Err(invalid(
                "name: the admin token cannot be revoked (nothing could then manage the fleet); rotate it with no overlap instead",
            ));
        }
        let now = self.state.now();
        let revoked = store::tokens::revoke(&tx, owner.tenant_id.as_deref(), &req.name, now)
            .map_err(db_error)?;
        if revoked == 0 {
            return Err(unknown_token(&owner, &req.name));
        }
        let row = store::tokens::list(&tx, owner.tenant_id.as_deref())
            .map_err(db_error)?
            .into_iter()
            .filter(|t| t.name == req.name)
            .max_by_key(|t| t.created_at)
            .ok_or_else(|| unknown_token(&owner, &req.name))?;
        tx.commit().map_err(db_error)?;
        tracing::info!(owner = %owner.label, name = %req.name, "revoked a token");
        Ok(message(row, now))
    }

    fn audit(
        &self,
        conn: Conn<'_>,
        request: Request<v1::ListAuditEntriesRequest>,
    ) -> Result<v1::ListAuditEntriesResponse, Status> {
        let (caller, req) = super::enter(&self.state, &conn, request)?;
        let page = super::paging::parse(req.page_size, &req.page_token)?;
        let tenant = super::list_scope(&conn, &caller, &req.tenant_id)?;
        let after = match &page.after {
            Some(key) => super::paging::int_of_key(key)
                .ok_or_else(|| invalid("page_token: not a token of this list"))?,
            None => 0,
        };
        let rows = store::audit::list(&conn, tenant.as_deref(), after, page.size as i64 + 1)
            .map_err(db_error)?;
        // A tenant's own sequence when one tenant's are read: it tells nothing of others.
        let seq = move |e: &store::audit::AuditRow| match tenant {
            Some(_) => e.tenant_seq.unwrap_or(0),
            None => e.seq,
        };
        let (entries, next_page_token) = super::paging::page(
            rows,
            &page,
            |e| super::paging::int_key(seq(e)),
            |e| {
                Ok(v1::AuditEntry {
                    seq: seq(&e),
                    time: to_timestamp(e.at),
                    tenant_id: e.tenant_id,
                    by_admin: e.by_admin,
                    token_name: e.token_name,
                    token_scope: e.token_scope,
                    method: e.method,
                    object: e.object,
                    outcome: e.outcome,
                    message: e.message,
                })
            },
        )?;
        Ok(v1::ListAuditEntriesResponse {
            entries,
            next_page_token,
        })
    }
}

#[tonic::async_trait]
impl AccessService for Access {
    async fn create_token(
        &self,
        r: Request<v1::CreateTokenRequest>,
    ) -> Result<Response<v1::IssuedToken>, Status> {
        super::writing(&self.state, self, r, Self::create).await
    }
    async fn get_token(
        &self,
        r: Request<v1::GetTokenRequest>,
    ) -> Result<Response<v1::Token>, Status> {
        super::reading(&self.state, self, r, Self::get).await
    }
    async fn list_tokens(
        &self,
        r: Request<v1::ListTokensRequest>,
    ) -> Result<Response<v1::ListTokensResponse>, Status> {
        super::reading(&self.state, self, r, Self::list).await
    }
    async fn rotate_token(
        &self,
        r: Request<v1::RotateTokenRequest>,
    ) -> Result<Response<v1::IssuedToken>, Status> {
        super::writing(&self.state, self, r, Self::rotate).await
    }
    async fn revoke_token(
        &self,
        r: Request<v1::RevokeTokenRequest>,
    ) -> Result<Response<v1::Token>, Status> {
        super::writing(&self.state, self, r, Self::revoke).await
    }
    async fn list_audit_entries(
        &self,
        r: Request<v1::ListAuditEntriesRequest>,
    ) -> Result<Response<v1::ListAuditEntriesResponse>, Status> {
        super::reading(&self.state, self, r, Self::audit).await
    }
}

/// Whether a new token's expiry is in the future and within [`MAX_LIFETIME_SECONDS`].
fn check_expiry(expires_at: Option<i64>, now: i64) -> Result<(), String> {
    match expires_at {
        Some(e) if e <= now => Err(format!(
            "expires_at: {} is not in the future",
            crate::clock::rfc3339(e)
        )),
        Some(e) if e - now > MAX_LIFETIME_SECONDS => Err(format!(
            "expires_at: {} is more than 10 years away ({MAX_LIFETIME_SECONDS} s), the longest a token may live; leave it out for a token that does not expire",
            crate::clock::rfc3339(e)
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expiry_is_in_the_future_and_at_most_ten_years_away() {
        let now = 1_800_000_000;
        assert!(check_expiry(None, now).is_ok());
        assert!(check_expiry(Some(now + 1), now).is_ok());
        assert!(check_expiry(Some(now + MAX_LIFETIME_SECONDS), now).is_ok());
        let far = check_expiry(Some(now + MAX_LIFETIME_SECONDS + 1), now).unwrap_err();
        assert!(
            far.starts_with("expires_at: ") && far.contains("10 years"),
            "{far}"
        );
        let huge = check_expiry(Some(now + (1 << 62)), now).unwrap_err();
        assert!(huge.contains("10 years"), "{huge}");
        assert!(check_expiry(Some(now), now)
            .unwrap_err()
            .contains("not in the future"));
    }

    #[test]
    fn a_tokens_state_says_why_it_is_refused() {
        let t = TokenRow {
            id: "i".into(),
            tenant_id: None,
            name: "n".into(),
            scope: "read".into(),
            created_at: 0,
            expires_at: Some(100),
            rotated_at: None,
            retire_at: None,
            revoked_at: None,
        };
        assert_eq!(state_of(&t, 50), "active");
        assert_eq!(state_of(&t, 100), "expired");
        let rotated = TokenRow {
            rotated_at: Some(10),
            retire_at: Some(70),
            ..t.clone()
        };
        assert_eq!(state_of(&rotated, 50), "retiring");
        assert_eq!(state_of(&rotated, 70), "rotated");
        let revoked = TokenRow {
            revoked_at: Some(20),
            ..rotated
        };
        assert_eq!(state_of(&revoked, 50), "revoked");
    }
}
