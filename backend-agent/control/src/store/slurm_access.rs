//! Each Slurm cluster's platform-side access: its munge key (never given to the team), the
//! uid of its account, the ports of its controllers and login, the team's ssh public keys,
//! the login's host key, and where its daemons run (the head node, with the primary
//! controller and the login, and the backup controller's node) with each node's slurmd
//! port.

use std::collections::BTreeMap;

use gpufleet_sql::{params, AsConn, Row};

#[derive(Clone, Debug, Default, PartialEq)]
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
    /// The node (id) that runs the primary controller and the login; '' none yet.
    pub head_node: String,
    /// The node (id) that runs the backup controller; '' none.
    pub backup_node: String,
    /// Each node's slurmd port, by node name, as the cluster's slurm.conf declares it.
    pub node_ports: BTreeMap<String, u16>,
    /// The login's host key: an OpenSSH private key ('' not made yet), and its public
    /// half as `TYPE BASE64`.
    pub login_host_key: String,
    pub login_host_public: String,
    /// The greatest NEXT_JOB_ID a controller of the cluster reported (0: none yet).
    pub next_job_id: u64,
    /// The FirstJobId the head's controller runs with (0: Slurm's default).
    pub first_job_id: u64,
}

const COLUMNS: &str = "uid, cluster_id, munge_key, controller_port, login_port, ssh_public_keys, \
     head_node, backup_node, node_ports, login_host_key, login_host_public, next_job_id, \
     first_job_id";

fn from_row(r: &Row) -> gpufleet_sql::Result<SlurmAccess> {
    let keys: String = r.get(5)?;
    let ports: String = r.get(8)?;
    Ok(SlurmAccess {
        uid: r.get(0)?,
        cluster_id: r.get(1)?,
        munge_key: r.get(2)?,
        controller_port: r.get(3)?,
        login_port: r.get(4)?,
        ssh_public_keys: serde_json::from_str(&keys).unwrap_or_default(),
        head_node: r.get(6)?,
        backup_node: r.get(7)?,
        node_ports: serde_json::from_str(&ports).unwrap_or_default(),
        login_host_key: r.get(9)?,
        login_host_public: r.get(10)?,
        next_job_id: r.get::<i64>(11)?.max(0) as u64,
        first_job_id: r.get::<i64>(12)?.max(0) as u64,
    })
}

fn keys_json(keys: &[String]) -> String {
    serde_json::to_string(keys).unwrap_or_else(|_| "[]".into())
}

fn ports_json(ports: &BTreeMap<String, u16>) -> String {
    serde_json::to_string(ports).unwrap_or_else(|_| "{}".into())
}

/// Records a new cluster's access.
pub fn insert(conn: &impl AsConn, a: &SlurmAccess) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        &format!(
            "INSERT INTO slurm_access ({COLUMNS})
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)"
        ),
        params![
            a.uid,
            a.cluster_id,
            a.munge_key,
            a.controller_port,
            a.login_port,
            keys_json(&a.ssh_public_keys),
            a.head_node,
            a.backup_node,
            ports_json(&a.node_ports),
            a.login_host_key,
            a.login_host_public,
            a.next_job_id as i64,
            a.first_job_id as i64,
        ],
    )?;
    Ok(())
}

/// Whether some cluster's account has `uid`.
pub fn uid_taken(conn: &impl AsConn, uid: u32) -> gpufleet_sql::Result<bool> {
    let found = conn.as_conn().query_opt(
        "SELECT 1 FROM slurm_access WHERE uid = ?1",
        params![uid],
        |_| Ok(()),
    )?;
    Ok(found.is_some())
}

/// Every port some Slurm cluster's controller, login or slurmd has: a new one is none of
/// them (on a host that runs several clusters' daemons, embedded nodes, they would meet).
pub fn ports_taken(conn: &impl AsConn) -> gpufleet_sql::Result<std::collections::BTreeSet<u16>> {
    let rows = conn.as_conn().query_map(
        "SELECT controller_port, login_port, node_ports FROM slurm_access",
        params![],
        |r| Ok((r.get::<u16>(0)?, r.get::<u16>(1)?, r.get::<String>(2)?)),
    )?;
    let mut taken = std::collections::BTreeSet::new();
    for (ctl, login, nodes) in rows {
        taken.insert(ctl);
        taken.insert(login);
        let nodes: BTreeMap<String, u16> = serde_json::from_str(&nodes).unwrap_or_default();
        taken.extend(nodes.into_values());
    }
    taken.remove(&0);
    Ok(taken)
}

pub fn get(conn: &impl AsConn, cluster_id: &str) -> gpufleet_sql::Result<Option<SlurmAccess>> {
    conn.as_conn().query_opt(
        &format!("SELECT {COLUMNS} FROM slurm_access WHERE cluster_id = ?1"),
        params![cluster_id],
        from_row,
    )
}

pub fn set_ssh_public_keys(
    conn: &impl AsConn,
    cluster_id: &str,
    keys: &[String],
) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        "UPDATE slurm_access SET ssh_public_keys = ?2 WHERE cluster_id = ?1",
        params![cluster_id, keys_json(keys)],
    )?;
    Ok(())
}

pub fn set_login_port(conn: &impl AsConn, cluster_id: &str, port: u16) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        "UPDATE slurm_access SET login_port = ?2 WHERE cluster_id = ?1",
        params![cluster_id, port],
    )?;
    Ok(())
}

/// Records the login's host key (once per cluster).
pub fn set_login_host_key(
    conn: &impl AsConn,
    cluster_id: &str,
    private: &str,
    public: &str,
) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        "UPDATE slurm_access SET login_host_key = ?2, login_host_public = ?3 WHERE cluster_id = ?1",
        params![cluster_id, private, public],
    )?;
    Ok(())
}

/// Records where the cluster's daemons run now, its nodes' slurmd ports, and the
/// FirstJobId its head's controller runs with.
pub fn set_placement(
    conn: &impl AsConn,
    cluster_id: &str,
    head_node: &str,
    backup_node: &str,
    node_ports: &BTreeMap<String, u16>,
    first_job_id: u64,
) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        "UPDATE slurm_access SET head_node = ?2, backup_node = ?3, node_ports = ?4, \
         first_job_id = ?5 WHERE cluster_id = ?1",
        params![
            cluster_id,
            head_node,
            backup_node,
            ports_json(node_ports),
            first_job_id as i64,
        ],
    )?;
    Ok(())
}

/// Records `next` as the cluster's greatest NEXT_JOB_ID when it is greater than the one
/// recorded; whether it was.
pub fn raise_next_job_id(
    conn: &impl AsConn,
    cluster_id: &str,
    next: u64,
) -> gpufleet_sql::Result<bool> {
    let changed = conn.as_conn().execute(
        "UPDATE slurm_access SET next_job_id = ?2 WHERE cluster_id = ?1 AND next_job_id < ?2",
        params![cluster_id, next as i64],
    )?;
    Ok(changed > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::postgres::engines::on_both;

    #[test]
    fn access_round_trips_and_goes_with_its_cluster() {
        on_both(|db| {
            let conn = db.conn();
            conn.execute_batch(
                "INSERT INTO tenants (id, name, display_name, labels, token_hash, created_at) VALUES ('t', 't', '', '{}', 'h', 0);",
            )
            .unwrap();
            let cluster = |id: &str| {
                conn.execute(
                    "INSERT INTO clusters (id, tenant_id, name, orchestrator, gpu_type, node_count, storage_gib, status, endpoint, credentials, storage_path, mig_layout)
                     VALUES (?1, 't', ?1, 'slurm', 'H100-80GB', 1, 1, 'running', '', '', '', '{}')",
                    params![id],
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
                login_host_key: "-----BEGIN OPENSSH PRIVATE KEY-----\n".into(),
                login_host_public: "ssh-ed25519 AAAA".into(),
                ..Default::default()
            };
            insert(&conn, &a).unwrap();
            assert_eq!(get(&conn, "c1").unwrap(), Some(a.clone()));
            assert!(uid_taken(&conn, a.uid).unwrap());
            assert!(!uid_taken(&conn, a.uid + 1).unwrap());
            set_ssh_public_keys(&conn, "c1", &[]).unwrap();
            set_login_port(&conn, "c1", 7002).unwrap();
            let ports = BTreeMap::from([("n1".to_string(), 7003), ("n2".to_string(), 7004)]);
            set_placement(&conn, "c1", "node-1", "node-2", &ports, 41).unwrap();
            set_login_host_key(&conn, "c1", "private", "public").unwrap();
            // The greatest next job id only ever goes up.
            assert!(raise_next_job_id(&conn, "c1", 40).unwrap());
            assert!(!raise_next_job_id(&conn, "c1", 12).unwrap());
            assert!(!raise_next_job_id(&conn, "c1", 40).unwrap());
            let b = get(&conn, "c1").unwrap().unwrap();
            assert_eq!((b.next_job_id, b.first_job_id), (40, 41));
            assert_eq!((b.login_port, b.ssh_public_keys.len()), (7002, 0));
            assert_eq!(
                (b.head_node.as_str(), b.backup_node.as_str()),
                ("node-1", "node-2")
            );
            assert_eq!(b.node_ports, ports);
            assert_eq!(
                (b.login_host_key.as_str(), b.login_host_public.as_str()),
                ("private", "public")
            );
            assert_eq!(
                ports_taken(&conn).unwrap().into_iter().collect::<Vec<_>>(),
                vec![7000, 7002, 7003, 7004]
            );
            conn.execute("DELETE FROM clusters WHERE id = 'c1'", params![])
                .unwrap();
            assert_eq!(get(&conn, "c1").unwrap(), None, "gone with its cluster");
            assert!(!uid_taken(&conn, a.uid).unwrap());
        });
    }

    /// A uid is one cluster's (UNIQUE on both engines), and the job ids and uids at the
    /// edges of their types round-trip.
    #[test]
    fn a_uid_is_one_clusters_and_wide_values_round_trip() {
        on_both(|db| {
            let conn = db.conn();
            conn.execute_batch(
                "INSERT INTO tenants (id, name, display_name, labels, token_hash, created_at) VALUES ('t', 't', '', '{}', 'h', 0);
                 INSERT INTO clusters (id, tenant_id, name, orchestrator, gpu_type, node_count, storage_gib, status, endpoint, credentials, storage_path, mig_layout)
                     VALUES ('c1', 't', 'c1', 'slurm', 'H100-80GB', 1, 1, 'running', '', '', '', '{}'),
                            ('c2', 't', 'c2', 'slurm', 'H100-80GB', 1, 1, 'running', '', '', '', '{}');",
            )
            .unwrap();
            let a = SlurmAccess {
                cluster_id: "c1".into(),
                uid: u32::MAX,
                controller_port: u16::MAX,
                next_job_id: i64::MAX as u64,
                first_job_id: 1 << 40,
                ..Default::default()
            };
            insert(&conn, &a).unwrap();
            assert_eq!(get(&conn, "c1").unwrap(), Some(a.clone()));
            let twin = SlurmAccess {
                cluster_id: "c2".into(),
                ..a.clone()
            };
            assert!(insert(&conn, &twin).is_err(), "a uid taken twice");
            assert!(get(&conn, "c2").unwrap().is_none());
        });
    }
}
