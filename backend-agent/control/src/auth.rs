//! Bearer-token authentication. The admin token is compared in constant time; tenant
//! tokens are stored only as SHA-256 hashes and looked up by hash.

use rand::RngCore;
use rusqlite::Connection;
use sha2::{Digest, Sha256};
use tonic::Status;

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

pub fn authenticate<T>(
    state: &AppState,
    conn: &Connection,
    request: &tonic::Request<T>,
) -> Result<Caller, Status> {
    let token = request
        .metadata()
        .get(gpufleet_proto::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .filter(|t| !t.is_empty())
        .ok_or_else(|| Status::unauthenticated(UNAUTHENTICATED))?;
    malformed(token).map_err(Status::unauthenticated)?;
    if constant_time_eq(token.as_bytes(), state.admin_token.as_bytes()) {
        return Ok(Caller::Admin);
    }
    match store::tenants::by_token_hash(conn, &hash_token(token)).map_err(db_error)? {
        Some(tenant) => Ok(Caller::Tenant(tenant.id)),
        None => Err(Status::unauthenticated(UNAUTHENTICATED)),
    }
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

/// Compares by hashing both sides first, so the time taken depends on neither the
/// length nor the content of the secret.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let (ha, hb) = (Sha256::digest(a), Sha256::digest(b));
    ha.iter()
        .zip(hb.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// Constant-time comparison of tokens (see [`constant_time_eq`]).
pub fn same_token(given: &str, expected: &str) -> bool {
    constant_time_eq(given.as_bytes(), expected.as_bytes())
}

/// The hash of a token as the store keeps it.
pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// A fresh random token with the given prefix (`gft_` for tenants, `gfa_` for the admin).
pub fn new_token(prefix: &str) -> String {
    let mut bytes = [0u8; 24];
    rand::thread_rng().fill_bytes(&mut bytes);
    format!("{prefix}{}", hex::encode(bytes))
}

#[cfg(test)]
mod tests {
    #[test]
    fn tokens_compare_whole() {
        assert!(super::same_token("abc", "abc"));
        assert!(!super::same_token("abc", "abd"));
        assert!(!super::same_token("abc ", "abc"));
        assert!(!super::same_token("", "abc"));
    }

    use super::*;

    #[test]
    fn tokens_are_random_and_prefixed() {
        let (a, b) = (new_token("gft_"), new_token("gft_"));
        assert!(a.starts_with("gft_") && a.len() == 52);
        assert_ne!(a, b);
        assert_eq!(hash_token(&a), hash_token(&a));
        assert_ne!(hash_token(&a), hash_token(&b));
    }

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
    fn constant_time_comparison() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret-longer"));
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
