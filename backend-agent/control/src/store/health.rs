//! Health-check results with history per node, each cluster's acceptance settings and
//! latest run, and the address where each node agent accepts bandwidth-test streams.

use rusqlite::{Connection, OptionalExtension, Row};
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

fn result_from(r: &Row) -> rusqlite::Result<ResultRow> {
    Ok(ResultRow {
        run_id: r.get(0)?,
        node_id: r.get(1)?,
        node: r.get(2)?,
        cluster_id: r.get(3)?,
        tenant_id: r.get(4)?,
        level: r.get(5)?,
        verdict: r.get(6)?,
        summary: r.get(7)?,
        checks: from_json(&r.get::<_, String>(8)?),
        action: r.get(9)?,
        finished_at: r.get(10)?,
    })
}

pub fn record(conn: &Connection, r: &ResultRow) -> rusqlite::Result<()> {
    conn.execute(
        &format!(
            "INSERT INTO health_results ({RESULT_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"
        ),
        rusqlite::params![
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
    conn: &Connection,
    run_id: &str,
    node_id: &str,
    action: &str,
) -> rusqlite::Result<()> {
    conn.execute(
        "UPDATE health_results SET action = ?3 WHERE run_id = ?1 AND node_id = ?2",
        [run_id, node_id, action],
    )?;
    Ok(())
}

/// A node's results, newest first, at most `limit`.
pub fn history(conn: &Connection, node_id: &str, limit: u32) -> rusqlite::Result<Vec<ResultRow>> {
    let mut stmt = conn.prepare(&format!(
        "SELECT {RESULT_COLUMNS} FROM health_results WHERE node_id = ?1 ORDER BY seq DESC LIMIT ?2"
    ))?;
    let rows = stmt.query_map(rusqlite::params![node_id, limit], result_from)?;
    rows.collect()
}

/// The newest result of each node checked as a member of `cluster_id`, by hostname.
pub fn latest_for_cluster(conn: &Connection, cluster_id: &str) -> rusqlite::Result<Vec<ResultRow>> {
    let mut stmt = conn.prepare(&format!(
        "SELECT {RESULT_COLUMNS} FROM health_results h WHERE cluster_id = ?1
         AND seq = (SELECT MAX(seq) FROM health_results WHERE cluster_id = ?1 AND node_id = h.node_id)
         ORDER BY node"
    ))?;
    let rows = stmt.query_map([cluster_id], result_from)?;
    rows.collect()
}

/// The results of one run of `cluster_id`'s checks, by hostname (a node checked more
/// than once in the run, e.g. a replacement, by its newest result), without the checks
/// themselves (empty): each node's verdict, summary and action.
pub fn run_results(
    conn: &Connection,
    cluster_id: &str,
    run_id: &str,
) -> rusqlite::Result<Vec<ResultRow>> {
    // Without the checks (every check of every GPU, as JSON): a cluster's answer shows each
    // node's verdict and summary, and decoding them made each read of a cluster slow.
    let columns = RESULT_COLUMNS.replace("checks", "'[]'");
    let mut stmt = conn.prepare(&format!(
        "SELECT {columns} FROM health_results h WHERE cluster_id = ?1 AND run_id = ?2
         AND seq = (SELECT MAX(seq) FROM health_results
                    WHERE cluster_id = ?1 AND run_id = ?2 AND node_id = h.node_id)
         ORDER BY node"
    ))?;
    let rows = stmt.query_map([cluster_id, run_id], result_from)?;
    rows.collect()
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

fn acceptance_from(r: &Row) -> rusqlite::Result<Acceptance> {
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
pub fn acceptance(conn: &Connection, cluster_id: &str) -> rusqlite::Result<Acceptance> {
    Ok(conn
        .query_row(
            &format!("SELECT {ACCEPTANCE_COLUMNS} FROM cluster_acceptance WHERE cluster_id = ?1"),
            [cluster_id],
            acceptance_from,
        )
        .optional()?
        .unwrap_or_else(|| Acceptance::default_for(cluster_id)))
}

pub fn put_acceptance(conn: &Connection, a: &Acceptance) -> rusqlite::Result<()> {
    conn.execute(
        &format!(
            "INSERT OR REPLACE INTO cluster_acceptance ({ACCEPTANCE_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"
        ),
        rusqlite::params![
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
pub fn forget_cluster(conn: &Connection, cluster_id: &str) -> rusqlite::Result<()> {
    conn.execute(
        "DELETE FROM cluster_acceptance WHERE cluster_id = ?1",
        [cluster_id],
    )?;
    Ok(())
}

pub fn set_bandwidth_addr(conn: &Connection, node_id: &str, addr: &str) -> rusqlite::Result<()> {
    conn.execute(
        "INSERT OR REPLACE INTO node_endpoints (node_id, bandwidth_addr) VALUES (?1, ?2)",
        [node_id, addr],
    )?;
    Ok(())
}

/// Where the node's agent accepts bandwidth-test streams ("" when it runs no listener).
pub fn bandwidth_addr(conn: &Connection, node_id: &str) -> rusqlite::Result<String> {
    Ok(conn
        .query_row(
            "SELECT bandwidth_addr FROM node_endpoints WHERE node_id = ?1",
            [node_id],
            |r| r.get(0),
        )
        .optional()?
        .unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let dir = tempfile::tempdir().unwrap();
        let conn = crate::store::open(&dir.path().join("s.db")).unwrap();
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
    }

    #[test]
    fn acceptance_defaults_until_set_and_addresses_are_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let conn = crate::store::open(&dir.path().join("s.db")).unwrap();
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
    }
}
