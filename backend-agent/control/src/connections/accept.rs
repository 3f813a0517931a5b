//! The API's accept loop: runs until the stop flag turns true (then the listener is
//! dropped, so the port refuses new connections while open ones drain). An accept error
//! never ends it: out of file descriptors (EMFILE, ENFILE) or kernel memory it backs off
//! and tries again, since descriptors come back as connections close; any other error
//! (a connection reset before it was accepted) is skipped.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gpufleet_process::signals::stopped;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;

use super::guarded::Guarded;
use super::Table;

/// The first and the longest pause after running out of descriptors.
const BACKOFF_FIRST: Duration = Duration::from_millis(5);
const BACKOFF_MOST: Duration = Duration::from_secs(1);
/// How often a repeated refusal or accept error is logged (each is counted).
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Whether an accept error means the process or system is out of a resource that comes
/// back (then wait), rather than one connection's trouble (then go on).
pub fn is_exhaustion(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// Logs a repeated warning at most once per [`LOG_EVERY`], with how many were skipped.
struct Throttled {
    last: Option<Instant>,
    skipped: u64,
}

impl Throttled {
    fn new() -> Self {
        Self {
            last: None,
            skipped: 0,
        }
    }

    /// Some(how many were not logged since the last one) when this one should be logged.
    fn due(&mut self) -> Option<u64> {
        if self.last.is_some_and(|t| t.elapsed() < LOG_EVERY) {
            self.skipped += 1;
            return None;
        }
        self.last = Some(Instant::now());
        Some(std::mem::take(&mut self.skipped))
    }
}

/// Accepts connections within the table's caps until `stop` turns true, or until the
/// server stops taking them. The handle ends only then: the caller treats its end
/// without a stop as the listener's death.
pub fn accept(
    listener: TcpListener,
    table: Arc<Table>,
    mut stop: watch::Receiver<bool>,
) -> (ReceiverStream<std::io::Result<Guarded>>, JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(16);
    let limits = Arc::new(table.limits.clone());
    let task = tokio::spawn(async move {
        let mut backoff = BACKOFF_FIRST;
        let (mut refusals, mut errors) = (Throttled::new(), Throttled::new());
        loop {
            let accepted = tokio::select! {
                _ = stopped(&mut stop) => break,
                accepted = listener.accept() => accepted,
            };
            let (stream, peer) = match accepted {
                Ok(a) => {
                    backoff = BACKOFF_FIRST;
                    a
                }
                Err(e) => {
                    let exhausted = is_exhaustion(&e);
                    crate::counters::accept_error(exhausted);
                    if let Some(skipped) = errors.due() {
                        tracing::warn!(error = %e, exhausted, skipped, "cannot accept a connection; the listener goes on");
                    }
                    if exhausted {
                        tokio::select! {
                            _ = stopped(&mut stop) => break,
                            _ = tokio::time::sleep(backoff) => {}
                        }
                        backoff = (backoff * 2).min(BACKOFF_MOST);
                    }
                    continue;
                }
            };
            let admission = match table.admit(peer) {
                Ok(a) => a,
                Err(why) => {
                    crate::counters::connection_refused(why.label());
                    if let Some(skipped) = refusals.due() {
                        tracing::warn!(%peer, cap = why.label(), skipped, open = table.open(), "refused a connection over the cap");
                    }
                    drop(stream);
                    continue;
                }
            };
            // Answers over ~600 bytes would otherwise wait ~40 ms for a delayed ACK
            // (tonic does not set it on streams it is given).
            if let Err(e) = stream.set_nodelay(true) {
                tracing::warn!(error = %e, "cannot set TCP_NODELAY");
            }
            if tx
                .send(Ok(Guarded::new(stream, admission, limits.clone())))
                .await
                .is_err()
            {
                break;
            }
        }
        tracing::info!("stopped accepting connections");
    });
    (ReceiverStream::new(rx), task)
}
