//! The Terraform plugin protocol: go-plugin's handshake and transport, and `tfplugin6`
//! over the framework. This is the only module that knows the protocol; the resources and
//! data sources see only `framework`.
//!
//! - `handshake`: the environment Terraform sets (cookie, versions, client certificate)
//!   and the line that answers it;
//! - `socket`, `tls`: a private unix socket, and mutual TLS with the client certificate
//!   required;
//! - `service`: `tfplugin6.Provider`, with `values` and `dynamic` (DynamicValue) and
//!   `convert` (schemas, diagnostics); `ephemeral` (ephemeral resources, 6.7), `write_only` (6.8) and
//!   `identity` (resource identity, 6.9), `list` (list resources for `terraform query`)
//!   and `actions` (Terraform 1.14+) beside it;
//! - `plugin`: go-plugin's controller and stdio services and gRPC health.
//!
//! The definitions are the project's own (`provider/proto/`, compiled by `build.rs`):
//! protocol 6.10 as Terraform v1.15.x's release tags define it.

mod actions;
mod convert;
mod dynamic;
mod ephemeral;
#[cfg(test)]
mod fakes;
mod handshake;
mod identity;
mod list;
mod plugin;
mod service;
mod socket;
mod tls;
mod values;
mod write_only;

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio_stream::wrappers::ReceiverStream;

use crate::framework::ProviderType;

// Generated: the namespace messages (e.g. `GetMetadata`) only hold nested ones.
#[allow(dead_code, clippy::all, clippy::pedantic)]
pub(crate) mod tfplugin6 {
    tonic::include_proto!("tfplugin6");
}

// Generated: the namespace messages (e.g. `GetMetadata`) only hold nested ones.
#[allow(dead_code, clippy::all, clippy::pedantic)]
pub(crate) mod plugin_proto {
    tonic::include_proto!("plugin");
}

// Generated: the namespace messages (e.g. `GetMetadata`) only hold nested ones.
#[allow(dead_code, clippy::all, clippy::pedantic)]
pub(crate) mod grpc_health {
    tonic::include_proto!("grpc.health.v1");
}

/// Terraform's client and terraform-plugin-go's servers allow 256 MiB each way (tonic's
/// default receive limit is 4 MiB: a large plan would fail).
const MAX_MESSAGE_BYTES: usize = 256 << 20;
/// A connection that has not finished its TLS handshake by then is dropped.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the provider would not serve: the message is for whoever started it.
#[derive(Debug)]
pub struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

/// Serves `provider` to Terraform under `name` (resource types become `<name>_<type>`)
/// until Terraform shuts it down. Refuses (`Refused`) when not started by a Terraform that
/// speaks protocol 6 over mutual TLS.
pub async fn serve(name: &str, provider: Arc<dyn ProviderType>) -> anyhow::Result<()> {
    let env = |key: &str| std::env::var(key).ok();
    let negotiated = handshake::negotiate(env).map_err(Refused)?;
    let tls = tls::server(&negotiated.client_cert_pem)?;
    let (listener, socket) = socket::bind(env)?;
    ignore_interrupts();

    let shutdown = Arc::new(Notify::new());
    let incoming = accept_tls(listener, tokio_rustls::TlsAcceptor::from(tls.config));
    let provider = service::ProviderService::new(name, provider);
    let server = tonic::transport::Server::builder()
        .add_service(
            tfplugin6::provider_server::ProviderServer::new(provider)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
        )
        .add_service(
            plugin_proto::grpc_controller_server::GrpcControllerServer::new(plugin::Controller {
                shutdown: shutdown.clone(),
            }),
        )
        .add_service(plugin_proto::grpc_stdio_server::GrpcStdioServer::new(
            plugin::Stdio,
        ))
        .add_service(grpc_health::health_server::HealthServer::new(
            plugin::Health,
        ))
        .serve_with_incoming_shutdown(incoming, async move { shutdown.notified().await });

    // The server accepts once it is polled; connections wait in the listen backlog until
    // then, so the line may go out first.
    let line = handshake::line(&socket.path.to_string_lossy(), &tls.cert_der);
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}")?;
    stdout.flush()?;
    drop(stdout);

    server.await?;
    drop(socket);
    Ok(())
}

/// Accepts connections and completes each TLS handshake on its own task, so a client that
/// stalls or fails its handshake holds up no one else. An accept error (e.g. out of file
/// descriptors) is retried after a pause rather than ending the server.
fn accept_tls(
    listener: tokio::net::UnixListener,
    acceptor: tokio_rustls::TlsAcceptor,
) -> ReceiverStream<std::io::Result<tokio_rustls::server::TlsStream<tokio::net::UnixStream>>> {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let acceptor = acceptor.clone();
            let accepted = tx.clone();
            tokio::spawn(async move {
                // A refused client (no certificate, another one) ends here.
                if let Ok(Ok(tls)) =
                    tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await
                {
                    let _ = accepted.send(Ok(tls)).await;
                }
            });
            if tx.is_closed() {
                return;
            }
        }
    });
    ReceiverStream::new(rx)
}

/// Ctrl-C reaches the whole process group; Terraform handles it (StopProvider, then
/// Shutdown), so the provider must not die of it, as go-plugin's servers do not.
fn ignore_interrupts() {
    use tokio::signal::unix::{signal, SignalKind};
    if let Ok(mut interrupts) = signal(SignalKind::interrupt()) {
        tokio::spawn(async move { while interrupts.recv().await.is_some() {} });
    }
}
