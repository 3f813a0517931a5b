//! The audit log's recording: a tower layer around the API gives every request a [`Note`];
//! authentication fills it (who, with which token, naming what, whether it changes
//! anything); when the response's status is known the layer queues an entry for every
//! change, whatever its outcome, and for every call refused for its token or its
//! permissions. One task writes the queue in batches. Reads are not recorded.
//!
//! The queue is bounded ([`QUEUE`]): entries beyond it are dropped and counted
//! (`gpufleet_audit_dropped_total`), so a flood of refused calls cannot grow memory.
//!
//! Every entry is chained to the one before it in its chain (`store::audit`);
//! [`chain::verify`] finds where a chain was edited or cut. An admin's change to a team's
//! objects (its tokens, quotas, reservations, clusters) and the refusals of a team's
//! expired, revoked or rotated tokens are entries of the team's view.
//!
//! Every text field is recorded escaped and bounded ([`text`]): what a caller names cannot
//! forge a line of the log or reach a terminal as a control sequence. Refusals of callers
//! without a valid token are sampled per peer and minute, the rest counted ([`sampler`]),
//! and kept within a budget of their own (`store::audit`): they never push out who
//! changed what.

pub mod chain;
pub mod sampler;
pub mod text;

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::sync::{mpsc, oneshot};

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
/// The other text fields (method, tenant, token name and scope) to this many.
const MAX_FIELD_CHARS: usize = 256;

/// What authentication learned about a call.
#[derive(Debug, Clone, Default)]
pub struct Caller {
    /// The tenant whose token it was, or whose object the admin's call acted on ("" for
    /// none, or no token of the store).
    pub tenant_id: String,
    /// The caller is the admin (its token or an admin-scoped one).
    pub by_admin: bool,
    /// The token was valid (else the refusal is sampled).
    pub authenticated: bool,
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
    sampler: Arc<sampler::Sampler>,
}

/// The audit writer's settings (serve's `--audit-keep*`).
pub type Retention = store::audit::Retention;

impl AuditLayer {
    /// The layer, the writer to run beside the server, and what ends the writer once the
    /// server is gone (after it has written every entry queued by then).
    pub fn new(
        state: Arc<AppState>,
        retention: Retention,
    ) -> (Self, impl Future<Output = ()>, Close) {
        let (queue, entries) = mpsc::channel(QUEUE);
        let (close, closed) = oneshot::channel();
        let sampler = Arc::new(sampler::Sampler::default());
        let layer = AuditLayer {
            queue,
            clock: state.clock.clone(),
            sampler: sampler.clone(),
        };
        let writer = write(state, entries, sampler, closed, retention);
        (layer, writer, Close(close))
    }
}

/// Ends the audit writer: entries queued until then are written, later ones refused
/// (counted as dropped). Dropping it does the same.
///
/// The layer's copies live in every connection's service, and a connection that outlasts
/// the server's grace keeps its copy: the writer cannot wait for every sender to go.
pub struct Close(oneshot::Sender<()>);

impl Close {
    pub fn close(self) {
        let _ = self.0.send(());
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
        let peer = crate::connections::activity::remote_addr(&request)
            .map(|a| crate::connections::peer_of(&a));
        let layer = self.layer.clone();
        let response = self.inner.call(request);
        Box::pin(async move {
            let result = response.await;
            if let Some(caller) = note.take() {
                let (outcome, message) = match &result {
                    Ok(r) => match tonic::Status::from_header_map(r.headers()) {
                        Some(s) if s.code() != tonic::Code::Ok => {
                            (code_name(s.code()), s.message().to_string())
                        }
                        _ => ("OK".to_string(), String::new()),
                    },
                    Err(_) => ("TRANSPORT_ERROR".to_string(), String::new()),
                };
                if recorded(&caller, &outcome) {
                    layer.queue_entry(caller, peer, method, outcome, message);
                }
            }
            result
        })
    }
}

impl AuditLayer {
    fn queue_entry(
        &self,
        caller: Caller,
        peer: Option<IpAddr>,
        method: String,
        outcome: String,
        message: String,
    ) {
        let now = self.clock.now();
        if !caller.authenticated {
            let (record, ended) = self.sampler.admit(peer, now);
            if let Some(c) = ended {
                self.send(counted_entry(c));
            }
            if !record {
                return;
            }
        }
        let field = |s: &str| text::escaped(s, MAX_FIELD_CHARS);
        let entry = store::audit::AuditRow {
            seq: 0,
            tenant_seq: None,
            at: now,
            tenant_id: field(&caller.tenant_id),
            by_admin: caller.by_admin,
            token_name: field(&caller.token_name),
            token_scope: field(&caller.token_scope),
            method: field(&method),
            object: text::escaped(&caller.object, MAX_OBJECT_CHARS),
            outcome,
            message: text::escaped(&message, MAX_MESSAGE_CHARS),
        };
        self.send(entry);
    }

    fn send(&self, entry: store::audit::AuditRow) {
        if self.queue.try_send(entry).is_err() {
            COUNTERS.audit_dropped.inc();
        }
    }
}

/// The entry that says how many refusals of a peer were counted, not recorded.
fn counted_entry(c: sampler::Counted) -> store::audit::AuditRow {
    store::audit::AuditRow {
        seq: 0,
        tenant_seq: None,
        at: c.to,
        tenant_id: String::new(),
        by_admin: false,
        token_name: String::new(),
        token_scope: String::new(),
        method: "*".into(),
        object: c.peer.clone(),
        outcome: "UNAUTHENTICATED".into(),
        message: format!(
            "{} more calls without a valid token from {} between {} and {} were refused; counted, not recorded one by one (at most {} per peer and {} s are)",
            c.count,
            c.peer,
            crate::clock::rfc3339(c.from),
            crate::clock::rfc3339(c.to),
            sampler::SAMPLED,
            sampler::WINDOW
        ),
    }
}

/// Entries written between two prunes at most: a prune reads the whole log, so a flood
/// must not make it do so per batch. The bounds are exceeded by at most this many.
const PRUNE_EVERY: usize = 2048;

/// Writes queued entries in batches until closed (or every sender is gone), then the
/// entries still queued; prunes as it goes.
async fn write(
    state: Arc<AppState>,
    mut entries: mpsc::Receiver<store::audit::AuditRow>,
    sampler: Arc<sampler::Sampler>,
    mut closed: oneshot::Receiver<()>,
    retention: Retention,
) {
    let mut batch = Vec::with_capacity(BATCH);
    // Pruned at the first batch: a store from before may be over the bounds.
    let mut unpruned = PRUNE_EVERY;
    let mut open = true;
    // A peer that stopped has its count written when its window has ended.
    let mut sweep = tokio::time::interval(std::time::Duration::from_secs(sampler::WINDOW as u64));
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let received = tokio::select! {
            received = entries.recv_many(&mut batch, BATCH) => received,
            _ = sweep.tick() => {
                let ended = sampler.ended(state.now(), false);
                batch.extend(ended.into_iter().map(counted_entry));
                if batch.is_empty() {
                    continue;
                }
                batch.len()
            }
            _ = &mut closed, if open => {
                // Refuses new entries; what is queued is still received, then 0.
                entries.close();
                open = false;
                continue;
            }
        };
        if received == 0 {
            // Closed and empty: what the windows counted so far is written last.
            let counted: Vec<_> = sampler
                .ended(state.now(), true)
                .into_iter()
                .map(counted_entry)
                .collect();
            if !counted.is_empty() {
                write_batch(&state, counted, None).await;
            }
            return;
        }
        unpruned += batch.len();
        let prune = unpruned >= PRUNE_EVERY;
        if prune {
            unpruned = 0;
        }
        write_batch(
            &state,
            std::mem::take(&mut batch),
            prune.then_some(retention),
        )
        .await;
    }
}

async fn write_batch(
    state: &AppState,
    rows: Vec<store::audit::AuditRow>,
    prune: Option<Retention>,
) {
    let now = state.now();
    let written = state
        .write(move |sp| -> Result<usize, crate::error::Error> {
            for row in &rows {
                store::audit::record(&sp, row)?;
            }
            if let Some(keep) = prune {
                store::audit::prune_within(&sp, now, keep)?;
            }
            sp.commit()?;
            Ok(rows.len())
        })
        .await;
    if let Err(e) = written {
        tracing::error!(error = %e, "could not write audit entries; they are lost");
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
