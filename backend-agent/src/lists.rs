//! `tenants`, `clusters` and `reservations`: what exists, with the ids the API and
//! `terraform import` take, as the token may see it (a tenant token: its own).

use gpufleet_proto::limits::MAX_MESSAGE_BYTES;
use gpufleet_proto::v1::{
    self, reservation_service_client::ReservationServiceClient,
    tenant_cluster_service_client::TenantClusterServiceClient,
    tenant_service_client::TenantServiceClient,
};

use crate::cli::{ClientArgs, ListArgs};
use crate::client::{channel, status, table};

/// "-" for an empty cell.
fn cell(s: String) -> String {
    if s.is_empty() {
        "-".to_string()
    } else {
        s
    }
}

fn rfc3339(t: Option<gpufleet_proto::timestamp::Timestamp>) -> String {
    t.and_then(|t| time::OffsetDateTime::from_unix_timestamp(t.seconds).ok())
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| "-".to_string())
}

/// Every page of a list call as table rows: `fetch` takes a page token and answers that
/// page's rows and the next token ("" after the last page).
async fn all_rows<F, Fut>(mut fetch: F) -> anyhow::Result<Vec<Vec<String>>>
where
    F: FnMut(String) -> Fut,
    Fut: std::future::Future<Output = Result<(Vec<Vec<String>>, String), tonic::Status>>,
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

/// Every cluster the token may see, by id, as `TENANT/NAME` (for tables that hold ids).
pub async fn cluster_names(
    args: &ClientArgs,
) -> anyhow::Result<std::collections::HashMap<String, String>> {
    let (ch, auth) = channel(args).await?;
    let client = TenantClusterServiceClient::with_interceptor(ch, auth)
        .max_decoding_message_size(MAX_MESSAGE_BYTES);
    let rows = all_rows(|page_token| {
        let mut client = client.clone();
        async move {
            let page = client
                .list_tenant_clusters(v1::ListTenantClustersRequest {
                    tenant_id: String::new(),
                    page_size: 0,
                    page_token,
                })
                .await?
                .into_inner();
            let rows = page
                .clusters
                .into_iter()
                .map(|c| vec![c.id, format!("{}/{}", c.tenant_name, c.name)])
                .collect();
            Ok((rows, page.next_page_token))
        }
    })
    .await?;
    Ok(rows
        .into_iter()
        .filter_map(|mut r| {
            let name = r.pop()?;
            Some((r.pop()?, name))
        })
        .collect())
}

pub async fn print_clusters(args: ListArgs) -> anyhow::Result<()> {
    let (ch, auth) = channel(&args.client).await?;
    let client = TenantClusterServiceClient::with_interceptor(ch, auth)
        .max_decoding_message_size(MAX_MESSAGE_BYTES);
    let tenant = args.tenant.clone().unwrap_or_default();
    let rows = all_rows(|page_token| {
        let (mut client, tenant_id) = (client.clone(), tenant.clone());
        async move {
            let page = client
                .list_tenant_clusters(v1::ListTenantClustersRequest {
                    tenant_id,
                    page_size: 0,
                    page_token,
                })
                .await?
                .into_inner();
            let rows = page
                .clusters
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
            Ok((rows, page.next_page_token))
        }
    })
    .await?;
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
