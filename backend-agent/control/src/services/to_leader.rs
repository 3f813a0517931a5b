//! Every replica serves the whole API: one that does not lead passes each call on to the
//! one that does, whole (issue 41).
//!
//! Why not serve it here: a change to a cluster sends orders to node agents, which carry
//! the lease's epoch and are refused by an agent that saw a newer one, and the agents'
//! sessions are with the leader (a replica that does not lead turns them away:
//! `agents::service`). Calls that only read or only write the store could be served here,
//! but one rule for all keeps a client's view the same at every address. The call goes on
//! as it came, as HTTP/2: headers (the bearer token, the deadline, the request id) and body
//! unchanged, so the leader authenticates, audits and answers it as its own, and a retry
//! with the same request id finds the first try wherever it ran. This replica only looks
//! whether the caller's token is good, so that the caller's connection here counts as
//! proven (`connections`: a flood evicts unproven connections first).
//!
//! A replica that does not know a leader, or whose leader cannot be reached, answers
//! UNAVAILABLE naming what it knows, and a client tries its next endpoint. A forwarded
//! call is never forwarded again (`FORWARDED_BY`): two replicas that each believe the
//! other leads answer instead of passing a call between them.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use http::HeaderValue;
use tonic::body::BoxBody;
use tonic::transport::{Channel, Endpoint};
use tonic::Status;

use crate::connections::Identity;
use crate::state::AppState;

/// Set on a call a replica forwards, to the forwarding replica's id.
pub const FORWARDED_BY: &str = "x-gpufleet-forwarded-by";

/// Node agents' sessions are never forwarded: they are the leader's (see above).
const NODE_AGENT_SERVICE: &str = "/gpufleet.v1.NodeAgentService/";

/// How long forwarding waits for the leader's connection before answering UNAVAILABLE.
const CONNECT_WITHIN: std::time::Duration = std::time::Duration::from_secs(5);

#[derive(Clone)]
pub struct ToLeaderLayer {
    to: Arc<Leaders>,
}

impl ToLeaderLayer {
    /// `ca`: the CA that signed the replicas' server certificates (serve's `--agent-ca`,
    /// the `pki` CA), needed to forward to a leader that serves https.
    pub fn new(state: Arc<AppState>, ca: Option<std::path::PathBuf>) -> Self {
        Self {
            to: Arc::new(Leaders {
                leadership: state.lease().clone(),
                state,
                ca,
                channel: Mutex::new(None),
            }),
        }
    }
}

impl<S> tower_layer::Layer<S> for ToLeaderLayer {
    type Service = ToLeader<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ToLeader {
            inner,
            to: self.to.clone(),
        }
    }
}

/// The connection to the leader, kept while it stays the leader.
struct Leaders {
    leadership: Arc<crate::lease::Leadership>,
    state: Arc<AppState>,
    ca: Option<std::path::PathBuf>,
    /// The leader's URL and a channel to it (connected lazily, reconnecting by itself).
    channel: Mutex<Option<(String, Channel)>>,
}

impl Leaders {
    /// Where to forward a call this replica does not lead for, or the status to answer.
    fn route(&self, forwarded_by: Option<&HeaderValue>) -> Result<Channel, Status> {
        let leadership = &self.leadership;
        let why = leadership.not_serving().unwrap_or_default();
        if let Some(by) = forwarded_by {
            let by = String::from_utf8_lossy(by.as_bytes());
            return Err(Status::unavailable(format!(
                "{why}, and this call was forwarded here by replica {}: retry, or call the leader",
                by.chars().take(64).collect::<String>()
            )));
        }
        let leader = match leadership.leader() {
            Some(l) if l.replica != leadership.replica() && !l.url.is_empty() => l,
            _ => return Err(Status::unavailable(format!("{why}: retry"))),
        };
        let mut kept = self.channel.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((url, channel)) = kept.as_ref() {
            if *url == leader.url {
                return Ok(channel.clone());
            }
        }
        let channel = self.connect(&leader.url).map_err(|e| {
            Status::unavailable(format!(
                "{why}, and this replica cannot forward to it: {e:#}; call the leader"
            ))
        })?;
        *kept = Some((leader.url.clone(), channel.clone()));
        Ok(channel)
    }

    fn connect(&self, url: &str) -> anyhow::Result<Channel> {
        // A leader cut off the network answers nothing: unanswered pings end the
        // connection, and the calls on it are answered UNAVAILABLE.
        let mut endpoint = Endpoint::from_shared(url.to_string())?
            .connect_timeout(CONNECT_WITHIN)
            .http2_keep_alive_interval(CONNECT_WITHIN)
            .keep_alive_timeout(CONNECT_WITHIN)
            .keep_alive_while_idle(true);
        let host = endpoint.uri().host().unwrap_or_default().to_string();
        if let Some(tls) = gpufleet_wire::tls::client_config(url, &host, self.ca.as_deref())
            .map_err(|e| {
                anyhow::anyhow!("{e:#} (a replica forwarding to an https leader verifies it with serve's --agent-ca, the CA that signed every replica's certificate)")
            })?
        {
            endpoint = endpoint.tls_config(tls)?;
        }
        Ok(endpoint.connect_lazy())
    }
}

#[derive(Clone)]
pub struct ToLeader<S> {
    inner: S,
    to: Arc<Leaders>,
}

type Answer<E> = Pin<Box<dyn Future<Output = Result<http::Response<BoxBody>, E>> + Send>>;

impl<S> tower_service::Service<http::Request<BoxBody>> for ToLeader<S>
where
    S: tower_service::Service<http::Request<BoxBody>, Response = http::Response<BoxBody>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<BoxBody>;
    type Error = S::Error;
    type Future = Answer<S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<BoxBody>) -> Self::Future {
        let leadership = &self.to.leadership;
        if request.uri().path().starts_with(NODE_AGENT_SERVICE) {
            return Box::pin(self.inner.call(request));
        }
        match leadership.not_serving() {
            None => return Box::pin(self.inner.call(request)),
            // Leading, but still settling what the former leader left: nobody to pass
            // it on to.
            Some(why) if leadership.epoch().is_some() => {
                let status = Status::unavailable(format!("{why}; retry"));
                return Box::pin(async move { Ok(not_run(status)) });
            }
            Some(_) => {}
        }
        let mut channel = match self.to.route(request.headers().get(FORWARDED_BY)) {
            Ok(channel) => channel,
            Err(status) => return Box::pin(async move { Ok(not_run(status)) }),
        };
        if let Ok(me) = HeaderValue::from_str(self.to.leadership.replica()) {
            request.headers_mut().insert(FORWARDED_BY, me);
        }
        let identity = request.extensions().get::<Identity>().cloned();
        let token = request
            .headers()
            .get(gpufleet_proto::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::to_string);
        // What tonic put here for this connection (its peer, its TLS) is not the leader's.
        *request.extensions_mut() = http::Extensions::new();
        let state = self.to.state.clone();
        Box::pin(async move {
            // The leader authenticates the call; this replica only looks whether the
            // token is good, so that the caller's connection here counts as proven and
            // is not evicted for a newcomer under a flood (`connections`).
            if let (Some(identity), Some(token)) = (identity, token) {
                let checker = state.clone();
                let good = state
                    .read(move |conn| -> crate::error::Result<bool> {
                        Ok(crate::auth::resolve_bearer(&checker, conn, &token).is_ok())
                    })
                    .await
                    .unwrap_or(false);
                if good {
                    identity.prove();
                }
            }
            let ready = std::future::poll_fn(|cx| channel.poll_ready(cx)).await;
            let answer = match ready {
                Ok(()) => channel.call(request).await,
                Err(e) => Err(e),
            };
            Ok(answer.unwrap_or_else(|e| {
                let status = Status::unavailable(format!(
                    "this replica does not lead and could not reach the leader: {}; retry",
                    gpufleet_wire::tls::causes(&e)
                ));
                if never_connected(&e) {
                    not_run(status)
                } else {
                    // The connection broke under the call: the leader may have run it.
                    status.into_http()
                }
            }))
        })
    }
}

/// `status` as an answer that says the call was not run at all (`gpufleet_proto::NOT_RUN`):
/// a client may send it again, whatever it is.
fn not_run(status: Status) -> http::Response<BoxBody> {
    let mut answer = status.into_http();
    answer
        .headers_mut()
        .insert(gpufleet_proto::NOT_RUN, HeaderValue::from_static("1"));
    answer
}

/// Whether forwarding failed before the call reached the leader (no connection).
fn never_connected(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(error);
    while let Some(e) = source {
        let refused = e
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused);
        if refused || e.downcast_ref::<tonic::ConnectError>().is_some() {
            return true;
        }
        source = e.source();
    }
    false
}
