//! The services a go-plugin server offers beside the provider: the controller (Terraform
//! asks the plugin to exit), stdio (nothing to forward) and gRPC health (`plugin` is
//! SERVING while the server runs).

use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::Notify;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::{grpc_health, plugin_proto};

/// The health service name go-plugin's client checks.
pub const HEALTH_SERVICE: &str = "plugin";

pub struct Controller {
    /// Notified once to stop the server.
    pub shutdown: Arc<Notify>,
}

#[tonic::async_trait]
impl plugin_proto::grpc_controller_server::GrpcController for Controller {
    async fn shutdown(
        &self,
        _req: Request<plugin_proto::Empty>,
    ) -> Result<Response<plugin_proto::Empty>, Status> {
        // The server finishes this reply, then stops accepting and drains.
        self.shutdown.notify_one();
        Ok(Response::new(plugin_proto::Empty {}))
    }
}

pub struct Stdio;

type StdioStream = Pin<Box<dyn Stream<Item = Result<plugin_proto::StdioData, Status>> + Send>>;

#[tonic::async_trait]
impl plugin_proto::grpc_stdio_server::GrpcStdio for Stdio {
    type StreamStdioStream = StdioStream;

    /// The provider writes nothing to stdout or stderr after the handshake line (its
    /// messages are diagnostics), so the stream ends at once.
    async fn stream_stdio(
        &self,
        _req: Request<()>,
    ) -> Result<Response<Self::StreamStdioStream>, Status> {
        Ok(Response::new(Box::pin(tokio_stream::empty())))
    }
}

pub struct Health;

#[tonic::async_trait]
impl grpc_health::health_server::Health for Health {
    async fn check(
        &self,
        req: Request<grpc_health::HealthCheckRequest>,
    ) -> Result<Response<grpc_health::HealthCheckResponse>, Status> {
        let service = req.into_inner().service;
        if service.is_empty() || service == HEALTH_SERVICE {
            Ok(Response::new(grpc_health::HealthCheckResponse {
                status: grpc_health::health_check_response::ServingStatus::Serving as i32,
            }))
        } else {
            Err(Status::not_found(format!(
                "no health status for service {service:?}"
            )))
        }
    }
}
