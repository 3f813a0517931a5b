//! The gpufleet API client: one channel (over one endpoint, or several that it fails over
//! between: `failover.rs`), the bearer token on every call, and the one place where gRPC
//! statuses become diagnostics a person can act on.

use std::error::Error as _;
use std::time::Duration;

use gpufleet_proto::limits::MAX_MESSAGE_BYTES;
use gpufleet_proto::v1::{
    fleet_service_client::FleetServiceClient, gpu_quota_service_client::GpuQuotaServiceClient,
    reservation_service_client::ReservationServiceClient,
    tenant_cluster_service_client::TenantClusterServiceClient,
    tenant_service_client::TenantServiceClient, GpuType, ListGpuTypesRequest, ListNodesRequest,
    Node, TenantCluster,
};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
use tonic::{Code, Status};

use crate::failover::Failover;
use crate::framework::Diagnostic;

use gpufleet_proto::BearerAuth;

type Authed = InterceptedService<Failover, BearerAuth>;

pub struct Client {
    /// The endpoints as diagnostics name them (comma-separated when several).
    endpoint: String,
    channel: Failover,
    auth: BearerAuth,
    /// The catalog does not change while Terraform runs: fetched once per process.
    gpu_types: tokio::sync::OnceCell<Vec<GpuType>>,
    /// The id of the token's own tenant (None: the admin token), asked once.
    /// The token's own tenant (id, name); None for the admin token.
    own_tenant: tokio::sync::OnceCell<Option<(String, String)>>,
}

impl Client {
    /// A client that connects on first use (so a plan that needs no API call does not
    /// need the backend), to the first of `endpoints` (at least one; see
    /// `crate::failover` for when it moves to the next).
    pub fn new(
        endpoints: &[String],
        token: Option<&str>,
        ca_cert_pem: Option<&str>,
    ) -> Result<Self, Diagnostic> {
        let mut checked = Vec::new();
        for endpoint in endpoints {
            let builder = checked_endpoint(endpoint, endpoints.len() > 1, ca_cert_pem)?;
            checked.push((endpoint.clone(), builder));
        }
        if checked.is_empty() {
            return Err(Diagnostic::error("endpoints: no endpoint", ""));
        }
        let auth = match token {
            Some(token) => {
                // The backend refuses such a token; say why before any call.
                if token.trim() != token {
                    return Err(Diagnostic::error(
                        "token: has leading or trailing whitespace, which no token has",
                        "A token read with file() keeps the file's newline: use trimspace(file(\"...\")).",
                    ));
                }
                BearerAuth::new(token).ok_or_else(|| {
                    Diagnostic::error("token: contains characters not allowed in a header", "")
                })?
            }
            None => BearerAuth::none(),
        };
        Ok(Self {
            endpoint: endpoints.join(", "),
            channel: Failover::new(
                checked
                    .into_iter()
                    .map(|(url, builder)| (url, builder.connect_lazy()))
                    .collect(),
            ),
            auth,
            gpu_types: tokio::sync::OnceCell::new(),
            own_tenant: tokio::sync::OnceCell::new(),
        })
    }

    /// The id of the tenant whose token this client holds; None for the admin token (or
    /// when the backend cannot say).
    pub async fn own_tenant(&self) -> Option<String> {
        self.own_tenant_named().await.map(|(id, _)| id)
    }

    /// The id and name of the tenant whose token this client holds; None for the admin
    /// token (or when the backend cannot say).
    pub async fn own_tenant_named(&self) -> Option<(String, String)> {
        self.own_tenant
            .get_or_init(|| async {
                let request = gpufleet_proto::v1::GetTenantRequest { id: String::new() };
                self.tenants()
                    .get_tenant(request)
                    .await
                    .ok()
                    .map(|t| t.into_inner())
                    .map(|t| (t.id, t.name))
            })
            .await
            .clone()
    }

    /// The control plane's URL that calls go to now (the first configured, or the one it
    /// moved to).
    pub fn endpoint(&self) -> &str {
        self.channel.current()
    }

    pub fn tenants(&self) -> TenantServiceClient<Authed> {
        TenantServiceClient::with_interceptor(self.channel.clone(), self.auth.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
    }

    pub fn quotas(&self) -> GpuQuotaServiceClient<Authed> {
        GpuQuotaServiceClient::with_interceptor(self.channel.clone(), self.auth.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
    }

    pub fn reservations(&self) -> ReservationServiceClient<Authed> {
        ReservationServiceClient::with_interceptor(self.channel.clone(), self.auth.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
    }

    pub fn fleet(&self) -> FleetServiceClient<Authed> {
        FleetServiceClient::with_interceptor(self.channel.clone(), self.auth.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
    }

    pub fn clusters(&self) -> TenantClusterServiceClient<Authed> {
        TenantClusterServiceClient::with_interceptor(self.channel.clone(), self.auth.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
    }

    pub fn access(&self) -> gpufleet_proto::v1::access_service_client::AccessServiceClient<Authed> {
        gpufleet_proto::v1::access_service_client::AccessServiceClient::with_interceptor(
            self.channel.clone(),
            self.auth.clone(),
        )
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
    }

    pub fn health(&self) -> gpufleet_proto::v1::health_service_client::HealthServiceClient<Authed> {
        gpufleet_proto::v1::health_service_client::HealthServiceClient::with_interceptor(
            self.channel.clone(),
            self.auth.clone(),
        )
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// Every node (of `gpu_type` and/or `cluster_id` when not empty), following pages.
    pub async fn all_nodes(&self, gpu_type: &str, cluster_id: &str) -> Result<Vec<Node>, Status> {
        let mut nodes = Vec::new();
        let mut page_token = String::new();
        loop {
            let request = ListNodesRequest {
                gpu_type: gpu_type.into(),
                cluster_id: cluster_id.into(),
                page_token,
                ..Default::default()
            };
            let page = self.fleet().list_nodes(request).await?.into_inner();
            nodes.extend(page.nodes);
            if page.next_page_token.is_empty() {
                return Ok(nodes);
            }
            page_token = page.next_page_token;
        }
    }

    /// A cluster with every node: an answer lists the first ones and counts the rest in
    /// `nodes_omitted`, which are then read with ListNodes.
    pub async fn with_all_nodes(
        &self,
        mut cluster: TenantCluster,
    ) -> Result<TenantCluster, Status> {
        if cluster.nodes_omitted > 0 {
            cluster.nodes = self.all_nodes("", &cluster.id).await?;
            cluster.nodes_omitted = 0;
            // A cluster's answer carries no heartbeat ages (ListNodes does): without this
            // a cluster of more than one page would drift on every refresh.
            for n in &mut cluster.nodes {
                n.heartbeat_age_seconds = 0;
            }
        }
        Ok(cluster)
    }

    /// The GPU model catalog (cached for the life of the provider process).
    pub async fn gpu_types(&self) -> Result<&[GpuType], Diagnostic> {
        self.gpu_types
            .get_or_try_init(|| async {
                self.fleet()
                    .list_gpu_types(ListGpuTypesRequest {})
                    .await
                    .map(|r| r.into_inner().gpu_types)
                    .map_err(|s| self.diagnostic(&s))
            })
            .await
            .map(Vec::as_slice)
    }

    /// A person-readable diagnostic for a failed call.
    pub fn diagnostic(&self, status: &Status) -> Diagnostic {
        describe_status(&self.endpoint, status)
    }
}

/// Between pings of a connection, and how long one may go unanswered.
const KEEPALIVE: Duration = Duration::from_secs(5);

/// `endpoint` checked, with its settings (one of several when `several`: its diagnostics
/// then name the `endpoints` attribute).
fn checked_endpoint(
    endpoint: &str,
    several: bool,
    ca_cert_pem: Option<&str>,
) -> Result<Endpoint, Diagnostic> {
    let attribute = if several { "endpoints" } else { "endpoint" };
    let mut builder = Endpoint::from_shared(endpoint.to_string())
        .map_err(|e| {
            Diagnostic::error(
                format!("{attribute}: {endpoint:?} is not a valid URL ({e})"),
                "Use e.g. http://127.0.0.1:7700 or https://gpufleet.example.com.",
            )
        })?
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(120))
        // A replica cut off the network answers nothing and closes nothing: unanswered
        // pings end the connection, so that a call moves on to the next endpoint instead
        // of waiting out its deadline.
        .http2_keep_alive_interval(KEEPALIVE)
        .keep_alive_timeout(KEEPALIVE)
        .keep_alive_while_idle(true)
        .tcp_nodelay(true);
    if let Some(pem) = ca_cert_pem {
        if !pem.contains("-----BEGIN CERTIFICATE-----") {
            return Err(Diagnostic::error(
                "ca_cert_pem: holds no PEM certificate (no -----BEGIN CERTIFICATE----- line)",
                "Set it to the CA's certificate, e.g. `ca_cert_pem = file(\"ca.pem\")`, or GPUFLEET_CA_CERT_PEM to its text.",
            ));
        }
        let host = builder.uri().host().unwrap_or_default().to_string();
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(pem))
            .domain_name(host);
        builder = builder.tls_config(tls).map_err(|e| {
            Diagnostic::error(
                format!("ca_cert_pem: cannot use this certificate ({e})"),
                "",
            )
        })?;
    } else if endpoint.starts_with("https://") {
        return Err(Diagnostic::error(
            "ca_cert_pem: an https endpoint needs the CA certificate that signed the backend's certificate",
            "This provider does not bundle public root certificates; set `ca_cert_pem` (or GPUFLEET_CA_CERT_PEM) to the PEM of the backend's CA.",
        ));
    }
    Ok(builder)
}

/// Maps a gRPC status to a diagnostic: transport failures say where and what to check,
/// authentication failures point at the token, and the backend's own messages (which
/// name the field and the numbers) pass through verbatim.
pub fn describe_status(endpoint: &str, status: &Status) -> Diagnostic {
    let message = status.message();
    if let Some(tls) = tls_failure(endpoint, status) {
        return tls;
    }
    match status.code() {
        Code::Unavailable | Code::Unknown | Code::DeadlineExceeded if is_transport_failure(status) => {
            Diagnostic::error(
                format!(
                    "cannot reach the gpufleet backend at {endpoint}: {}. Is `gpufleet-agent serve` running? Set `endpoint` or GPUFLEET_ENDPOINT.",
                    transport_cause(status)
                ),
                "",
            )
        }
        // The backend's own wording carries a hint for every kind of client; ours is
        // specific to the provider, so it replaces it instead of repeating it.
        // A token that cannot be one (whitespace, too long), or one of the backend's that no
        // longer works (`token 'ci' of tenant 'a' expired at ...`, `was rotated at ... and
        // its overlap ended at ...`, `was revoked at ...`): the backend says which.
        Code::Unauthenticated
            if message.starts_with("the bearer token") || message.starts_with("token '") =>
        {
            Diagnostic::error(
            format!("the gpufleet backend at {endpoint} rejected the token: {message}. Set `token` or GPUFLEET_TOKEN to the admin token or a tenant token."),
            "",
        )
        }
        Code::Unauthenticated => Diagnostic::error(
            format!("the gpufleet backend at {endpoint} rejected the token (missing, revoked or not one of its tokens). Set `token` or GPUFLEET_TOKEN to the admin token or a tenant token."),
            "",
        ),
        Code::PermissionDenied => Diagnostic::error(
            format!("the token does not allow this: {message}"),
            "Managing tenants and quotas needs the admin token; a tenant token manages only its own reservations and clusters.",
        ),
        Code::DeadlineExceeded => Diagnostic::error(
            format!("the gpufleet backend at {endpoint} did not answer in time: {message}"),
            "",
        ),
        _ => Diagnostic::error(message.to_string(), ""),
    }
}

/// A failed TLS handshake, in words that say which setting is wrong: rustls's error (in
/// the transport error's chain) says whether the CA or the name did not match.
fn tls_failure(endpoint: &str, status: &Status) -> Option<Diagnostic> {
    const PEER_CERT: &str = "invalid peer certificate: ";
    let mut source = status.source();
    while let Some(err) = source {
        let text = err.to_string();
        if let Some(reason) = text.strip_prefix(PEER_CERT) {
            let summary = match reason {
                "UnknownIssuer" | "BadSignature" => format!(
                    "TLS handshake with the gpufleet backend at {endpoint} failed: the server's certificate is not signed by ca_cert_pem"
                ),
                _ => format!(
                    "TLS handshake with the gpufleet backend at {endpoint} failed: the server's certificate is not accepted ({reason})"
                ),
            };
            return Some(Diagnostic::error(
                summary,
                "Set `ca_cert_pem` (or GPUFLEET_CA_CERT_PEM) to the CA that signed the backend's certificate, and use an endpoint host that the certificate names.",
            ));
        }
        if text.starts_with("received corrupt message") {
            return Some(Diagnostic::error(
                format!("TLS handshake with the gpufleet backend at {endpoint} failed: the server did not answer with TLS ({text})"),
                "Use an http:// endpoint if the backend serves without --tls-cert.",
            ));
        }
        source = err.source();
    }
    None
}

fn is_transport_failure(status: &Status) -> bool {
    status.source().is_some()
        || status.message().contains("transport error")
        || status.message().contains("error trying to connect")
}

/// The innermost cause of a transport failure, in words ("connection refused").
fn transport_cause(status: &Status) -> String {
    let mut source = status.source();
    let mut innermost: Option<String> = None;
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return io_words(io);
        }
        innermost = Some(err.to_string());
        source = err.source();
    }
    innermost.unwrap_or_else(|| status.message().to_string())
}

fn io_words(err: &std::io::Error) -> String {
    use std::io::ErrorKind;
    match err.kind() {
        ErrorKind::ConnectionRefused => "connection refused".into(),
        ErrorKind::ConnectionReset => "connection reset".into(),
        ErrorKind::TimedOut => "connection timed out".into(),
        ErrorKind::NotFound => "host not found".into(),
        _ => err.to_string(),
    }
}

#[cfg(test)]
mod failover_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn refused_connection_is_one_clear_sentence() {
        // A port nothing listens on: bind, note the port, close.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let endpoint = format!("http://127.0.0.1:{port}");
        let client = Client::new(std::slice::from_ref(&endpoint), Some("t"), None).unwrap();
        let err = client.gpu_types().await.unwrap_err();
        assert_eq!(
            err.summary,
            format!("cannot reach the gpufleet backend at {endpoint}: connection refused. Is `gpufleet-agent serve` running? Set `endpoint` or GPUFLEET_ENDPOINT.")
        );
    }

    #[test]
    fn backend_messages_pass_through_verbatim() {
        let status = Status::failed_precondition("needs 24 H100-80GB GPUs, quota leaves 16");
        assert_eq!(
            describe_status("http://x", &status).summary,
            "needs 24 H100-80GB GPUs, quota leaves 16"
        );
        let status = Status::unauthenticated("unknown token");
        assert_eq!(
            describe_status("http://x", &status).summary,
            "the gpufleet backend at http://x rejected the token (missing, revoked or not one of its tokens). Set `token` or GPUFLEET_TOKEN to the admin token or a tenant token."
        );
    }

    #[test]
    fn a_token_with_whitespace_or_expired_is_refused_saying_why() {
        let err = Client::new(&["http://127.0.0.1:1".into()], Some("gft_abc\n"), None)
            .err()
            .unwrap();
        assert!(err
            .summary
            .starts_with("token: has leading or trailing whitespace"));
        assert!(err.detail.contains("trimspace"));
        let status = Status::unauthenticated(
            "token 'ci' of tenant 'a' expired at 2026-01-01T00:00:00Z; ask for a new one",
        );
        assert_eq!(
            describe_status("http://x", &status).summary,
            "the gpufleet backend at http://x rejected the token: token 'ci' of tenant 'a' expired at 2026-01-01T00:00:00Z; ask for a new one. Set `token` or GPUFLEET_TOKEN to the admin token or a tenant token."
        );
        let status = Status::unauthenticated("the bearer token is 4096 characters long");
        assert!(describe_status("http://x", &status)
            .summary
            .contains("rejected the token: the bearer token is 4096 characters long"));
    }

    #[test]
    fn ca_cert_pem_without_a_certificate_is_refused() {
        let err = Client::new(
            &["https://gpufleet.example.com".into()],
            None,
            Some("not pem"),
        )
        .err()
        .unwrap();
        assert!(err
            .summary
            .starts_with("ca_cert_pem: holds no PEM certificate"));
    }

    #[test]
    fn https_without_a_ca_is_refused_with_the_reason() {
        let err = Client::new(&["https://gpufleet.example.com".into()], None, None)
            .err()
            .unwrap();
        assert!(err.summary.starts_with("ca_cert_pem:"));
        let err = Client::new(&["not a url".into()], None, None)
            .err()
            .unwrap();
        assert!(err.summary.starts_with("endpoint:"));
    }
}
