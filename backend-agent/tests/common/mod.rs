//! Shared harness: start the real `gpufleet-agent serve` on a free port with a temp data
//! dir, and gRPC clients that carry a bearer token.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};

use gpufleet_proto::v1::{
    access_service_client::AccessServiceClient, fleet_service_client::FleetServiceClient,
    gpu_quota_service_client::GpuQuotaServiceClient, health_service_client::HealthServiceClient,
    reservation_service_client::ReservationServiceClient,
    tenant_cluster_service_client::TenantClusterServiceClient,
    tenant_service_client::TenantServiceClient, *,
};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

pub mod rogue;

pub const ADMIN: &str = "test-admin-token";
pub const HOUR: i64 = 3600;

/// A running agent; killed when dropped.
pub struct Agent {
    child: Option<Child>,
    pub endpoint: String,
    pub data_dir: PathBuf,
}

impl Agent {
    /// Starts with the fixed admin token [`ADMIN`].
    pub fn start(data_dir: &Path) -> Agent {
        Self::start_with(data_dir, &["--admin-token", ADMIN])
    }

    /// Starts with extra `serve` flags and reads the listening line from stdout.
    pub fn start_with(data_dir: &Path, extra: &[&str]) -> Agent {
        Self::start_limited(data_dir, extra, None)
    }

    /// As [`Agent::start_with`], with the process's open-file limit (soft and hard) set to
    /// `open_files` when given, as a service manager's `LimitNOFILE=` would.
    pub fn start_limited(data_dir: &Path, extra: &[&str], open_files: Option<u64>) -> Agent {
        use std::os::unix::process::CommandExt;
        let log = std::fs::File::create(data_dir.with_extension("log")).expect("log file");
        let mut command = Command::new(env!("CARGO_BIN_EXE_gpufleet-agent"));
        command.arg("serve");
        if !extra.contains(&"--listen") {
            command.args(["--listen", "127.0.0.1:0"]);
        }
        command
            .arg("--data-dir")
            .arg(data_dir)
            .args(extra)
            .env_remove("GPUFLEET_ADMIN_TOKEN")
            .env_remove("GPUFLEET_FLEET")
            .stdout(Stdio::piped())
            .stderr(log);
        if let Some(n) = open_files {
            let limit = libc::rlimit {
                rlim_cur: n as libc::rlim_t,
                rlim_max: n as libc::rlim_t,
            };
            // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
            unsafe {
                command.pre_exec(move || {
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = command.spawn().expect("start gpufleet-agent");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .expect("read stdout");
        let endpoint = line
            .trim()
            .strip_prefix("gpufleet-agent listening on ")
            .unwrap_or_else(|| {
                let log =
                    std::fs::read_to_string(data_dir.with_extension("log")).unwrap_or_default();
                panic!("unexpected first line {line:?}; log:\n{log}")
            })
            .to_string();
        Agent {
            child: Some(child),
            endpoint,
            data_dir: data_dir.to_path_buf(),
        }
    }

    /// SIGTERM, then the exit status. Drop clients first: the server waits (briefly) for
    /// open connections.
    pub fn stop(mut self) -> ExitStatus {
        let mut child = self.child.take().unwrap();
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        child.wait().expect("wait for gpufleet-agent")
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        let child = self.child.as_mut().unwrap();
        child.try_wait().expect("poll gpufleet-agent").is_none()
    }

    /// Sends `signal` and waits for the exit. A process still running after `limit` is a
    /// hang: it is killed and the test fails with its log, instead of hanging the suite.
    pub fn signal_and_wait(mut self, signal: i32, limit: std::time::Duration) -> ExitStatus {
        let mut child = self.child.take().unwrap();
        unsafe { libc::kill(child.id() as i32, signal) };
        let deadline = std::time::Instant::now() + limit;
        loop {
            if let Some(status) = child.try_wait().expect("wait for gpufleet-agent") {
                return status;
            }
            if std::time::Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                let log = std::fs::read_to_string(self.data_dir.with_extension("log"))
                    .unwrap_or_default();
                panic!("gpufleet-agent still running {limit:?} after signal {signal}; log:\n{log}");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    pub async fn admin(&self) -> Clients {
        self.clients(ADMIN).await
    }

    pub async fn clients(&self, token: &str) -> Clients {
        clients_at(&self.endpoint, token).await
    }
}

/// Clients of the API at `endpoint` carrying `token`.
pub async fn clients_at(endpoint: &str, token: &str) -> Clients {
    {
        let channel = Channel::from_shared(endpoint.to_string())
            .unwrap()
            .connect()
            .await
            .expect("connect");
        let b = Bearer::new(token).expect("a printable token");
        Clients {
            tenants: TenantServiceClient::with_interceptor(channel.clone(), b.clone()),
            quotas: GpuQuotaServiceClient::with_interceptor(channel.clone(), b.clone()),
            reservations: ReservationServiceClient::with_interceptor(channel.clone(), b.clone()),
            fleet: FleetServiceClient::with_interceptor(channel.clone(), b.clone()),
            clusters: TenantClusterServiceClient::with_interceptor(channel.clone(), b.clone()),
            health: HealthServiceClient::with_interceptor(channel.clone(), b.clone()),
            access: AccessServiceClient::with_interceptor(channel, b),
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // The accounts and runtime dirs of Slurm clusters the test did not destroy.
        gpufleet_slurm::leftovers::forget_all_under(&self.data_dir);
    }
}

/// The clients' interceptor (one for every gpufleet client).
pub type Bearer = gpufleet_proto::BearerAuth;

pub struct Clients {
    pub tenants: TenantServiceClient<InterceptedService<Channel, Bearer>>,
    pub quotas: GpuQuotaServiceClient<InterceptedService<Channel, Bearer>>,
    pub reservations: ReservationServiceClient<InterceptedService<Channel, Bearer>>,
    pub fleet: FleetServiceClient<InterceptedService<Channel, Bearer>>,
    pub clusters: TenantClusterServiceClient<InterceptedService<Channel, Bearer>>,
    pub health: HealthServiceClient<InterceptedService<Channel, Bearer>>,
    pub access: AccessServiceClient<InterceptedService<Channel, Bearer>>,
}

/// The metrics endpoint's address, from the agent's log.
pub fn metrics_addr(agent: &Agent) -> String {
    let log = std::fs::read_to_string(agent.data_dir.with_extension("log")).unwrap();
    let start = log
        .find("Prometheus metrics on http://")
        .expect("the metrics address in the log")
        + "Prometheus metrics on http://".len();
    let rest = &log[start..];
    rest[..rest.find("/metrics").unwrap()].to_string()
}

/// A scrape as Prometheus makes it: with the endpoint's bearer token (generated into the
/// data dir, as no --metrics-token-file is given).
pub fn scrape(agent: &Agent, addr: &str) -> String {
    let token = std::fs::read_to_string(agent.data_dir.join("metrics.token")).unwrap();
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(
        format!(
            "GET /metrics HTTP/1.0\r\nHost: x\r\nAuthorization: Bearer {}\r\n\r\n",
            token.trim()
        )
        .as_bytes(),
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text
}

/// The value of the series that `line_start` begins (name and labels), in a scrape.
pub fn metric_value(text: &str, line_start: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
}

pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

pub fn ts(unix: i64) -> Option<prost_types::Timestamp> {
    Some(gpufleet_proto::timestamp::from_unix(unix))
}

/// A MIG layout (profile -> instances per GPU) from a literal list.
pub fn mig_layout(items: &[(&str, i32)]) -> std::collections::HashMap<String, i32> {
    items.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

/// The status of a call that must fail.
pub fn status<T: std::fmt::Debug>(r: Result<tonic::Response<T>, tonic::Status>) -> tonic::Status {
    r.expect_err("the call should have failed")
}

/// Asserts a failed call's code and that its message contains `text`.
#[track_caller]
pub fn assert_status<T: std::fmt::Debug>(
    r: Result<tonic::Response<T>, tonic::Status>,
    code: tonic::Code,
    text: &str,
) -> String {
    let s = status(r);
    assert_eq!(s.code(), code, "message: {}", s.message());
    assert!(
        s.message().contains(text),
        "expected {text:?} in {:?}",
        s.message()
    );
    s.message().to_string()
}

impl Clients {
    /// Creates a tenant; returns it and its token.
    pub async fn tenant(&mut self, name: &str) -> (Tenant, String) {
        let r = self
            .tenants
            .create_tenant(CreateTenantRequest {
                request_id: format!("create-{name}"),
                name: name.into(),
                ..Default::default()
            })
            .await
            .expect("create tenant")
            .into_inner();
        (r.tenant.unwrap(), r.token)
    }

    pub async fn quota(
        &mut self,
        tenant_id: &str,
        gpu_type: &str,
        gpus: i64,
        burst_gpus: i64,
    ) -> GpuQuota {
        self.quotas
            .create_gpu_quota(CreateGpuQuotaRequest {
                request_id: format!("quota-{tenant_id}-{gpu_type}"),
                tenant_id: tenant_id.into(),
                gpu_type: gpu_type.into(),
                gpus,
                burst_gpus,
                ..Default::default()
            })
            .await
            .expect("create quota")
            .into_inner()
    }

    pub fn reservation(
        tenant_id: &str,
        gpu_type: &str,
        nodes: i64,
        start: i64,
        end: i64,
    ) -> CreateReservationRequest {
        CreateReservationRequest {
            request_id: format!("res-{tenant_id}-{gpu_type}-{nodes}-{start}-{end}"),
            tenant_id: tenant_id.into(),
            gpu_type: gpu_type.into(),
            node_count: nodes,
            start_time: ts(start),
            end_time: ts(end),
            allow_on_demand: false,
            ..Default::default()
        }
    }

    pub fn cluster(
        tenant_id: &str,
        name: &str,
        gpu_type: &str,
        nodes: i64,
    ) -> CreateTenantClusterRequest {
        CreateTenantClusterRequest {
            request_id: format!("cluster-{tenant_id}-{name}"),
            tenant_id: tenant_id.into(),
            name: name.into(),
            orchestrator: "kubernetes".into(),
            gpu_type: gpu_type.into(),
            node_count: nodes,
            ..Default::default()
        }
    }

    /// A reservation request with on-demand overflow allowed.
    pub fn on_demand_reservation(
        tenant_id: &str,
        gpu_type: &str,
        nodes: i64,
        start: i64,
        end: i64,
    ) -> CreateReservationRequest {
        CreateReservationRequest {
            allow_on_demand: true,
            ..Self::reservation(tenant_id, gpu_type, nodes, start, end)
        }
    }

    /// Creates a pool-only reservation that must succeed.
    pub async fn create_reservation(
        &mut self,
        tenant_id: &str,
        gpu_type: &str,
        nodes: i64,
        start: i64,
        end: i64,
    ) -> Reservation {
        self.create_reservation_from(Self::reservation(tenant_id, gpu_type, nodes, start, end))
            .await
    }

    /// Sends a reservation create that must succeed.
    pub async fn create_reservation_from(&mut self, req: CreateReservationRequest) -> Reservation {
        self.reservations
            .create_reservation(req)
            .await
            .expect("create reservation")
            .into_inner()
    }

    /// A reservation update that changes nothing (node_count 0 means "unchanged"); set the
    /// fields to change on top of it.
    pub fn reservation_update(id: &str) -> UpdateReservationRequest {
        UpdateReservationRequest {
            id: id.into(),
            node_count: 0,
            end_time: None,
            allow_on_demand: None,
            ..Default::default()
        }
    }

    /// An update of the node count only.
    pub fn resize_reservation(id: &str, nodes: i64) -> UpdateReservationRequest {
        UpdateReservationRequest {
            node_count: nodes,
            ..Self::reservation_update(id)
        }
    }

    /// An update of allow_on_demand only.
    pub fn set_allow_on_demand(id: &str, allow: bool) -> UpdateReservationRequest {
        UpdateReservationRequest {
            allow_on_demand: Some(allow),
            ..Self::reservation_update(id)
        }
    }

    /// Sends a reservation update that must succeed.
    pub async fn update_reservation(&mut self, req: UpdateReservationRequest) -> Reservation {
        self.reservations
            .update_reservation(req)
            .await
            .expect("update reservation")
            .into_inner()
    }

    pub async fn get_reservation(&mut self, id: &str) -> Reservation {
        self.reservations
            .get_reservation(GetReservationRequest { id: id.into() })
            .await
            .expect("get reservation")
            .into_inner()
    }

    pub async fn delete_reservation(&mut self, id: &str) {
        self.reservations
            .delete_reservation(DeleteReservationRequest { id: id.into() })
            .await
            .expect("delete reservation");
    }

    /// A cluster request that draws its nodes from a reservation.
    pub fn cluster_on_reservation(
        tenant_id: &str,
        name: &str,
        gpu_type: &str,
        nodes: i64,
        reservation_id: &str,
    ) -> CreateTenantClusterRequest {
        CreateTenantClusterRequest {
            reservation_id: reservation_id.into(),
            ..Self::cluster(tenant_id, name, gpu_type, nodes)
        }
    }

    /// Creates a cluster on pool nodes (no reservation) that must succeed.
    pub async fn create_pool_cluster(
        &mut self,
        tenant_id: &str,
        name: &str,
        gpu_type: &str,
        nodes: i64,
    ) -> TenantCluster {
        self.create_cluster(Self::cluster(tenant_id, name, gpu_type, nodes))
            .await
    }

    /// Sends a cluster create that must succeed.
    pub async fn create_cluster(&mut self, req: CreateTenantClusterRequest) -> TenantCluster {
        self.clusters
            .create_tenant_cluster(req)
            .await
            .expect("create tenant cluster")
            .into_inner()
    }

    /// Sends a cluster update that must succeed.
    pub async fn update_cluster(&mut self, req: UpdateTenantClusterRequest) -> TenantCluster {
        self.clusters
            .update_tenant_cluster(req)
            .await
            .expect("update tenant cluster")
            .into_inner()
    }

    pub async fn get_cluster(&mut self, id: &str) -> TenantCluster {
        self.clusters
            .get_tenant_cluster(GetTenantClusterRequest { id: id.into() })
            .await
            .expect("get tenant cluster")
            .into_inner()
    }

    pub async fn delete_cluster(&mut self, id: &str) {
        self.clusters
            .delete_tenant_cluster(DeleteTenantClusterRequest { id: id.into() })
            .await
            .expect("delete tenant cluster");
    }

    pub async fn usage(&mut self, tenant_id: &str, gpu_type: &str) -> QuotaUsage {
        self.quotas
            .get_quota_usage(QuotaUsageRequest {
                tenant_id: tenant_id.into(),
                gpu_type: gpu_type.into(),
            })
            .await
            .expect("get quota usage")
            .into_inner()
    }

    /// Every node this token may list.
    pub async fn nodes(&mut self) -> Vec<Node> {
        self.fleet
            .list_nodes(ListNodesRequest::default())
            .await
            .expect("list nodes")
            .into_inner()
            .nodes
    }

    /// The nodes of one GPU model, as this caller sees them.
    pub async fn nodes_of(&mut self, gpu_type: &str) -> Vec<Node> {
        self.fleet
            .list_nodes(ListNodesRequest {
                gpu_type: gpu_type.into(),
                ..Default::default()
            })
            .await
            .expect("list nodes")
            .into_inner()
            .nodes
    }

    pub async fn gpu_types(&mut self) -> Vec<GpuType> {
        self.fleet
            .list_gpu_types(ListGpuTypesRequest {})
            .await
            .expect("list gpu types")
            .into_inner()
            .gpu_types
    }

    pub async fn tenant_count(&mut self) -> usize {
        self.tenants
            .list_tenants(ListTenantsRequest::default())
            .await
            .expect("list tenants")
            .into_inner()
            .tenants
            .len()
    }

    /// Asserts the store still equals `before` (a [`Clients::snapshot`]).
    pub async fn assert_unchanged(&mut self, before: &str, why: &str) {
        assert_eq!(self.snapshot().await, before, "{why}");
    }

    /// Everything the admin can list, as text: equal snapshots mean an unchanged store
    /// (reservation statuses and heartbeat ages aside, which move with the clock).
    pub async fn snapshot(&mut self) -> String {
        let tenants = self
            .tenants
            .list_tenants(ListTenantsRequest::default())
            .await
            .unwrap()
            .into_inner();
        let quotas = self
            .quotas
            .list_gpu_quotas(ListGpuQuotasRequest::default())
            .await
            .unwrap()
            .into_inner();
        let mut reservations = self
            .reservations
            .list_reservations(ListReservationsRequest::default())
            .await
            .unwrap()
            .into_inner();
        for r in &mut reservations.reservations {
            r.status.clear();
        }
        let clusters = self
            .clusters
            .list_tenant_clusters(ListTenantClustersRequest::default())
            .await
            .unwrap()
            .into_inner();
        let mut nodes = self
            .fleet
            .list_nodes(ListNodesRequest::default())
            .await
            .unwrap()
            .into_inner();
        // Heartbeat ages move with the clock (and a restart's health checks) too.
        for n in &mut nodes.nodes {
            n.heartbeat_age_seconds = 0;
        }
        format!("{tenants:?}\n{quotas:?}\n{reservations:?}\n{clusters:?}\n{nodes:?}")
    }
}

/// `serve` for tests of rogue agents (`rogue`): one whole A100 node of the control
/// plane's own, so that the H100 nodes are the rogues' alone, a 2s node timeout and
/// metrics; `extra` adds flags.
pub fn start_for_rogues(dir: &Path, extra: &[&str]) -> Agent {
    let fleet = dir.join("fleet.toml");
    std::fs::write(
        &fleet,
        "[[pool]]\ngpu_type = \"A100-40GB\"\nnodes = 1\ngpus_per_node = 1\n",
    )
    .unwrap();
    let mut args = vec![
        "--admin-token",
        ADMIN,
        "--fleet",
        fleet.to_str().unwrap(),
        "--node-timeout",
        "2s",
        "--metrics-listen",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    Agent::start_with(&dir.join("data"), &args)
}

pub async fn node(admin: &mut Clients, name: &str) -> Option<Node> {
    admin.nodes().await.into_iter().find(|n| n.hostname == name)
}

/// Waits (up to 60 s) until `name` is in `state`; panics naming what it saw. A state in
/// `never` seen on the way fails at once.
pub async fn wait_state(admin: &mut Clients, name: &str, state: &str, never: &[&str]) -> Node {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut seen = Vec::new();
    loop {
        if let Some(n) = node(admin, name).await {
            assert!(
                !never.contains(&n.state.as_str()),
                "{name} was {} ({}) on the way to {state}; seen {seen:?}",
                n.state,
                n.state_reason
            );
            if n.state == state {
                return n;
            }
            if seen.last() != Some(&n.state) {
                seen.push(n.state.clone());
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{name} never became {state}; seen {seen:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// A rogue node that registered and passed its admission check: ready.
pub async fn ready_rogue(
    agent: &Agent,
    admin: &mut Clients,
    name: &str,
    gpus: usize,
) -> rogue::Rogue {
    let mut rogue = rogue::Rogue::register(
        &agent.endpoint,
        &agent.data_dir,
        rogue::registration(name, "H100-80GB", gpus),
    )
    .await
    .expect("registered");
    let check = rogue.next_order().await;
    rogue.pass_check(&check);
    wait_state(admin, name, "ready", &["quarantined"]).await;
    rogue
}
