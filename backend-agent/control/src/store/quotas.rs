//! GPU quota rows: one per (tenant, gpu_type). The same statements run on SQLite and
//! PostgreSQL (`gpufleet_sql`); lists come in bytewise order of their text keys on both.

use gpufleet_sql::{params, AsConn, Row};

#[derive(Debug, Clone)]
pub struct QuotaRow {
    pub id: String,
    pub tenant_id: String,
    pub gpu_type: String,
    pub gpus: i64,
    pub burst_gpus: i64,
    /// Weight in fair sharing of idle capacity, 1 to 1000.
    pub weight: i64,
    /// Idle guaranteed GPUs that may be lent to other tenants; None: no limit.
    pub lending_limit_gpus: Option<i64>,
}

impl QuotaRow {
    /// A quota with the default weight (1) and no lending limit.
    pub fn new(id: String, tenant_id: String, gpu_type: String, gpus: i64, burst: i64) -> Self {
        Self {
            id,
            tenant_id,
            gpu_type,
            gpus,
            burst_gpus: burst,
            weight: gpufleet_proto::limits::DEFAULT_QUOTA_WEIGHT,
            lending_limit_gpus: None,
        }
    }
}

const COLUMNS: &str = "id, tenant_id, gpu_type, gpus, burst_gpus, weight, lending_limit_gpus";

fn from_row(r: &Row) -> gpufleet_sql::Result<QuotaRow> {
    Ok(QuotaRow {
        id: r.get(0)?,
        tenant_id: r.get(1)?,
        gpu_type: r.get(2)?,
        gpus: r.get(3)?,
        burst_gpus: r.get(4)?,
        weight: r.get(5)?,
        lending_limit_gpus: r.get(6)?,
    })
}

/// By tenant, then model, by their bytes, as SQLite's ORDER BY gives them (PostgreSQL's
/// follows the database's collation, where case and punctuation weigh differently).
fn by_tenant_and_model_bytes(mut quotas: Vec<QuotaRow>) -> Vec<QuotaRow> {
    quotas.sort_by(|a, b| (&a.tenant_id, &a.gpu_type).cmp(&(&b.tenant_id, &b.gpu_type)));
    quotas
}

pub fn insert(conn: &impl AsConn, q: &QuotaRow) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        &format!("INSERT INTO quotas ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"),
        params![
            q.id,
            q.tenant_id,
            q.gpu_type,
            q.gpus,
            q.burst_gpus,
            q.weight,
            q.lending_limit_gpus
        ],
    )?;
    Ok(())
}

pub fn get(conn: &impl AsConn, id: &str) -> gpufleet_sql::Result<Option<QuotaRow>> {
    conn.as_conn().query_opt(
        &format!("SELECT {COLUMNS} FROM quotas WHERE id = ?1"),
        params![id],
        from_row,
    )
}

pub fn for_model(
    conn: &impl AsConn,
    tenant_id: &str,
    gpu_type: &str,
) -> gpufleet_sql::Result<Option<QuotaRow>> {
    conn.as_conn().query_opt(
        &format!("SELECT {COLUMNS} FROM quotas WHERE tenant_id = ?1 AND gpu_type = ?2"),
        params![tenant_id, gpu_type],
        from_row,
    )
}

/// All quotas, or those of one tenant.
pub fn list(conn: &impl AsConn, tenant_id: Option<&str>) -> gpufleet_sql::Result<Vec<QuotaRow>> {
    // CAST: PostgreSQL cannot tell the type of a parameter that is only tested for NULL.
    let quotas = conn.as_conn().query_map(
        &format!(
            "SELECT {COLUMNS} FROM quotas WHERE CAST(?1 AS TEXT) IS NULL OR tenant_id = ?1
             ORDER BY tenant_id, gpu_type"
        ),
        params![tenant_id],
        from_row,
    )?;
    Ok(by_tenant_and_model_bytes(quotas))
}

/// The quotas of one model, every tenant's.
pub fn of_model(conn: &impl AsConn, gpu_type: &str) -> gpufleet_sql::Result<Vec<QuotaRow>> {
    let quotas = conn.as_conn().query_map(
        &format!("SELECT {COLUMNS} FROM quotas WHERE gpu_type = ?1 ORDER BY tenant_id"),
        params![gpu_type],
        from_row,
    )?;
    Ok(by_tenant_and_model_bytes(quotas))
}

pub fn update(
    conn: &impl AsConn,
    id: &str,
    gpus: i64,
    burst_gpus: i64,
) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        "UPDATE quotas SET gpus = ?2, burst_gpus = ?3 WHERE id = ?1",
        params![id, gpus, burst_gpus],
    )?;
    Ok(())
}

/// Sets a quota's weight and lending limit (None: no limit).
pub fn set_sharing(
    conn: &impl AsConn,
    id: &str,
    weight: i64,
    lending_limit_gpus: Option<i64>,
) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        "UPDATE quotas SET weight = ?2, lending_limit_gpus = ?3 WHERE id = ?1",
        params![id, weight, lending_limit_gpus],
    )?;
    Ok(())
}

pub fn delete(conn: &impl AsConn, id: &str) -> gpufleet_sql::Result<()> {
    conn.as_conn()
        .execute("DELETE FROM quotas WHERE id = ?1", params![id])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::postgres::engines::on_both;
    use gpufleet_sql::Engine;

    fn quota(id: &str, tenant: &str, model: &str, gpus: i64) -> QuotaRow {
        QuotaRow::new(id.into(), tenant.into(), model.into(), gpus, gpus + 8)
    }

    fn ids(quotas: Vec<QuotaRow>) -> Vec<String> {
        quotas.into_iter().map(|q| q.id).collect()
    }

    #[test]
    fn quotas_are_kept_listed_in_bytewise_order_and_shared() {
        on_both(|db| {
            let c = db.conn();
            if c.engine() == Engine::Postgres {
                // A collation where case weighs less than letters: still bytewise.
                c.execute_batch(
                    "ALTER TABLE quotas ALTER COLUMN tenant_id TYPE TEXT COLLATE \"und-x-icu\";
                     ALTER TABLE quotas ALTER COLUMN gpu_type TYPE TEXT COLLATE \"und-x-icu\";",
                )
                .unwrap();
            }
            c.execute(
                "INSERT INTO tenants (id, name, display_name, labels, token_hash, created_at)
                 VALUES ('a', 'a', 'A', '{}', 'h1', 0), ('B', 'b', 'B', '{}', 'h2', 0)",
                params![],
            )
            .unwrap();
            insert(&c, &quota("q1", "a", "h100", 8)).unwrap();
            insert(&c, &quota("q2", "a", "H100", 16)).unwrap();
            insert(&c, &quota("q3", "B", "h100", 0)).unwrap();
            // One quota per tenant and model.
            assert!(insert(&c, &quota("q4", "a", "h100", 1)).is_err());

            let q2 = get(&c, "q2").unwrap().unwrap();
            assert_eq!((q2.gpus, q2.burst_gpus, q2.weight), (16, 24, 1));
            assert_eq!(q2.lending_limit_gpus, None);
            assert_eq!(for_model(&c, "a", "h100").unwrap().unwrap().id, "q1");
            assert!(for_model(&c, "B", "H100").unwrap().is_none());
            assert!(get(&c, "q9").unwrap().is_none());

            assert_eq!(ids(list(&c, None).unwrap()), ["q3", "q2", "q1"]);
            assert_eq!(ids(list(&c, Some("a")).unwrap()), ["q2", "q1"]);
            assert_eq!(ids(of_model(&c, "h100").unwrap()), ["q3", "q1"]);

            update(&c, "q1", 4, 6).unwrap();
            set_sharing(&c, "q1", 7, Some(2)).unwrap();
            let q1 = get(&c, "q1").unwrap().unwrap();
            assert_eq!((q1.gpus, q1.burst_gpus, q1.weight), (4, 6, 7));
            assert_eq!(q1.lending_limit_gpus, Some(2));
            set_sharing(&c, "q1", 7, None).unwrap();
            assert_eq!(get(&c, "q1").unwrap().unwrap().lending_limit_gpus, None);
            // The schema's bounds hold on both.
            assert!(set_sharing(&c, "q1", 0, None).is_err());
            delete(&c, "q1").unwrap();
            assert_eq!(ids(list(&c, Some("a")).unwrap()), ["q2"]);
        });
    }
}
