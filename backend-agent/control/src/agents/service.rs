//! NodeAgentService: the control plane's end of each agent's stream.

use std::pin::Pin;
use std::sync::Arc;

use gpufleet_proto::v1::{
    self, agent_message, control_message, node_agent_service_server::NodeAgentService,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use super::admission::{self, Refusal};
use super::pacing::{Pacing, Verdict};
use crate::state::AppState;
use crate::store;

/// How long a new stream may take to send its registration.
const REGISTER_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

pub struct Agents {
    pub state: Arc<AppState>,
    /// Agents must present a client certificate (mutual TLS with --agent-ca).
    pub require_client_cert: bool,
    /// The agent CA's revocation list in force (`--agent-crl`): a session whose
    /// certificate it comes to name is ended.
    pub revocations: Option<crate::tls_reload::Revocations>,
}

pub use crate::auth::same_token;

fn join_token_of<T>(request: &Request<T>) -> Option<&str> {
    request
        .metadata()
        .get(gpufleet_proto::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
}

type ControlStream = Pin<Box<dyn Stream<Item = Result<v1::ControlMessage, Status>> + Send>>;

#[tonic::async_trait]
impl NodeAgentService for Agents {
    type SessionStream = ControlStream;

    async fn session(
        &self,
        request: Request<Streaming<v1::AgentMessage>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        // With mutual TLS, the certificate names the one node it may register.
        let (certified_name, certificate) = if self.require_client_cert {
            let certs = request.peer_certs().unwrap_or_default();
            let Some(first) = certs.first() else {
                return Err(Status::unauthenticated(
                    "node agents must connect with a client certificate signed by the control plane's --agent-ca (gpufleet-agent node --cert/--key)",
                ));
            };
            let name = gpufleet_wire::pki::common_name(first.as_ref()).ok_or_else(|| {
                Status::unauthenticated("the client certificate names no node (no common name)")
            })?;
            (Some(name), Some(first.as_ref().to_vec()))
        } else {
            (None, None)
        };
        // Revoked while this session is open: the session ends (the handshake refuses the
        // certificate from then on).
        let mut revoked = match (&self.revocations, certificate) {
            (Some(list), Some(der)) => Some((list.clone(), der)),
            _ => None,
        };
        let checked =
            join_token_of(&request).map(|t| self.state.join_tokens.check(t, self.state.now()));
        match checked {
            // The join token: the connection is kept and never evicted for a newcomer.
            Some(Ok(())) => crate::connections::mark_proven(request.extensions()),
            Some(Err(crate::join_tokens::Refused::Retired(at))) => {
                tracing::warn!(peer = ?request.remote_addr(), "a node agent presented a rotated join token");
                return Err(Status::unauthenticated(format!(
                    "join token: rotated, and its overlap ended at {}; give the agent the new one (the control plane's <data-dir>/join.token)",
                    crate::clock::rfc3339(at)
                )));
            }
            _ => {
                tracing::warn!(peer = ?request.remote_addr(), "a node agent presented a wrong join token");
                return Err(Status::unauthenticated(
                    "join token: not this control plane's (see its <data-dir>/join.token or --join-token)",
                ));
            }
        }
        // Orders come from the replica that leads (they carry its epoch), so node agents'
        // sessions are with it: another replica turns the agent away, and the agent tries
        // its next --control-plane address.
        if let Some(why) = self.state.lease().not_leading() {
            return Err(Status::unavailable(format!(
                "{why}: node agents connect to the replica that leads"
            )));
        }
        // Where it registers from: candidates are bounded per source.
        let source = request
            .remote_addr()
            .map(|a| admission::source_of(crate::connections::peer_of(&a)))
            .unwrap_or_default();
        let mut inbound = request.into_inner();
        let first = tokio::time::timeout(REGISTER_WITHIN, inbound.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no registration within 10s"))??;
        let Some(v1::AgentMessage {
            msg: Some(agent_message::Msg::Register(reg)),
        }) = first
        else {
            return Err(Status::invalid_argument(
                "the first message of a session must be a registration",
            ));
        };
        let checked = admission::check(&reg).map_err(refusal)?;
        if let Some(cn) = certified_name.filter(|cn| *cn != checked.name) {
            return Err(Status::permission_denied(format!(
                "name: the client certificate is for node '{}', not '{}'; issue one with gpufleet-agent pki --agent {}",
                cn.chars().take(63).collect::<String>(),
                checked.name,
                checked.name
            )));
        }
        let agent_version = checked.version.clone();
        let name = checked.name.clone();
        let kept_clusters = checked.slurm_clusters.clone();
        let isolation_problem = checked.isolation_problem.clone();
        let known = self
            .state
            .read(move |conn| {
                store::nodes::by_hostname(conn, &name).map_err(crate::state::db_error)
            })
            .await?;
        if let Some(known) = known {
            if self.state.agents.is_live(&known.id) {
                return Err(Status::already_exists(format!(
                    "name: node {} is held by a live agent; give this host another --name, or stop the other agent",
                    known.hostname
                )));
            }
        }
        // Each registration costs admission checks: a name registering faster than any
        // agent's reconnect backoff is looping or hostile.
        if let Err(wait) = self
            .state
            .agents
            .registrations
            .admit(&checked.name, std::time::Instant::now())
        {
            return Err(Status::resource_exhausted(format!(
                "name: node {} registered {} times in a row; retry in {}s",
                checked.name,
                crate::registry::REGISTER_BURST,
                wait.as_secs().max(1)
            )));
        }
        let (t, bounds) = (self.state.now(), self.state.candidates.clone());
        let admitted = self
            .state
            .write(move |sp| -> Result<_, Status> {
                let slots = admission::Slots {
                    max: bounds.max,
                    per_source: bounds.max_per_source,
                    source: &source,
                };
                let admitted = admission::admit(&sp, &checked, t, &slots).map_err(refusal)?;
                sp.commit().map_err(crate::state::db_error)?;
                Ok(admitted)
            })
            .await?;
        let node_id = admitted.id;
        let (out, out_rx) = mpsc::unbounded_channel();
        // Kept to end the session with a status of its own (the registry holds `out`).
        let ending = out.clone();
        let _ = out.send(Ok(v1::ControlMessage {
            msg: Some(control_message::Msg::Registered(v1::Registered {
                node_id: node_id.clone(),
                heartbeat_interval_ms: self.state.agents.heartbeat_interval().as_millis() as u32,
                node_secret: admitted.issued_secret.unwrap_or_default(),
                release: gpufleet_wire::protocol_version::RELEASE.into(),
                protocol: Some(gpufleet_wire::protocol_version::PROTOCOL),
            })),
        }));
        let session = self
            .state
            .agents
            .attach(&node_id, out, agent_version.clone());
        self.state
            .agents
            .set_isolation_problem(&node_id, &isolation_problem);
        tracing::info!(node = %node_id, hardware = %reg.hardware, agent = %agent_version, "node agent registered");
        // The medium health checks, then bring the node to what the control plane wants
        // it to be and mark it ready (a node that fails them is quarantined).
        tokio::spawn(crate::scheduling::health::admit_registered(
            self.state.clone(),
            node_id.clone(),
            reg.bandwidth_addr.chars().take(256).collect(),
            kept_clusters,
            isolation_problem,
        ));

        // The GPUs this node registered with: its heartbeats' readings are only of these.
        let registered_gpus: Vec<(u32, String)> = reg
            .inventory
            .as_ref()
            .map(|inv| {
                inv.gpus
                    .iter()
                    .map(|g| (g.index.max(0) as u32, g.uuid.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let state = self.state.clone();
        let mut leads = self.state.lease().watch();
        tokio::spawn(async move {
            let mut pacing = Pacing::new(std::time::Instant::now());
            // Why the agent said it is stopping, when it did.
            let mut left = None;
            // This replica stopped leading: the agent moves to the one that leads, and
            // this replica records nothing of its going (the node is the leader's now).
            let mut moved = false;
            let mut follow_leadership = true;
            loop {
                let message = tokio::select! {
                    m = inbound.message() => m,
                    _ = leads.wait_for(Option::is_none), if follow_leadership => {
                        // Stopping: the session ends with the server, in its grace
                        // period, not here.
                        if state.lease().is_stopping() {
                            follow_leadership = false;
                            continue;
                        }
                        let why = state.lease().not_leading().unwrap_or_default();
                        tracing::info!(node = %node_id, %why, "ending a node agent's session: this replica no longer leads");
                        let _ = ending.send(Err(Status::unavailable(format!(
                            "{why}: node agents connect to the replica that leads"
                        ))));
                        moved = true;
                        break;
                    }
                    _ = revocation(&mut revoked) => {
                        tracing::warn!(node = %node_id, "ending the session of a node agent whose certificate was revoked");
                        let _ = ending.send(Err(Status::unauthenticated(
                            "the client certificate was revoked (the control plane's --agent-crl names it); issue a new one with gpufleet-agent pki --agent NAME",
                        )));
                        // Unreachable now, saying why, not after the node timeout as "no
                        // heartbeat": the agent cannot come back with this certificate.
                        left = Some(
                            "its agent's certificate was revoked (--agent-crl names it)"
                                .to_string(),
                        );
                        break;
                    }
                };
                if let Ok(Some(_)) = &message {
                    match pacing.admit(std::time::Instant::now()) {
                        Verdict::Take => {}
                        Verdict::Drop => {
                            crate::counters::agent_message_dropped(crate::counters::AGENT_RATE);
                            continue;
                        }
                        over => {
                            cut(&ending, &node_id, over);
                            break;
                        }
                    }
                }
                // Evicted (a candidate past --candidate-ttl) or replaced: this stream
                // is over.
                if state.agents.session_of(&node_id) != Some(session) {
                    break;
                }
                match message {
                    Ok(Some(v1::AgentMessage { msg: Some(msg) })) => match msg {
                        agent_message::Msg::Heartbeat(beat) => {
                            let verdict = pacing.heartbeat(&beat);
                            if verdict != Verdict::Take {
                                cut(&ending, &node_id, verdict);
                                break;
                            }
                            state.agents.heartbeat(&node_id, session);
                            if beat.volumes_read {
                                match crate::volume_use::check(&beat.volumes) {
                                    Ok(v) => state.agents.volume_use.record(&node_id, session, v),
                                    Err(why) => {
                                        tracing::debug!(node = %node_id, %why, "dropping a heartbeat's volume readings");
                                        crate::counters::agent_message_dropped(
                                            crate::counters::AGENT_TELEMETRY,
                                        );
                                    }
                                }
                            }
                            if !beat.gpus.is_empty() {
                                match crate::telemetry::check(&beat.gpus, &registered_gpus) {
                                    Ok(gpus) => {
                                        // Counted as GPU-seconds used at the next flush
                                        // (the metering task).
                                        let t = state.now();
                                        state.agents.telemetry.note_usage(&node_id, t, &gpus);
                                        state.agents.telemetry.record(&node_id, session, gpus)
                                    }
                                    Err(why) => {
                                        tracing::debug!(node = %node_id, %why, "dropping a heartbeat's GPU readings");
                                        crate::counters::agent_message_dropped(
                                            crate::counters::AGENT_TELEMETRY,
                                        );
                                    }
                                }
                            }
                        }
                        agent_message::Msg::Result(result) => {
                            state.agents.heartbeat(&node_id, session);
                            // Only an answer to an order sent to this node and still
                            // waited for is believed.
                            let Some(claim) = state.agents.claim(&node_id, &result.order_id) else {
                                tracing::warn!(node = %node_id, order = %result.order_id.chars().take(64).collect::<String>(), "ignoring an answer to no order this control plane waits for");
                                crate::counters::refused_result(crate::counters::UNSOLICITED);
                                continue;
                            };
                            // Checked and recorded on the writer thread, then answered.
                            let node = node_id.clone();
                            let order_id = result.order_id.clone();
                            let recorded = state
                                .apply(move |conn| {
                                    Ok::<_, crate::error::Error>(super::results::record(
                                        conn, &node, result,
                                    ))
                                })
                                .await;
                            match recorded {
                                Ok(result) => claim.answer(result),
                                Err(e) => {
                                    tracing::error!(node = %node_id, error = %e, "recording an order result failed");
                                    claim.answer(v1::OrderResult {
                                        order_id,
                                        ok: false,
                                        error: format!(
                                            "the control plane could not record the answer: {e}"
                                        ),
                                        ..Default::default()
                                    });
                                }
                            }
                        }
                        agent_message::Msg::Register(_) => {
                            tracing::warn!(node = %node_id, "ignoring a second registration on one stream");
                        }
                        agent_message::Msg::Leaving(l) => {
                            let why: String = l.reason.chars().take(256).collect();
                            tracing::info!(node = %node_id, %why, "node agent is leaving");
                            left = Some(why);
                            break;
                        }
                    },
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(node = %node_id, error = %e, "node agent stream failed");
                        break;
                    }
                }
            }
            state.agents.telemetry.forget(&node_id, session);
            state.agents.volume_use.forget(&node_id, session);
            match left {
                _ if moved => {
                    state.agents.detach(&node_id, session);
                }
                // A planned stop: unreachable now, not after the node timeout.
                Some(why) => {
                    if state.agents.declare_left(&node_id, session) {
                        super::monitor::agent_left(&state, &node_id, &why).await;
                    }
                }
                None => {
                    tracing::info!(node = %node_id, "node agent disconnected");
                    if state.agents.detach(&node_id, session) {
                        super::monitor::agent_gone(&state, &node_id).await;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(
            out_rx,
        ))))
    }
}

/// Resolves when the revocation list comes to name the session's certificate; never
/// without a list or a certificate.
async fn revocation(revoked: &mut Option<(crate::tls_reload::Revocations, Vec<u8>)>) {
    let Some((list, der)) = revoked.as_mut() else {
        return std::future::pending().await;
    };
    let named = |l: &Option<std::sync::Arc<gpufleet_wire::server_tls::RevokedCerts>>| {
        l.as_ref().is_some_and(|l| l.names(der))
    };
    if list.wait_for(named).await.is_err() {
        // The list's sender is gone (the server is stopping): nothing more to watch.
        *revoked = None;
        std::future::pending::<()>().await;
    }
}

/// Ends a session the pacing refused (the agent sees why, and reconnects), counted by
/// reason.
fn cut(
    ending: &mpsc::UnboundedSender<Result<v1::ControlMessage, Status>>,
    node_id: &str,
    verdict: Verdict,
) {
    use crate::counters::{AGENT_PROTOCOL, AGENT_RATE};
    let (reason, status) = match verdict {
        Verdict::CutForRate(why) => {
            // The message that tipped it over was dropped too.
            crate::counters::agent_message_dropped(AGENT_RATE);
            (AGENT_RATE, Status::resource_exhausted(why))
        }
        Verdict::CutForProtocol(why) => (AGENT_PROTOCOL, Status::invalid_argument(why)),
        Verdict::Take | Verdict::Drop => return,
    };
    tracing::warn!(node = %node_id, reason, why = %status.message(), "ending a node agent's session");
    crate::counters::agent_session_cut(reason);
    let _ = ending.send(Err(status));
}

fn refusal(r: Refusal) -> Status {
    match r {
        Refusal::Invalid(m) => Status::invalid_argument(m),
        Refusal::Contradiction(m) | Refusal::Unsupported(m) => Status::failed_precondition(m),
        Refusal::Impostor(m) => Status::permission_denied(m),
        Refusal::Full(m) => Status::resource_exhausted(m),
        Refusal::Store(e) => crate::state::db_error(e),
    }
}
