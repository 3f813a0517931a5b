//! The control plane as one value. [`ControlPlane::open`] takes its [`Config`] (`serve`'s
//! flags, parsed by the binary), checks it, opens and seeds the state and recovers what a
//! previous run left; [`ControlPlane::start_tasks`] starts its background work and
//! [`ControlPlane::serve`] the gRPC API, both until the stop flag turns true.
//!
//! The fleet is one of [`Fleet`]: external node agents that register, the simulated fleet
//! of a fleet file, or this host alone through NVML (seeded on first start from what it
//! reports, see `crate::host`). For the last two the binary runs embedded node agents for
//! [`ControlPlane::embedded_hosts`]; they connect to [`ControlPlane::agent_service`] over
//! loopback like any external agent.

use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use gpufleet_gpu::hardware::{GpuBackend, SimulatedNode};
use gpufleet_process::data_dir::DataDirLock;
use gpufleet_process::signals::stopped;
use gpufleet_proto::limits::MAX_MESSAGE_BYTES;
use gpufleet_proto::v1::{
    fleet_service_server::FleetServiceServer, gpu_quota_service_server::GpuQuotaServiceServer,
    node_agent_service_server::NodeAgentServiceServer,
    reservation_service_server::ReservationServiceServer,
    tenant_cluster_service_server::TenantClusterServiceServer,
    tenant_service_server::TenantServiceServer,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::agents::service::Agents;
use crate::services::{
    clusters::Clusters, fleet::Fleet as FleetApi, quotas::Quotas, reservations::Reservations,
    tenants::Tenants,
};
use crate::state::AppState;
use crate::{auth, fleet, store};

/// How long open connections may linger after a shutdown signal.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// Where the control plane's nodes come from.
pub enum Fleet {
    /// Whoever registers with the join token (`--node-agents external`).
    External,
    /// The simulated fleet of a fleet file, or the built-in one, as embedded agents.
    Simulated { fleet_file: Option<PathBuf> },
    /// This host alone, through NVML, as the fleet's one pool node.
    ThisHost(Arc<dyn GpuBackend>),
}

/// What `serve` was asked for.
pub struct Config {
    pub listen: SocketAddr,
    /// Where node agents and tenants reach this host's Slurm controllers and logins.
    pub advertise_address: std::net::IpAddr,
    /// Plain http on an address other than loopback is allowed.
    pub insecure: bool,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// The CA whose certificates node agents must present (mutual TLS).
    pub agent_ca: Option<PathBuf>,
    /// That CA's revocation list of agent certificates (`pki --revoke`).
    pub agent_crl: Option<PathBuf>,
    /// How often the TLS files are looked at for a renewal (SIGHUP: at once).
    pub tls_reload_every: Duration,
    pub data_dir: PathBuf,
    /// The platform's shared storage (`--shared-storage`): a btrfs every host mounts at
    /// this path, where tenant clusters' volumes live; None: unsized directories in the
    /// data dir.
    pub shared_storage: Option<PathBuf>,
    pub fleet: Fleet,
    /// Generated into `<data-dir>/admin.token` (and `join.token`) when `None`.
    pub admin_token: Option<String>,
    pub join_token: Option<String>,
    /// The drivers on offer; empty: the fleet file's, else every known release.
    pub drivers: Vec<String>,
    pub node_timeout: Duration,
    pub replace_after: Duration,
    /// How long each kind of work order may go unanswered.
    pub order_deadlines: crate::deadlines::OrderDeadlines,
    pub health: crate::scheduling::health::Settings,
    pub max_open_reservations: u32,
    pub metrics_listen: Option<SocketAddr>,
    /// The bearer token a scrape of the metrics must present, read from this file;
    /// generated into `<data-dir>/metrics.token` when `None`.
    pub metrics_token_file: Option<PathBuf>,
    /// Label per-tenant series with the tenant's name too (by default only its id).
    pub metrics_tenant_names: bool,
    /// Where the time comes from (tests: a file).
    pub clock: crate::clock::Clock,
    /// Bus bandwidth per GPU model the fleet delivers (`--bus-bandwidth`), over the fleet
    /// file's `bus_bandwidth_gbps`: tenants' acceptance thresholds are bounded by it.
    pub delivers: fleet::Delivers,
    /// The automatic-quarantine breaker: how many quarantines per model and window.
    pub breaker: crate::scheduling::breaker::Settings,
    /// How many nodes may wait to be admitted, and for how long.
    pub candidates: crate::state::CandidateSettings,
    /// How much of the audit log is kept (`--audit-keep*`).
    pub audit_retention: crate::audit::Retention,
    /// The TCP ports new Slurm controllers, slurmds and logins listen on.
    pub slurm_ports: gpufleet_slurm::PortRange,
    /// The operator's price list (`--prices`), which prices GetUsage's rows.
    pub prices: Option<crate::usage_cost::PriceBook>,
    /// How durable a commit is, and whether a store behind its commit record is served
    /// (`--durability`, `--accept-rollback`).
    pub store: store::OpenOptions,
    /// The PostgreSQL database every replica shares (its address), instead of the data
    /// dir's SQLite file (`--postgres`).
    pub database: Option<String>,
    /// The bounds on the API's connections; what is not given follows the file limit
    /// `serve` runs with (`crate::connections::Limits::for_file_limit`).
    pub connections: crate::connections::Wanted,
    /// This replica's id and the singletons' lease TTL (`--replica-id`, `--lease-ttl`).
    pub lease: crate::lease::Settings,
    /// Where the other replicas reach this one's API (`--api-url`); None: the scheme, the
    /// listening address (or `advertise_address` when that is unspecified) and the bound
    /// port.
    pub api_url: Option<String>,
}

impl Config {
    /// `serve`'s defaults for a data dir and a fleet: loopback on a free port, no TLS,
    /// generated tokens, every known driver (or the fleet file's) on offer.
    pub fn new(data_dir: PathBuf, fleet: Fleet) -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            advertise_address: std::net::IpAddr::from([127, 0, 0, 1]),
            insecure: false,
            tls_cert: None,
            tls_key: None,
            agent_ca: None,
            agent_crl: None,
            tls_reload_every: Duration::from_secs(30),
            data_dir,
            shared_storage: None,
            fleet,
            admin_token: None,
            join_token: None,
            drivers: Vec::new(),
            node_timeout: Duration::from_secs(30),
            replace_after: Duration::from_secs(300),
            order_deadlines: Default::default(),
            health: Default::default(),
            max_open_reservations: crate::state::DEFAULT_MAX_OPEN_RESERVATIONS,
            metrics_listen: None,
            metrics_token_file: None,
            metrics_tenant_names: false,
            clock: Default::default(),
            delivers: Default::default(),
            breaker: Default::default(),
            candidates: Default::default(),
            audit_retention: Default::default(),
            slurm_ports: Default::default(),
            prices: None,
            store: Default::default(),
            database: None,
            connections: Default::default(),
            lease: Default::default(),
            api_url: None,
        }
    }
}

/// A node an embedded agent should run for: its name, capacity, model and hardware.
pub struct EmbeddedHost {
    pub name: String,
    pub capacity: String,
    pub gpu_type: String,
    pub backend: Arc<dyn GpuBackend>,
    /// Set for simulated hardware (which `<data-dir>/sim-faults.toml` can then reach).
    pub sim: Option<Arc<SimulatedNode>>,
    /// The driver a simulated node runs now (its record's).
    pub driver_version: String,
    /// The CPUs and memory (MiB) a simulated node declares to Slurm (its fleet group's, as
    /// recorded); None for this host's own.
    pub declared: Option<(u32, u64)>,
}

/// Every node of the store as an embedded host with simulated GPUs (its recorded MIG
/// state and driver, and what it declares to Slurm).
pub fn simulated_hosts(conn: &impl gpufleet_sql::AsConn) -> anyhow::Result<Vec<EmbeddedHost>> {
    crate::recorded::simulated_nodes(conn)?
        .into_iter()
        .map(|(row, sim)| {
            let sim = Arc::new(sim);
            let declared = store::nodes::host(conn, &row.id)?.map(|h| (h.cpus, h.memory_mib));
            Ok(EmbeddedHost {
                declared,
                name: row.hostname,
                capacity: row.capacity,
                gpu_type: row.gpu_type,
                backend: sim.clone(),
                sim: Some(sim),
                driver_version: row.driver_version,
            })
        })
        .collect()
}

/// The metrics endpoint to serve: where, the token a scrape presents, what it labels.
struct Metrics {
    listen: SocketAddr,
    token: String,
    tenant_names: bool,
}

/// How to get the metrics token, at the end of a refused scrape's answer.
const METRICS_TOKEN_HINT: &str = "scrape with the token of serve's --metrics-token-file (default <data-dir>/metrics.token) for the whole fleet, or a tenant's token for its own clusters, e.g. Prometheus' authorization.credentials_file";

/// The metrics token in `path` (the operator's): trimmed, and usable as a bearer token.
fn metrics_token(path: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--metrics-token-file: cannot read {}", path.display()))?;
    let token = text.trim();
    if token.is_empty() {
        anyhow::bail!("--metrics-token-file: {} is empty", path.display());
    }
    if let Some(c) = token.chars().find(|c| !c.is_ascii_graphic()) {
        anyhow::bail!(
            "--metrics-token-file: the token in {} holds {c:?}; a bearer token is printable ASCII without spaces",
            path.display()
        );
    }
    let max = gpufleet_proto::limits::MAX_TOKEN_CHARS;
    if token.len() > max {
        anyhow::bail!(
            "--metrics-token-file: the token in {} is {} characters long, {max} at most",
            path.display(),
            token.len()
        );
    }
    Ok(token.to_string())
}

/// An opened control plane: its state, and what serving it needs.
pub struct ControlPlane {
    pub state: Arc<AppState>,
    tls: Option<Arc<crate::tls_reload::ReloadableTls>>,
    tls_reload_every: Duration,
    audit_retention: crate::audit::Retention,
    listen: SocketAddr,
    metrics: Option<Metrics>,
    require_client_cert: bool,
    /// The CA a replica that does not lead verifies the leader's certificate with.
    replica_ca: Option<PathBuf>,
    api_url: Option<String>,
    connections: crate::connections::Limits,
    embedded: Vec<EmbeddedHost>,
    tasks: Vec<JoinHandle<()>>,
    /// Held while this value lives (the kernel drops it even on SIGKILL); marked stopping
    /// when the stop flag turns, so a restart waits for it.
    lock: Arc<DataDirLock>,
}

impl ControlPlane {
    /// Checks `config`, then opens the data dir (locked), the store and the tokens, seeds
    /// the fleet and recovers interrupted work. Blocking: call it off the async workers.
    pub fn open(config: Config) -> anyhow::Result<Self> {
        // A bad certificate or key fails before the data dir is touched.
        let tls = gpufleet_wire::server_tls::ServerTlsFiles::from_flags(
            config.tls_cert.as_deref(),
            config.tls_key.as_deref(),
            config.agent_ca.as_deref(),
            config.agent_crl.as_deref(),
        )?
        .map(crate::tls_reload::ReloadableTls::open)
        .transpose()?;
        if tls.is_none() && !config.listen.ip().is_loopback() && !config.insecure {
            anyhow::bail!(
                "--listen: {} is not a loopback address and TLS is off, so tokens would cross the network in clear text; give --tls-cert/--tls-key (and --agent-ca for node agents), or --insecure to accept that",
                config.listen
            );
        }
        crate::lease::check_replica_id(&config.lease.replica)
            .and_then(|()| crate::lease::check_ttl(config.lease.ttl))
            .map_err(|e| anyhow::anyhow!("--{e}"))?;
        // A bad fleet file, too, is refused before the data dir exists.
        let fleet_def = match &config.fleet {
            Fleet::Simulated { fleet_file } => Some(fleet::load(fleet_file.as_deref())?),
            _ => None,
        };
        // Private before anything is written: the store holds every tenant's keys.
        let data_dir =
            gpufleet_process::data_dir::private(&config.data_dir, &[crate::state::VOLUMES])?;
        let lock = DataDirLock::acquire(&data_dir)?;
        // The data dir's SQLite file (checked against its commit record), or the
        // PostgreSQL database every replica shares, made current.
        let (mut db, record) = match &config.database {
            None => {
                let (conn, record) = store::open_checked(&data_dir.join("state.db"), config.store)?;
                (gpufleet_sql::Database::sqlite(conn), Some(record))
            }
            Some(url) => {
                let shown = gpufleet_sql::database::redacted(url);
                let mut db = gpufleet_sql::Database::postgres(url)
                    .with_context(|| format!("connecting to {shown}"))?;
                store::postgres::migrate(&mut db, config.clock.now())
                    .with_context(|| format!("making {shown}'s schema current"))?;
                tracing::info!(database = %shown, "serving the store on PostgreSQL");
                (db, None)
            }
        };
        // Every write of this start holds the writer's lock, as the writer does later.
        let lock_key = crate::group_commit::WRITER_LOCK;
        // The singletons' lease, before anything of theirs runs. On SQLite the data dir's
        // lock says no other replica of this store is alive: the lease of a former process
        // is taken over at once, with a higher epoch. On PostgreSQL other replicas may be
        // alive: the lease is taken over only once it has expired.
        let leadership = Arc::new(crate::lease::Leadership::new(config.lease.clone()));
        let at_start = {
            let asked = std::time::Instant::now();
            let exclusive = config.database.is_none();
            let now = config.clock.now();
            let acquired =
                db.write_exclusive(lock_key, |c| leadership.acquire(c, now, exclusive))?;
            leadership.record(&acquired, asked);
            acquired
        };
        let mut offered = config.drivers.clone();
        let mut delivers = fleet::Delivers::default();
        // External agents mount each cluster's volume on its nodes; embedded ones are this
        // host, which has the shared storage itself.
        let external_nodes = matches!(config.fleet, Fleet::External);
        let embedded = match config.fleet {
            Fleet::External => Vec::new(),
            Fleet::ThisHost(backend) => {
                let now = config.clock.now();
                let (node_id, created) =
                    db.write_exclusive(lock_key, |c| Ok(crate::host::seed(c, &*backend, now)))??;
                if created {
                    tracing::info!(node = %node_id, "seeded this host as the fleet's one node");
                }
                let gpus = backend
                    .gpus()
                    .map_err(|e| anyhow::anyhow!("--hardware nvml: {e}"))?;
                vec![EmbeddedHost {
                    name: node_id,
                    capacity: store::nodes::POOL.into(),
                    gpu_type: gpufleet_wire::inventory::host_model(&gpus)?.name.clone(),
                    backend,
                    sim: None,
                    driver_version: String::new(),
                    declared: None,
                }]
            }
            Fleet::Simulated { .. } => {
                let Some(fleet_def) = fleet_def else {
                    anyhow::bail!("the fleet file was not read");
                };
                if offered.is_empty() {
                    offered = fleet_def.drivers.clone();
                }
                delivers = fleet_def.delivers();
                let now = config.clock.now();
                let seeded =
                    db.write_exclusive(lock_key, |c| Ok(fleet::seed(c, &fleet_def, now)))??;
                if seeded > 0 {
                    tracing::info!(nodes = seeded, "seeded the simulated fleet");
                }
                // Only the fleet file's own nodes run embedded: a node that registered
                // with the join token (anyone may claim `sim`) keeps waiting for its own
                // agent, and cannot make a restart wait for it.
                let declared: std::collections::BTreeSet<String> = fleet::declared(&fleet_def)
                    .into_iter()
                    .map(|(_, _, host)| host)
                    .collect();
                db.read(|c| Ok(simulated_hosts(c)))??
                    .into_iter()
                    .filter(|h| declared.contains(&h.name))
                    .collect()
            }
        };
        let volumes = match &config.shared_storage {
            Some(root) => crate::volumes::Volumes::shared(root)
                .map_err(anyhow::Error::msg)?
                .with_node_mounts(external_nodes),
            // External agents make node-local volumes; embedded ones use the data dir's.
            None => crate::volumes::Volumes::in_data_dir(data_dir.join(crate::state::VOLUMES))
                .with_node_mounts(external_nodes),
        };
        let now = config.clock.now();
        // Recovery treats this start as the store's only process. On PostgreSQL a replica
        // that finds another leading does not run it: that one's work is not interrupted.
        let recover = matches!(at_start, crate::store::leases::Acquired::Held(_));
        if !recover {
            tracing::info!("another replica leads: start-up recovery is left to it");
        }
        db.write_exclusive(lock_key, |c| {
            if !recover {
                return Ok(Ok(()));
            }
            Ok(
                crate::scheduling::clusters::recover_interrupted(c, &volumes, now).and_then(|()| {
                    // Those include the take-backs a former leader left unrecorded: their
                    // marks go, so that no later leader takes a request's `updating` for
                    // one of them.
                    store::take_backs::clear_all(c)?;
                    // Every agent registers anew with this process.
                    store::nodes::await_agents(c, now)?;
                    Ok(())
                }),
            )
        })??;
        let (admin_token, admin_token_file) = match config.admin_token.filter(|t| !t.is_empty()) {
            Some(t) => (t, None),
            None => (
                token_file(&data_dir, "admin.token", "gfa_")?,
                Some(data_dir.join("admin.token")),
            ),
        };
        let join_tokens = match config
            .join_token
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty())
        {
            Some(t) => crate::join_tokens::JoinTokens::fixed(t),
            None => crate::join_tokens::JoinTokens::new(
                token_file(&data_dir, "join.token", "gfj_")?,
                Some(data_dir.join("join.token")),
            )
            .context("cannot read the retiring join tokens beside join.token")?,
        };
        let join_token = join_tokens.current();
        let metrics = match config.metrics_listen {
            None => None,
            Some(listen) => Some(Metrics {
                listen,
                token: match &config.metrics_token_file {
                    Some(path) => metrics_token(path)?,
                    None => token_file(&data_dir, "metrics.token", "gfm_")?,
                },
                tenant_names: config.metrics_tenant_names,
            }),
        };
        let drivers = if offered.is_empty() {
            crate::drivers::Offer::all()
        } else {
            crate::drivers::Offer::only(&offered).map_err(|e| anyhow::anyhow!("--{e}"))?
        };
        let connections = connection_limits(config.connections)?;
        let registry = crate::registry::Registry::new(config.node_timeout, config.replace_after)
            .with_deadlines(config.order_deadlines.clone())
            .with_leadership(leadership);
        let state = Arc::new(
            match &config.database {
                None => AppState::with_commit_record(
                    db.into_sqlite().expect("an SQLite store"),
                    record,
                    data_dir,
                    admin_token,
                    join_token,
                    registry,
                    drivers,
                ),
                Some(url) => {
                    drop(db);
                    AppState::on_postgres(url, data_dir, admin_token, join_token, registry, drivers)
                }
            }
            .with_admin_token_file(admin_token_file)
            .with_join_tokens(join_tokens)
            .with_health(config.health)
            .with_max_open_reservations(config.max_open_reservations)
            .with_clock(config.clock)
            .with_delivers(delivers.overridden_by(&config.delivers))
            .with_breaker(config.breaker)
            .with_candidates(config.candidates)
            .with_slurm_address(config.advertise_address)
            .with_slurm_ports(config.slurm_ports)
            .with_prices(config.prices)
            .with_external_nodes(external_nodes)
            .with_volumes(volumes),
        );
        Ok(Self {
            state,
            tls,
            tls_reload_every: config.tls_reload_every,
            audit_retention: config.audit_retention,
            listen: config.listen,
            metrics,
            require_client_cert: config.agent_ca.is_some(),
            replica_ca: config.agent_ca.clone(),
            api_url: config.api_url.clone(),
            connections,
            embedded,
            tasks: Vec::new(),
            lock: Arc::new(lock),
        })
    }

    /// The nodes embedded agents should run for (taken once).
    pub fn embedded_hosts(&mut self) -> Vec<EmbeddedHost> {
        std::mem::take(&mut self.embedded)
    }

    /// The NodeAgentService that agents connect to, for a listener of the caller's (the
    /// embedded agents' loopback one); without client certificates.
    pub fn agent_service(&self) -> NodeAgentServiceServer<Agents> {
        NodeAgentServiceServer::new(Agents {
            state: self.state.clone(),
            require_client_cert: false,
            revocations: None,
        })
    }

    /// Starts the watch over heartbeats, preemption, periodic health checks, Slurm
    /// supervision, refills of clusters short of nodes, drift sweeps, the counting of GPU
    /// utilisation as usage and the metrics endpoint; [`ControlPlane::serve`] joins them.
    ///
    /// The singletons among them run only while this replica holds the singletons' lease,
    /// which it renews meanwhile (`crate::lease`).
    pub async fn start_tasks(&mut self, stop: &watch::Receiver<bool>) -> anyhow::Result<()> {
        let state = &self.state;
        self.tasks
            .push(tokio::spawn(renew_lease(state.clone(), stop.clone())));
        macro_rules! singleton {
            ($name:literal, $run:path) => {{
                let state = state.clone();
                tokio::spawn(crate::lease::while_leader(
                    state.lease().clone(),
                    stop.clone(),
                    $name,
                    move |stop| $run(state.clone(), stop),
                ))
            }};
        }
        self.tasks.extend([
            singleton!("monitor", crate::agents::monitor::run),
            singleton!("take_back", crate::scheduling::take_back::run),
            singleton!("health", crate::scheduling::health::run_periodic),
            singleton!("slurm", crate::slurm_clusters::supervise),
            singleton!("refills", crate::services::clusters::run_refills),
            singleton!("admissions", crate::services::admissions::run),
            singleton!("drift", crate::mig::run_drift_sweeps),
            singleton!("takeover", crate::takeover::settle),
            tokio::spawn(fail_orders_when_not_leading(state.clone(), stop.clone())),
            tokio::spawn(crate::metering::run(state.clone(), stop.clone())),
        ]);
        if let Some(m) = &self.metrics {
            // The bearer token decides the view: the operator's everything, a tenant's
            // its own (`metrics::view`).
            let (state, names) = (state.clone(), m.tenant_names);
            let operator: Arc<str> = Arc::from(m.token.as_str());
            let slots = Arc::new(crate::metrics::view::Slots::default());
            let render = move |token: String| {
                let (state, operator) = (state.clone(), operator.clone());
                crate::metrics::view::render(state, names, operator, slots.clone(), token)
            };
            let bound = gpufleet_process::metrics_endpoint::listen_by_token(
                m.listen,
                "control plane",
                METRICS_TOKEN_HINT,
                render,
                stop.clone(),
            )
            .await?;
            let _ = self.state.metrics_address.set(bound);
        }
        Ok(())
    }

    /// Waits until each of `names` has registered and settled: ready, or quarantined by a
    /// failed check.
    pub async fn await_nodes_settled(
        &self,
        names: &[String],
        within: Duration,
    ) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let names = names.to_vec();
            let waiting = self
                .state
                .read(move |conn| -> crate::error::Result<Vec<String>> {
                    let mut waiting = Vec::new();
                    for name in names {
                        let settled = store::nodes::by_hostname(conn, &name)?.is_some_and(|n| {
                            n.state == store::nodes::NODE_READY
                                || n.state == store::nodes::NODE_QUARANTINED
                        });
                        if !settled {
                            waiting.push(name);
                        }
                    }
                    Ok(waiting)
                })
                .await?;
            if waiting.is_empty() {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                anyhow::bail!(
                    "embedded node agents not ready within {within:?}: {}",
                    waiting.join(", ")
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Binds the API's address, prints the one line on stdout that says where it listens,
    /// and serves until `stop` turns true; then joins the background tasks.
    pub async fn serve(mut self, stop: watch::Receiver<bool>) -> anyhow::Result<()> {
        let listener = tokio::net::TcpListener::bind(self.listen)
            .await
            .with_context(|| format!("cannot listen on {}", self.listen))?;
        let addr = listener.local_addr()?;
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        // The one line on stdout: tests and scripts read the real port from it.
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "gpufleet-agent listening on {scheme}://{addr}")?;
        stdout.flush()?;
        drop(stdout);
        // The lease says where the leader serves: the other replicas forward to it.
        let api_url = self.api_url.clone().unwrap_or_else(|| {
            let ip = if addr.ip().is_unspecified() {
                self.state.slurm_address
            } else {
                addr.ip()
            };
            format!("{scheme}://{}", SocketAddr::new(ip, addr.port()))
        });
        self.state.lease().set_url(&api_url);
        tracing::info!(%addr, scheme, data_dir = %self.state.data_dir.display(), "serving");
        {
            let (lock, mut stop) = (self.lock.clone(), stop.clone());
            tokio::spawn(async move {
                stopped(&mut stop).await;
                lock.mark_stopping();
            });
        }

        // On SIGINT/SIGTERM: close the listening socket at once (new clients are refused,
        // not left waiting in the backlog), let in-flight calls finish, and give
        // connections that stay open (idle clients, clients that never speak) a bounded
        // grace period. Connections are bounded in number, per peer and in time.
        let table = crate::connections::Table::new(self.connections.clone());
        let (incoming, accepting) =
            crate::connections::accept::accept(listener, table.clone(), stop.clone());
        let shutdown = {
            let mut stop = stop.clone();
            async move { stopped(&mut stop).await }
        };
        let grace = {
            let mut stop = stop.clone();
            async move {
                stopped(&mut stop).await;
                tokio::time::sleep(SHUTDOWN_GRACE).await;
            }
        };
        // A partitioned agent's connection stays open and silent (TCP to a black hole
        // retries for many minutes): PINGs unanswered within the node timeout close it,
        // so its session's task ends instead of waiting on a dead socket.
        let keepalive = (self.state.agents.node_timeout / 2).max(Duration::from_millis(500));
        // The audit log's writer ends once the server is gone, after writing what was
        // queued.
        let (audit, audit_writer, audit_close) =
            crate::audit::AuditLayer::new(self.state.clone(), self.audit_retention);
        let audit_writer = tokio::spawn(audit_writer);
        if let Some(tls) = &self.tls {
            self.tasks.push(tokio::spawn(
                tls.clone().watch(self.tls_reload_every, stop.clone()),
            ));
        }
        let revocations = self.tls.as_ref().map(|t| t.revocations());
        let router = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(keepalive))
            .http2_keepalive_timeout(Some(keepalive))
            .layer(crate::metrics::api::ApiMetricsLayer)
            .layer(crate::services::short_errors::ShortErrorsLayer)
            .layer(crate::services::request_framing::RequestFramingLayer)
            .layer(crate::connections::activity::ActivityLayer::new(table))
            .layer(crate::services::to_leader::ToLeaderLayer::new(
                self.state.clone(),
                self.replica_ca.clone(),
            ))
            .layer(audit)
            .add_service(
                gpufleet_proto::v1::access_service_server::AccessServiceServer::new(
                    crate::services::tokens::Access {
                        state: self.state.clone(),
                    },
                )
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            )
            .add_service(
                TenantServiceServer::new(Tenants {
                    state: self.state.clone(),
                })
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            )
            .add_service(
                GpuQuotaServiceServer::new(Quotas {
                    state: self.state.clone(),
                })
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            )
            .add_service(
                ReservationServiceServer::new(Reservations {
                    state: self.state.clone(),
                })
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            )
            .add_service(
                FleetServiceServer::new(FleetApi {
                    state: self.state.clone(),
                })
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            )
            .add_service(
                TenantClusterServiceServer::new(Clusters {
                    state: self.state.clone(),
                })
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            )
            .add_service(
                gpufleet_proto::v1::health_service_server::HealthServiceServer::new(
                    crate::services::health::Health {
                        state: self.state.clone(),
                    },
                )
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            )
            .add_service(NodeAgentServiceServer::new(Agents {
                state: self.state.clone(),
                require_client_cert: self.require_client_cert,
                revocations,
            }));
        let server: std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<(), tonic::transport::Error>> + Send>,
        > = match &self.tls {
            Some(tls) => Box::pin(router.serve_with_incoming_shutdown(
                crate::connections::tls::handshakes(incoming, tls.clone()),
                shutdown,
            )),
            None => Box::pin(router.serve_with_incoming_shutdown(incoming, shutdown)),
        };
        // The accept loop ends only on the stop flag: if it ends otherwise the API is
        // gone while the process lives, so serve fails and a supervisor restarts it.
        let listener_died = {
            let stop = stop.clone();
            async move {
                let ended = accepting.await;
                if *stop.borrow() {
                    std::future::pending::<()>().await;
                }
                ended
            }
        };
        tokio::select! {
            result = server => result?,
            _ = grace => tracing::info!("closing connections still open after the grace period"),
            ended = listener_died => {
                let why = match ended {
                    Err(e) => format!("its task failed: {e}"),
                    Ok(()) => "the server stopped taking connections".to_string(),
                };
                anyhow::bail!("the API listener on {addr} stopped while serving ({why}); exiting so that a supervisor restarts serve");
            }
        }
        audit_close.close();
        if tokio::time::timeout(SHUTDOWN_GRACE, audit_writer)
            .await
            .is_err()
        {
            tracing::warn!("audit entries still queued after the grace period are lost");
        }
        // Background tasks end on the same flag; one that does not within the grace
        // period is left to the runtime's shutdown.
        let joined = futures_join(self.tasks);
        if tokio::time::timeout(SHUTDOWN_GRACE, joined).await.is_err() {
            tracing::warn!("background tasks still running after the grace period");
        }
        tracing::info!("shut down cleanly");
        Ok(())
    }
}

/// Each time this replica stops leading, fails the orders it waits on: their agents move to
/// the replica that leads and answer there, so the changes that sent them end (and are
/// settled by the leader) rather than wait out the orders' deadlines.
async fn fail_orders_when_not_leading(state: Arc<AppState>, mut stop: watch::Receiver<bool>) {
    let mut leads = state.lease().watch();
    loop {
        tokio::select! {
            _ = leads.wait_for(Option::is_some) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        tokio::select! {
            _ = leads.wait_for(Option::is_none) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let failed = state.agents.fail_all_waiting(
            "this replica stopped leading; the order goes unanswered here (node agents answer the replica that leads)",
        );
        if failed > 0 {
            tracing::warn!(
                orders = failed,
                "this replica stopped leading: failed the orders it waited on"
            );
        }
    }
}

/// Renews the singletons' lease through the writer until `stop`, then releases it.
async fn renew_lease(state: Arc<AppState>, stop: watch::Receiver<bool>) {
    let leadership = state.lease().clone();
    let renew = {
        let state = state.clone();
        move || {
            let (state, leadership) = (state.clone(), state.lease().clone());
            async move {
                let now = state.now();
                state
                    .apply(move |conn| Ok(leadership.acquire(conn, now, false)?))
                    .await
            }
        }
    };
    let release = move |epoch: u64| async move {
        let (leadership, now) = (state.lease().clone(), state.now());
        state
            .apply(move |conn| {
                let epoch = i64::try_from(epoch).unwrap_or(i64::MAX);
                Ok(store::leases::release(
                    conn,
                    crate::lease::SINGLETONS,
                    leadership.replica(),
                    epoch,
                    now,
                )?)
            })
            .await
    };
    crate::lease::run(leadership, stop, renew, release).await;
}

/// Waits for every task (their panics are logged, not raised).
async fn futures_join(tasks: Vec<JoinHandle<()>>) {
    for task in tasks {
        if let Err(e) = task.await {
            tracing::error!(error = %e, "a background task failed");
        }
    }
}

/// Reads `<data-dir>/<name>`, or creates it (mode 0600) with a fresh token.
fn token_file(data_dir: &Path, name: &str, prefix: &str) -> anyhow::Result<String> {
    let path = data_dir.join(name);
    match std::fs::read_to_string(&path) {
        Ok(text) if !text.trim().is_empty() => return Ok(text.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
    let token = auth::new_token(prefix);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    writeln!(file, "{token}")?;
    tracing::info!(path = %path.display(), "generated a token");
    Ok(token)
}

/// The connection bounds to serve with: `wanted`, or the defaults for the file limit,
/// after raising the soft file limit to the hard one. Says what it runs with.
fn connection_limits(
    wanted: crate::connections::Wanted,
) -> anyhow::Result<crate::connections::Limits> {
    let files =
        crate::connections::file_limit::raise().context("cannot read the open-file limit")?;
    let limits = wanted.resolve(files.now);
    if limits.max_connections as u64 + crate::connections::RESERVED_DESCRIPTORS > files.now {
        tracing::warn!(
            open_files = files.now,
            max_connections = limits.max_connections,
            "--max-connections is above what the open-file limit leaves (less {} for the store and agents): a flood may exhaust descriptors before the cap; accepting then backs off",
            crate::connections::RESERVED_DESCRIPTORS
        );
    }
    tracing::info!(
        open_files = files.now,
        open_files_before = files.before,
        max_connections = limits.max_connections,
        max_connections_per_peer = limits.max_per_peer,
        first_request_within = ?limits.first_request_within,
        idle_connection_timeout = ?limits.idle_after,
        "API connection limits"
    );
    Ok(limits)
}
