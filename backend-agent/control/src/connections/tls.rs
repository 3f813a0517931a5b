//! TLS on the API's accepted connections, with the configuration in force when each one
//! arrives (`tls_reload`). Each handshake runs in a task of its own, bounded in time, so
//! a client that stalls mid-handshake holds only its own connection (which already
//! counts against the connection caps).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};

use super::guarded::Guarded;
use crate::tls_reload::ReloadableTls;

/// How long a handshake may take.
const HANDSHAKE_WITHIN: Duration = Duration::from_secs(10);

/// The connections of `incoming` that completed a handshake.
pub fn handshakes(
    incoming: impl Stream<Item = std::io::Result<Guarded>> + Send + 'static,
    tls: Arc<ReloadableTls>,
) -> ReceiverStream<std::io::Result<TlsStream<Guarded>>> {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        let mut incoming = std::pin::pin!(incoming);
        while let Some(accepted) = incoming.next().await {
            let stream = match accepted {
                Ok(s) => s,
                Err(e) => {
                    if tx.send(Err(e)).await.is_err() {
                        return;
                    }
                    continue;
                }
            };
            let (tx, acceptor) = (tx.clone(), TlsAcceptor::from(tls.config()));
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_WITHIN, acceptor.accept(stream)).await {
                    Ok(Ok(tls_stream)) => {
                        let _ = tx.send(Ok(tls_stream)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(error = %e, "a TLS handshake failed"),
                    Err(_) => tracing::debug!("a TLS handshake took longer than 10s"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}
