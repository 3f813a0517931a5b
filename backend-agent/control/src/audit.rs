//! The audit log's recording: a tower layer around the API gives every request a [`Note`];
//! authentication fills it (who, with which token, naming what, whether it changes
//! anything); when the response's status is known the layer queues an entry for every
//! change, whatever its outcome, and for every call refused for its token or its
//! permissions. One task writes the queue in batches. Reads are not recorded.
//!
//! The queue is bounded ([`QUEUE`]): entries beyond it are dropped and counted
//! (`gpufleet_audit_dropped_total`), so a flood of refused calls cannot grow memory.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::sync::mpsc;

use crate::counters::COUNTERS;
use crate::state::AppState;
use crate::store;

/// Entries waiting for the writer at most.
pub const QUEUE: usize = 4096;
/// Entries written per transaction at most.
const BATCH: usize = 256;
/// A refusal's message is kept to this many characters ...
const MAX_MESSAGE_CHARS: usize = 512;
/// ... and the object a call named to this many: it is noted before the message's bounds
/// are checked, and an unauthenticated caller must not queue megabytes per call.
const MAX_OBJECT_CHARS: usize = 256;

/// What authentication learned about a call.
#[derive(Debug, Clone, Default)]
pub struct Caller {
    /// The tenant whose token it was ("" for the admin's or no valid token).
    pub tenant_id: String,
    pub token_name: String,
    pub token_scope: String,
    pub object: String,
    pub changes: bool,
}

/// Filled by authentication, read by the layer once the call's status is known.
#[derive(Debug, Clone, Default)]
pub struct Note(Arc<Mutex<Option<Caller>>>);

impl Note {
    pub fn fill(&self, mut caller: Caller) {
        if caller.object.chars().count() > MAX_OBJECT_CHARS {
            caller.object = caller.object.chars().take(MAX_OBJECT_CHARS).collect();
        }
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(caller);
    }

    fn take(&self) -> Option<Caller> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// Whether a call with this outcome is recorded.
fn recorded(caller: &Caller, outcome: &str) -> bool {
    caller.changes || matches!(outcome, "UNAUTHENTICATED" | "PERMISSION_DENIED")
}

/// Gives every request a [`Note`] and queues the entries to record.
#[derive(Clone, Debug)]
pub struct AuditLayer {
    queue: mpsc::Sender<store::audit::AuditRow>,
    clock: crate::clock::Clock,
}

impl AuditLayer {
    /// The layer, and the writer to run beside the server until the queue closes.
    pub fn new(state: Arc<AppState>) -> (Self, impl Future<Output = ()>) {
        let (queue, entries) = mpsc::channel(QUEUE);
        let layer = AuditLayer {
            queue,
            clock: state.clock.clone(),
        };
        (layer, write(state, entries))
    }
}

impl<S> tower_layer::Layer<S> for AuditLayer {
    type Service = Audit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Audit {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Audit<S> {
    inner: S,
    layer: AuditLayer,
}

impl<S, B, R> tower_service::Service<http::Request<B>> for Audit<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let note = Note::default();
        request.extensions_mut().insert(note.clone());
        let method = request.uri().path().trim_start_matches('/').to_string();
        let layer = self.layer.clone();
        let response = self.inner.call(request);
        Box::pin(async move {
            let result = response.await;
            if let Some(caller) = note.take() {
                let (outcome, message) = match &result {
                    Ok(r) => match tonic::Status::from_header_map(r.headers()) {
                        Some(s) if s.code() != tonic::Code::Ok => {
                            (code_name(s.code()), cut(s.message()))
                        }
                        _ => ("OK".to_string(), String::new()),
                    },
                    Err(_) => ("TRANSPORT_ERROR".to_string(), String::new()),
                };
                if recorded(&caller, &outcome) {
                    layer.queue_entry(caller, method, outcome, message);
                }
            }
            result
        })
    }
}

impl AuditLayer {
    fn queue_entry(&self, caller: Caller, method: String, outcome: String, message: String) {
        let entry = store::audit::AuditRow {
            seq: 0,
            tenant_seq: None,
            at: self.clock.now(),
            tenant_id: caller.tenant_id,
            token_name: caller.token_name,
            token_scope: caller.token_scope,
            method,
            object: caller.object,
            outcome,
            message,
        };
        if self.queue.try_send(entry).is_err() {
            COUNTERS.audit_dropped.inc();
        }
    }
}

/// Writes queued entries in batches until every sender is gone; prunes as it goes.
async fn write(state: Arc<AppState>, mut entries: mpsc::Receiver<store::audit::AuditRow>) {
    let mut batch = Vec::with_capacity(BATCH);
    while entries.recv_many(&mut batch, BATCH).await > 0 {
        let rows = std::mem::take(&mut batch);
        let now = state.now();
        let written = state
            .write(move |sp| -> Result<usize, crate::error::Error> {
                for row in &rows {
                    store::audit::record(&sp, row)?;
                }
                store::audit::prune(&sp, now)?;
                sp.commit()?;
                Ok(rows.len())
            })
            .await;
        if let Err(e) = written {
            tracing::error!(error = %e, "could not write audit entries; they are lost");
        }
    }
}

fn code_name(code: tonic::Code) -> String {
    // tonic's Debug names are CamelCase; the log uses the canonical names.
    let camel = format!("{code:?}");
    let mut out = String::new();
    for (i, c) in camel.chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

fn cut(message: &str) -> String {
    message.chars().take(MAX_MESSAGE_CHARS).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_have_their_canonical_names() {
        assert_eq!(
            code_name(tonic::Code::PermissionDenied),
            "PERMISSION_DENIED"
        );
        assert_eq!(code_name(tonic::Code::Ok), "OK");
        assert_eq!(code_name(tonic::Code::Unauthenticated), "UNAUTHENTICATED");
    }

    #[test]
    fn a_huge_object_is_noted_cut() {
        let note = Note::default();
        note.fill(Caller {
            object: "x".repeat(4 << 20),
            ..Caller::default()
        });
        assert_eq!(note.take().unwrap().object.len(), MAX_OBJECT_CHARS);
    }

    #[test]
    fn changes_and_refusals_are_recorded_reads_are_not() {
        let read = Caller::default();
        assert!(!recorded(&read, "OK"));
        assert!(!recorded(&read, "NOT_FOUND"));
        assert!(recorded(&read, "PERMISSION_DENIED"));
        assert!(recorded(&read, "UNAUTHENTICATED"));
        let change = Caller {
            changes: true,
            ..Caller::default()
        };
        assert!(recorded(&change, "OK") && recorded(&change, "FAILED_PRECONDITION"));
    }
}
