//! The actions (Terraform 1.14+): day-2 operations an `action` block names and
//! `terraform apply -invoke=action.gpufleet_<name>.<label>` runs, with progress lines in
//! Terraform's UI while the backend works.
//!
//! - `run_health_check`: health checks of a cluster's nodes at a level, now;
//! - `drain_node`: a node out of service on the admin's word (its cluster gets another);
//! - `return_node`: a quarantined node back to service (the admin token).

mod drain_node;
mod health_check;
mod return_node;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::framework::{ActionType, AttrPath, Diagnostics, Progress};
use crate::state::ProviderState;

pub fn all(state: &Arc<ProviderState>) -> Vec<Arc<dyn ActionType>> {
    vec![
        Arc::new(health_check::RunHealthCheck::new(state.clone())),
        Arc::new(drain_node::DrainNode::new(state.clone())),
        Arc::new(return_node::ReturnNode::new(state.clone())),
    ]
}

/// How often a long call says it is still running.
const STILL_RUNNING_EVERY: Duration = Duration::from_secs(10);

/// Awaits `call`, saying "still <what> (Ns)" while it runs, so Terraform's UI shows the
/// action alive through a long backend call.
async fn saying_while<T>(progress: &Progress, what: &str, call: impl Future<Output = T>) -> T {
    saying_every(STILL_RUNNING_EVERY, progress, what, call).await
}

async fn saying_every<T>(
    every: Duration,
    progress: &Progress,
    what: &str,
    call: impl Future<Output = T>,
) -> T {
    tokio::pin!(call);
    let started = tokio::time::Instant::now();
    let mut ticks = tokio::time::interval_at(started + every, every);
    loop {
        tokio::select! {
            done = &mut call => return done,
            _ = ticks.tick() => {
                progress
                    .say(format!("still {what} ({}s)", started.elapsed().as_secs()))
                    .await;
            }
        }
    }
}

/// Puts errors that name no attribute on `attribute` (the backend's refusals of the one
/// object an action names): the backend's field name `backend_field` at the start of a
/// message becomes the attribute's, and a message naming no field starts with it.
fn on_attribute(mut d: Diagnostics, attribute: &str, backend_field: &str) -> Diagnostics {
    let prefix = format!("{backend_field}: ");
    for e in d.0.iter_mut() {
        if e.path.is_none() {
            e.path = Some(AttrPath::attr(attribute));
        }
        e.summary = match e.summary.strip_prefix(&prefix) {
            Some(rest) => format!("{attribute}: {rest}"),
            None if e.summary.starts_with(&format!("{attribute}: ")) => e.summary.clone(),
            None => format!("{attribute}: {}", e.summary),
        };
    }
    d
}

#[cfg(test)]
mod tests {
    use tokio::sync::{mpsc, oneshot};

    use super::*;
    use crate::framework::Diagnostic;

    #[tokio::test]
    async fn a_long_call_says_it_is_still_running_until_it_ends() {
        let (lines, mut said) = mpsc::channel(16);
        let progress = Progress::new(lines);
        let (finish, finished) = oneshot::channel::<()>();
        // The call ends only once two "still" lines were said: no timing guess.
        let watcher = async move {
            let mut got = Vec::new();
            while got.len() < 2 {
                got.push(said.recv().await.expect("a line"));
            }
            let _ = finish.send(());
            got
        };
        let call = async move {
            let _ = finished.await;
            7
        };
        let every = Duration::from_millis(5);
        let (answer, got) = tokio::join!(saying_every(every, &progress, "checking", call), watcher);
        assert_eq!(answer, 7);
        assert!(
            got.iter().all(|l| l.starts_with("still checking (")),
            "{got:?}"
        );
    }

    #[test]
    fn a_backend_refusal_lands_on_the_attribute_and_names_it() {
        let renamed = on_attribute(
            Diagnostic::error("name: node n1 is ready, not quarantined", "").into(),
            "node",
            "name",
        );
        assert_eq!(
            renamed.0[0].summary,
            "node: node n1 is ready, not quarantined"
        );
        assert_eq!(renamed.0[0].path, Some(AttrPath::attr("node")));
        let prefixed = on_attribute(
            Diagnostic::error("tenant cluster 'x' not found", "").into(),
            "cluster_id",
            "id",
        );
        assert_eq!(
            prefixed.0[0].summary,
            "cluster_id: tenant cluster 'x' not found"
        );
    }
}
