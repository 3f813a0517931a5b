//! The agent's side of the stream: register, then heartbeats up, orders down and verified
//! results up; reconnect with backoff when the control plane goes away.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gpufleet_proto::v1::{
    self, agent_message, control_message, node_agent_service_client::NodeAgentServiceClient,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::executor::Executor;
use gpufleet_process::signals::stopped;
use gpufleet_wire::protocol_version::{self, Version};

pub struct Agent {
    pub name: String,
    /// "pool" or "on-demand".
    pub capacity: String,
    /// "sim" or "nvml".
    pub hardware: &'static str,
    pub exec: Arc<Executor>,
    pub link: crate::link::Link,
    /// `<data-dir>/status.json`: what the agent last registered and reported (its own view).
    pub status_file: PathBuf,
    /// `<data-dir>/node.secret` (0600): what binds this node's name to this host; issued
    /// by the control plane at the first registration, presented at every later one.
    pub secret_file: PathBuf,
    /// host:port of its bandwidth-test listener, as peers reach it (empty: none).
    pub bandwidth_addr: String,
    /// The host as Slurm declares the node.
    pub host: crate::host::Declared,
    /// The agent's GPUs as its heartbeats report them (the executor's backend, tapped).
    pub telemetry: Arc<crate::telemetry::XidTap>,
    /// End the node's Slurm daemons and jobs when the agent stops (`--stop-workloads`).
    pub stop_workloads: bool,
    /// Where the host's cgroup v1 hierarchies are checked at each registration; None: not.
    pub cgroup_root: Option<PathBuf>,
}

/// The control plane refused this node (a wrong join token, a revoked certificate, an
/// inventory that contradicts the node's), or this agent refused a control plane of a
/// protocol too far from its own: the error [`run`] ends with, typed so that the
/// binary can tell it from a failure worth a restart.
#[derive(Debug)]
pub struct Refused {
    pub node: String,
    pub why: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the control plane refused node {}: {}",
            self.node, self.why
        )
    }
}

impl std::error::Error for Refused {}

enum End {
    /// The control plane refused this node; retrying cannot help.
    Refused(tonic::Status),
    /// The connection ended or failed; try again.
    Lost(String),
}

/// What one reading for the heartbeats holds (`Heartbeat.gpus`, `Heartbeat.volumes`).
#[derive(Debug, Clone, Default)]
struct Reading {
    gpus: Vec<v1::GpuTelemetry>,
    volumes: Vec<v1::VolumeUse>,
}

const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How often the agent reads its GPUs for its heartbeats (`Heartbeat.gpus`).
const TELEMETRY_EVERY: Duration = Duration::from_secs(5);

/// Serves the control plane until `stop` turns true. Returns an error only when the
/// control plane refuses the node (wrong join token, name in use, contradicting inventory).
pub async fn run(agent: Arc<Agent>, stop: watch::Receiver<bool>) -> anyhow::Result<()> {
    let served = serve(&agent, stop).await;
    let exec = agent.exec.clone();
    if agent.stop_workloads {
        // Told to: the Slurm daemons and every job step they started end here, not with
        // the process, which would leave the job steps running.
        tokio::task::spawn_blocking(move || exec.slurm.stop_all()).await?;
    } else {
        // A restart or an upgrade: the node's work goes on, and the next agent adopts it.
        let left = exec.slurm.leave_all();
        if left > 0 {
            tracing::info!(node = %agent.name, clusters = left, "the node's Slurm daemons and jobs run on; the next agent adopts them (--stop-workloads ends them with the agent)");
        }
    }
    served
}

async fn serve(agent: &Arc<Agent>, mut stop: watch::Receiver<bool>) -> anyhow::Result<()> {
    let exec = agent.exec.clone();
    tokio::task::spawn_blocking(move || exec.recover()).await?;
    let mut backoff = Duration::from_millis(100);
    loop {
        let ended = session(agent, stop.clone()).await;
        if *stop.borrow() {
            return Ok(());
        }
        match ended {
            End::Refused(status) => {
                return Err(Refused {
                    node: agent.name.clone(),
                    why: status.message().to_string(),
                }
                .into())
            }
            End::Lost(why) if agent.link.addresses() > 1 => {
                let lost = agent.link.current().to_string();
                let next = agent.link.advance();
                tracing::warn!(node = %agent.name, control_plane = %lost, reason = %why, retry_in = ?backoff, next = %next, "lost the control plane; trying its next address");
            }
            End::Lost(why) => {
                tracing::warn!(node = %agent.name, reason = %why, retry_in = ?backoff, "lost the control plane");
            }
        }
        tokio::select! {
            _ = stopped(&mut stop) => return Ok(()),
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

fn classify(status: tonic::Status) -> End {
    use tonic::Code;
    match status.code() {
        Code::Unauthenticated
        | Code::PermissionDenied
        | Code::FailedPrecondition
        | Code::InvalidArgument => End::Refused(status),
        // The name is held by a session that looks live: after a partition that may be
        // this agent's own old session, which the control plane drops once its heartbeats
        // are overdue. Keep trying.
        Code::AlreadyExists => End::Lost(status.message().to_string()),
        // The message alone is often "transport error": the reason (a TLS alert such as
        // a revoked certificate) is in its sources.
        _ => End::Lost(format!(
            "{}: {}",
            status.code(),
            match std::error::Error::source(&status) {
                Some(source) => gpufleet_wire::tls::causes(source),
                None => status.message().to_string(),
            }
        )),
    }
}

async fn inventory(exec: &Arc<Executor>) -> Result<v1::NodeInventory, End> {
    let exec = exec.clone();
    tokio::task::spawn_blocking(move || exec.inventory())
        .await
        .map_err(|e| End::Lost(e.to_string()))?
        .map_err(|e| End::Lost(format!("cannot read this node's GPUs: {e}")))
}

fn write_status(agent: &Agent, node_id: &str, inventory: Option<&v1::NodeInventory>) {
    let status = serde_json::json!({
        "name": agent.name,
        "node_id": node_id,
        "capacity": agent.capacity,
        "hardware": agent.hardware,
        "driver_version": inventory.map(|i| i.driver_version.clone()),
        "gpus": inventory.map(|i| i.gpus.iter().map(|g| serde_json::json!({
            "index": g.index,
            "uuid": g.uuid,
            "mig_enabled": g.mig_enabled,
            "mig_devices": g.mig_devices.iter().map(|d| serde_json::json!({
                "profile": d.profile, "start": d.start, "uuid": d.uuid,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>()),
    });
    let tmp = agent.status_file.with_extension("json.tmp");
    let written = std::fs::write(&tmp, serde_json::to_vec_pretty(&status).unwrap_or_default())
        .and_then(|_| std::fs::rename(&tmp, &agent.status_file));
    if let Err(e) = written {
        tracing::warn!(path = %agent.status_file.display(), error = %e, "cannot write the status file");
    }
}

/// The node secret kept from an earlier registration ("" before the first).
fn read_secret(path: &std::path::Path) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// A bandwidth test's token is accepted from the moment its order arrives, even while an
/// earlier order still runs: the peers' streams to this node need not wait for it.
fn arm_bandwidth(agent: &Agent, order: &v1::WorkOrder) {
    if let (Some(v1::work_order::Kind::RunHealthCheck(h)), Some(listener)) =
        (&order.kind, &agent.exec.bandwidth)
    {
        if let Some(test) = h
            .bandwidth
            .as_ref()
            .filter(|t| super::bandwidth::validate(t).is_ok())
        {
            listener.arm(&test.token, super::bandwidth::arm_for(test));
        }
    }
}

/// A session the control plane has registered: what the agent sends up, what comes
/// down, and the registration's answer.
struct Opened {
    up: mpsc::UnboundedSender<v1::AgentMessage>,
    down: tonic::Streaming<v1::ControlMessage>,
    registered: v1::Registered,
}

/// Why this host cannot isolate a tenant's cluster, with its cgroup v1 hierarchies under
/// `cgroup_root` ("" when it can, or when not checked).
fn isolation_problem(cgroup_root: Option<&std::path::Path>) -> String {
    cgroup_root
        .and_then(gpufleet_slurm::cgroup_controllers_problem)
        .unwrap_or_default()
}

/// Connects, registers and keeps what the registration issued.
async fn open(agent: &Arc<Agent>) -> Result<Opened, End> {
    // The files as they are now: a renewed certificate or rotated join token is used.
    let link = agent.link.clone();
    let resolved = match tokio::task::spawn_blocking(move || link.resolve()).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return Err(End::Lost(format!("{e:#}"))),
        Err(e) => return Err(End::Lost(e.to_string())),
    };
    let channel = match resolved.endpoint.connect().await {
        Ok(c) => c,
        Err(e) => return Err(End::Lost(gpufleet_wire::tls::causes(&e))),
    };
    let mut client = NodeAgentServiceClient::new(channel);
    let inventory = match inventory(&agent.exec).await {
        Ok(i) => i,
        Err(e) => return Err(e),
    };
    let (up, up_rx) = mpsc::unbounded_channel::<v1::AgentMessage>();
    let _ = up.send(v1::AgentMessage {
        msg: Some(agent_message::Msg::Register(v1::RegisterNode {
            name: agent.name.clone(),
            capacity: agent.capacity.clone(),
            inventory: Some(inventory.clone()),
            hardware: agent.hardware.to_string(),
            bandwidth_addr: agent.bandwidth_addr.clone(),
            node_secret: read_secret(&agent.secret_file),
            slurm_clusters: agent.exec.slurm.kept(),
            slurm_address: agent.host.address.to_string(),
            slurm_hostname: agent.host.hostname.clone(),
            cpus: agent.host.cpus,
            memory_mib: agent.host.memory_mib,
            release: protocol_version::RELEASE.into(),
            protocol: Some(protocol_version::PROTOCOL),
            isolation_problem: isolation_problem(agent.cgroup_root.as_deref()),
        })),
    });
    let mut request = tonic::Request::new(UnboundedReceiverStream::new(up_rx));
    match gpufleet_proto::bearer(&resolved.join_token).parse() {
        Ok(v) => {
            request
                .metadata_mut()
                .insert(gpufleet_proto::AUTHORIZATION, v);
        }
        Err(_) => {
            return Err(End::Refused(tonic::Status::unauthenticated(
                "--join-token: not a valid header value",
            )))
        }
    }
    let tls = agent.link.is_tls();
    let unregistered = |end: End| {
        match end {
        End::Lost(why) if tls => End::Lost(format!(
            "could not register: {why} (over TLS, check that --ca-cert signed the control plane's certificate, and that --cert/--key come from its --agent-ca and were not revoked)"
        )),
        End::Lost(why) => End::Lost(format!("could not register: {why}")),
        refused => refused,
    }
    };
    let mut down = match client.session(request).await {
        Ok(r) => r.into_inner(),
        Err(s) => return Err(unregistered(classify(s))),
    };
    let registered = match down.message().await {
        Ok(Some(v1::ControlMessage {
            msg: Some(control_message::Msg::Registered(r)),
        })) => r,
        Ok(_) => {
            return Err(End::Lost(
                "the control plane did not answer the registration".into(),
            ))
        }
        Err(s) => return Err(unregistered(classify(s))),
    };
    let control_plane = Version::peer(&registered.release, registered.protocol);
    if !control_plane.supported() {
        // A control plane that checks versions refuses this agent before it records it;
        // one that does not (older than protocol 2) is left at once, before any order.
        return Err(End::Refused(tonic::Status::failed_precondition(format!(
            "protocol: this control plane is {control_plane} and this agent is {} (it works with control planes of protocols {}); {}",
            Version::ours(),
            protocol_version::accepted(),
            control_plane.remedy("control plane", "agent")
        ))));
    }
    tracing::info!(node = %agent.name, node_id = %registered.node_id, %control_plane, address = %resolved.url, "registered with the control plane");
    if !registered.node_secret.is_empty() {
        if let Err(e) =
            gpufleet_process::data_dir::keep_private(&agent.secret_file, &registered.node_secret)
        {
            // Without it the next registration under this name is refused: say so now.
            tracing::error!(path = %agent.secret_file.display(), error = %e, "cannot keep the node secret");
        }
    }
    write_status(agent, &registered.node_id, Some(&inventory));
    Ok(Opened {
        up,
        down,
        registered,
    })
}

/// One session: registered, heartbeats up and orders down until the connection ends or
/// `stop` turns true; then the agent says it is leaving before the stream ends.
async fn session(agent: &Arc<Agent>, mut stop: watch::Receiver<bool>) -> End {
    let opened = tokio::select! {
        _ = stopped(&mut stop) => return End::Lost("stopping".into()),
        opened = open(agent) => opened,
    };
    let Opened {
        up,
        mut down,
        registered,
    } = match opened {
        Ok(o) => o,
        Err(end) => return end,
    };

    let queued = Arc::new(AtomicU32::new(0));
    crate::metrics::watch_queue(&agent.name, &queued);
    let interval = Duration::from_millis(u64::from(registered.heartbeat_interval_ms.max(50)));
    // The GPUs (and the node-local team volumes' use) are read every TELEMETRY_EVERY on a
    // blocking thread of their own, so that a hardware call that hangs never holds a
    // heartbeat back; each new reading rides on the next heartbeat.
    let (readings_tx, mut readings) = watch::channel(Reading::default());
    let sampler = {
        let telemetry = agent.telemetry.clone();
        let volumes = agent.exec.local_volumes.clone();
        tokio::spawn(async move {
            loop {
                let (t, v) = (telemetry.clone(), volumes.clone());
                let read = move || Reading {
                    gpus: t.sample(),
                    volumes: v.usage(),
                };
                let Ok(sample) = tokio::task::spawn_blocking(read).await else {
                    break;
                };
                if readings_tx.send(sample).is_err() {
                    break;
                }
                tokio::time::sleep(TELEMETRY_EVERY).await;
            }
        })
    };
    let heartbeats = {
        let up = up.clone();
        let queued = queued.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            let mut seq = 0u64;
            loop {
                tick.tick().await;
                seq += 1;
                let (read, reading) = match readings.has_changed().unwrap_or(false) {
                    true => (true, readings.borrow_and_update().clone()),
                    false => (false, Reading::default()),
                };
                let beat = v1::Heartbeat {
                    seq,
                    orders_queued: queued.load(Ordering::Relaxed),
                    gpus: reading.gpus,
                    volumes: reading.volumes,
                    volumes_read: read,
                };
                if up
                    .send(v1::AgentMessage {
                        msg: Some(agent_message::Msg::Heartbeat(beat)),
                    })
                    .is_err()
                {
                    break;
                }
            }
        })
    };
    // Orders run one at a time, in arrival order, on a blocking thread.
    let (orders, mut order_rx) = mpsc::unbounded_channel::<v1::WorkOrder>();
    let worker = {
        let (agent, up) = (agent.clone(), up.clone());
        let queued = queued.clone();
        let node_id = registered.node_id.clone();
        tokio::spawn(async move {
            while let Some(order) = order_rx.recv().await {
                let exec = agent.exec.clone();
                let kind = crate::metrics::order_kind(&order);
                let result = tokio::task::spawn_blocking(move || exec.run(&order)).await;
                queued.fetch_sub(1, Ordering::Relaxed);
                let Ok(result) = result else { break };
                crate::metrics::order_answered(&agent.name, kind, result.ok);
                write_status(&agent, &node_id, result.inventory.as_ref());
                if up
                    .send(v1::AgentMessage {
                        msg: Some(agent_message::Msg::Result(result)),
                    })
                    .is_err()
                {
                    break;
                }
            }
        })
    };
    let end = loop {
        let message = tokio::select! {
            _ = stopped(&mut stop) => break End::Lost("stopping".into()),
            message = down.message() => message,
        };
        match message {
            Ok(Some(v1::ControlMessage {
                msg: Some(control_message::Msg::Order(order)),
            })) if Executor::runs_apart(&order) => {
                // A question that changes nothing here: answered at once, not in turn.
                tracing::debug!(node = %agent.name, order = %order.id, "query received");
                let (agent, up) = (agent.clone(), up.clone());
                tokio::spawn(async move {
                    let kind = crate::metrics::order_kind(&order);
                    let exec = agent.exec.clone();
                    if let Ok(result) =
                        tokio::task::spawn_blocking(move || exec.run_apart(&order)).await
                    {
                        crate::metrics::order_answered(&agent.name, kind, result.ok);
                        let _ = up.send(v1::AgentMessage {
                            msg: Some(agent_message::Msg::Result(result)),
                        });
                    }
                });
            }
            Ok(Some(v1::ControlMessage {
                msg: Some(control_message::Msg::Order(order)),
            })) => {
                tracing::info!(node = %agent.name, order = %order.id, "work order received");
                arm_bandwidth(agent, &order);
                queued.fetch_add(1, Ordering::Relaxed);
                let _ = orders.send(order);
            }
            Ok(Some(_)) => {}
            Ok(None) => break End::Lost("the control plane closed the stream".into()),
            Err(s) => break classify(s),
        }
    };
    heartbeats.abort();
    sampler.abort();
    // An order running on its blocking thread finishes and is journaled; the control
    // plane re-sends it after the reconnect and gets the journaled answer.
    worker.abort();
    if *stop.borrow() {
        leave(&agent.name, agent.stop_workloads, up, down).await;
    }
    end
}

/// How long a stopping agent waits for the control plane to take its leave.
const LEAVE_WITHIN: Duration = Duration::from_secs(2);

/// Tells the control plane this agent is stopping on purpose, ends the request stream,
/// and waits (briefly) for the control plane to end its side, so the message is
/// delivered rather than cut off with the connection.
async fn leave(
    name: &str,
    stop_workloads: bool,
    up: mpsc::UnboundedSender<v1::AgentMessage>,
    mut down: tonic::Streaming<v1::ControlMessage>,
) {
    let _ = up.send(v1::AgentMessage {
        msg: Some(agent_message::Msg::Leaving(v1::Leaving {
            reason: if stop_workloads {
                "its agent stopped with its workloads (--stop-workloads)"
            } else {
                "its agent stopped (a restart or upgrade: its Slurm daemons and jobs run on)"
            }
            .into(),
        })),
    });
    drop(up);
    let drained = tokio::time::timeout(LEAVE_WITHIN, async {
        while let Ok(Some(_)) = down.message().await {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(node = %name, "the control plane did not take this agent's leave within {LEAVE_WITHIN:?}");
    } else {
        tracing::info!(node = %name, "told the control plane this node is leaving");
    }
}

#[cfg(test)]
mod tests {
    use super::isolation_problem;

    #[test]
    fn a_registration_names_the_cgroup_controllers_its_host_lacks_and_embedded_ones_nothing() {
        let root = tempfile::tempdir().unwrap();
        let mount = |c: &str| {
            std::fs::create_dir_all(root.path().join(c)).unwrap();
            std::fs::write(root.path().join(c).join("cgroup.procs"), "").unwrap();
        };
        for c in ["cpu", "cpuset", "devices", "freezer", "pids"] {
            mount(c);
        }
        let why = isolation_problem(Some(root.path()));
        let memory = root.path().join("memory");
        assert!(
            why.contains(&format!("'memory' is not mounted at {}", memory.display())),
            "{why}"
        );
        assert!(!why.contains("'cpu'"), "{why}");
        mount("memory");
        assert_eq!(isolation_problem(Some(root.path())), "");
        assert_eq!(isolation_problem(None), "", "not checked");
    }
}
