//! What the control plane asks a Slurm cluster's controller, and how: through an agent of
//! one of the cluster's own nodes (`SlurmQuery`), which asks with its own Slurm commands
//! and munged. The control plane holds the cluster's munge key only to hand it to the
//! cluster's nodes; it runs no munged and no Slurm command of a team, and reaches no
//! controller itself.
//!
//! Why not a munged on the control plane's host, talking to the controller over the
//! network: a munged serving a cluster's key mints credentials for any uid of that
//! cluster, root included (its Slurm administrator), to whoever reaches its socket. Kept
//! on the cluster's own nodes, the key is where the cluster's daemons already need it and
//! nowhere else, and nothing of a team runs on the control plane's host.
//!
//! The agents asked are the head's (primary controller), then the backup's, then the
//! other nodes': each node's slurm.conf names both controllers, so a node still answers
//! when the head is lost and the backup has taken over. What comes back is bounded (an
//! agent's answer is not trusted further than that).

use std::collections::BTreeMap;

use gpufleet_proto::v1;
use gpufleet_slurm::status::{JobCounts, NodeState};

use crate::registry::Outcome;
use crate::state::AppState;
use crate::store::nodes::NodeRow;

/// What the controller said.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Said {
    pub nodes: BTreeMap<String, NodeState>,
    /// None when `squeue` did not answer.
    pub jobs: Option<JobCounts>,
    /// A probe's outcome ("ran", "busy: ...").
    pub probe: String,
    /// The controller's next job id (0: not read), at most Slurm's largest.
    pub next_job_id: u64,
    /// Jobs the controller ended as orphans since the answering agent last said (job id,
    /// the node that ran steps of it): recorded as the cluster's events by [`ask`].
    pub orphans: Vec<(u64, String)>,
}

/// At most this many orphan jobs of one answer are recorded.
const MAX_ORPHANS: usize = 256;

/// Slurm's greatest job id (MaxJobId's default): a next job id past it is not believed.
const MAX_JOB_ID: u64 = 67_043_328;

/// At most this many live nodes are asked in turn (each ask may take Slurm's own limits,
/// some 20 s, when the controllers do not answer).
const MAX_ASKED: usize = 3;

/// How long one node's agent is waited for (its Slurm commands are bounded to 10 s each).
const ASK_WITHIN: std::time::Duration = std::time::Duration::from_secs(25);

/// At most this many nodes of an answer are read, each text at most this long.
const MAX_NODES: usize = 8192;
const MAX_TEXT: usize = 256;

fn cut(s: &str) -> String {
    crate::message_cut::cut(s, MAX_TEXT)
}

fn said(a: v1::SlurmAnswer) -> Said {
    Said {
        nodes: a
            .nodes
            .into_iter()
            .take(MAX_NODES)
            .map(|n| {
                (
                    cut(&n.name),
                    NodeState {
                        state: cut(&n.state),
                        gres: cut(&n.gres),
                        reason: cut(&n.reason),
                    },
                )
            })
            .collect(),
        jobs: a.jobs_known.then_some(JobCounts {
            running: a.jobs_running,
            pending: a.jobs_pending,
            ending: a.jobs_ending,
        }),
        probe: cut(&a.probe),
        next_job_id: if a.next_job_id <= MAX_JOB_ID {
            a.next_job_id
        } else {
            0
        },
        orphans: a
            .orphans
            .into_iter()
            .filter(|o| o.job_id > 0 && o.job_id <= MAX_JOB_ID)
            .take(MAX_ORPHANS)
            .map(|o| (o.job_id, crate::message_cut::cut(&o.node, 64)))
            .collect(),
    }
}

/// Tells the team each job the cluster's controller ended as an orphan: a job of a former
/// controller, lost with its head, whose steps a node still ran (the new controller
/// knew no such job). Slurm's own word for a job ended by its node's failure.
async fn record_orphans(state: &AppState, answered_by: &NodeRow, orphans: &[(u64, String)]) {
    let Some(cluster_id) = answered_by.cluster_id.clone() else {
        return;
    };
    let (t, by, orphans) = (state.now(), answered_by.hostname.clone(), orphans.to_vec());
    let recorded = state
        .apply(move |conn| -> crate::error::Result<()> {
            let Some(c) = crate::store::clusters::get(conn, &cluster_id)? else {
                return Ok(());
            };
            // Once per job: the controller logs an orphan each time a node reports it.
            let told = crate::store::events::list(conn, &c.id)?;
            for (job, node) in &orphans {
                let message = format!("job {job} ended: NODE_FAIL (its controller was lost)");
                if told.iter().any(|e| e.message == message) {
                    continue;
                }
                let node = if node.is_empty() { &by } else { node };
                crate::store::events::record(
                    conn,
                    t,
                    &c.id,
                    &c.tenant_id,
                    "job_ended",
                    node,
                    &message,
                )?;
            }
            Ok(())
        })
        .await;
    if let Err(e) = recorded {
        tracing::warn!(node = %answered_by.hostname, error = %e, "cannot record the jobs the controller ended as orphans");
    }
}

/// Asks `action` of cluster `cluster` (its Slurm name) through the first of `nodes` (in
/// the order to try them, at most [`MAX_ASKED`] of them live) whose agent answers; Err
/// says what each said.
pub async fn ask(
    state: &AppState,
    cluster: &str,
    nodes: &[NodeRow],
    action: &str,
    names: &[String],
    reason: &str,
) -> Result<Said, String> {
    let mut why = Vec::new();
    let mut asked = 0;
    for n in nodes {
        if !state.agents.is_live(&n.id) {
            why.push(format!("{}: unreachable", n.hostname));
            continue;
        }
        let order = v1::WorkOrder {
            id: uuid::Uuid::new_v4().to_string(),
            epoch: 0, // stamped by Registry::dispatch
            kind: Some(v1::work_order::Kind::SlurmQuery(v1::SlurmQuery {
                cluster: cluster.to_string(),
                action: action.to_string(),
                nodes: names.to_vec(),
                reason: reason.to_string(),
            })),
        };
        asked += 1;
        let answer = tokio::time::timeout(ASK_WITHIN, state.agents.dispatch(&n.id, order)).await;
        match answer {
            Err(_) => why.push(format!("{}: no answer within {ASK_WITHIN:?}", n.hostname)),
            Ok(Ok(Outcome::Answered(r))) if r.ok => match r.slurm {
                Some(a) => {
                    let said = said(a);
                    if !said.orphans.is_empty() {
                        record_orphans(state, n, &said.orphans).await;
                    }
                    return Ok(said);
                }
                None => why.push(format!("{}: no answer", n.hostname)),
            },
            Ok(Ok(Outcome::Answered(r))) => why.push(format!("{}: {}", n.hostname, cut(&r.error))),
            Ok(Ok(Outcome::Unreachable(w))) => why.push(format!("{}: {w}", n.hostname)),
            Ok(Err(_)) => return Err("the control plane is stopping".into()),
        }
        if asked == MAX_ASKED {
            break;
        }
    }
    if why.is_empty() {
        why.push("the cluster has no node".into());
    }
    Err(why.join("; "))
}
