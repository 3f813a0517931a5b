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

pub async fn print_tenants(args: ClientArgs) -> anyhow::Result<()> {
    let (ch, auth) = channel(&args).await?;
    let mut client = TenantServiceClient::with_interceptor(ch, auth)
        .max_decoding_message_size(MAX_MESSAGE_BYTES);
    let mut rows = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_tenants(v1::ListTenantsRequest {
                page_size: 0,
                page_token,
            })
            .await
            .map_err(status)?
            .into_inner();
        rows.extend(
            page.tenants
                .into_iter()
                .map(|t| vec![t.name, t.id, cell(t.display_name)]),
        );
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    print!("{}", table(&["NAME", "ID", "DISPLAY NAME"], &rows));
    Ok(())
}

pub async fn print_clusters(args: ListArgs) -> anyhow::Result<()> {
    let (ch, auth) = channel(&args.client).await?;
    let mut client = TenantClusterServiceClient::with_interceptor(ch, auth)
        .max_decoding_message_size(MAX_MESSAGE_BYTES);
    let mut rows = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_tenant_clusters(v1::ListTenantClustersRequest {
                tenant_id: args.tenant.clone().unwrap_or_default(),
                page_size: 0,
                page_token,
            })
            .await
            .map_err(status)?
            .into_inner();
        rows.extend(page.clusters.into_iter().map(|c| {
            vec![
                c.tenant_name,
                c.name,
                c.id,
                c.orchestrator,
                c.gpu_type,
                c.node_count.to_string(),
                c.status,
            ]
        }));
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
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
    let mut client = ReservationServiceClient::with_interceptor(ch, auth)
        .max_decoding_message_size(MAX_MESSAGE_BYTES);
    let mut rows = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_reservations(v1::ListReservationsRequest {
                tenant_id: args.tenant.clone().unwrap_or_default(),
                page_size: 0,
                page_token,
            })
            .await
            .map_err(status)?
            .into_inner();
        rows.extend(page.reservations.into_iter().map(|r| {
            vec![
                r.tenant_name,
                r.id,
                r.gpu_type,
                r.node_count.to_string(),
                rfc3339(r.start_time),
                rfc3339(r.end_time),
                r.status,
            ]
        }));
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    let header = [
        "TENANT", "ID", "GPU TYPE", "NODES", "START", "END", "STATUS",
    ];
    print!("{}", table(&header, &rows));
    Ok(())
}
