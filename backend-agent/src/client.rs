//! The small admin client: `fleet` and `nodes` tables, and `hw-check`.

use anyhow::Context;
use gpufleet_proto::v1::{self, fleet_service_client::FleetServiceClient};
use gpufleet_proto::BearerAuth;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::cli::{ClientArgs, HwCheckArgs};

pub(crate) type Client = FleetServiceClient<InterceptedService<Channel, BearerAuth>>;

fn token(args: &ClientArgs) -> anyhow::Result<String> {
    if let Some(t) = args.token.as_ref().filter(|t| !t.is_empty()) {
        return Ok(t.clone());
    }
    let path = args.data_dir.join("admin.token");
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "no token: set GPUFLEET_TOKEN or --token, or run where {} exists",
            path.display()
        )
    })?;
    Ok(text.trim().to_string())
}

pub(crate) async fn connect(args: &ClientArgs) -> anyhow::Result<Client> {
    let (channel, auth) = channel(args).await?;
    Ok(FleetServiceClient::with_interceptor(channel, auth)
        .max_decoding_message_size(gpufleet_proto::limits::MAX_MESSAGE_BYTES))
}

/// A connection to the control plane and the token to present on it.
pub(crate) async fn channel(args: &ClientArgs) -> anyhow::Result<(Channel, BearerAuth)> {
    let auth = BearerAuth::new(&token(args)?).context("the token is not valid header text")?;
    let mut endpoint = Channel::from_shared(args.endpoint.clone())
        .with_context(|| format!("--endpoint: '{}' is not a valid URL", args.endpoint))?;
    let host = endpoint.uri().host().unwrap_or_default().to_string();
    if let Some(tls) =
        gpufleet_wire::tls::client_config(&args.endpoint, &host, args.ca_cert.as_deref())?
    {
        endpoint = endpoint
            .tls_config(tls)
            .context("--ca-cert: cannot use this CA certificate")?;
    }
    let channel = endpoint.connect().await.map_err(|e| {
        anyhow::anyhow!(
            "cannot reach the control plane at {} ({}); is `gpufleet-agent serve` running?",
            args.endpoint,
            root_cause(&e)
        )
    })?;
    if let Some(addr) = args.endpoint.strip_prefix("http://") {
        let addr = addr.trim_end_matches('/');
        if speaks_tls(addr).await {
            anyhow::bail!(
                "--endpoint: the control plane at {addr} speaks https, not http; use --endpoint https://{addr} (with --ca-cert for its CA when it is the pki's)"
            );
        }
    }
    Ok((channel, auth))
}

/// Whether the server at `addr` answers an HTTP/2 preface with TLS (a TLS record: an
/// alert or a handshake), as a TLS-only `serve` does to a plain-http client; otherwise
/// the call would fail later with only "broken pipe" or "frame with invalid size".
async fn speaks_tls(addr: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const TLS_ALERT: u8 = 0x15;
    const TLS_HANDSHAKE: u8 = 0x16;
    let probe = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .ok()?;
        let mut first = [0u8; 1];
        s.read_exact(&mut first).await.ok()?;
        Some(first[0])
    };
    matches!(
        tokio::time::timeout(std::time::Duration::from_secs(2), probe).await,
        Ok(Some(TLS_ALERT | TLS_HANDSHAKE))
    )
}

/// What a failed call says to a person: the control plane's own sentence (which names the
/// field and the numbers), or for a failed connection the cause once; no raw gRPC code.
pub(crate) fn status(s: tonic::Status) -> anyhow::Error {
    use tonic::Code;
    match s.code() {
        Code::Unavailable | Code::Unknown | Code::DeadlineExceeded if is_transport(&s) => {
            anyhow::anyhow!(
                "cannot reach the control plane ({}); is `gpufleet-agent serve` running, and is --endpoint right?",
                transport_cause(&s)
            )
        }
        Code::Unauthenticated => {
            anyhow::anyhow!("the control plane refused the token: {}", s.message())
        }
        _ => anyhow::anyhow!("{}", s.message()),
    }
}

fn is_transport(s: &tonic::Status) -> bool {
    use std::error::Error as _;
    s.source().is_some() || s.message().starts_with("transport error")
}

/// The innermost cause of a transport failure ("Connection refused (os error 111)"
/// rather than "transport error: tcp connect error: tcp connect error: ...").
fn transport_cause(s: &tonic::Status) -> String {
    use std::error::Error as _;
    match s.source() {
        Some(e) => root_cause(e),
        None => s.message().to_string(),
    }
}

fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut root = e;
    while let Some(next) = root.source() {
        root = next;
    }
    root.to_string()
}

/// Widest cell shown: longer ones are cut, so a node's odd report cannot blow up the
/// table (or the formatter, whose widths are bounded). Reasons fit whole.
const MAX_CELL: usize = 1024;

/// `cell` with its control characters escaped (a name a caller chose, recorded before
/// the audit log escaped it, must not forge a row or drive the terminal), cut to
/// [`MAX_CELL`] characters, ending in "…" when cut.
fn fitted(cell: &str) -> String {
    gpufleet_control::audit::text::escaped(cell, MAX_CELL)
}

/// Left-aligned columns wide enough for every cell.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.iter().map(|c| fitted(c)).collect())
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let parts: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        parts.join("  ").trim_end().to_string() + "\n"
    };
    let mut out = line(header.to_vec());
    for row in &rows {
        out += &line(row.iter().map(String::as_str).collect());
    }
    out
}

pub async fn print_fleet(args: ClientArgs) -> anyhow::Result<()> {
    let mut client = connect(&args).await?;
    let types = client
        .list_gpu_types(v1::ListGpuTypesRequest {})
        .await
        .map_err(status)?
        .into_inner()
        .gpu_types;
    // The free counts are the control plane's, the same for every token: a tenant's
    // ListNodes holds only its own nodes, so they cannot be counted from it.
    let rows: Vec<Vec<String>> = types
        .iter()
        .map(|t| {
            vec![
                t.name.clone(),
                t.gpus_per_node.to_string(),
                format!("{}", t.memory_mib),
                t.pool_nodes.to_string(),
                t.free_pool_nodes.to_string(),
                t.on_demand_nodes.to_string(),
                t.free_on_demand_nodes.to_string(),
                if t.mig_capable { "yes" } else { "no" }.into(),
            ]
        })
        .collect();
    print!(
        "{}",
        table(
            &[
                "GPU TYPE",
                "GPUS/NODE",
                "MEMORY MIB",
                "POOL NODES",
                "POOL FREE",
                "ON-DEMAND NODES",
                "ON-DEMAND FREE",
                "MIG"
            ],
            &rows
        )
    );
    Ok(())
}

/// `events ID`: a cluster's event log as a table, oldest first.
pub async fn print_events(args: crate::cli::EventsArgs) -> anyhow::Result<()> {
    let mut client = connect(&args.client).await?;
    let stream = args.object_id.is_none();
    let mut events = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_events(v1::ListEventsRequest {
                object_id: args.object_id.clone().unwrap_or_default(),
                page_token,
                ..Default::default()
            })
            .await
            .map_err(status)?
            .into_inner();
        events.extend(page.events);
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    let rows: Vec<Vec<String>> = events
        .into_iter()
        .map(|e| {
            let time = e
                .time
                .as_ref()
                .map(|t| gpufleet_control::state::rfc3339(t.seconds))
                .unwrap_or_default();
            let node = if e.node.is_empty() {
                "-".into()
            } else {
                e.node
            };
            let mut row = vec![e.seq.to_string(), time];
            if stream {
                // The stream mixes objects: say whose each event is.
                let tenant = if e.tenant_id.is_empty() {
                    "-".into()
                } else {
                    e.tenant_id
                };
                row.extend([e.object_id, tenant]);
            }
            row.extend([e.kind, node, e.message]);
            row
        })
        .collect();
    let header: &[&str] = if stream {
        &["SEQ", "TIME", "OBJECT", "TENANT", "KIND", "NODE", "MESSAGE"]
    } else {
        &["SEQ", "TIME", "KIND", "NODE", "MESSAGE"]
    };
    print!("{}", table(header, &rows));
    Ok(())
}

/// One breaker as a row: model, state, quarantines/cap in the window, held, why.
fn breaker_row(b: v1::QuarantineBreaker) -> Vec<String> {
    vec![
        b.gpu_type,
        if b.open { "open" } else { "closed" }.into(),
        format!(
            "{}/{} per {}s",
            b.quarantines_in_window, b.cap, b.window_seconds
        ),
        b.held.to_string(),
        if b.reason.is_empty() {
            "-".into()
        } else {
            b.reason
        },
    ]
}

const BREAKER_HEADER: [&str; 5] = ["GPU TYPE", "BREAKER", "QUARANTINES", "HELD", "WHY"];

/// `breaker list`: every model's automatic-quarantine breaker.
pub async fn print_breakers(args: ClientArgs) -> anyhow::Result<()> {
    let mut client = connect(&args).await?;
    let breakers = client
        .list_quarantine_breakers(v1::ListQuarantineBreakersRequest {})
        .await
        .map_err(status)?
        .into_inner()
        .breakers;
    let rows: Vec<Vec<String>> = breakers.into_iter().map(breaker_row).collect();
    print!("{}", table(&BREAKER_HEADER, &rows));
    Ok(())
}

/// `breaker reset --gpu-type M`: closes the model's breaker.
pub async fn reset_breaker(args: crate::cli::BreakerResetArgs) -> anyhow::Result<()> {
    let mut client = connect(&args.client).await?;
    let b = client
        .reset_quarantine_breaker(v1::ResetQuarantineBreakerRequest {
            gpu_type: args.gpu_type,
        })
        .await
        .map_err(status)?
        .into_inner();
    println!(
        "breaker of {} is closed: automatic quarantines count afresh (at most {} per {}s)",
        b.gpu_type, b.cap, b.window_seconds
    );
    Ok(())
}

/// `node-return NAME`: a quarantined node back to service.
pub async fn return_node(args: crate::cli::NodeReturnArgs) -> anyhow::Result<()> {
    let mut client = connect(&args.client).await?;
    let node = client
        .return_node(v1::ReturnNodeRequest { name: args.name })
        .await
        .map_err(status)?
        .into_inner();
    println!(
        "node {} returned to service: {} ({})",
        node.hostname, node.state, node.state_reason
    );
    Ok(())
}

pub async fn forget_node_secret(args: crate::cli::NodeReturnArgs) -> anyhow::Result<()> {
    let mut client = connect(&args.client).await?;
    let node = client
        .forget_node_secret(v1::ForgetNodeSecretRequest { name: args.name })
        .await
        .map_err(status)?
        .into_inner();
    println!(
        "node {}: its name is released; the next agent to register under it takes it",
        node.hostname
    );
    Ok(())
}

pub fn hw_check(args: HwCheckArgs) -> anyhow::Result<()> {
    print!(
        "{}",
        gpufleet_node::hardware::check_report(args.hardware.into(), args.nvml_lib.as_deref())?
    );
    print!(
        "{}",
        gpufleet_node::health::host_checks(
            args.hardware.into(),
            args.nvml_lib.as_deref(),
            &args.level
        )?
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn tables_align_columns() {
        let t = super::table(&["A", "BB"], &[vec!["xyz".into(), "1".into()]]);
        assert_eq!(t, "A    BB\nxyz  1\n");
    }

    #[test]
    fn a_huge_cell_is_cut_not_a_panic() {
        // A 2 MB driver string once made the formatter panic (width out of range).
        let huge = "9".repeat(2 << 20);
        let t = super::table(&["DRIVER", "N"], &[vec![huge, "1".into()]]);
        let row = t.lines().nth(1).unwrap();
        assert!(row.ends_with("…  1"), "{row}");
        assert_eq!(row.chars().count(), super::MAX_CELL + 3);
    }

    #[test]
    fn a_newline_or_escape_in_a_cell_stays_in_its_row() {
        let forged = "x\n15  2026-01-01T00:00:00Z  -  admin  DeleteTenant  alpha  OK";
        let t = super::table(
            &["OBJECT", "OUTCOME"],
            &[vec![forged.into(), "\u{1b}[2J".into()]],
        );
        assert_eq!(t.lines().count(), 2, "{t}");
        assert!(!t.contains('\u{1b}'), "{t}");
        assert!(t.contains("x\\u{a}15"), "{t}");
    }
}
