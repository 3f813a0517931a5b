//! `tenants`, `clusters`, `reservations` and `nodes`: what exists, with the ids the API and
//! `terraform import` take, as the token may see it (a tenant token: its own).

use gpufleet_proto::limits::MAX_MESSAGE_BYTES;
use gpufleet_proto::v1::{
    self, reservation_service_client::ReservationServiceClient,
    tenant_cluster_service_client::TenantClusterServiceClient,
    tenant_service_client::TenantServiceClient,
};

use crate::cli::{ClientArgs, ListArgs};
use crate::client::{channel, connect, status, table};

/// "-" for an empty cell.
pub(crate) fn cell(s: String) -> String {
    if s.is_empty() {
        "-".to_string()
    } else {
        s
    }
}

pub(crate) fn rfc3339(t: Option<gpufleet_proto::timestamp::Timestamp>) -> String {
    t.and_then(|t| time::OffsetDateTime::from_unix_timestamp(t.seconds).ok())
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| "-".to_string())
}

/// Every page of a list call: `fetch` takes a page token and answers that page's items
/// (table rows, or objects) and the next token ("" after the last page).
pub(crate) async fn all_rows<T, F, Fut>(mut fetch: F) -> anyhow::Result<Vec<T>>
where
    F: FnMut(String) -> Fut,
    Fut: std::future::Future<Output = Result<(Vec<T>, String), tonic::Status>>,
{
    let mut rows = Vec::new();
    let mut page_token = String::new();
    loop {
        let (page, next) = fetch(page_token).await.map_err(status)?;
        rows.extend(page);
        if next.is_empty() {
            return Ok(rows);
        }
        page_token = next;
    }
}

pub async fn print_tenants(args: ClientArgs) -> anyhow::Result<()> {
    let (ch, auth) = channel(&args).await?;
    let client = TenantServiceClient::with_interceptor(ch, auth)
        .max_decoding_message_size(MAX_MESSAGE_BYTES);
    let rows = all_rows(|page_token| {
        let mut client = client.clone();
        async move {
            let page = client
                .list_tenants(v1::ListTenantsRequest {
                    page_size: 0,
                    page_token,
                })
                .await?
                .into_inner();
            let rows = page
                .tenants
                .into_iter()
                .map(|t| vec![t.name, t.id, cell(t.display_name)])
                .collect();
            Ok((rows, page.next_page_token))
        }
    })
    .await?;
    print!("{}", table(&["NAME", "ID", "DISPLAY NAME"], &rows));
    Ok(())
}

/// Every cluster the token may see (a tenant token: its own), of `tenant_id` when given.
async fn all_clusters(
    args: &ClientArgs,
    tenant_id: String,
) -> anyhow::Result<Vec<v1::TenantCluster>> {
    let (ch, auth) = channel(args).await?;
    let client = TenantClusterServiceClient::with_interceptor(ch, auth)
        .max_decoding_message_size(MAX_MESSAGE_BYTES);
    all_rows(|page_token| {
        let (mut client, tenant_id) = (client.clone(), tenant_id.clone());
        async move {
            let page = client
                .list_tenant_clusters(v1::ListTenantClustersRequest {
                    tenant_id,
                    page_size: 0,
                    page_token,
                })
                .await?
                .into_inner();
            Ok((page.clusters, page.next_page_token))
        }
    })
    .await
}

/// Every cluster the token may see, by id, as `TENANT/NAME` (for tables that hold ids).
pub async fn cluster_names(
    args: &ClientArgs,
) -> anyhow::Result<std::collections::HashMap<String, String>> {
    Ok(all_clusters(args, String::new())
        .await?
        .into_iter()
        .map(|c| (c.id, format!("{}/{}", c.tenant_name, c.name)))
        .collect())
}

pub async fn print_clusters(args: ListArgs) -> anyhow::Result<()> {
    let rows: Vec<Vec<String>> =
        all_clusters(&args.client, args.tenant.clone().unwrap_or_default())
            .await?
            .into_iter()
            .map(|c| {
                vec![
                    c.tenant_name,
                    c.name,
                    c.id,
                    c.orchestrator,
                    c.gpu_type,
                    c.node_count.to_string(),
                    c.status,
                ]
            })
            .collect();
    let header = [
        "TENANT",
        "NAME",
        "ID",
        "ORCHESTRATOR",
        "GPU TYPE",
        "NODES",
        "STATUS",
    ];
    print!("{}", table(&header, &rows));
    Ok(())
}

pub async fn print_reservations(args: ListArgs) -> anyhow::Result<()> {
    let (ch, auth) = channel(&args.client).await?;
    let client = ReservationServiceClient::with_interceptor(ch, auth)
        .max_decoding_message_size(MAX_MESSAGE_BYTES);
    let tenant = args.tenant.clone().unwrap_or_default();
    let rows = all_rows(|page_token| {
        let (mut client, tenant_id) = (client.clone(), tenant.clone());
        async move {
            let page = client
                .list_reservations(v1::ListReservationsRequest {
                    tenant_id,
                    page_size: 0,
                    page_token,
                })
                .await?
                .into_inner();
            let rows = page
                .reservations
                .into_iter()
                .map(|r| {
                    vec![
                        r.tenant_name,
                        r.id,
                        r.gpu_type,
                        r.node_count.to_string(),
                        rfc3339(r.start_time),
                        rfc3339(r.end_time),
                        r.status,
                    ]
                })
                .collect();
            Ok((rows, page.next_page_token))
        }
    })
    .await?;
    let header = [
        "TENANT", "ID", "GPU TYPE", "NODES", "START", "END", "STATUS",
    ];
    print!("{}", table(&header, &rows));
    Ok(())
}

/// Every node, following the pages of ListNodes.
async fn all_nodes(client: &mut crate::client::Client) -> anyhow::Result<Vec<v1::Node>> {
    let mut nodes = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_nodes(v1::ListNodesRequest {
                page_token,
                ..Default::default()
            })
            .await
            .map_err(status)?
            .into_inner();
        nodes.extend(page.nodes);
        if page.next_page_token.is_empty() {
            return Ok(nodes);
        }
        page_token = page.next_page_token;
    }
}

pub async fn print_nodes(args: ClientArgs) -> anyhow::Result<()> {
    let mut client = connect(&args).await?;
    let nodes = all_nodes(&mut client).await?;
    // Clusters by name (TENANT/NAME), as people call them; an id only if it is not listed.
    let names = if nodes.iter().any(|n| !n.cluster_id.is_empty()) {
        cluster_names(&args).await?
    } else {
        Default::default()
    };
    let rows: Vec<Vec<String>> = nodes
        .into_iter()
        .map(|n| {
            let cluster = if n.cluster_id.is_empty() {
                "-".to_string()
            } else {
                names.get(&n.cluster_id).cloned().unwrap_or(n.cluster_id)
            };
            let heartbeat = if n.heartbeat_age_seconds < 0 {
                "-".to_string()
            } else {
                format!("{}s", n.heartbeat_age_seconds)
            };
            vec![
                n.hostname,
                n.gpu_type,
                n.capacity,
                n.gpu_count.to_string(),
                n.driver_version,
                n.state,
                heartbeat,
                cluster,
                // Why it is busy or quarantined (e.g. the failed check, value, threshold).
                if n.state_reason.is_empty() {
                    "-".to_string()
                } else {
                    n.state_reason
                },
            ]
        })
        .collect();
    print!(
        "{}",
        table(
            &[
                "HOSTNAME",
                "GPU TYPE",
                "CAPACITY",
                "GPUS",
                "DRIVER",
                "STATE",
                "HEARTBEAT",
                "CLUSTER",
                "REASON"
            ],
            &rows
        )
    );
    Ok(())
}
