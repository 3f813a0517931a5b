//! Long cluster changes that outlive their request, and requests that find one under way.
//!
//! tonic drops a handler's future when its caller's deadline fires or the caller goes
//! away. A cluster create, update or delete that is past its first transaction has orders
//! out to node agents and must record (or undo) what they did, so that part runs in a task
//! of its own, which the handler awaits: the caller may leave, the change still finishes.
//! A caller that comes back with the same request (a Terraform apply after a timeout) waits
//! for the change already under way instead of being refused.
//!
//! A change that fails without recording its end (the store went away under it, on
//! PostgreSQL a database restart or failover) would leave its cluster in its changing
//! status with nothing to carry it on, and those waiting on it waiting forever: it is
//! settled then as a restart settles it (`scheduling::clusters::settle_interrupted`),
//! by this replica while it leads, once the store takes the write.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tonic::{Code, Status};

use crate::state::{db_error, AppState};
use crate::store::{self, clusters::ClusterRow};

/// Runs `work`, the rest of a change that put cluster `id` in `status`, to completion in
/// its own task (see [`detach`]). When `work` fails (or panics) and the cluster is still in
/// `status`, the change is settled (see the module's text) before the caller is answered.
pub async fn run<T: Send + 'static>(
    state: Arc<AppState>,
    id: String,
    status: &'static str,
    work: impl Future<Output = Result<T, Status>> + Send + 'static,
) -> Result<T, Status> {
    detach(async move {
        let outcome = detach(work).await;
        if outcome.is_err() {
            settle_if_left(&state, &id, status).await;
        }
        outcome
    })
    .await
}

/// Runs `work` to completion in its own task and returns its result, or an error if the
/// task itself failed. Dropping the returned future (a caller gone) leaves `work` running.
async fn detach<T: Send + 'static>(
    work: impl Future<Output = Result<T, Status>> + Send + 'static,
) -> Result<T, Status> {
    tokio::spawn(work)
        .await
        .map_err(|e| Status::internal(format!("cluster change worker failed: {e}")))?
}

/// How long a failed change's settling is tried again while the store does not take it.
const SETTLE_FOR: Duration = Duration::from_secs(600);

/// Settles cluster `id` if a failed change left it in `status`: tried again, backing off,
/// while the store cannot take the write and this replica leads (else the next leader's
/// takeover settles it, as after a restart).
async fn settle_if_left(state: &Arc<AppState>, id: &str, status: &'static str) {
    let give_up = Instant::now() + SETTLE_FOR;
    let mut pause = FIRST_LOOK;
    loop {
        let (lease, volumes, key, t) = (
            state.lease().clone(),
            state.volumes.clone(),
            id.to_string(),
            state.now(),
        );
        let settled = state
            .write(move |sp| -> Result<Option<ClusterRow>, Status> {
                // A former leader settles nothing: the one leading now does, at its takeover.
                lease.fence(&sp).map_err(Status::from)?;
                let Some(c) = store::clusters::get(&sp, &key).map_err(db_error)? else {
                    return Ok(None);
                };
                if c.status != status {
                    return Ok(None);
                }
                crate::scheduling::clusters::settle_interrupted(&sp, &volumes, &c, t)
                    .map_err(db_error)?;
                sp.commit().map_err(db_error)?;
                Ok(Some(c))
            })
            .await;
        let retry = match &settled {
            Ok(Some(c)) => {
                tracing::warn!(cluster = %c.name, %status, "settled a change that failed without recording its end");
                return;
            }
            Ok(None) => return,
            // The store unreachable (or its connection broken under the write).
            Err(e) => matches!(e.code(), Code::Unavailable | Code::Internal | Code::Unknown),
        };
        if !retry || Instant::now() > give_up || state.lease().epoch().is_none() {
            if let Err(e) = settled {
                tracing::error!(cluster = %id, %status, error = %e.message(), "cannot settle a change that failed without recording its end; the next leader's takeover (or a restart) settles it");
            }
            return;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}

/// How often a waiter looks at a change under way (the first look is quick: most
/// changes the waiter finds are about to settle).
const FIRST_LOOK: Duration = Duration::from_millis(50);
const LAST_LOOK: Duration = Duration::from_millis(500);

/// Waits until cluster `id` is no longer in `status` (a change under way) and returns the
/// row as it settled: None when the cluster is gone (a delete went through, or a create
/// was taken back). The wait ends with the caller: a dropped future stops looking.
pub async fn settled(
    state: &std::sync::Arc<AppState>,
    id: &str,
    status: &str,
) -> Result<Option<ClusterRow>, Status> {
    let mut pause = FIRST_LOOK;
    loop {
        let (s, key) = (state.clone(), id.to_string());
        let row = s
            .read(move |conn| store::clusters::get(conn, &key).map_err(db_error))
            .await?;
        match row {
            Some(c) if c.status == status => {}
            other => return Ok(other),
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(LAST_LOOK);
    }
}

/// Whether `target` (a cluster row with a request's changes applied) asks for what `now`
/// already holds: the same inputs, whatever the status and what the backend fills in.
pub fn same_target(now: &ClusterRow, target: &ClusterRow) -> bool {
    let inputs = |c: &ClusterRow| {
        (
            c.node_count,
            c.storage_gib,
            c.mig_layout.clone(),
            c.cuda_version.clone(),
            c.driver_version.clone(),
            c.max_unavailable,
        )
    };
    inputs(now) == inputs(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn work_goes_on_when_its_caller_leaves() {
        let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
        let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<u32>();
        let caller = tokio::spawn(detach(async move {
            let _ = started_tx.send(());
            let _ = go_rx.await;
            let _ = done_tx.send(7);
            Ok(7u32)
        }));
        started_rx.await.unwrap();
        // The caller's deadline fires: its future is dropped mid-way.
        caller.abort();
        assert!(caller.await.unwrap_err().is_cancelled());
        go_tx.send(()).unwrap();
        assert_eq!(done_rx.await.unwrap(), 7);
    }

    fn row() -> ClusterRow {
        ClusterRow {
            id: "c1".into(),
            tenant_id: "t1".into(),
            name: "train".into(),
            orchestrator: "kubernetes".into(),
            gpu_type: "H100-80GB".into(),
            node_count: 2,
            reservation_id: None,
            storage_gib: 100,
            status: "updating".into(),
            endpoint: String::new(),
            credentials: String::new(),
            storage_path: String::new(),
            mig_layout: Default::default(),
            status_reason: String::new(),
            cuda_version: String::new(),
            driver_version: "570.133.20".into(),
            max_unavailable: 1,
            storage_retention: "delete".into(),
        }
    }

    #[test]
    fn the_same_target_whatever_the_status() {
        let now = row();
        let settled = ClusterRow {
            status: "running".into(),
            ..row()
        };
        assert!(same_target(&now, &settled));
        let other_driver = ClusterRow {
            driver_version: "580.65.06".into(),
            ..row()
        };
        assert!(!same_target(&now, &other_driver));
        let bigger = ClusterRow {
            node_count: 3,
            ..row()
        };
        assert!(!same_target(&now, &bigger));
    }

    #[tokio::test]
    async fn a_failed_worker_is_an_internal_error() {
        let err = detach::<()>(async { panic!("boom") }).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::Internal);
    }
}
