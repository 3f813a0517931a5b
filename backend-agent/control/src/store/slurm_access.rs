//! Each Slurm cluster's platform-side access: its munge key (never given to the team), the
//! uid of its account, the ports of its controller and login, and the team's ssh public
//! keys.

use rusqlite::{Connection, OptionalExtension, Row};

#[derive(Clone, Debug, PartialEq)]
pub struct SlurmAccess {
    pub cluster_id: String,
    /// base64.
    pub munge_key: String,
    /// The cluster account's uid (and gid), the same on every host; unique.
    pub uid: u32,
    pub controller_port: u16,
    /// 0: not allocated yet (a cluster from before logins).
    pub login_port: u16,
    pub ssh_public_keys: Vec<String>,
}

const COLUMNS: &str = "uid, cluster_id, munge_key, controller_port, login_port, ssh_public_keys";

fn from_row(r: &Row) -> rusqlite::Result<SlurmAccess> {
    let keys: String = r.get(5)?;
    Ok(SlurmAccess {
        uid: r.get(0)?,
        cluster_id: r.get(1)?,
        munge_key: r.get(2)?,
        controller_port: r.get(3)?,
        login_port: r.get(4)?,
        ssh_public_keys: serde_json::from_str(&keys).unwrap_or_default(),
    })
}

fn keys_json(keys: &[String]) -> String {
    serde_json::to_string(keys).unwrap_or_else(|_| "[]".into())
}

/// Records a new cluster's access.
pub fn insert(conn: &Connection, a: &SlurmAccess) -> rusqlite::Result<()> {
    conn.execute(
        "INSERT INTO slurm_access (uid, cluster_id, munge_key, controller_port, login_port, ssh_public_keys)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        (
            a.uid,
            &a.cluster_id,
            &a.munge_key,
            a.controller_port,
            a.login_port,
            keys_json(&a.ssh_public_keys),
        ),
    )?;
    Ok(())
}

/// Whether some cluster's account has `uid`.
pub fn uid_taken(conn: &Connection, uid: u32) -> rusqlite::Result<bool> {
    conn.prepare_cached("SELECT 1 FROM slurm_access WHERE uid = ?1")?
        .query_row([uid], |_| Ok(()))
        .optional()
        .map(|found| found.is_some())
}

pub fn get(conn: &Connection, cluster_id: &str) -> rusqlite::Result<Option<SlurmAccess>> {
    conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM slurm_access WHERE cluster_id = ?1"
    ))?
    .query_row([cluster_id], from_row)
    .optional()
}

pub fn set_ssh_public_keys(
    conn: &Connection,
    cluster_id: &str,
    keys: &[String],
) -> rusqlite::Result<()> {
    conn.execute(
        "UPDATE slurm_access SET ssh_public_keys = ?2 WHERE cluster_id = ?1",
        (cluster_id, keys_json(keys)),
    )?;
    Ok(())
}

pub fn set_login_port(conn: &Connection, cluster_id: &str, port: u16) -> rusqlite::Result<()> {
    conn.execute(
        "UPDATE slurm_access SET login_port = ?2 WHERE cluster_id = ?1",
        (cluster_id, port),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_round_trips_and_goes_with_its_cluster() {
        let dir = tempfile::tempdir().unwrap();
        let conn = crate::store::open(&dir.path().join("s.db")).unwrap();
        conn.execute_batch(
            "INSERT INTO tenants (id, name, display_name, labels, token_hash, created_at) VALUES ('t', 't', '', '{}', 'h', 0);",
        )
        .unwrap();
        let cluster = |id: &str| {
            conn.execute(
                "INSERT INTO clusters (id, tenant_id, name, orchestrator, gpu_type, node_count, storage_gib, status, endpoint, credentials, storage_path, mig_layout)
                 VALUES (?1, 't', ?1, 'slurm', 'H100-80GB', 1, 1, 'running', '', '', '', '{}')",
                [id],
            )
            .unwrap();
        };
        cluster("c1");
        let a = SlurmAccess {
            cluster_id: "c1".into(),
            munge_key: "a2V5".into(),
            uid: 1_900_000_007,
            controller_port: 7000,
            login_port: 7001,
            ssh_public_keys: vec!["ssh-ed25519 AAAA".into()],
        };
        insert(&conn, &a).unwrap();
        assert_eq!(get(&conn, "c1").unwrap(), Some(a.clone()));
        assert!(uid_taken(&conn, a.uid).unwrap());
        assert!(!uid_taken(&conn, a.uid + 1).unwrap());
        set_ssh_public_keys(&conn, "c1", &[]).unwrap();
        set_login_port(&conn, "c1", 7002).unwrap();
        let b = get(&conn, "c1").unwrap().unwrap();
        assert_eq!((b.login_port, b.ssh_public_keys.len()), (7002, 0));
        conn.execute("DELETE FROM clusters WHERE id = 'c1'", [])
            .unwrap();
        assert_eq!(get(&conn, "c1").unwrap(), None, "gone with its cluster");
        assert!(!uid_taken(&conn, a.uid).unwrap());
    }
}
