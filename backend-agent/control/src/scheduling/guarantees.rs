//! Guarantees that hold: the guaranteed GPUs of one model, summed over every tenant's
//! quota, may not exceed the GPUs of that model's pool nodes. Burst GPUs are best effort
//! and do not count.

use gpufleet_sql::AsConn;

use super::{gpus_per_node, node_counts};
use crate::error::{Error, Result};
use crate::store;

/// What a model's guarantees are checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Promised {
    /// Guaranteed GPUs of the other quotas of this model.
    pub others: i64,
    pub pool_nodes: i64,
    pub gpus_per_node: i64,
}

/// The rule: `gpus` more guaranteed GPUs fit beside `promised.others` in the pool.
pub fn check(gpu_type: &str, gpus: i64, promised: Promised) -> std::result::Result<(), String> {
    let pool_gpus = promised.pool_nodes.saturating_mul(promised.gpus_per_node);
    let total = promised.others.saturating_add(gpus);
    if gpus == 0 || total <= pool_gpus {
        return Ok(());
    }
    let left = (pool_gpus - promised.others).max(0);
    Err(format!(
        "gpus: {total} guaranteed {gpu_type} GPUs across tenants would exceed the pool's {pool_gpus} ({} pool nodes x {} GPUs): other tenants are guaranteed {}, so at most {left} can be guaranteed here; put the rest in burst_gpus (best effort)",
        promised.pool_nodes, promised.gpus_per_node, promised.others
    ))
}

/// Loads what the guarantees of `gpu_type` are checked against, leaving out quota
/// `except` (the one being updated) and adding `unstored`: guarantees a dry run counts
/// that have no row (quotas a plan creates for tenants it creates too).
pub fn promised(
    conn: &impl AsConn,
    gpu_type: &str,
    except: Option<&str>,
    unstored: i64,
) -> Result<Promised> {
    let others = store::quotas::list(conn, None)?
        .into_iter()
        .filter(|q| q.gpu_type == gpu_type && Some(q.id.as_str()) != except)
        .fold(unstored, |sum, q| sum.saturating_add(q.gpus));
    let (pool_nodes, _) = node_counts(conn, gpu_type)?;
    Ok(Promised {
        others,
        pool_nodes,
        gpus_per_node: gpus_per_node(conn, gpu_type)?,
    })
}

/// Refuses (FAILED_PRECONDITION) a quota guaranteeing `gpus` of `gpu_type` that would
/// promise more than the pool has (see [`promised`] for `except` and `unstored`).
pub fn admit(
    conn: &impl AsConn,
    gpu_type: &str,
    gpus: i64,
    except: Option<&str>,
    unstored: i64,
) -> Result<()> {
    let promised = promised(conn, gpu_type, except, unstored)?;
    check(gpu_type, gpus, promised).map_err(Error::Precondition)
}

#[cfg(test)]
mod tests {
    use super::*;

    const POOL: Promised = Promised {
        others: 16,
        pool_nodes: 4,
        gpus_per_node: 8,
    };

    #[test]
    fn guarantees_up_to_the_pool_are_admitted() {
        assert!(check("H100-80GB", 16, POOL).is_ok());
        assert!(check("H100-80GB", 0, Promised { others: 99, ..POOL }).is_ok());
    }

    #[test]
    fn over_promising_names_the_numbers() {
        let err = check("H100-80GB", 24, POOL).unwrap_err();
        assert_eq!(
            err,
            "gpus: 40 guaranteed H100-80GB GPUs across tenants would exceed the pool's 32 (4 pool nodes x 8 GPUs): other tenants are guaranteed 16, so at most 16 can be guaranteed here; put the rest in burst_gpus (best effort)"
        );
        let none = Promised {
            others: 0,
            pool_nodes: 0,
            gpus_per_node: 0,
        };
        assert!(check("L40S", 8, none).unwrap_err().contains("pool's 0"));
    }
}
