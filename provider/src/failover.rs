//! Several endpoints of one control plane (`endpoints = [...]`, or GPUFLEET_ENDPOINT with
//! commas): every call goes to the current endpoint; when the connection to it fails,
//! the client moves to the next one (round robin) for this and every later call.
//!
//! A call is sent again on the next endpoint only when that cannot do anything twice:
//! - it never left this process (the TCP connection or its name lookup failed), or
//! - it may have run, but it is a read (`Get*`, `List*`, `CheckMigLayout`,
//!   `ResolveDriver`, a `validate_only` dry run) or a create that carries a `request_id`,
//!   which is sent again unchanged, so the backend answers it with what the first one
//!   made.
//!
//! Any other call that may have run (an update, a delete, a create without a request id)
//! fails as it did, and the next call goes to the next endpoint. An UNAVAILABLE answer
//! marked [`gpufleet_proto::NOT_RUN`] (a replica that does not lead and could not pass
//! the call on) counts as never sent. A TLS failure or a deadline is not a lost
//! connection: it is answered as it is.
//!
//! When every endpoint failed so that the call may be sent again, the client goes round
//! them again, backing off, for up to [`FAILOVER_WINDOW`]: while the replica that led is
//! gone and another has not taken its lease over yet (the lease's TTL, 15 s by default),
//! no endpoint can answer. One endpoint (e.g. a load balancer's) is asked again so only
//! while it answers "not run"; a call to an address that does not answer fails at once.

use std::error::Error as StdErrorTrait;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use gpufleet_proto::v1;
use prost::Message;
use tonic::body::BoxBody;
use tonic::codegen::{http, BoxFuture, Bytes, Context, Poll, Service, StdError};
use tonic::transport::Channel;

/// At most this many endpoints.
pub const MAX_ENDPOINTS: usize = 8;

/// How long a call goes round its endpoints while none can answer it: longer than a
/// replica takes to take an expired lease over (a TTL of 15 s and a renewal every 5 s).
pub const FAILOVER_WINDOW: std::time::Duration = std::time::Duration::from_secs(45);
/// The pause after a round in which every endpoint failed, doubled each round up to the
/// last.
const FIRST_PAUSE: std::time::Duration = std::time::Duration::from_millis(200);
const LAST_PAUSE: std::time::Duration = std::time::Duration::from_secs(3);

/// How a call to one endpoint failed, as far as moving to another goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The connection could not be made: the backend never saw the call.
    NotSent,
    /// The connection broke (or the backend answered UNAVAILABLE) after the call was
    /// sent: it may have run.
    MaybeRan,
}

/// What a call is, as far as sending it twice goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// Changes nothing.
    Read,
    /// Carries a request id: the backend answers a second one with the first's result.
    Keyed,
    /// Anything else.
    Other,
}

/// Whether a call that failed so is sent again to the next endpoint.
pub fn may_retry(failure: Failure, call: Call) -> bool {
    match failure {
        Failure::NotSent => true,
        Failure::MaybeRan => matches!(call, Call::Read | Call::Keyed),
    }
}

/// What the call to `path` (`/gpufleet.v1.TenantService/CreateTenant`) with `body` (the
/// gRPC frame of its request) is.
pub fn call_kind(path: &str, body: &[u8]) -> Call {
    let Some(method) = path
        .strip_prefix("/gpufleet.v1.")
        .and_then(|p| p.split_once('/'))
        .map(|(_, m)| m)
    else {
        return Call::Other;
    };
    if method.starts_with("Get")
        || method.starts_with("List")
        || matches!(method, "CheckMigLayout" | "ResolveDriver")
    {
        return Call::Read;
    }
    // An uncompressed frame: flag 0, the length, the message (the provider compresses
    // nothing; anything else is not judged).
    let message = match body {
        [0, a, b, c, d, message @ ..]
            if u32::try_from(message.len()) == Ok(u32::from_be_bytes([*a, *b, *c, *d])) =>
        {
            message
        }
        _ => return Call::Other,
    };
    let (validate_only, request_id) = match method {
        "CreateTenant" => {
            fields::<v1::CreateTenantRequest>(message, |r| (r.validate_only, r.request_id.clone()))
        }
        "CreateGpuQuota" => fields::<v1::CreateGpuQuotaRequest>(message, |r| {
            (r.validate_only, r.request_id.clone())
        }),
        "CreateReservation" => fields::<v1::CreateReservationRequest>(message, |r| {
            (r.validate_only, r.request_id.clone())
        }),
        "CreateTenantCluster" => fields::<v1::CreateTenantClusterRequest>(message, |r| {
            (r.validate_only, r.request_id.clone())
        }),
        "CreateToken" => {
            fields::<v1::CreateTokenRequest>(message, |r| (r.validate_only, r.request_id.clone()))
        }
        "RotateToken" => {
            fields::<v1::RotateTokenRequest>(message, |r| (false, r.request_id.clone()))
        }
        "DeleteTenant" => {
            fields::<v1::DeleteTenantRequest>(message, |r| (r.validate_only, String::new()))
        }
        "UpdateGpuQuota" => {
            fields::<v1::UpdateGpuQuotaRequest>(message, |r| (r.validate_only, String::new()))
        }
        "DeleteGpuQuota" => {
            fields::<v1::DeleteGpuQuotaRequest>(message, |r| (r.validate_only, String::new()))
        }
        "UpdateReservation" => {
            fields::<v1::UpdateReservationRequest>(message, |r| (r.validate_only, String::new()))
        }
        "UpdateTenantCluster" => {
            fields::<v1::UpdateTenantClusterRequest>(message, |r| (r.validate_only, String::new()))
        }
        _ => None,
    }
    .unwrap_or((false, String::new()));
    if validate_only {
        Call::Read
    } else if !request_id.is_empty() {
        Call::Keyed
    } else {
        Call::Other
    }
}

fn fields<M: Message + Default>(
    message: &[u8],
    of: impl Fn(&M) -> (bool, String),
) -> Option<(bool, String)> {
    M::decode(message).ok().map(|m| of(&m))
}

/// How a transport error failed, from its chain of causes: None for what another
/// endpoint would not fix (a TLS handshake, a deadline).
pub fn failure(error: &(dyn StdErrorTrait + 'static)) -> Option<Failure> {
    let mut connect = false;
    let mut source = Some(error);
    while let Some(e) = source {
        if e.downcast_ref::<tokio_rustls::rustls::Error>().is_some()
            || e.downcast_ref::<tonic::TimeoutExpired>().is_some()
        {
            return None;
        }
        let refused = e
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused);
        connect |= refused || e.downcast_ref::<tonic::ConnectError>().is_some();
        source = e.source();
    }
    Some(if connect {
        Failure::NotSent
    } else {
        Failure::MaybeRan
    })
}

/// A response that says UNAVAILABLE in its headers (the backend's own, e.g. a replica
/// that is stopping): the call may have run, unless the backend says it did not.
fn unavailable(response: &http::Response<BoxBody>) -> Option<Failure> {
    let headers = response.headers();
    if headers
        .get("grpc-status")
        .is_none_or(|s| s.as_bytes() != b"14")
    {
        return None;
    }
    Some(if headers.contains_key(gpufleet_proto::NOT_RUN) {
        Failure::NotSent
    } else {
        Failure::MaybeRan
    })
}

/// Whether an answer is the backend's UNAVAILABLE saying it did not run the call.
fn said_not_run(response: &http::Response<BoxBody>) -> bool {
    response.headers().contains_key(gpufleet_proto::NOT_RUN)
        && unavailable(response) == Some(Failure::NotSent)
}

/// The endpoints and which is current, shared by every clone of the client's channel.
struct Shared<S> {
    endpoints: Vec<(String, S)>,
    current: AtomicUsize,
    /// [`FAILOVER_WINDOW`] (tests: shorter).
    window: std::time::Duration,
}

/// The channel the client's services call through: the endpoints' channels, in order.
pub struct Failover<S = Channel> {
    shared: Arc<Shared<S>>,
}

impl<S> Clone for Failover<S> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<S> Failover<S> {
    /// `endpoints`: each endpoint's URL and its channel (at least one).
    pub fn new(endpoints: Vec<(String, S)>) -> Self {
        assert!(!endpoints.is_empty(), "at least one endpoint");
        Self {
            shared: Arc::new(Shared {
                endpoints,
                current: AtomicUsize::new(0),
                window: FAILOVER_WINDOW,
            }),
        }
    }

    /// The same, going round the endpoints for `window` at most.
    #[cfg(test)]
    fn with_window(endpoints: Vec<(String, S)>, window: std::time::Duration) -> Self {
        let mut failover = Self::new(endpoints);
        Arc::get_mut(&mut failover.shared)
            .expect("not shared yet")
            .window = window;
        failover
    }

    /// The URL calls go to now.
    pub fn current(&self) -> &str {
        let n = self.shared.endpoints.len();
        &self.shared.endpoints[self.shared.current.load(Ordering::Relaxed) % n].0
    }
}

type Request = http::Request<BoxBody>;
type Response = http::Response<BoxBody>;

impl<S> Service<Request> for Failover<S>
where
    S: Service<Request, Response = Response> + Clone + Send + Sync + 'static,
    S::Error: Into<StdError>,
    S::Future: Send,
{
    type Response = Response;
    type Error = StdError;
    type Future = BoxFuture<Response, StdError>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), StdError>> {
        // Each call makes its endpoint's channel ready itself.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let shared = self.shared.clone();
        Box::pin(async move { shared.send(request).await })
    }
}

impl<S> Shared<S>
where
    S: Service<Request, Response = Response> + Clone + Send + Sync + 'static,
    S::Error: Into<StdError>,
    S::Future: Send,
{
    async fn send(&self, request: Request) -> Result<Response, StdError> {
        let n = self.endpoints.len();
        // The request again for each endpoint: a unary call's one frame.
        let (parts, body) = request.into_parts();
        let body = collect(body).await?;
        let kind = call_kind(parts.uri.path(), &body);
        let deadline = tokio::time::Instant::now() + self.window;
        let mut pause = FIRST_PAUSE;
        loop {
            match self.round(&parts, &body, kind).await {
                Round::Answered(answer) => return answer,
                Round::AllFailed(answer) => {
                    // One endpoint (a load balancer's, say) is asked again only when the
                    // backend said it did not run the call (a replica between leaders):
                    // an address that does not answer at all is reported at once.
                    let again = n > 1 || matches!(&answer, Ok(r) if said_not_run(r));
                    if !again || tokio::time::Instant::now() + pause > deadline {
                        return answer;
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(LAST_PAUSE);
                }
            }
        }
    }

    /// One try of each endpoint, from the current one, until one answers or a failure
    /// may not be sent again.
    async fn round(&self, parts: &http::request::Parts, body: &Bytes, kind: Call) -> Round {
        let n = self.endpoints.len();
        let start = self.current.load(Ordering::Relaxed);
        for attempt in 0..n {
            let at = (start + attempt) % n;
            let mut again =
                http::Request::new(tonic::body::boxed(http_body_util::Full::new(body.clone())));
            *again.method_mut() = parts.method.clone();
            *again.uri_mut() = parts.uri.clone();
            *again.version_mut() = parts.version;
            *again.headers_mut() = parts.headers.clone();
            *again.extensions_mut() = parts.extensions.clone();
            let answer = call(self.endpoints[at].1.clone(), again).await;
            let failed = match &answer {
                Ok(response) => unavailable(response),
                Err(e) => failure(e.as_ref()),
            };
            let Some(failed) = failed else {
                return Round::Answered(answer);
            };
            // Later calls go to the next endpoint (unless another call moved on already).
            let _ = self.current.compare_exchange(
                at,
                (at + 1) % n,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            if !may_retry(failed, kind) {
                return Round::Answered(answer);
            }
            if attempt + 1 == n {
                return Round::AllFailed(answer);
            }
        }
        unreachable!("the last attempt returns")
    }
}

/// How a round of the endpoints ended.
enum Round {
    /// With an answer to give (an endpoint's, or a failure that may not be sent again).
    Answered(Result<Response, StdError>),
    /// Every endpoint failed so that the call may be sent again: the last failure.
    AllFailed(Result<Response, StdError>),
}

/// One call on one endpoint's channel, once it is ready.
async fn call<S>(mut service: S, request: Request) -> Result<Response, StdError>
where
    S: Service<Request, Response = Response>,
    S::Error: Into<StdError>,
{
    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .map_err(Into::into)?;
    service.call(request).await.map_err(Into::into)
}

async fn collect(body: BoxBody) -> Result<Bytes, StdError> {
    use http_body_util::BodyExt;
    Ok(body.collect().await?.to_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn frame(message: &impl Message) -> Vec<u8> {
        let bytes = message.encode_to_vec();
        let mut frame = vec![0];
        frame.extend((bytes.len() as u32).to_be_bytes());
        frame.extend(bytes);
        frame
    }

    #[test]
    fn reads_and_keyed_creates_are_sent_again_and_other_changes_only_when_never_sent() {
        let create = |request_id: &str| v1::CreateTenantRequest {
            request_id: request_id.into(),
            name: "speech".into(),
            ..Default::default()
        };
        let path = "/gpufleet.v1.TenantService/CreateTenant";
        assert_eq!(call_kind(path, &frame(&create("r-1"))), Call::Keyed);
        assert_eq!(call_kind(path, &frame(&create(""))), Call::Other);
        let dry_run = v1::CreateTenantRequest {
            validate_only: true,
            ..create("")
        };
        assert_eq!(call_kind(path, &frame(&dry_run)), Call::Read);
        let cluster = v1::CreateTenantClusterRequest {
            request_id: "tf-abc".into(),
            ..Default::default()
        };
        assert_eq!(
            call_kind(
                "/gpufleet.v1.TenantClusterService/CreateTenantCluster",
                &frame(&cluster)
            ),
            Call::Keyed
        );
        let rotate = v1::RotateTokenRequest {
            request_id: "r-2".into(),
            ..Default::default()
        };
        assert_eq!(
            call_kind("/gpufleet.v1.AccessService/RotateToken", &frame(&rotate)),
            Call::Keyed
        );
        for read in [
            "/gpufleet.v1.TenantService/GetTenant",
            "/gpufleet.v1.FleetService/ListNodes",
            "/gpufleet.v1.FleetService/CheckMigLayout",
        ] {
            assert_eq!(call_kind(read, &[]), Call::Read, "{read}");
        }
        let update = v1::UpdateTenantClusterRequest {
            id: "c-1".into(),
            ..Default::default()
        };
        let update_path = "/gpufleet.v1.TenantClusterService/UpdateTenantCluster";
        assert_eq!(call_kind(update_path, &frame(&update)), Call::Other);
        let planned = v1::UpdateTenantClusterRequest {
            validate_only: true,
            ..update
        };
        assert_eq!(call_kind(update_path, &frame(&planned)), Call::Read);
        for other in [
            "/gpufleet.v1.TenantClusterService/DeleteTenantCluster",
            "/gpufleet.v1.FleetService/DrainNode",
            "/gpufleet.v1.HealthService/RunHealthCheck",
            "/other.v1.Service/GetThing",
        ] {
            assert_eq!(call_kind(other, &[0, 0, 0, 0, 0]), Call::Other, "{other}");
        }
        // A frame that is not one (compressed, cut short) is not judged a keyed create.
        let mut compressed = frame(&create("r-1"));
        compressed[0] = 1;
        assert_eq!(call_kind(path, &compressed), Call::Other);
        let whole = frame(&create("r-1"));
        assert_eq!(call_kind(path, &whole[..whole.len() - 1]), Call::Other);

        for call in [Call::Read, Call::Keyed, Call::Other] {
            assert!(may_retry(Failure::NotSent, call));
        }
        assert!(may_retry(Failure::MaybeRan, Call::Read));
        assert!(may_retry(Failure::MaybeRan, Call::Keyed));
        assert!(!may_retry(Failure::MaybeRan, Call::Other));
    }

    #[test]
    fn a_refused_connection_was_never_sent_and_a_reset_one_may_have_run() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(failure(&refused), Some(Failure::NotSent));
        let connect =
            tonic::ConnectError(Box::new(std::io::Error::from(std::io::ErrorKind::TimedOut)));
        assert_eq!(failure(&connect), Some(Failure::NotSent));
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert_eq!(failure(&reset), Some(Failure::MaybeRan));
        let tls = tonic::ConnectError(Box::new(tokio_rustls::rustls::Error::General(
            "bad certificate".into(),
        )));
        assert_eq!(failure(&tls), None, "TLS is a setting, not a lost replica");
        assert_eq!(failure(&tonic::TimeoutExpired(())), None);
    }

    /// A fake endpoint: answers with `answer` and records the request ids it was sent.
    #[derive(Clone)]
    struct Fake {
        answer: fn() -> Result<Response, StdError>,
        seen: Arc<Mutex<Vec<String>>>,
        /// Answers OK from the call after this many (a replica that came to lead).
        ok_after: Option<usize>,
    }

    impl Service<Request> for Fake {
        type Response = Response;
        type Error = StdError;
        type Future = BoxFuture<Response, StdError>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), StdError>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: Request) -> Self::Future {
            let (seen, answer, ok_after) = (self.seen.clone(), self.answer, self.ok_after);
            Box::pin(async move {
                let body = collect(request.into_body()).await?;
                let id = v1::CreateTenantRequest::decode(&body[5..])
                    .map(|r| r.request_id)
                    .unwrap_or_default();
                let calls = {
                    let mut seen = seen.lock().unwrap();
                    seen.push(id);
                    seen.len()
                };
                match ok_after {
                    Some(n) if calls > n => ok(),
                    _ => answer(),
                }
            })
        }
    }

    fn ok() -> Result<Response, StdError> {
        Ok(http::Response::new(tonic::body::empty_body()))
    }

    fn refused() -> Result<Response, StdError> {
        Err(Box::new(tonic::ConnectError(Box::new(
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        ))))
    }

    fn reset() -> Result<Response, StdError> {
        Err(Box::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        )))
    }

    fn not_run() -> Result<Response, StdError> {
        let mut response = http::Response::new(tonic::body::empty_body());
        response
            .headers_mut()
            .insert("grpc-status", http::HeaderValue::from_static("14"));
        response
            .headers_mut()
            .insert(gpufleet_proto::NOT_RUN, http::HeaderValue::from_static("1"));
        Ok(response)
    }

    fn stopping() -> Result<Response, StdError> {
        let mut response = http::Response::new(tonic::body::empty_body());
        response
            .headers_mut()
            .insert("grpc-status", http::HeaderValue::from_static("14"));
        Ok(response)
    }

    fn replicas(answers: &[fn() -> Result<Response, StdError>]) -> (Failover<Fake>, Vec<Fake>) {
        let fakes: Vec<Fake> = answers
            .iter()
            .map(|&answer| Fake {
                answer,
                seen: Arc::default(),
                ok_after: None,
            })
            .collect();
        let endpoints = fakes
            .iter()
            .enumerate()
            .map(|(i, f)| (format!("http://replica-{i}:7700"), f.clone()))
            .collect();
        (Failover::new(endpoints), fakes)
    }

    fn create(request_id: &str) -> Request {
        let body = frame(&v1::CreateTenantRequest {
            request_id: request_id.into(),
            name: "speech".into(),
            ..Default::default()
        });
        let mut request = http::Request::new(tonic::body::boxed(http_body_util::Full::new(
            Bytes::from(body),
        )));
        *request.uri_mut() = "/gpufleet.v1.TenantService/CreateTenant".parse().unwrap();
        request
    }

    fn seen(fake: &Fake) -> Vec<String> {
        fake.seen.lock().unwrap().clone()
    }

    #[tokio::test]
    async fn a_refused_endpoint_is_left_for_the_next_for_this_call_and_later_ones() {
        let (mut failover, fakes) = replicas(&[refused, ok, ok]);
        assert_eq!(failover.current(), "http://replica-0:7700");
        failover.call(create("")).await.unwrap();
        assert_eq!(seen(&fakes[0]), [""]);
        assert_eq!(seen(&fakes[1]), [""], "never sent, so sent again");
        assert_eq!(failover.current(), "http://replica-1:7700");
        failover.call(create("r-2")).await.unwrap();
        assert_eq!(
            seen(&fakes[0]).len(),
            1,
            "the next call starts at the live one"
        );
        assert_eq!(seen(&fakes[1]), ["", "r-2"]);
        assert!(seen(&fakes[2]).is_empty());
    }

    #[tokio::test]
    async fn a_call_that_may_have_run_is_sent_again_only_with_its_request_id() {
        let (mut failover, fakes) = replicas(&[reset, ok]);
        failover.call(create("r-1")).await.unwrap();
        assert_eq!(seen(&fakes[0]), ["r-1"]);
        assert_eq!(seen(&fakes[1]), ["r-1"], "the same request id");

        let (mut failover, fakes) = replicas(&[reset, ok]);
        let err = failover.call(create("")).await.unwrap_err();
        assert!(failure(err.as_ref()) == Some(Failure::MaybeRan), "{err}");
        assert!(seen(&fakes[1]).is_empty(), "not sent twice");
        assert_eq!(failover.current(), "http://replica-1:7700", "but moved on");

        let (mut failover, fakes) = replicas(&[stopping, ok]);
        failover.call(create("r-3")).await.unwrap();
        assert_eq!(seen(&fakes[1]), ["r-3"]);
        let (mut failover, fakes) = replicas(&[stopping, ok]);
        let answer = failover.call(create("")).await.unwrap();
        assert_eq!(
            unavailable(&answer),
            Some(Failure::MaybeRan),
            "the backend's UNAVAILABLE, as it was"
        );
        assert!(seen(&fakes[1]).is_empty());

        // A replica that says it did not run the call: any call goes on to the next.
        let (mut failover, fakes) = replicas(&[not_run, ok]);
        failover.call(create("")).await.unwrap();
        assert_eq!(seen(&fakes[1]), [""]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_endpoints_are_gone_round_until_one_answers_within_the_window() {
        // Between two leaders: every replica answers "not run" until one leads (its
        // fourth call here).
        let (_, fakes) = replicas(&[not_run, not_run]);
        let fakes: Vec<Fake> = fakes
            .into_iter()
            .map(|f| Fake {
                ok_after: Some(3),
                ..f
            })
            .collect();
        let endpoints = fakes
            .iter()
            .enumerate()
            .map(|(i, f)| (format!("http://replica-{i}:7700"), f.clone()))
            .collect();
        let started = tokio::time::Instant::now();
        let mut failover = Failover::with_window(endpoints, std::time::Duration::from_secs(45));
        let answer = failover.call(create("")).await.unwrap();
        assert_eq!(unavailable(&answer), None, "answered");
        assert_eq!((seen(&fakes[0]).len(), seen(&fakes[1]).len()), (4, 3));
        assert!(
            started.elapsed() >= FIRST_PAUSE,
            "it backed off between rounds"
        );

        // None ever answers: the last failure, once the window is spent.
        let (_, fakes) = replicas(&[not_run, not_run]);
        let endpoints = fakes
            .iter()
            .enumerate()
            .map(|(i, f)| (format!("http://replica-{i}:7700"), f.clone()))
            .collect();
        let started = tokio::time::Instant::now();
        let window = std::time::Duration::from_secs(45);
        let mut failover = Failover::with_window(endpoints, window);
        let answer = failover.call(create("")).await.unwrap();
        assert_eq!(unavailable(&answer), Some(Failure::NotSent));
        assert!(started.elapsed() <= window, "{:?}", started.elapsed());
        assert!(seen(&fakes[0]).len() > 3, "went round several times");
    }

    #[tokio::test(start_paused = true)]
    async fn every_endpoint_is_tried_once_and_the_last_failure_answers() {
        let (_, fakes) = replicas(&[refused, refused, refused]);
        let endpoints = fakes
            .iter()
            .enumerate()
            .map(|(i, f)| (format!("http://replica-{i}:7700"), f.clone()))
            .collect();
        // No window: one round.
        let mut failover = Failover::with_window(endpoints, std::time::Duration::ZERO);
        let err = failover.call(create("r-1")).await.unwrap_err();
        assert_eq!(failure(err.as_ref()), Some(Failure::NotSent));
        for fake in &fakes {
            assert_eq!(seen(fake), ["r-1"]);
        }
        // One endpoint that answers "not run" (a replica between leaders, behind a load
        // balancer) is asked again until it runs the call.
        let fake = Fake {
            answer: not_run,
            seen: Arc::default(),
            ok_after: Some(2),
        };
        let mut failover = Failover::with_window(
            vec![("http://lb:7700".to_string(), fake.clone())],
            std::time::Duration::from_secs(45),
        );
        let answer = failover.call(create("")).await.unwrap();
        assert_eq!(unavailable(&answer), None);
        assert_eq!(seen(&fake).len(), 3);
        // One endpoint: sent once, as without failover.
        let (mut failover, fakes) = replicas(&[reset]);
        failover.call(create("r-1")).await.unwrap_err();
        assert_eq!(seen(&fakes[0]), ["r-1"]);
        assert_eq!(failover.current(), "http://replica-0:7700");
    }
}
