//! Health-check results with history per node, each cluster's acceptance settings and
//! latest run, and the address where each node agent accepts bandwidth-test streams.

use gpufleet_sql::{params, AsConn, Row};
use serde::{Deserialize, Serialize};

use super::{from_json, to_json};

/// One check's verdict as stored (the wire's CheckResult, without the transport).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Check {
    pub name: String,
    #[serde(default)]
    pub gpu_uuid: String,
    pub verdict: String,
    #[serde(default)]
    pub value: String,
    #[serde(default)]
    pub threshold: String,
    #[serde(default)]
    pub detail: String,
    #[serde(default)]
    pub peer: String,
    #[serde(default)]
    pub gbps: f64,
}

/// One node's checks of one run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResultRow {
    pub run_id: String,
    pub node_id: String,
    /// The node's hostname.
    pub node: String,
    /// The cluster the node belonged to when checked ("" when free).
    pub cluster_id: String,
    pub tenant_id: String,
    pub level: String,
    /// "passed" or "failed".
    pub verdict: String,
    pub summary: String,
    pub checks: Vec<Check>,
    /// What the control plane did about it ("quarantined", "replaced by ...", "").
    pub action: String,
    pub finished_at: i64,
}

const RESULT_COLUMNS: &str = "run_id, node_id, node, cluster_id, tenant_id, level, verdict, summary, checks, action, finished_at";

fn result_from(r: &Row) -> gpufleet_sql::Result<ResultRow> {
    Ok(ResultRow {
        run_id: r.get(0)?,
        node_id: r.get(1)?,
        node: r.get(2)?,
        cluster_id: r.get(3)?,
        tenant_id: r.get(4)?,
        level: r.get(5)?,
        verdict: r.get(6)?,
        summary: r.get(7)?,
        checks: from_json(&r.get::<String>(8)?),
        action: r.get(9)?,
        finished_at: r.get(10)?,
    })
}

/// Records one node's result. Its `seq` (SQLite's AUTOINCREMENT, an identity column on
/// PostgreSQL) only orders one node's results, newest last: no reader takes it as a
/// cursor, so a sequence's gaps and its numbers out of commit order (two results of one
/// node recorded at once, which have no order between them) do no harm.
pub fn record(conn: &impl AsConn, r: &ResultRow) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        &format!(
            "INSERT INTO health_results ({RESULT_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"
        ),
        params![
            r.run_id,
            r.node_id,
            r.node,
            r.cluster_id,
            r.tenant_id,
            r.level,
            r.verdict,
            r.summary,
            to_json(&r.checks),
            r.action,
            r.finished_at
        ],
    )?;
    Ok(())
}

/// Notes what was done about a node's result of `run_id`.
pub fn set_action(
    conn: &impl AsConn,
    run_id: &str,
    node_id: &str,
    action: &str,
) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        "UPDATE health_results SET action = ?3 WHERE run_id = ?1 AND node_id = ?2",
        params![run_id, node_id, action],
    )?;
    Ok(())
}

/// A node's results, newest first, at most `limit`.
pub fn history(
    conn: &impl AsConn,
    node_id: &str,
    limit: u32,
) -> gpufleet_sql::Result<Vec<ResultRow>> {
    conn.as_conn().query_map(
        &format!(
            "SELECT {RESULT_COLUMNS} FROM health_results WHERE node_id = ?1 ORDER BY seq DESC LIMIT ?2"
        ),
        params![node_id, limit],
        result_from,
    )
}

/// The newest result of each node checked as a member of `cluster_id`, by hostname.
pub fn latest_for_cluster(
    conn: &impl AsConn,
    cluster_id: &str,
) -> gpufleet_sql::Result<Vec<ResultRow>> {
    conn.as_conn().query_map(
        &format!(
            "SELECT {RESULT_COLUMNS} FROM health_results h WHERE cluster_id = ?1
             AND seq = (SELECT MAX(seq) FROM health_results WHERE cluster_id = ?1 AND node_id = h.node_id)
             ORDER BY node"
        ),
        params![cluster_id],
        result_from,
    )
}

/// The results of one run of `cluster_id`'s checks, by hostname (a node checked more
/// than once in the run, e.g. a replacement, by its newest result), without the checks
/// themselves (empty): each node's verdict, summary and action.
pub fn run_results(
    conn: &impl AsConn,
    cluster_id: &str,
    run_id: &str,
) -> gpufleet_sql::Result<Vec<ResultRow>> {
    // Without the checks (every check of every GPU, as JSON): a cluster's answer shows each
    // node's verdict and summary, and decoding them made each read of a cluster slow.
    let columns = RESULT_COLUMNS.replace("checks", "'[]'");
    conn.as_conn().query_map(
        &format!(
            "SELECT {columns} FROM health_results h WHERE cluster_id = ?1 AND run_id = ?2
             AND seq = (SELECT MAX(seq) FROM health_results
                        WHERE cluster_id = ?1 AND run_id = ?2 AND node_id = h.node_id)
             ORDER BY node"
        ),
        params![cluster_id, run_id],
        result_from,
    )
}

/// A cluster's acceptance settings and the outcome of its latest run.
#[derive(Debug, Clone, PartialEq)]
pub struct Acceptance {
    pub cluster_id: String,
    pub level: String,
    pub min_bus_bandwidth_gbps: f64,
    pub run_on_create: bool,
    /// "passed", "failed", "running" or "not_run".
    pub status: String,
    pub run_id: String,
    /// The level of the latest run (a tenant may run another than the cluster's).
    pub run_level: String,
    pub checked_at: i64,
    pub alg_bandwidth_gbps: f64,
    pub bus_bandwidth_gbps: f64,
}

impl Acceptance {
    /// The settings of a cluster that asked for none: medium, unjudged bandwidth, run on
    /// create.
    pub fn default_for(cluster_id: &str) -> Self {
        Self {
            cluster_id: cluster_id.to_string(),
            level: "medium".into(),
            min_bus_bandwidth_gbps: 0.0,
            run_on_create: true,
            status: "not_run".into(),
            run_id: String::new(),
            run_level: String::new(),
            checked_at: 0,
            alg_bandwidth_gbps: 0.0,
            bus_bandwidth_gbps: 0.0,
        }
    }
}

const ACCEPTANCE_COLUMNS: &str = "cluster_id, level, min_bus_bandwidth_gbps, run_on_create, status, run_id, run_level, checked_at, alg_bandwidth_gbps, bus_bandwidth_gbps";

fn acceptance_from(r: &Row) -> gpufleet_sql::Result<Acceptance> {
    Ok(Acceptance {
        cluster_id: r.get(0)?,
        level: r.get(1)?,
        min_bus_bandwidth_gbps: r.get(2)?,
        run_on_create: r.get(3)?,
        status: r.get(4)?,
        run_id: r.get(5)?,
        run_level: r.get(6)?,
        checked_at: r.get(7)?,
        alg_bandwidth_gbps: r.get(8)?,
        bus_bandwidth_gbps: r.get(9)?,
    })
}

/// The cluster's acceptance row; the defaults when it has none (clusters from before).
pub fn acceptance(conn: &impl AsConn, cluster_id: &str) -> gpufleet_sql::Result<Acceptance> {
    Ok(conn
        .as_conn()
        .query_opt(
            &format!("SELECT {ACCEPTANCE_COLUMNS} FROM cluster_acceptance WHERE cluster_id = ?1"),
            params![cluster_id],
            acceptance_from,
        )?
        .unwrap_or_else(|| Acceptance::default_for(cluster_id)))
}

/// Sets the cluster's whole acceptance row. An upsert setting every column, where SQLite
/// had INSERT OR REPLACE (PostgreSQL has none): the same row either way, as nothing
/// refers to it.
pub fn put_acceptance(conn: &impl AsConn, a: &Acceptance) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        &format!(
            "INSERT INTO cluster_acceptance ({ACCEPTANCE_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
             ON CONFLICT (cluster_id) DO UPDATE SET level = excluded.level,
                 min_bus_bandwidth_gbps = excluded.min_bus_bandwidth_gbps,
                 run_on_create = excluded.run_on_create, status = excluded.status,
                 run_id = excluded.run_id, run_level = excluded.run_level,
                 checked_at = excluded.checked_at, alg_bandwidth_gbps = excluded.alg_bandwidth_gbps,
                 bus_bandwidth_gbps = excluded.bus_bandwidth_gbps"
        ),
        params![
            a.cluster_id,
            a.level,
            a.min_bus_bandwidth_gbps,
            a.run_on_create,
            a.status,
            a.run_id,
            a.run_level,
            a.checked_at,
            a.alg_bandwidth_gbps,
            a.bus_bandwidth_gbps
        ],
    )?;
    Ok(())
}

/// Forgets a deleted cluster's settings (its nodes' results stay in their history).
pub fn forget_cluster(conn: &impl AsConn, cluster_id: &str) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        "DELETE FROM cluster_acceptance WHERE cluster_id = ?1",
        params![cluster_id],
    )?;
    Ok(())
}

/// Sets where the node's agent accepts bandwidth-test streams (an upsert, as
/// `put_acceptance`).
pub fn set_bandwidth_addr(
    conn: &impl AsConn,
    node_id: &str,
    addr: &str,
) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        "INSERT INTO node_endpoints (node_id, bandwidth_addr) VALUES (?1, ?2)
         ON CONFLICT (node_id) DO UPDATE SET bandwidth_addr = excluded.bandwidth_addr",
        params![node_id, addr],
    )?;
    Ok(())
}

/// Where the node's agent accepts bandwidth-test streams ("" when it runs no listener).
pub fn bandwidth_addr(conn: &impl AsConn, node_id: &str) -> gpufleet_sql::Result<String> {
    Ok(conn
        .as_conn()
        .query_opt(
            "SELECT bandwidth_addr FROM node_endpoints WHERE node_id = ?1",
            params![node_id],
            |r| r.get(0),
        )?
        .unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::postgres::engines::on_both;

    fn row(run: &str, node: &str, cluster: &str, verdict: &str, at: i64) -> ResultRow {
        ResultRow {
            run_id: run.into(),
            node_id: node.into(),
            node: node.into(),
            cluster_id: cluster.into(),
            tenant_id: "t1".into(),
            level: "medium".into(),
            verdict: verdict.into(),
            summary: String::new(),
            checks: vec![Check {
                name: "xid".into(),
                verdict: if verdict == "passed" { "pass" } else { "fail" }.into(),
                value: "1 XID 79".into(),
                threshold: "0".into(),
                ..Default::default()
            }],
            action: String::new(),
            finished_at: at,
        }
    }

    #[test]
    fn results_keep_history_and_the_cluster_sees_each_nodes_newest() {
        on_both(|db| {
            let conn = db.conn();
            record(&conn, &row("r1", "n1", "c1", "passed", 1)).unwrap();
            record(&conn, &row("r1", "n2", "c1", "passed", 1)).unwrap();
            record(&conn, &row("r2", "n1", "c1", "failed", 2)).unwrap();
            record(&conn, &row("r3", "n1", "", "passed", 3)).unwrap();
            set_action(&conn, "r2", "n1", "quarantined").unwrap();
            let latest = latest_for_cluster(&conn, "c1").unwrap();
            assert_eq!(latest.len(), 2);
            assert_eq!(
                (latest[0].run_id.as_str(), latest[0].action.as_str()),
                ("r2", "quarantined")
            );
            assert_eq!(latest[0].checks[0].value, "1 XID 79");
            let h = history(&conn, "n1", 10).unwrap();
            assert_eq!(
                h.iter().map(|r| r.run_id.as_str()).collect::<Vec<_>>(),
                ["r3", "r2", "r1"]
            );
            assert!(latest_for_cluster(&conn, "c2").unwrap().is_empty());
            let run = run_results(&conn, "c1", "r1").unwrap();
            assert_eq!(run.len(), 2);
            assert!(run.iter().all(|r| r.verdict == "passed"));
        });
    }

    #[test]
    fn acceptance_defaults_until_set_and_addresses_are_replaced() {
        on_both(|db| {
            let conn = db.conn();
            assert_eq!(
                acceptance(&conn, "c1").unwrap(),
                Acceptance::default_for("c1")
            );
            let mut a = Acceptance::default_for("c1");
            a.level = "quick".into();
            a.min_bus_bandwidth_gbps = 5.5;
            put_acceptance(&conn, &a).unwrap();
            assert_eq!(acceptance(&conn, "c1").unwrap(), a);
            forget_cluster(&conn, "c1").unwrap();
            assert_eq!(acceptance(&conn, "c1").unwrap().level, "medium");
            assert_eq!(bandwidth_addr(&conn, "n1").unwrap(), "");
            set_bandwidth_addr(&conn, "n1", "127.0.0.1:1").unwrap();
            set_bandwidth_addr(&conn, "n1", "127.0.0.1:2").unwrap();
            assert_eq!(bandwidth_addr(&conn, "n1").unwrap(), "127.0.0.1:2");
        });
    }

    /// A second put replaces every column (SQLite's INSERT OR REPLACE did; now an upsert
    /// on both engines), and reals and the flag round-trip.
    #[test]
    fn a_second_put_replaces_the_whole_row() {
        on_both(|db| {
            let conn = db.conn();
            let first = Acceptance {
                level: "long".into(),
                min_bus_bandwidth_gbps: 40.5,
                run_on_create: false,
                status: "running".into(),
                run_id: "r1".into(),
                run_level: "long".into(),
                checked_at: 1 << 40,
                alg_bandwidth_gbps: 123.25,
                bus_bandwidth_gbps: 231.09375,
                ..Acceptance::default_for("c1")
            };
            put_acceptance(&conn, &first).unwrap();
            assert_eq!(acceptance(&conn, "c1").unwrap(), first);
            let second = Acceptance {
                status: "passed".into(),
                run_id: "r2".into(),
                run_level: "quick".into(),
                checked_at: 7,
                alg_bandwidth_gbps: 1.0,
                bus_bandwidth_gbps: 0.0,
                ..Acceptance::default_for("c1")
            };
            put_acceptance(&conn, &second).unwrap();
            assert_eq!(acceptance(&conn, "c1").unwrap(), second);
            let rows: i64 = conn
                .query_row("SELECT COUNT(*) FROM cluster_acceptance", params![], |r| {
                    r.get(0)
                })
                .unwrap();
            assert_eq!(rows, 1);
        });
    }

    /// A run's results hold each node's newest of that run, without their checks; the
    /// history stops at its limit.
    #[test]
    fn a_runs_results_are_each_nodes_newest_of_the_run_without_checks() {
        on_both(|db| {
            let conn = db.conn();
            record(&conn, &row("r1", "n2", "c1", "failed", 1)).unwrap();
            record(&conn, &row("r1", "n1", "c1", "passed", 1)).unwrap();
            // n2 replaced and checked again in the same run.
            record(&conn, &row("r1", "n2", "c1", "passed", 2)).unwrap();
            record(&conn, &row("r2", "n1", "c1", "failed", 3)).unwrap();
            let run = run_results(&conn, "c1", "r1").unwrap();
            assert_eq!(
                run.iter()
                    .map(|r| (r.node.as_str(), r.verdict.as_str(), r.checks.len()))
                    .collect::<Vec<_>>(),
                [("n1", "passed", 0), ("n2", "passed", 0)]
            );
            let h = history(&conn, "n1", 1).unwrap();
            assert_eq!(
                h.iter().map(|r| r.run_id.as_str()).collect::<Vec<_>>(),
                ["r2"]
            );
        });
    }
}
