//! Several `serve` replicas on one PostgreSQL server (issue 41), with the node agents
//! that join them: the server is a real Debian PostgreSQL the harness starts
//! (`gpufleet_sql::test_server`), each replica a [`Backend`] with its own data dir and
//! port and the admin and join tokens they all share, and each node agent a simulated
//! one that knows every replica's address (it finds the leader: the others turn it
//! away).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use std::time::{Duration, Instant};

use gpufleet_proto::v1::ListNodesRequest;
use gpufleet_sql::test_server::TestServer;

use crate::backend::{generate_token, Backend};
use crate::node_agent::NodeAgent;

/// A safety net for nodes that never become ready (registration and the admission
/// checks take about a second), not a timing assertion.
const READY_LIMIT: Duration = Duration::from_secs(90);

pub struct Replicas {
    /// Dropped first (killed), then the agents, then the database.
    pub replicas: Vec<Backend>,
    pub nodes: Vec<NodeAgent>,
    database_file: PathBuf,
    _dir: tempfile::TempDir,
    database: TestServer,
}

impl Replicas {
    /// Starts a database and `count` replicas `r0`, `r1`, ... of it, one after the other
    /// (`r0` takes the lease first), each with `--lease-ttl ttl` and `extra` flags.
    pub fn start(count: usize, ttl: &str, extra: &[&str]) -> Replicas {
        let database = TestServer::start().unwrap_or_else(|e| {
            panic!("{e} (the HA tests need Debian's postgresql: scripts/bootstrap installs it)")
        });
        let url = database
            .database("gpufleet")
            .unwrap_or_else(|e| panic!("{e}"));
        let dir = tempfile::Builder::new()
            .prefix("gpufleet-replicas-")
            .tempdir()
            .expect("a temp dir");
        // The address holds the password: a file of the operator's, 0600.
        let database_file = dir.path().join("database.url");
        std::fs::write(&database_file, &url).expect("write the database file");
        std::fs::set_permissions(&database_file, std::fs::Permissions::from_mode(0o600))
            .expect("chmod the database file");
        let (admin, join) = (generate_token("admin"), generate_token("join"));
        let file = database_file.display().to_string();
        let replicas = (0..count)
            .map(|i| {
                let id = format!("r{i}");
                let mut args = vec![
                    "--postgres",
                    "--database-file",
                    &file,
                    "--node-agents",
                    "external",
                    "--replica-id",
                    &id,
                    "--lease-ttl",
                    ttl,
                ];
                args.extend_from_slice(extra);
                Backend::start_replica(&admin, &join, &args)
            })
            .collect();
        Replicas {
            replicas,
            nodes: Vec::new(),
            database_file,
            _dir: dir,
            database,
        }
    }

    /// Every replica's endpoint, comma-separated: a node agent's `--control-plane`, the
    /// provider's `endpoints`.
    pub fn endpoints(&self) -> String {
        self.replicas
            .iter()
            .map(Backend::endpoint)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Starts a simulated node agent `name` that knows every replica (`extra`: e.g.
    /// `--capacity on-demand`).
    pub fn start_node(&mut self, name: &str, extra: &[&str]) {
        let agent = NodeAgent::start_dialing(&self.replicas[0], &self.endpoints(), name, extra);
        self.nodes.push(agent);
    }

    /// Waits until `count` nodes are ready, as replica `at` answers (a call a replica
    /// answers UNAVAILABLE, between two leaders, is asked again).
    pub async fn wait_ready(&self, at: usize, count: usize) {
        let deadline = Instant::now() + READY_LIMIT;
        let mut admin = self.replicas[at].admin().await;
        loop {
            let last = match admin.fleet.list_nodes(ListNodesRequest::default()).await {
                Ok(r) => {
                    let nodes = r.into_inner().nodes;
                    let ready = nodes.iter().filter(|n| n.state == "ready").count();
                    if ready >= count {
                        return;
                    }
                    let states: Vec<String> = nodes
                        .iter()
                        .map(|n| format!("{} {}", n.hostname, n.state))
                        .collect();
                    states.join(", ")
                }
                Err(e) => format!("{e:?}"),
            };
            assert!(
                Instant::now() < deadline,
                "{count} nodes not ready within {READY_LIMIT:?}; last: {last}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Kills the database server (every process of it, SIGKILL) and starts it again at
    /// once: it recovers from its WAL, and the replicas connect to it anew.
    pub fn crash_database(&mut self) {
        self.database
            .crash_and_restart()
            .unwrap_or_else(|e| panic!("the database server: {e}"));
    }

    /// The file that holds the database's address (`--database-file`).
    pub fn database_file(&self) -> &Path {
        &self.database_file
    }

    /// Every replica's log, headed by its endpoint, for a failure's message.
    pub fn logs(&self) -> String {
        self.replicas
            .iter()
            .map(|r| format!("--- replica at {} ---\n{}", r.endpoint(), r.log()))
            .collect()
    }
}

/// Waits (on `runtime`) until cluster `name` is being created, as `client` lists it, while
/// `going()` says the apply creating it still runs: the moment a test strikes during a
/// create. Panics, saying `context`, when the apply ended first or after `within`.
pub fn wait_for_create_under_way(
    runtime: &tokio::runtime::Runtime,
    client: &mut crate::Clients,
    name: &str,
    within: Duration,
    going: impl Fn() -> bool,
    context: impl Fn() -> String,
) {
    let deadline = Instant::now() + within;
    loop {
        let clusters = runtime
            .block_on(
                client
                    .clusters
                    .list_tenant_clusters(gpufleet_proto::v1::ListTenantClustersRequest::default()),
            )
            .map(|r| r.into_inner().clusters)
            .unwrap_or_default();
        if clusters
            .iter()
            .any(|c| c.name == name && c.status == "creating")
        {
            return;
        }
        assert!(
            Instant::now() < deadline && going(),
            "the create of {name} was never seen under way\n{}",
            context()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
