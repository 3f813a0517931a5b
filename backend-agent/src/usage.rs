//! `usage`: GPU-seconds held in a window (issue 42), and used (from the GPUs' utilisation
//! readings; "not reported" where none reported any, never 0), as a table, JSON, or CSV
//! whose columns never change (for finance exports):
//! `since,until,tenant,cluster,gpu_type,class,gpu_seconds`, then always
//! `gpu_seconds_used,gpu_seconds_measured` (used empty when not reported), then
//! `mig_profile,slice_seconds` last. `--by mig_profile` splits a MIG cluster's GPUs
//! between the profiles its layout cuts them into (`none`: whole GPUs): each row's
//! `gpu_seconds` is its profile's part of the GPUs held, `slice_seconds` its instances
//! held times seconds.
//! With `--prices FILE` (the price list `replay --prices` reads: `gpufleet_economics::prices`)
//! each row gains its cost, GPU-hours held times the price of its model and class (the class
//! mapping is `prices::Class::of_usage`), with totals per tenant; the CSV inserts
//! `gpu_hours,price_per_gpu_hour,cost` after `gpu_seconds`, where they always were. A row
//! the list does not price is refused, naming the model, the class and the file, before
//! anything is printed.

use gpufleet_economics::prices::{self, Class, Prices};
use gpufleet_proto::limits::{usage_by, usage_window, MAX_MESSAGE_BYTES};
use gpufleet_proto::money::{cents, decimal as money};
use gpufleet_proto::v1::{self, gpu_quota_service_client::GpuQuotaServiceClient};
use std::collections::BTreeMap;
use std::path::Path;
use time::format_description::well_known::Rfc3339;

use crate::cli::{UsageArgs, UsageFormat};
use crate::client::{channel, status, table};

/// The CSV header: part of the export's contract, append only.
pub const CSV_COLUMNS: &str = "since,until,tenant,cluster,gpu_type,class,gpu_seconds";
/// Appended to [`CSV_COLUMNS`] with `--prices`: also append only.
pub const CSV_COST_COLUMNS: &str = "gpu_hours,price_per_gpu_hour,cost";
/// Last in every CSV (after the cost columns with `--prices`), so that no column moves:
/// GPU-seconds used (empty: not reported) and held time the readings covered.
pub const CSV_USED_COLUMNS: &str = "gpu_seconds_used,gpu_seconds_measured";
/// After [`CSV_USED_COLUMNS`], last in every CSV: the MIG profile (`none` for whole GPUs,
/// empty when not grouped by) and MIG instance-seconds held.
pub const CSV_MIG_COLUMNS: &str = "mig_profile,slice_seconds";
/// What the table says of a group whose GPUs reported no utilisation.
pub const NOT_REPORTED: &str = "not reported";

/// One row's price and cost. Cost is `gpu_seconds / 3600 × per_gpu_hour`, rounded to
/// hundredths of the price list's currency (cents); a tenant's total is the sum of its
/// rows' rounded costs, so the CSV's rows add up to it exactly.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cost {
    pub per_gpu_hour: f64,
    pub cents: i64,
}

/// The rows' costs, one per row, from `prices` (read from `file`); a row whose model and
/// class have no price is refused naming both and the file.
pub fn costs(prices: &Prices, file: &Path, rows: &[v1::UsageRow]) -> anyhow::Result<Vec<Cost>> {
    rows.iter()
        .map(|r| {
            let class = Class::of_usage(&r.class);
            let per_gpu_hour = class
                .and_then(|c| prices.per_gpu_hour(&r.gpu_type, c))
                .ok_or_else(|| {
                    let row = match class {
                        Some(c) if c.name() == r.class => {
                            format!("add a row `{},{},PER_GPU_HOUR`", r.gpu_type, c.name())
                        }
                        Some(c) => format!(
                            "{} is priced as {}: add a row `{},{},PER_GPU_HOUR`",
                            r.class,
                            c.name(),
                            r.gpu_type,
                            c.name()
                        ),
                        None => {
                            "a price list has the classes guaranteed, burst, on-demand".to_string()
                        }
                    };
                    anyhow::anyhow!(
                        "--prices {}: no price for {} {} (tenant '{}'); {row}",
                        file.display(),
                        r.gpu_type,
                        r.class,
                        r.tenant
                    )
                })?;
            Ok(Cost {
                per_gpu_hour,
                cents: cents(r.gpu_seconds, per_gpu_hour),
            })
        })
        .collect()
}

fn hours(gpu_seconds: i64, decimals: usize) -> String {
    format!("{:.*}", decimals, gpu_seconds as f64 / 3600.0)
}

/// Per tenant (the rows' `tenant`; empty where `--by` has no tenant): GPU-seconds and cost.
pub fn totals(rows: &[v1::UsageRow], costs: &[Cost]) -> BTreeMap<String, (i64, i64)> {
    let mut out: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for (r, c) in rows.iter().zip(costs) {
        let t = out.entry(r.tenant.clone()).or_default();
        t.0 += r.gpu_seconds;
        t.1 += c.cents;
    }
    out
}

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
    let prices = match &args.prices {
        Some(file) => {
            if let Some(missing) = ["gpu_type", "class"]
                .into_iter()
                .find(|c| !args.by.iter().any(|b| b == c))
            {
                anyhow::bail!(
                    "--prices: a price is per GPU model and class, so --by must include \
                     gpu_type and class (it has no {missing}), e.g. --by tenant,gpu_type,class"
                );
            }
            Some(prices::load_any(file)?)
        }
        None => None,
    };
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
    // Every row priced before anything is printed.
    let costs = match (&prices, &args.prices) {
        (Some(prices), Some(file)) => Some(costs(prices, file, &report.rows)?),
        _ => None,
    };
    print!("{}", render(&args, &report, costs.as_deref()));
    Ok(())
}

/// The answer in the asked format; `costs` (one per row) with `--prices`.
pub fn render(args: &UsageArgs, report: &v1::UsageReport, costs: Option<&[Cost]>) -> String {
    match args.format {
        UsageFormat::Csv => csv(&args.since, &args.until, &report.rows, costs),
        UsageFormat::Json => {
            let rows: Vec<serde_json::Value> = report
                .rows
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    let mut row = serde_json::json!({
                        "tenant": r.tenant,
                        "cluster": r.cluster,
                        "gpu_type": r.gpu_type,
                        "class": r.class,
                        "gpu_seconds": r.gpu_seconds,
                        "gpu_seconds_used": r.gpu_seconds_used,
                        "gpu_seconds_measured": r.gpu_seconds_measured,
                        "mig_profile": r.mig_profile,
                        "slice_seconds": r.slice_seconds,
                    });
                    if let Some(c) = costs.map(|c| c[i]) {
                        row["gpu_hours"] = (r.gpu_seconds as f64 / 3600.0).into();
                        row["price_per_gpu_hour"] = c.per_gpu_hour.into();
                        row["cost"] = (c.cents as f64 / 100.0).into();
                    }
                    row
                })
                .collect();
            let mut doc = serde_json::json!({
                "since": args.since,
                "until": args.until,
                "retention_seconds": report.retention_seconds,
                "rows": rows,
            });
            if let (Some(c), Some(file)) = (costs, &args.prices) {
                doc["prices"] = file.display().to_string().into();
                doc["totals"] = totals(&report.rows, c)
                    .into_iter()
                    .map(|(tenant, (seconds, cents))| {
                        serde_json::json!({
                            "tenant": tenant,
                            "gpu_seconds": seconds,
                            "gpu_hours": seconds as f64 / 3600.0,
                            "cost": cents as f64 / 100.0,
                        })
                    })
                    .collect::<Vec<_>>()
                    .into();
            }
            format!("{doc:#}\n")
        }
        UsageFormat::Table => {
            let shown: Vec<&str> = ["tenant", "cluster", "gpu_type", "class", "mig_profile"]
                .into_iter()
                .filter(|c| {
                    args.by.iter().any(|b| b == c)
                        || (*c == "tenant" && args.by.iter().any(|b| b == "cluster"))
                })
                .collect();
            let mut header: Vec<String> = shown.iter().map(|c| c.to_uppercase()).collect();
            let slices = shown.contains(&"mig_profile");
            header.extend([
                "GPU-SECONDS".to_string(),
                "GPU-HOURS".to_string(),
                "USED GPU-SECONDS".to_string(),
            ]);
            if slices {
                header.push("SLICE-HOURS".to_string());
            }
            if costs.is_some() {
                header.extend(["PRICE/GPU-HOUR".to_string(), "COST".to_string()]);
            }
            let rows: Vec<Vec<String>> = report
                .rows
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    let mut row: Vec<String> = shown
                        .iter()
                        .map(|c| match *c {
                            "tenant" => r.tenant.clone(),
                            "cluster" => r.cluster.clone(),
                            "gpu_type" => r.gpu_type.clone(),
                            "class" => r.class.clone(),
                            _ => r.mig_profile.clone(),
                        })
                        .collect();
                    row.push(r.gpu_seconds.to_string());
                    row.push(hours(r.gpu_seconds, 2));
                    row.push(
                        r.gpu_seconds_used
                            .map_or(NOT_REPORTED.to_string(), |u| u.to_string()),
                    );
                    if slices {
                        row.push(hours(r.slice_seconds, 2));
                    }
                    if let Some(c) = costs.map(|c| c[i]) {
                        row.push(c.per_gpu_hour.to_string());
                        row.push(money(c.cents));
                    }
                    row
                })
                .collect();
            let header: Vec<&str> = header.iter().map(String::as_str).collect();
            let mut out = table(&header, &rows);
            if let Some(c) = costs {
                let rows: Vec<Vec<String>> = totals(&report.rows, c)
                    .into_iter()
                    .map(|(tenant, (seconds, cents))| {
                        let tenant = if tenant.is_empty() {
                            "(all)".into()
                        } else {
                            tenant
                        };
                        vec![tenant, hours(seconds, 2), money(cents)]
                    })
                    .collect();
                out.push('\n');
                out.push_str(&table(&["TENANT TOTAL", "GPU-HOURS", "COST"], &rows));
            }
            out
        }
    }
}

/// CSV with [`CSV_COLUMNS`] (and [`CSV_COST_COLUMNS`] with costs: GPU-hours to 6
/// decimals, the price as the list gives it, the cost to hundredths), then
/// [`CSV_USED_COLUMNS`] and [`CSV_MIG_COLUMNS`]; a field with a comma or quote is quoted. No total rows: each row
/// is one line a spreadsheet can sum.
fn csv(since: &str, until: &str, rows: &[v1::UsageRow], costs: Option<&[Cost]>) -> String {
    let field = |s: &str| {
        if s.contains([',', '"', '\n']) {
            format!("\"{}\"", s.replace('"', "\"\""))
        } else {
            s.to_string()
        }
    };
    let mut out = match costs {
        Some(_) => {
            format!("{CSV_COLUMNS},{CSV_COST_COLUMNS},{CSV_USED_COLUMNS},{CSV_MIG_COLUMNS}\n")
        }
        None => format!("{CSV_COLUMNS},{CSV_USED_COLUMNS},{CSV_MIG_COLUMNS}\n"),
    };
    for (i, r) in rows.iter().enumerate() {
        let cells = [since, until, &r.tenant, &r.cluster, &r.gpu_type, &r.class];
        let cells: Vec<String> = cells.iter().map(|c| field(c)).collect();
        out.push_str(&format!("{},{}", cells.join(","), r.gpu_seconds));
        if let Some(c) = costs.map(|c| c[i]) {
            out.push_str(&format!(
                ",{},{},{}",
                hours(r.gpu_seconds, 6),
                c.per_gpu_hour,
                money(c.cents)
            ));
        }
        let used = r
            .gpu_seconds_used
            .map(|u| u.to_string())
            .unwrap_or_default();
        out.push_str(&format!(",{used},{}", r.gpu_seconds_measured));
        out.push_str(&format!(",{},{}", field(&r.mig_profile), r.slice_seconds));
        out.push('\n');
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
                gpu_seconds_used: Some(1800),
                gpu_seconds_measured: 7200,
                mig_profile: String::new(),
                slice_seconds: 0,
                ..Default::default()
            }],
            retention_seconds: 400 * 86_400,
            ..Default::default()
        }
    }

    /// Every column always, in one order, whatever the grouping: finance loads it.
    #[test]
    fn csv_has_stable_columns_and_quotes_what_needs_it() {
        let out = render(
            &args(UsageFormat::Csv, &["tenant", "gpu_type"]),
            &report(),
            None,
        );
        assert_eq!(
            out,
            "since,until,tenant,cluster,gpu_type,class,gpu_seconds,gpu_seconds_used,gpu_seconds_measured,mig_profile,slice_seconds\n\
             2027-01-01T00:00:00Z,2027-02-01T00:00:00Z,\"vision, inc\",,H100-80GB,on-demand,7200,1800,7200,,0\n"
        );
        // Not reported is an empty field, never 0.
        let mut mig = report();
        mig.rows[0].gpu_seconds_used = None;
        mig.rows[0].gpu_seconds_measured = 0;
        let out = render(&args(UsageFormat::Csv, &["tenant"]), &mig, None);
        assert!(out.ends_with(",on-demand,7200,,0,,0\n"), "{out}");
        let json: serde_json::Value =
            serde_json::from_str(&render(&args(UsageFormat::Json, &["tenant"]), &mig, None))
                .unwrap();
        assert!(json["rows"][0]["gpu_seconds_used"].is_null(), "{json}");
        assert_eq!(json["rows"][0]["gpu_seconds"], 7200);
    }

    /// Grouped by MIG profile: the profile and its slice-hours in the table, both last in
    /// the CSV (no earlier column moves), and in the JSON.
    #[test]
    fn mig_profiles_are_a_column_of_their_own_with_their_slices() {
        let report = v1::UsageReport {
            rows: vec![
                v1::UsageRow {
                    mig_profile: "1g.10gb".into(),
                    slice_seconds: 7 * 7200,
                    ..row("vision", "guaranteed", 7200)
                },
                v1::UsageRow {
                    mig_profile: "none".into(),
                    ..row("vision", "guaranteed", 3600)
                },
            ],
            retention_seconds: 0,
            ..Default::default()
        };
        let by = ["class", "mig_profile"];
        assert_eq!(
            render(&args(UsageFormat::Table, &by), &report, None),
            "CLASS       MIG_PROFILE  GPU-SECONDS  GPU-HOURS  USED GPU-SECONDS  SLICE-HOURS\n\
             guaranteed  1g.10gb      7200         2.00       not reported      14.00\n\
             guaranteed  none         3600         1.00       not reported      0.00\n"
        );
        let csv = render(&args(UsageFormat::Csv, &by), &report, None);
        assert!(
            csv.starts_with(&format!(
                "{CSV_COLUMNS},{CSV_USED_COLUMNS},mig_profile,slice_seconds\n"
            )),
            "{csv}"
        );
        assert!(
            csv.contains(",vision,,H100-80GB,guaranteed,7200,,0,1g.10gb,50400\n"),
            "{csv}"
        );
        let json: serde_json::Value =
            serde_json::from_str(&render(&args(UsageFormat::Json, &by), &report, None)).unwrap();
        assert_eq!(json["rows"][0]["mig_profile"], "1g.10gb");
        assert_eq!(json["rows"][0]["slice_seconds"], 50400);
    }

    #[test]
    fn the_table_shows_the_grouped_columns_and_hours() {
        let out = render(&args(UsageFormat::Table, &["class"]), &report(), None);
        assert_eq!(
            out,
            "CLASS      GPU-SECONDS  GPU-HOURS  USED GPU-SECONDS\n\
             on-demand  7200         2.00       1800\n"
        );
        let mut mig = report();
        mig.rows[0].gpu_seconds_used = None;
        let out = render(&args(UsageFormat::Table, &["class"]), &mig, None);
        assert!(out.ends_with("2.00       not reported\n"), "{out}");
    }

    fn row(tenant: &str, class: &str, gpu_seconds: i64) -> v1::UsageRow {
        v1::UsageRow {
            tenant: tenant.into(),
            cluster: String::new(),
            gpu_type: "H100-80GB".into(),
            class: class.into(),
            gpu_seconds,
            ..Default::default()
        }
    }

    fn prices() -> Prices {
        prices::parse_any(
            Path::new("prices.csv"),
            "gpu_type,class,per_gpu_hour\n\
             H100-80GB,guaranteed,2.5\nH100-80GB,burst,3\nH100-80GB,on-demand,6\n",
        )
        .unwrap()
    }

    /// GPU-hours times the price, to hundredths; totals are the rows' rounded costs summed.
    #[test]
    fn cost_is_gpu_hours_times_the_price_of_model_and_class() {
        assert_eq!(cents(8000, 2.5), 556); // 2.2222 h x 2.5 = 5.5555
        assert_eq!(cents(7200, 6.0), 1200);
        assert_eq!(cents(0, 6.0), 0);
        assert_eq!(cents(1, 0.0), 0);
        assert_eq!(money(556), "5.56");
        assert_eq!(money(5), "0.05");
        assert_eq!(money(120_000), "1200.00");
        let rows = [
            row("vision", "guaranteed", 8000),
            row("vision", "on-demand", 3600),
            // Priced as burst: the mapping is prices::Class::of_usage.
            row("vision", "borrowed-preemptible", 1800),
            row("speech", "burst", 4800),
        ];
        let c = costs(&prices(), Path::new("prices.csv"), &rows).unwrap();
        let got: Vec<(f64, i64)> = c.iter().map(|c| (c.per_gpu_hour, c.cents)).collect();
        assert_eq!(got, [(2.5, 556), (6.0, 600), (3.0, 150), (3.0, 400)]);
        let t = totals(&rows, &c);
        assert_eq!(t["vision"], (8000 + 3600 + 1800, 556 + 600 + 150));
        assert_eq!(t["speech"], (4800, 400));
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn a_row_without_a_price_is_refused_naming_model_class_and_file() {
        let only_guaranteed = prices::parse_any(
            Path::new("p.csv"),
            "gpu_type,class,per_gpu_hour\nH100-80GB,guaranteed,2.5\n",
        )
        .unwrap();
        let refused = |class: &str| {
            costs(
                &only_guaranteed,
                Path::new("/etc/prices.csv"),
                &[row("vision", "guaranteed", 10), row("vision", class, 10)],
            )
            .unwrap_err()
            .to_string()
        };
        assert_eq!(
            refused("on-demand"),
            "--prices /etc/prices.csv: no price for H100-80GB on-demand (tenant 'vision'); \
             add a row `H100-80GB,on-demand,PER_GPU_HOUR`"
        );
        assert_eq!(
            refused("borrowed-preemptible"),
            "--prices /etc/prices.csv: no price for H100-80GB borrowed-preemptible \
             (tenant 'vision'); borrowed-preemptible is priced as burst: add a row \
             `H100-80GB,burst,PER_GPU_HOUR`"
        );
        let mut other = row("vision", "guaranteed", 10);
        other.gpu_type = "A100-80GB".into();
        let e = costs(&only_guaranteed, Path::new("p.csv"), &[other])
            .unwrap_err()
            .to_string();
        assert!(e.contains("no price for A100-80GB guaranteed"), "{e}");
    }

    /// The existing columns first, unchanged; the cost columns appended.
    #[test]
    fn priced_csv_appends_its_columns_and_the_table_totals_per_tenant() {
        let report = v1::UsageReport {
            rows: vec![
                row("vision", "guaranteed", 8000),
                row("vision", "on-demand", 3600),
            ],
            retention_seconds: 0,
            ..Default::default()
        };
        let c = costs(&prices(), Path::new("prices.csv"), &report.rows).unwrap();
        let by = ["tenant", "gpu_type", "class"];
        assert_eq!(
            render(&args(UsageFormat::Csv, &by), &report, Some(&c)),
            "since,until,tenant,cluster,gpu_type,class,gpu_seconds,gpu_hours,price_per_gpu_hour,cost,gpu_seconds_used,gpu_seconds_measured,mig_profile,slice_seconds\n\
             2027-01-01T00:00:00Z,2027-02-01T00:00:00Z,vision,,H100-80GB,guaranteed,8000,2.222222,2.5,5.56,,0,,0\n\
             2027-01-01T00:00:00Z,2027-02-01T00:00:00Z,vision,,H100-80GB,on-demand,3600,1.000000,6,6.00,,0,,0\n"
        );
        let table = render(&args(UsageFormat::Table, &by), &report, Some(&c));
        assert!(
            table.ends_with("TENANT TOTAL  GPU-HOURS  COST\nvision        3.22       11.56\n"),
            "{table}"
        );
        let mut priced = args(UsageFormat::Json, &by);
        priced.prices = Some("prices.csv".into());
        let json: serde_json::Value =
            serde_json::from_str(&render(&priced, &report, Some(&c))).unwrap();
        assert_eq!(json["prices"], "prices.csv");
        assert_eq!(json["rows"][0]["cost"], 5.56);
        assert_eq!(json["totals"][0]["cost"], 11.56);
    }
}
