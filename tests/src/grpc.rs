//! gRPC clients for every gpufleet.v1 service, carrying one bearer token.

use gpufleet_proto::v1::fleet_service_client::FleetServiceClient;
use gpufleet_proto::v1::gpu_quota_service_client::GpuQuotaServiceClient;
use gpufleet_proto::v1::reservation_service_client::ReservationServiceClient;
use gpufleet_proto::v1::tenant_cluster_service_client::TenantClusterServiceClient;
use gpufleet_proto::v1::tenant_service_client::TenantServiceClient;
use gpufleet_proto::v1::{
    ListGpuQuotasRequest, ListNodesRequest, ListReservationsRequest, ListTenantClustersRequest,
    ListTenantsRequest,
};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig};

/// The clients' interceptor (one for every gpufleet client).
pub use gpufleet_proto::BearerAuth;

/// The interceptor for `token`, which the tests make printable.
pub fn bearer_auth(token: &str) -> BearerAuth {
    BearerAuth::new(token).expect("a token is printable ASCII")
}

pub type Authed = InterceptedService<Channel, BearerAuth>;

/// One client per service, all on one connection and one token.
#[derive(Clone)]
pub struct Clients {
    pub tenants: TenantServiceClient<Authed>,
    pub quotas: GpuQuotaServiceClient<Authed>,
    pub reservations: ReservationServiceClient<Authed>,
    pub clusters: TenantClusterServiceClient<Authed>,
    pub fleet: FleetServiceClient<Authed>,
}

/// What the backend holds, as seen with one token: for "the backend is empty" and
/// "nothing changed" assertions.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Inventory {
    pub tenants: Vec<gpufleet_proto::v1::Tenant>,
    pub quotas: Vec<gpufleet_proto::v1::GpuQuota>,
    pub reservations: Vec<gpufleet_proto::v1::Reservation>,
    pub clusters: Vec<gpufleet_proto::v1::TenantCluster>,
}

impl Inventory {
    pub fn is_empty(&self) -> bool {
        self.tenants.is_empty()
            && self.quotas.is_empty()
            && self.reservations.is_empty()
            && self.clusters.is_empty()
    }
}

impl Clients {
    pub async fn connect(endpoint: &str, token: &str) -> Clients {
        Clients::connect_with_ca(endpoint, token, None).await
    }

    /// Like [`Clients::connect`]; for an https endpoint, trusting the CA `ca_pem` and
    /// checking that the server's certificate names the endpoint's host.
    pub async fn connect_with_ca(endpoint: &str, token: &str, ca_pem: Option<&str>) -> Clients {
        let mut builder = Channel::from_shared(endpoint.to_string())
            .unwrap_or_else(|e| panic!("bad endpoint {endpoint:?}: {e}"));
        if let Some(ca) = ca_pem {
            let host = builder.uri().host().unwrap_or_default().to_string();
            let tls = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(ca))
                .domain_name(host);
            builder = builder
                .tls_config(tls)
                .unwrap_or_else(|e| panic!("TLS config for {endpoint}: {e:?}"));
        }
        let channel = builder
            .connect()
            .await
            .unwrap_or_else(|e| panic!("connect to {endpoint}: {e:?}"));
        Clients::on_channel(channel, token)
    }

    /// Like [`Clients::connect`], from inside a host of the multi-host tier: every
    /// connection (reconnects too) is made in `from`'s network namespace.
    pub async fn connect_from(
        from: &crate::netns::Launcher,
        endpoint: &str,
        token: &str,
    ) -> Clients {
        Clients::on_channel(channel_from(from, endpoint).await, token)
    }

    /// Clients on an existing channel.
    pub fn on_channel(channel: Channel, token: &str) -> Clients {
        let auth = bearer_auth(token);
        Clients {
            tenants: TenantServiceClient::with_interceptor(channel.clone(), auth.clone()),
            quotas: GpuQuotaServiceClient::with_interceptor(channel.clone(), auth.clone()),
            reservations: ReservationServiceClient::with_interceptor(channel.clone(), auth.clone()),
            clusters: TenantClusterServiceClient::with_interceptor(channel.clone(), auth.clone()),
            fleet: FleetServiceClient::with_interceptor(channel, auth),
        }
    }

    /// Every tenant, quota, reservation and cluster this token can see. A tenant token's
    /// ListTenants may be refused; that counts as "none visible".
    pub async fn inventory(&mut self) -> Inventory {
        let tenants = match self
            .tenants
            .list_tenants(ListTenantsRequest::default())
            .await
        {
            Ok(r) => r.into_inner().tenants,
            Err(status) if status.code() == tonic::Code::PermissionDenied => Vec::new(),
            Err(status) => panic!("ListTenants: {status}"),
        };
        let quotas = self
            .quotas
            .list_gpu_quotas(ListGpuQuotasRequest::default())
            .await
            .unwrap_or_else(|s| panic!("ListGpuQuotas: {s}"))
            .into_inner()
            .quotas;
        let reservations = self
            .reservations
            .list_reservations(ListReservationsRequest::default())
            .await
            .unwrap_or_else(|s| panic!("ListReservations: {s}"))
            .into_inner()
            .reservations;
        let clusters = self
            .clusters
            .list_tenant_clusters(ListTenantClustersRequest::default())
            .await
            .unwrap_or_else(|s| panic!("ListTenantClusters: {s}"))
            .into_inner()
            .clusters;
        Inventory {
            tenants,
            quotas,
            reservations,
            clusters,
        }
    }

    /// Every node this token can see.
    pub async fn nodes(&mut self) -> Vec<gpufleet_proto::v1::Node> {
        self.fleet
            .list_nodes(ListNodesRequest::default())
            .await
            .unwrap_or_else(|s| panic!("ListNodes: {s}"))
            .into_inner()
            .nodes
    }
}

/// A plain-http channel to `endpoint` whose connections are made in `from`'s network
/// namespace (see [`crate::netns::Launcher::connect`]).
pub async fn channel_from(from: &crate::netns::Launcher, endpoint: &str) -> Channel {
    let from = from.clone();
    let connector = tower::service_fn(move |uri: tonic::transport::Uri| {
        let from = from.clone();
        async move {
            let host = uri.host().unwrap_or_default().to_string();
            let port = uri.port_u16().unwrap_or(80);
            let addr: std::net::SocketAddr = format!("{host}:{port}")
                .parse()
                .map_err(|e| std::io::Error::other(format!("{uri}: not an address:port: {e}")))?;
            // The namespace's thread blocks on connect: off the runtime's workers.
            let (tx, rx) = tokio::sync::oneshot::channel();
            std::thread::spawn(move || {
                let _ = tx.send(from.connect(addr));
            });
            let stream = rx
                .await
                .map_err(|_| std::io::Error::other("the connecting thread ended"))??;
            stream.set_nonblocking(true)?;
            let stream = tokio::net::TcpStream::from_std(stream)?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
        }
    });
    tonic::transport::Endpoint::from_shared(endpoint.to_string())
        .unwrap_or_else(|e| panic!("bad endpoint {endpoint:?}: {e}"))
        .connect_with_connector(connector)
        .await
        .unwrap_or_else(|e| panic!("connect to {endpoint}: {e:?}"))
}
