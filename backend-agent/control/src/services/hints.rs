//! What a "not found" may add to help a caller who mistyped a name: the names that exist
//! and that this caller may see, nearest first. A tenant token sees only its own tenant,
//! so its answer is the same whether the name it asked for exists or not.

use gpufleet_sql::AsConn;
use tonic::Status;

use crate::auth::Caller;
use crate::state::db_error;
use crate::store;

/// Names a hint lists at most.
const MAX_LISTED: usize = 8;

/// NOT_FOUND for a tenant spelled `spelling` (a name or an id), with the tenants this
/// caller may see: the admin's nearest names, a tenant token's own tenant.
pub fn unknown_tenant(conn: &impl AsConn, caller: &Caller, spelling: &str) -> Status {
    let hint = match tenant_hint(conn, caller, spelling) {
        Ok(hint) => hint,
        Err(e) => return e,
    };
    Status::not_found(format!(
        "tenant {} not found ({hint})",
        crate::limits::quote(spelling)
    ))
}

fn tenant_hint(conn: &impl AsConn, caller: &Caller, spelling: &str) -> Result<String, Status> {
    let mut names: Vec<String> = store::tenants::list(conn)
        .map_err(db_error)?
        .into_iter()
        .filter(|t| caller.sees(&t.id))
        .map(|t| t.name)
        .collect();
    if let Caller::Tenant(_) = caller {
        return Ok(match names.first() {
            Some(own) => format!("this token's tenant is '{own}'"),
            None => "this token's tenant is gone".to_string(),
        });
    }
    if names.is_empty() {
        return Ok("there are no tenants yet".to_string());
    }
    names.sort_by_key(|n| (distance(n, spelling), n.clone()));
    let more = names.len().saturating_sub(MAX_LISTED);
    names.truncate(MAX_LISTED);
    let mut hint = String::new();
    if distance(&names[0], spelling) <= 2 {
        hint.push_str(&format!("did you mean '{}'? ", names[0]));
    }
    hint.push_str(&format!("tenants: {}", names.join(", ")));
    if more > 0 {
        hint.push_str(&format!(" and {more} more"));
    }
    Ok(hint)
}

/// Edit distance (insertions, deletions, substitutions) between two short names.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().take(128).collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().take(128).enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::distance;

    #[test]
    fn distance_counts_single_character_edits() {
        assert_eq!(distance("nlp", "nlpp"), 1);
        assert_eq!(distance("vision", "vsion"), 1);
        assert_eq!(distance("speech", "speech"), 0);
        assert_eq!(distance("", "abc"), 3);
        assert_eq!(distance("kitten", "sitting"), 3);
    }
}
