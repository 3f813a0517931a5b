//! Tenant cluster rows. Their nodes are the `nodes` rows whose `cluster_id` points here.
//! The same statements run on SQLite and PostgreSQL (`gpufleet_sql`), but for the JSON
//! list of [`tenants_of`] (see `nodes::json_list_values`).

use std::collections::BTreeMap;

use gpufleet_sql::{params, AsConn, Row};

use super::{from_json, to_json};

#[derive(Debug, Clone)]
pub struct ClusterRow {
    pub id: String,
    pub tenant_id: String,
    pub name: String,
    pub orchestrator: String,
    pub gpu_type: String,
    pub node_count: i64,
    pub reservation_id: Option<String>,
    pub storage_gib: i64,
    pub status: String,
    pub endpoint: String,
    pub credentials: String,
    pub storage_path: String,
    pub mig_layout: BTreeMap<String, u32>,
    /// Why the status is what it is, when it is not simply `running` (empty otherwise).
    pub status_reason: String,
    /// The CUDA version asked for ("" when none).
    pub cuda_version: String,
    /// The driver the cluster's nodes run ("" until known).
    pub driver_version: String,
    /// Nodes a rolling driver change takes out of service at once.
    pub max_unavailable: i64,
    /// What deleting the cluster does to its volume: "delete" or "keep".
    pub storage_retention: String,
}

const COLUMNS: &str = "id, tenant_id, name, orchestrator, gpu_type, node_count, reservation_id, storage_gib, status, endpoint, credentials, storage_path, mig_layout, status_reason, cuda_version, driver_version, max_unavailable, storage_retention";

fn from_row(r: &Row) -> gpufleet_sql::Result<ClusterRow> {
    Ok(ClusterRow {
        id: r.get(0)?,
        tenant_id: r.get(1)?,
        name: r.get(2)?,
        orchestrator: r.get(3)?,
        gpu_type: r.get(4)?,
        node_count: r.get(5)?,
        reservation_id: r.get(6)?,
        storage_gib: r.get(7)?,
        status: r.get(8)?,
        endpoint: r.get(9)?,
        credentials: r.get(10)?,
        storage_path: r.get(11)?,
        mig_layout: from_json(&r.get::<String>(12)?),
        status_reason: r.get(13)?,
        cuda_version: r.get(14)?,
        driver_version: r.get(15)?,
        max_unavailable: r.get(16)?,
        storage_retention: r.get(17)?,
    })
}

pub fn insert(conn: &impl AsConn, c: &ClusterRow) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        &format!(
            "INSERT INTO clusters ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18)"
        ),
        params![
            c.id,
            c.tenant_id,
            c.name,
            c.orchestrator,
            c.gpu_type,
            c.node_count,
            c.reservation_id,
            c.storage_gib,
            c.status,
            c.endpoint,
            c.credentials,
            c.storage_path,
            to_json(&c.mig_layout),
            c.status_reason,
            c.cuda_version,
            c.driver_version,
            c.max_unavailable,
            c.storage_retention
        ],
    )?;
    Ok(())
}

pub fn get(conn: &impl AsConn, id: &str) -> gpufleet_sql::Result<Option<ClusterRow>> {
    conn.as_conn().query_opt(
        &format!("SELECT {COLUMNS} FROM clusters WHERE id = ?1"),
        params![id],
        from_row,
    )
}

/// The tenant of each of `cluster_ids` that exists: one statement for a whole page.
pub fn tenants_of(
    conn: &impl AsConn,
    cluster_ids: &[&str],
) -> gpufleet_sql::Result<std::collections::HashMap<String, String>> {
    let c = conn.as_conn();
    let rows = c.query_map(
        &format!(
            "SELECT id, tenant_id FROM clusters WHERE id IN ({})",
            super::nodes::json_list_values(c.engine())
        ),
        params![super::nodes::json_list(cluster_ids)],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    Ok(rows.into_iter().collect())
}

pub fn by_name(
    conn: &impl AsConn,
    tenant_id: &str,
    name: &str,
) -> gpufleet_sql::Result<Option<ClusterRow>> {
    conn.as_conn().query_opt(
        &format!("SELECT {COLUMNS} FROM clusters WHERE tenant_id = ?1 AND name = ?2"),
        params![tenant_id, name],
        from_row,
    )
}

/// Clusters filtered by tenant, GPU model and/or reservation, in tenant and name order
/// by their bytes, as SQLite's ORDER BY gives them (PostgreSQL's follows the database's
/// collation, where case and punctuation weigh differently).
pub fn list(
    conn: &impl AsConn,
    tenant_id: Option<&str>,
    gpu_type: Option<&str>,
    reservation_id: Option<&str>,
) -> gpufleet_sql::Result<Vec<ClusterRow>> {
    // CAST: PostgreSQL cannot tell the type of a parameter that is only tested for NULL.
    let mut clusters = conn.as_conn().query_map(
        &format!(
            "SELECT {COLUMNS} FROM clusters
             WHERE (CAST(?1 AS TEXT) IS NULL OR tenant_id = ?1)
               AND (CAST(?2 AS TEXT) IS NULL OR gpu_type = ?2)
               AND (CAST(?3 AS TEXT) IS NULL OR reservation_id = ?3)
             ORDER BY tenant_id, name"
        ),
        params![tenant_id, gpu_type, reservation_id],
        from_row,
    )?;
    clusters.sort_by(|a, b| (&a.tenant_id, &a.name).cmp(&(&b.tenant_id, &b.name)));
    Ok(clusters)
}

pub fn update(conn: &impl AsConn, c: &ClusterRow) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        "UPDATE clusters SET node_count = ?2, storage_gib = ?3, status = ?4, mig_layout = ?5, status_reason = ?6,
         cuda_version = ?7, driver_version = ?8, max_unavailable = ?9, storage_retention = ?10 WHERE id = ?1",
        params![
            c.id,
            c.node_count,
            c.storage_gib,
            c.status,
            to_json(&c.mig_layout),
            c.status_reason,
            c.cuda_version,
            c.driver_version,
            c.max_unavailable,
            c.storage_retention
        ],
    )?;
    Ok(())
}

/// Sets a cluster's status and its reason (empty when there is nothing to explain).
pub fn set_status(
    conn: &impl AsConn,
    id: &str,
    status: &str,
    reason: &str,
) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        "UPDATE clusters SET status = ?2, status_reason = ?3 WHERE id = ?1",
        params![id, status, reason],
    )?;
    Ok(())
}

/// Sets a settled cluster's status (`running` or `degraded`) and reason, unless a change
/// has started meanwhile. Returns whether the row changed.
pub fn set_settled_status(
    conn: &impl AsConn,
    id: &str,
    status: &str,
    reason: &str,
) -> gpufleet_sql::Result<bool> {
    let n = conn.as_conn().execute(
        "UPDATE clusters SET status = ?2, status_reason = ?3
         WHERE id = ?1 AND status IN ('running', 'degraded') AND (status != ?2 OR status_reason != ?3)",
        params![id, status, reason],
    )?;
    Ok(n > 0)
}

/// Sets how a tenant reaches its cluster (a Slurm cluster's configuration changes with
/// its nodes).
pub fn set_endpoint(conn: &impl AsConn, id: &str, endpoint: &str) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        "UPDATE clusters SET endpoint = ?2 WHERE id = ?1",
        params![id, endpoint],
    )?;
    Ok(())
}

pub fn set_credentials(
    conn: &impl AsConn,
    id: &str,
    credentials: &str,
) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        "UPDATE clusters SET credentials = ?2 WHERE id = ?1",
        params![id, credentials],
    )?;
    Ok(())
}

/// Clusters whose status is one of `statuses`.
pub fn with_status(conn: &impl AsConn, statuses: &[&str]) -> gpufleet_sql::Result<Vec<ClusterRow>> {
    let mut out = Vec::new();
    for c in list(conn, None, None, None)? {
        if statuses.contains(&c.status.as_str()) {
            out.push(c);
        }
    }
    Ok(out)
}

/// Degraded clusters that hold fewer nodes than their node_count: failed nodes were
/// quarantined and their replacement failed (a replacement under way leaves the
/// cluster's status alone until it fails).
pub fn short_of_nodes(conn: &impl AsConn) -> gpufleet_sql::Result<Vec<ClusterRow>> {
    conn.as_conn().query_map(
        &format!(
            "SELECT {COLUMNS} FROM clusters c
             WHERE status = 'degraded'
               AND node_count > (SELECT COUNT(*) FROM nodes n WHERE n.cluster_id = c.id)"
        ),
        params![],
        from_row,
    )
}

pub fn delete(conn: &impl AsConn, id: &str) -> gpufleet_sql::Result<()> {
    conn.as_conn()
        .execute("DELETE FROM clusters WHERE id = ?1", params![id])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::postgres::engines;
    use gpufleet_sql::{Conn, Database};

    /// Each test runs on SQLite and on PostgreSQL, with tenants `t1` and `t2` and t1's
    /// reservation `r` (plain SQL: those modules are not on the engine seam yet).
    fn on_both(test: impl Fn(&Conn<'_>)) {
        engines::on_both(|db| {
            fixtures(db);
            test(&db.conn());
        });
    }

    fn fixtures(db: &Database) {
        db.conn()
            .execute_batch(
                "INSERT INTO tenants (id, name, display_name, labels, token_hash, created_at)
                 VALUES ('t1', 'a', 'A', '{}', 'h1', 0), ('t2', 'b', 'B', '{}', 'h2', 0);
                 INSERT INTO reservations (id, tenant_id, gpu_type, node_count, start_time, end_time,
                     allow_on_demand, pool_nodes, on_demand_nodes)
                 VALUES ('r', 't1', 'H100-80GB', 2, 0, 100, 0, 2, 0);",
            )
            .unwrap();
    }

    fn cluster(id: &str, tenant_id: &str, name: &str, gpu_type: &str) -> ClusterRow {
        ClusterRow {
            id: id.into(),
            tenant_id: tenant_id.into(),
            name: name.into(),
            orchestrator: "kubernetes".into(),
            gpu_type: gpu_type.into(),
            node_count: 2,
            reservation_id: None,
            storage_gib: 10,
            status: "running".into(),
            endpoint: format!("https://{id}"),
            credentials: "{}".into(),
            storage_path: format!("/v/{id}"),
            mig_layout: BTreeMap::new(),
            status_reason: String::new(),
            cuda_version: String::new(),
            driver_version: String::new(),
            max_unavailable: 1,
            storage_retention: "delete".into(),
        }
    }

    fn ids(rows: Vec<ClusterRow>) -> Vec<String> {
        rows.into_iter().map(|c| c.id).collect()
    }

    fn add_node(c: &Conn<'_>, id: &str, cluster_id: &str) {
        c.execute(
            "INSERT INTO nodes (id, hostname, gpu_type, capacity, gpu_count, driver_version, cuda_version, cluster_id)
             VALUES (?1, ?1, 'H100-80GB', 'pool', 8, '', '', ?2)",
            params![id, cluster_id],
        )
        .unwrap();
    }

    #[test]
    fn a_cluster_reads_back_as_written_and_lists_by_filter() {
        on_both(|c| {
            let mut z = cluster("c-z", "t1", "z", "H100-80GB");
            z.reservation_id = Some("r".into());
            z.orchestrator = "slurm".into();
            z.mig_layout = BTreeMap::from([("1g.10gb".to_string(), 7)]);
            z.cuda_version = "12.4".into();
            z.max_unavailable = 3;
            z.storage_retention = "keep".into();
            insert(c, &z).unwrap();
            insert(c, &cluster("c-b", "t2", "b", "H100-80GB")).unwrap();
            insert(c, &cluster("c-a", "t1", "a", "A100-80GB")).unwrap();
            // A second cluster of one name in one tenant is refused.
            assert!(insert(c, &cluster("c-z2", "t1", "z", "H100-80GB")).is_err());

            let got = get(c, "c-z").unwrap().unwrap();
            assert_eq!(
                (
                    got.reservation_id.as_deref(),
                    got.orchestrator.as_str(),
                    got.mig_layout.get("1g.10gb"),
                    got.cuda_version.as_str(),
                    got.max_unavailable,
                    got.storage_retention.as_str(),
                    got.storage_path.as_str(),
                ),
                (Some("r"), "slurm", Some(&7), "12.4", 3, "keep", "/v/c-z")
            );
            assert!(get(c, "missing").unwrap().is_none());
            assert_eq!(by_name(c, "t1", "z").unwrap().unwrap().id, "c-z");
            assert!(by_name(c, "t2", "z").unwrap().is_none());

            // In tenant and name order; each filter alone and together.
            assert_eq!(
                ids(list(c, None, None, None).unwrap()),
                ["c-a", "c-z", "c-b"]
            );
            assert_eq!(
                ids(list(c, Some("t1"), None, None).unwrap()),
                ["c-a", "c-z"]
            );
            assert_eq!(
                ids(list(c, None, Some("H100-80GB"), None).unwrap()),
                ["c-z", "c-b"]
            );
            assert_eq!(ids(list(c, None, None, Some("r")).unwrap()), ["c-z"]);
            assert_eq!(
                ids(list(c, Some("t2"), Some("H100-80GB"), None).unwrap()),
                ["c-b"]
            );
            assert!(list(c, Some("t2"), Some("A100-80GB"), None)
                .unwrap()
                .is_empty());
        });
    }

    #[test]
    fn updates_and_statuses_change_only_their_cluster() {
        on_both(|c| {
            insert(c, &cluster("c1", "t1", "one", "H100-80GB")).unwrap();
            insert(c, &cluster("c2", "t1", "two", "H100-80GB")).unwrap();
            let mut one = get(c, "c1").unwrap().unwrap();
            one.node_count = 4;
            one.storage_gib = 20;
            one.mig_layout = BTreeMap::from([("3g.40gb".to_string(), 2)]);
            one.driver_version = "550.54".into();
            update(c, &one).unwrap();
            let got = get(c, "c1").unwrap().unwrap();
            assert_eq!((got.node_count, got.storage_gib), (4, 20));
            assert_eq!(got.mig_layout, one.mig_layout);
            assert_eq!(got.driver_version, "550.54");

            set_status(c, "c2", "updating", "scaling to 3 nodes").unwrap();
            // A settled status is not set over a change under way...
            assert!(!set_settled_status(c, "c2", "running", "").unwrap());
            assert_eq!(get(c, "c2").unwrap().unwrap().status, "updating");
            // ...and is set once, on a settled cluster.
            assert!(set_settled_status(c, "c1", "degraded", "a node failed").unwrap());
            assert!(!set_settled_status(c, "c1", "degraded", "a node failed").unwrap());
            assert!(set_settled_status(c, "c1", "degraded", "two nodes failed").unwrap());
            let got = get(c, "c1").unwrap().unwrap();
            assert_eq!(
                (got.status.as_str(), got.status_reason.as_str()),
                ("degraded", "two nodes failed")
            );
            assert_eq!(
                ids(with_status(c, &["degraded", "updating"]).unwrap()),
                ["c1", "c2"]
            );
            assert_eq!(
                ids(with_status(c, &["running"]).unwrap()),
                Vec::<String>::new()
            );

            set_endpoint(c, "c1", "login:2222").unwrap();
            set_credentials(c, "c1", "{\"k\":1}").unwrap();
            let got = get(c, "c1").unwrap().unwrap();
            assert_eq!(
                (got.endpoint.as_str(), got.credentials.as_str()),
                ("login:2222", "{\"k\":1}")
            );
            assert_eq!(get(c, "c2").unwrap().unwrap().endpoint, "https://c2");

            delete(c, "c1").unwrap();
            assert!(get(c, "c1").unwrap().is_none());
            assert_eq!(ids(list(c, None, None, None).unwrap()), ["c2"]);
        });
    }

    /// The JSON list is the one statement that differs per engine: ids that JSON escapes,
    /// a missing one and an empty list read the same on both.
    #[test]
    fn tenants_of_reads_a_page_through_a_json_list() {
        on_both(|c| {
            insert(c, &cluster("c1", "t1", "one", "H100-80GB")).unwrap();
            insert(c, &cluster("c \"2\" \\ é", "t2", "two", "H100-80GB")).unwrap();
            let tenants = tenants_of(c, &["c1", "c \"2\" \\ é", "missing"]).unwrap();
            assert_eq!(
                tenants,
                std::collections::HashMap::from([
                    ("c1".to_string(), "t1".to_string()),
                    ("c \"2\" \\ é".to_string(), "t2".to_string()),
                ])
            );
            assert!(tenants_of(c, &[]).unwrap().is_empty());
        });
    }

    /// Under a PostgreSQL collation where case weighs less than letters, the list still
    /// comes in SQLite's (bytewise) order.
    #[test]
    fn postgres_lists_in_bytewise_order_whatever_the_collation() {
        let (_guard, db, _) = engines::postgres();
        fixtures(&db);
        let c = db.conn();
        c.execute_batch("ALTER TABLE clusters ALTER COLUMN name TYPE TEXT COLLATE \"und-x-icu\"")
            .unwrap();
        for name in ["b", "C", "a"] {
            insert(&c, &cluster(name, "t1", name, "H100-80GB")).unwrap();
        }
        insert(&c, &cluster("t2-a", "t2", "a", "H100-80GB")).unwrap();
        // The premise: the database's own order is not bytewise.
        let collated: Vec<String> = c
            .query_map(
                "SELECT name FROM clusters WHERE tenant_id = 't1' ORDER BY name",
                params![],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(collated, ["a", "b", "C"]);
        assert_eq!(
            ids(list(&c, None, None, None).unwrap()),
            ["C", "a", "b", "t2-a"]
        );
        assert_eq!(
            ids(with_status(&c, &["running"]).unwrap()),
            ["C", "a", "b", "t2-a"]
        );
    }

    #[test]
    fn short_of_nodes_is_a_degraded_cluster_with_fewer_nodes_than_its_count() {
        on_both(|c| {
            for (id, name) in [("short", "a"), ("whole", "b"), ("running", "c")] {
                insert(c, &cluster(id, "t1", name, "H100-80GB")).unwrap();
            }
            set_status(c, "short", "degraded", "").unwrap();
            set_status(c, "whole", "degraded", "").unwrap();
            add_node(c, "n1", "short");
            add_node(c, "n2", "whole");
            add_node(c, "n3", "whole");
            add_node(c, "n4", "running");
            assert_eq!(ids(short_of_nodes(c).unwrap()), ["short"]);
        });
    }
}
