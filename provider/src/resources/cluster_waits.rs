//! How `gpufleet_tenant_cluster`'s create, update and delete wait for the backend under
//! their `timeouts`: the call runs with the time left as its deadline; a call cut short is
//! sent again (the backend answers a repeated request with the change already under way);
//! a cluster answered while still `creating` or `updating` is polled until it settles. When
//! the time is up, the error says the cluster's status and its latest events.

use gpufleet_proto::v1 as api;
use tonic::Code;

use super::capacity_wait;
use super::waiting::{self, afterword, cut_short, with_deadline, Deadline, Expired, Waiting};
use crate::client::Client;
use crate::framework::{Diagnostic, Diagnostics};

/// Which cluster an operation is about, to read what it waits on after a timeout.
pub struct Subject {
    /// Known once the backend has answered (always for update and delete).
    pub id: Option<String>,
    /// The tenant as the configuration names it ("" for the token's own).
    pub tenant: String,
    pub name: String,
}

/// Sends a call until the backend answers it or the deadline passes: a call cut short
/// is sent again after a pause (the backend answers a repeated request with the change
/// already under way). The backend's answer, refusal included, is the inner result.
async fn resend<T, F, Fut>(
    client: &Client,
    deadline: &mut Deadline,
    subject: &Subject,
    done: &str,
    send: F,
) -> Result<Result<T, tonic::Status>, Diagnostics>
where
    F: Fn(std::time::Duration) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    loop {
        match deadline.call(&send).await {
            Ok(Err(s)) if cut_short(&s) => {
                if deadline.pause().await.is_err() {
                    return Err(timed_out(client, deadline, subject, done).await);
                }
            }
            Ok(answer) => return Ok(answer),
            Err(Expired) => return Err(timed_out(client, deadline, subject, done).await),
        }
    }
}

/// A create, waiting until the cluster is running (or degraded), or the deadline.
pub async fn create(
    client: &Client,
    request: api::CreateTenantClusterRequest,
    mut deadline: Deadline,
) -> Result<api::TenantCluster, Diagnostics> {
    let subject = Subject {
        id: None,
        tenant: request.tenant_id.clone(),
        name: request.name.clone(),
    };
    let send = |left| {
        let mut service = client.clusters();
        let r = with_deadline(request.clone(), left);
        async move { service.create_tenant_cluster(r).await }
    };
    let created = resend(client, &mut deadline, &subject, "created", send)
        .await?
        .map_err(|s| Diagnostics::from(client.diagnostic(&s)))?;
    settle(client, &mut deadline, created, "created").await
}

/// An update, waiting until the cluster has settled, or the deadline. (The backend
/// answers the same update of a cluster still updating to it once that update is through.)
pub async fn update(
    client: &Client,
    request: api::UpdateTenantClusterRequest,
    name: String,
    mut deadline: Deadline,
) -> Result<api::TenantCluster, Diagnostics> {
    let subject = Subject {
        id: Some(request.id.clone()),
        tenant: String::new(),
        name,
    };
    let send = |left| {
        let mut service = client.clusters();
        let r = with_deadline(request.clone(), left);
        async move { service.update_tenant_cluster(r).await }
    };
    let updated = resend(client, &mut deadline, &subject, "updated", send)
        .await?
        .map_err(|s| Diagnostics::from(client.diagnostic(&s)))?;
    settle(client, &mut deadline, updated, "updated").await
}

/// A delete, done when the backend says so (or the cluster is already gone).
pub async fn delete(
    client: &Client,
    id: String,
    name: String,
    mut deadline: Deadline,
) -> Result<(), Diagnostics> {
    let subject = Subject {
        id: Some(id.clone()),
        tenant: String::new(),
        name,
    };
    let send = |left| {
        let mut service = client.clusters();
        let r = with_deadline(api::DeleteTenantClusterRequest { id: id.clone() }, left);
        async move { service.delete_tenant_cluster(r).await }
    };
    match resend(client, &mut deadline, &subject, "deleted", send).await? {
        Ok(_) => Ok(()),
        Err(s) if s.code() == Code::NotFound => Ok(()),
        Err(s) => Err(client.diagnostic(&s).into()),
    }
}

/// Polls a cluster the backend answered while still changing until it settles.
async fn settle(
    client: &Client,
    deadline: &mut Deadline,
    mut c: api::TenantCluster,
    done: &str,
) -> Result<api::TenantCluster, Diagnostics> {
    let subject = Subject {
        id: Some(c.id.clone()),
        tenant: c.tenant_id.clone(),
        name: c.name.clone(),
    };
    // A create that waits for capacity is answered `queued`: it is polled like a change.
    while waiting::CHANGING.contains(&c.status.as_str()) || c.status == capacity_wait::QUEUED {
        if deadline.pause().await.is_err() {
            return Err(timed_out(client, deadline, &subject, done).await);
        }
        let looked = deadline
            .call(|left| {
                let mut service = client.clusters();
                let r = with_deadline(api::GetTenantClusterRequest { id: c.id.clone() }, left);
                async move { service.get_tenant_cluster(r).await }
            })
            .await;
        match looked {
            Ok(Ok(now)) => c = now,
            Ok(Err(s)) if s.code() == Code::NotFound && c.status == capacity_wait::QUEUED => {
                // Its wait ran out (or someone deleted it) before it was admitted.
                let events = latest_events(client, &c.id).await;
                let said = events
                    .iter()
                    .rev()
                    .find(|e| e.kind == "queue_expired" || e.kind == "deleted")
                    .map_or(c.status_reason.clone(), |e| e.message.clone());
                return Err(capacity_wait::ran_out(&c.name, &said).into());
            }
            Ok(Err(s)) if s.code() == Code::NotFound => {
                return Err(Diagnostic::error(
                    format!(
                        "tenant cluster {:?} is gone: it was to be {done}, and the backend took the change back",
                        c.name
                    ),
                    "The change failed on the backend after this apply's first call was cut short; its events and the backend's log say why. The next apply tries again.",
                )
                .into());
            }
            Ok(Err(s)) if cut_short(&s) => {}
            Ok(Err(s)) => return Err(client.diagnostic(&s).into()),
            Err(Expired) => return Err(timed_out(client, deadline, &subject, done).await),
        }
    }
    Ok(c)
}

/// The error of an operation out of time: the cluster's status and latest events, read
/// with the little time a timed-out operation still has.
async fn timed_out(
    client: &Client,
    deadline: &Deadline,
    subject: &Subject,
    done: &str,
) -> Diagnostics {
    let cluster = look_up(client, subject).await;
    let events = match &cluster {
        Some(c) => latest_events(client, &c.id).await,
        None => Vec::new(),
    };
    waiting::timed_out(
        deadline,
        &Waiting {
            what: format!("tenant cluster {:?}", subject.name),
            done,
            status: cluster.map(|c| (c.status, c.status_reason)),
            events,
        },
    )
    .into()
}

/// The cluster as it is now: by id, or by tenant and name when no answer gave its id.
async fn look_up(client: &Client, subject: &Subject) -> Option<api::TenantCluster> {
    match &subject.id {
        Some(id) => client
            .clusters()
            .get_tenant_cluster(afterword(api::GetTenantClusterRequest { id: id.clone() }))
            .await
            .ok()
            .map(tonic::Response::into_inner),
        None => {
            let mut token = String::new();
            for _ in 0..CLUSTER_PAGES {
                let answer = client
                    .clusters()
                    .list_tenant_clusters(afterword(api::ListTenantClustersRequest {
                        tenant_id: subject.tenant.clone(),
                        page_size: 1000,
                        page_token: token,
                    }))
                    .await
                    .ok()?
                    .into_inner();
                if let Some(c) = answer.clusters.into_iter().find(|c| c.name == subject.name) {
                    return Some(c);
                }
                if answer.next_page_token.is_empty() {
                    break;
                }
                token = answer.next_page_token;
            }
            None
        }
    }
}

/// Pages of a tenant's clusters read to find one by name after a timed-out create.
const CLUSTER_PAGES: usize = 10;

/// Pages ListEvents read to find an object's latest events (it keeps at most 1,000).
const EVENT_PAGES: usize = 4;

/// The object's events, the latest page of them (oldest first); none when they cannot be
/// read in time.
async fn latest_events(client: &Client, object_id: &str) -> Vec<api::Event> {
    let mut events = Vec::new();
    let mut token = String::new();
    for _ in 0..EVENT_PAGES {
        let Ok(answer) = client
            .fleet()
            .list_events(afterword(api::ListEventsRequest {
                object_id: object_id.to_string(),
                page_size: 1000,
                page_token: token,
            }))
            .await
        else {
            break;
        };
        let answer = answer.into_inner();
        if !answer.events.is_empty() {
            events = answer.events;
        }
        if answer.next_page_token.is_empty() {
            break;
        }
        token = answer.next_page_token;
    }
    events
}
