//! `usage`: GPU-seconds held in a window (issue 42), as a table, JSON, or CSV whose columns
//! never change (for finance exports): `since,until,tenant,cluster,gpu_type,class,gpu_seconds`.

use gpufleet_proto::limits::{usage_by, usage_window, MAX_MESSAGE_BYTES};
use gpufleet_proto::v1::{self, gpu_quota_service_client::GpuQuotaServiceClient};
use time::format_description::well_known::Rfc3339;

use crate::cli::{UsageArgs, UsageFormat};
use crate::client::{channel, status, table};

/// The CSV header: part of the export's contract, append only.
pub const CSV_COLUMNS: &str = "since,until,tenant,cluster,gpu_type,class,gpu_seconds";

fn unix(flag: &str, text: &str) -> anyhow::Result<i64> {
    time::OffsetDateTime::parse(text, &Rfc3339)
        .map(|t| t.unix_timestamp())
        .map_err(|e| {
            anyhow::anyhow!(
                "--{flag}: {text:?} is not an RFC 3339 time such as 2027-01-01T00:00:00Z ({e})"
            )
        })
}

pub async fn print(args: UsageArgs) -> anyhow::Result<()> {
    let since = unix("since", &args.since)?;
    let until = unix("until", &args.until)?;
    usage_window(since, until).map_err(|e| anyhow::anyhow!("--{e}"))?;
    usage_by(&args.by).map_err(|e| anyhow::anyhow!("--{e}"))?;
    let (ch, auth) = channel(&args.list.client).await?;
    let mut client = GpuQuotaServiceClient::with_interceptor(ch, auth)
        .max_decoding_message_size(MAX_MESSAGE_BYTES);
    let report = client
        .get_usage(v1::UsageRequest {
            tenant_id: args.list.tenant.clone().unwrap_or_default(),
            since: Some(gpufleet_proto::timestamp::Timestamp {
                seconds: since,
                nanos: 0,
            }),
            until: Some(gpufleet_proto::timestamp::Timestamp {
                seconds: until,
                nanos: 0,
            }),
            by: args.by.clone(),
        })
        .await
        .map_err(status)?
        .into_inner();
    print!("{}", render(&args, &report));
    Ok(())
}

/// The answer in the asked format.
pub fn render(args: &UsageArgs, report: &v1::UsageReport) -> String {
    match args.format {
        UsageFormat::Csv => csv(&args.since, &args.until, &report.rows),
        UsageFormat::Json => {
            let rows: Vec<serde_json::Value> = report
                .rows
                .iter()
                .map(|r| {
                    serde_json::json!({
                        "tenant": r.tenant,
                        "cluster": r.cluster,
                        "gpu_type": r.gpu_type,
                        "class": r.class,
                        "gpu_seconds": r.gpu_seconds,
                    })
                })
                .collect();
            let doc = serde_json::json!({
                "since": args.since,
                "until": args.until,
                "retention_seconds": report.retention_seconds,
                "rows": rows,
            });
            format!("{doc:#}\n")
        }
        UsageFormat::Table => {
            let shown: Vec<&str> = ["tenant", "cluster", "gpu_type", "class"]
                .into_iter()
                .filter(|c| {
                    args.by.iter().any(|b| b == c)
                        || (*c == "tenant" && args.by.iter().any(|b| b == "cluster"))
                })
                .collect();
            let mut header: Vec<String> = shown.iter().map(|c| c.to_uppercase()).collect();
            header.extend(["GPU-SECONDS".to_string(), "GPU-HOURS".to_string()]);
            let rows: Vec<Vec<String>> = report
                .rows
                .iter()
                .map(|r| {
                    let mut row: Vec<String> = shown
                        .iter()
                        .map(|c| match *c {
                            "tenant" => r.tenant.clone(),
                            "cluster" => r.cluster.clone(),
                            "gpu_type" => r.gpu_type.clone(),
                            _ => r.class.clone(),
                        })
                        .collect();
                    row.push(r.gpu_seconds.to_string());
                    row.push(format!("{:.2}", r.gpu_seconds as f64 / 3600.0));
                    row
                })
                .collect();
            let header: Vec<&str> = header.iter().map(String::as_str).collect();
            table(&header, &rows)
        }
    }
}

/// CSV with [`CSV_COLUMNS`]; a field with a comma or quote is quoted.
fn csv(since: &str, until: &str, rows: &[v1::UsageRow]) -> String {
    let field = |s: &str| {
        if s.contains([',', '"', '\n']) {
            format!("\"{}\"", s.replace('"', "\"\""))
        } else {
            s.to_string()
        }
    };
    let mut out = format!("{CSV_COLUMNS}\n");
    for r in rows {
        let cells = [since, until, &r.tenant, &r.cluster, &r.gpu_type, &r.class];
        let cells: Vec<String> = cells.iter().map(|c| field(c)).collect();
        out.push_str(&format!("{},{}\n", cells.join(","), r.gpu_seconds));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(format: UsageFormat, by: &[&str]) -> UsageArgs {
        use clap::Parser;
        let mut argv = vec![
            "gpufleet-agent".to_string(),
            "usage".into(),
            "--since".into(),
            "2027-01-01T00:00:00Z".into(),
            "--until".into(),
            "2027-02-01T00:00:00Z".into(),
        ];
        if !by.is_empty() {
            argv.extend(["--by".into(), by.join(",")]);
        }
        let cli = crate::cli::Cli::parse_from(argv);
        match cli.command {
            crate::cli::Command::Usage(mut a) => {
                a.format = format;
                a
            }
            other => panic!("parsed {other:?}"),
        }
    }

    fn report() -> v1::UsageReport {
        v1::UsageReport {
            rows: vec![v1::UsageRow {
                tenant: "vision, inc".into(),
                cluster: String::new(),
                gpu_type: "H100-80GB".into(),
                class: "on-demand".into(),
                gpu_seconds: 7200,
            }],
            retention_seconds: 400 * 86_400,
        }
    }

    /// Every column always, in one order, whatever the grouping: finance loads it.
    #[test]
    fn csv_has_stable_columns_and_quotes_what_needs_it() {
        let out = render(&args(UsageFormat::Csv, &["tenant", "gpu_type"]), &report());
        assert_eq!(
            out,
            "since,until,tenant,cluster,gpu_type,class,gpu_seconds\n\
             2027-01-01T00:00:00Z,2027-02-01T00:00:00Z,\"vision, inc\",,H100-80GB,on-demand,7200\n"
        );
    }

    #[test]
    fn the_table_shows_the_grouped_columns_and_hours() {
        let out = render(&args(UsageFormat::Table, &["class"]), &report());
        assert_eq!(
            out,
            "CLASS      GPU-SECONDS  GPU-HOURS\non-demand  7200         2.00\n"
        );
    }
}
