//! The client's failover over real connections (`crate::failover` moves between the
//! endpoints; this drives it through [`Client`] against real tonic replicas).

use std::sync::{Arc, Mutex};

use gpufleet_proto::v1;

use super::Client;

/// A real tonic replica of TenantService: it records the request ids of creates and
/// the ids of updates, and answers UNAVAILABLE (as a stopping replica does) or OK.
struct Replica {
    unavailable: bool,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Replica {
    // The answer of a tonic handler, as its callers return it.
    #[allow(clippy::result_large_err)]
    fn answer<T: Default>(&self, key: String) -> Result<tonic::Response<T>, tonic::Status> {
        self.seen.lock().unwrap().push(key);
        match self.unavailable {
            true => Err(tonic::Status::unavailable("the state writer has stopped")),
            false => Ok(tonic::Response::new(T::default())),
        }
    }
}

#[tonic::async_trait]
impl v1::tenant_service_server::TenantService for Replica {
    async fn create_tenant(
        &self,
        r: tonic::Request<v1::CreateTenantRequest>,
    ) -> Result<tonic::Response<v1::CreateTenantResponse>, tonic::Status> {
        self.answer(r.into_inner().request_id)
    }
    async fn get_tenant(
        &self,
        r: tonic::Request<v1::GetTenantRequest>,
    ) -> Result<tonic::Response<v1::Tenant>, tonic::Status> {
        self.answer(r.into_inner().id)
    }
    async fn list_tenants(
        &self,
        _: tonic::Request<v1::ListTenantsRequest>,
    ) -> Result<tonic::Response<v1::ListTenantsResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented(""))
    }
    async fn update_tenant(
        &self,
        r: tonic::Request<v1::UpdateTenantRequest>,
    ) -> Result<tonic::Response<v1::Tenant>, tonic::Status> {
        self.answer(r.into_inner().id)
    }
    async fn delete_tenant(
        &self,
        _: tonic::Request<v1::DeleteTenantRequest>,
    ) -> Result<tonic::Response<v1::DeleteResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented(""))
    }
}

/// Serves a replica on a free loopback port; its URL and what it saw.
async fn serve(unavailable: bool) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::<Mutex<Vec<String>>>::default();
    let replica = Replica {
        unavailable,
        seen: seen.clone(),
    };
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(v1::tenant_service_server::TenantServiceServer::new(replica))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    (url, seen)
}

#[tokio::test]
async fn over_real_connections_a_stopping_replica_hands_on_reads_and_keyed_creates_only() {
    let (stopping, at_stopping) = serve(true).await;
    let (live, at_live) = serve(false).await;
    let dead = {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        format!("http://127.0.0.1:{port}")
    };
    let endpoints = [dead.clone(), stopping.clone(), live.clone()];
    let client = Client::new(&endpoints, Some("t"), None).unwrap();
    let create = v1::CreateTenantRequest {
        request_id: "r-1".into(),
        name: "speech".into(),
        ..Default::default()
    };
    // Refused at the dead one, UNAVAILABLE at the stopping one, made at the live one:
    // each that saw it saw the same request id.
    client.tenants().create_tenant(create).await.unwrap();
    assert_eq!(*at_stopping.lock().unwrap(), ["r-1"]);
    assert_eq!(*at_live.lock().unwrap(), ["r-1"]);
    assert_eq!(client.endpoint(), live);

    // From the stopping one on: a read goes on to the live one; an update it may have
    // run is answered as it was, and the client moves on all the same.
    let client = Client::new(&endpoints[1..], Some("t"), None).unwrap();
    let read = v1::GetTenantRequest { id: "t-1".into() };
    client.tenants().get_tenant(read).await.unwrap();
    assert_eq!(*at_live.lock().unwrap(), ["r-1", "t-1"]);
    let client = Client::new(&endpoints[1..], Some("t"), None).unwrap();
    let update = v1::UpdateTenantRequest {
        id: "t-2".into(),
        ..Default::default()
    };
    let err = client.tenants().update_tenant(update).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err}");
    assert_eq!(*at_stopping.lock().unwrap(), ["r-1", "t-1", "t-2"]);
    assert_eq!(*at_live.lock().unwrap(), ["r-1", "t-1"], "not sent twice");
    assert_eq!(client.endpoint(), live);
}
