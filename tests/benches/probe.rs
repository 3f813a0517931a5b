//! Issue 40's probe, measured again: what a caller without a valid token, or one team,
//! can still take from everyone else on the release build. Three shapes, each on a fresh
//! `gpufleet-agent serve` (release build: `$GPUFLEET_AGENT_BIN`, else
//! `target/release/gpufleet-agent`):
//!
//! 1. N1, connections: one local process opens `HELD` connections over loopback (all of
//!    loopback is one peer, capped at 256), makes one call on each with a token that is
//!    none (refused) and holds them open; then `CLI_CALLS` runs of `gpufleet-agent fleet`
//!    and one gRPC call on a fresh connection, both with the admin token: how many succeed.
//! 2. N2, the audit trail: a team makes `TEAM_ENTRIES` changes (reservation creates and
//!    deletes, half each), then `FLOOD` calls without a valid token arrive from
//!    `FLOOD_CLIENTS` connections (`FLOOD_TASKS` calls in flight); serve is stopped
//!    cleanly (the flood's count is written by then at the latest), `gpufleet-agent audit
//!    --verify` walks the hash chains, and the log, read after a restart, says how many of
//!    the team's entries are kept and what the flood wrote.
//! 3. N5, the metrics endpoint: `SCRAPERS` threads scrape with one team's token back to
//!    back for `SCRAPE_S` seconds while the operator scrapes with the metrics token, also
//!    back to back: the share of the operator's scrapes answered 200.
//!
//! Prints one table with, beside each figure, the figure issue 40 reported from the build
//! before the fixes (c649f78, 99bcb17, 0163f21, 16ecb3a, c328b8b). Those were not measured
//! again: the bench has no cheap way to build an older commit (a release build of one takes
//! a full build of its own), so the column says so. Nothing is asserted. The whole run
//! takes about 30 s on 2 shared cores, the flood of 210,048 calls under 10 s of it (the
//! issue's probe needed ~60 s for as many, each of them written to the log then).
//!
//! `cargo build --release -p gpufleet-agent --bins && cargo bench -p gpufleet-e2e --bench probe`
//! Environment: `HELD` (default 300), `CLI_CALLS` (20), `TEAM_ENTRIES` (136), `FLOOD`
//! (210048, as the probe), `FLOOD_CLIENTS` (8), `FLOOD_TASKS` (64), `SCRAPERS`
//! (24), `SCRAPE_S` (20).

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpufleet_e2e::fixtures::{create_quota, create_reservation, create_tenant};
use gpufleet_e2e::grpc::bearer_auth;
use gpufleet_e2e::{prom, Backend, Clients};
use gpufleet_proto::v1::access_service_client::AccessServiceClient;
use gpufleet_proto::v1::{
    AuditEntry, DeleteReservationRequest, DeleteTenantRequest, ListAuditEntriesRequest,
    ListTenantsRequest,
};

/// A bearer token that is no token of the store.
const NOT_A_TOKEN: &str = "gft_not-a-token";
const GPU_TYPE: &str = "H100-80GB";

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn percent(part: usize, whole: usize) -> f64 {
    if whole == 0 {
        return 0.0;
    }
    100.0 * part as f64 / whole as f64
}

/// One call on a connection of its own; `Err` says why it failed (connect or call).
async fn fresh_call(endpoint: &str, token: &str) -> Result<(), String> {
    let channel = tonic::transport::Channel::from_shared(endpoint.to_string())
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let mut c = Clients::on_channel(channel, token);
    c.tenants
        .list_tenants(ListTenantsRequest::default())
        .await
        .map(drop)
        .map_err(|s| format!("ListTenants: {s}"))
}

/// What shape 1 measured.
struct Connections {
    held: usize,
    hold_s: f64,
    cli_ok: usize,
    cli_calls: usize,
    cli_p50_ms: f64,
    cli_max_ms: f64,
    grpc: Result<(), String>,
    evicted: f64,
}

async fn connections(held_wanted: usize, cli_calls: usize) -> Connections {
    let backend = tokio::task::spawn_blocking(|| {
        Backend::start_with_args(&["--metrics-listen", "127.0.0.1:0"])
    })
    .await
    .expect("start serve");
    let endpoint = backend.endpoint();
    let started = Instant::now();
    let mut held = Vec::with_capacity(held_wanted);
    for _ in 0..held_wanted {
        let mut c = Clients::connect(&endpoint, NOT_A_TOKEN).await;
        match c.tenants.list_tenants(ListTenantsRequest::default()).await {
            Err(s) if s.code() == tonic::Code::Unauthenticated => held.push(c),
            other => panic!("a call with no valid token was answered {other:?}"),
        }
    }
    let hold_s = started.elapsed().as_secs_f64();

    let agent = gpufleet_e2e::binaries::release_agent();
    let admin = backend.admin_token().to_string();
    let (cli_ok, mut took) = {
        let (endpoint, admin) = (endpoint.clone(), admin.clone());
        tokio::task::spawn_blocking(move || {
            let mut ok = 0;
            let mut took = Vec::with_capacity(cli_calls);
            for _ in 0..cli_calls {
                let t0 = Instant::now();
                let out = Command::new(&agent)
                    .arg("fleet")
                    .env("GPUFLEET_ENDPOINT", &endpoint)
                    .env("GPUFLEET_TOKEN", &admin)
                    .output()
                    .expect("run gpufleet-agent fleet");
                took.push(t0.elapsed());
                if out.status.success() {
                    ok += 1;
                } else if ok == 0 {
                    eprintln!(
                        "gpufleet-agent fleet failed: {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
            }
            (ok, took)
        })
        .await
        .expect("CLI calls")
    };
    took.sort();
    let grpc = fresh_call(&endpoint, &admin).await;
    let evicted = metric(
        &operator_scrape(&backend),
        "gpufleet_api_connections_closed_total{reason=\"evicted\"}",
    );
    let count = held.len();
    drop(held);
    tokio::task::spawn_blocking(move || drop(backend))
        .await
        .expect("stop serve");
    Connections {
        held: count,
        hold_s,
        cli_ok,
        cli_calls,
        cli_p50_ms: took
            .get(took.len() / 2)
            .map_or(0.0, |d| d.as_secs_f64() * 1e3),
        cli_max_ms: took.last().map_or(0.0, |d| d.as_secs_f64() * 1e3),
        grpc,
        evicted,
    }
}

/// The metrics endpoint's address (serve logs it) and the operator's scrape token.
fn metrics_of(backend: &Backend) -> (String, String) {
    let addr = prom::wait_for_metrics_addr("serve", || backend.log());
    let token = std::fs::read_to_string(backend.data_file("metrics.token"))
        .expect("serve's metrics.token")
        .trim()
        .to_string();
    (addr, token)
}

fn operator_scrape(backend: &Backend) -> String {
    let (addr, token) = metrics_of(backend);
    prom::scrape_with(&addr, &token)
}

/// The value of one series in a scrape (0 when absent).
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| {
            let rest = line.strip_prefix(series)?;
            rest.strip_prefix(' ')?.trim().parse().ok()
        })
        .unwrap_or(0.0)
}

/// What shape 2 measured.
struct Audit {
    team_written: usize,
    team_kept: usize,
    oldest_team_entry_kept: bool,
    admin_first_kept: bool,
    flood: usize,
    flood_s: f64,
    refused: usize,
    other_answers: usize,
    dropped: f64,
    unauthenticated_entries: usize,
    /// Of those, the entries that count a window's refusals not recorded one by one.
    counting_entries: usize,
    counted_in_entries: u64,
    total_entries: usize,
    verify: Result<String, String>,
}

/// Every audit entry, oldest first, read with the admin's token.
async fn audit_log(backend: &Backend) -> Vec<AuditEntry> {
    let channel = tonic::transport::Channel::from_shared(backend.endpoint())
        .expect("endpoint")
        .connect()
        .await
        .expect("connect to serve");
    let mut access =
        AccessServiceClient::with_interceptor(channel, bearer_auth(backend.admin_token()));
    let mut entries = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = access
            .list_audit_entries(ListAuditEntriesRequest {
                tenant_id: String::new(),
                page_size: 1000,
                page_token,
            })
            .await
            .unwrap_or_else(|s| panic!("ListAuditEntries: {s}"))
            .into_inner();
        entries.extend(page.entries);
        if page.next_page_token.is_empty() {
            return entries;
        }
        page_token = page.next_page_token;
    }
}

/// The count a sampled window's entry carries: "N more calls without a valid token ...".
fn counted(entry: &AuditEntry) -> u64 {
    entry
        .message
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

async fn audit(team_entries: usize, flood: usize, clients: usize, tasks: usize) -> Audit {
    let fleet = format!("[[pool]]\ngpu_type = \"{GPU_TYPE}\"\nnodes = 8\n");
    let mut backend = tokio::task::spawn_blocking(move || {
        Backend::start_with_fleet_and_args(&fleet, &["--metrics-listen", "127.0.0.1:0"])
    })
    .await
    .expect("start serve");
    let endpoint = backend.endpoint();
    let mut admin = backend.admin().await;
    let (team, token) = create_tenant(&mut admin, "probe-team").await;
    create_quota(&mut admin, &team.id, GPU_TYPE, 8, 0).await;
    let mut own = Clients::connect(&endpoint, &token).await;
    // The team's changes: each reservation taken back before the next (its quota is one
    // node).
    let mut first_object = String::new();
    for i in 0..team_entries / 2 {
        let r =
            create_reservation(&mut own, &team.id, GPU_TYPE, 1, 1 + i as i64, 2 + i as i64).await;
        if first_object.is_empty() {
            first_object = r.id.clone();
        }
        own.reservations
            .delete_reservation(DeleteReservationRequest { id: r.id })
            .await
            .unwrap_or_else(|s| panic!("DeleteReservation: {s}"));
    }

    // The flood: calls that change something (so each refusal is one the log would hold),
    // from a few connections, many in flight.
    let mut strangers = Vec::new();
    for _ in 0..clients.max(1) {
        strangers.push(Clients::connect(&endpoint, NOT_A_TOKEN).await);
    }
    let next = Arc::new(AtomicUsize::new(0));
    let refused = Arc::new(AtomicUsize::new(0));
    let other = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut running = Vec::new();
    for k in 0..tasks.max(1) {
        let mut c = strangers[k % strangers.len()].clone();
        let (next, refused, other) = (next.clone(), refused.clone(), other.clone());
        running.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= flood {
                    break;
                }
                let answer = c
                    .tenants
                    .delete_tenant(DeleteTenantRequest {
                        id: format!("flood-{i}"),
                        ..Default::default()
                    })
                    .await;
                match answer {
                    Err(s) if s.code() == tonic::Code::Unauthenticated => {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                    other_answer => {
                        if other.fetch_add(1, Ordering::Relaxed) < 3 {
                            eprintln!("a flood call was answered {other_answer:?}");
                        }
                    }
                }
            }
        }));
    }
    for t in running {
        t.await.expect("flood task");
    }
    let flood_s = started.elapsed().as_secs_f64();
    let dropped = metric(&operator_scrape(&backend), "gpufleet_audit_dropped_total");
    drop((admin, own, strangers));

    // A clean stop writes what the queue holds and each window's count.
    let backend = tokio::task::spawn_blocking(move || {
        backend.terminate();
        backend
    })
    .await
    .expect("stop serve");
    let verify = {
        let data_dir = backend.data_dir();
        tokio::task::spawn_blocking(move || {
            let out = Command::new(gpufleet_e2e::binaries::release_agent())
                .args(["audit", "--verify", "--data-dir"])
                .arg(&data_dir)
                .output()
                .expect("run gpufleet-agent audit --verify");
            let first = |b: &[u8]| {
                String::from_utf8_lossy(b)
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_string()
            };
            if out.status.success() {
                Ok(first(&out.stdout))
            } else {
                Err(first(&out.stderr))
            }
        })
        .await
        .expect("audit --verify")
    };
    let mut backend = backend;
    let backend = tokio::task::spawn_blocking(move || {
        backend.start_again();
        backend
    })
    .await
    .expect("start serve again");
    let entries = audit_log(&backend).await;
    let own_entries: Vec<&AuditEntry> = entries
        .iter()
        .filter(|e| e.tenant_id == team.id && !e.by_admin && !e.token_name.is_empty())
        .collect();
    let unauthenticated: Vec<&AuditEntry> =
        entries.iter().filter(|e| e.token_name.is_empty()).collect();
    let counting: Vec<&&AuditEntry> = unauthenticated.iter().filter(|e| e.method == "*").collect();
    let counted_in_entries = counting.iter().map(|e| counted(e)).sum();
    let admin_first_kept = entries
        .iter()
        .find(|e| e.by_admin)
        .is_some_and(|e| e.method.ends_with("/CreateTenant"));
    // The team's first change is its first reservation's create, the second its delete
    // (which names the reservation).
    let oldest_team_entry_kept = matches!(
        own_entries.as_slice(),
        [create, delete, ..] if create.method.ends_with("/CreateReservation")
            && delete.method.ends_with("/DeleteReservation")
            && delete.object == first_object
    );
    tokio::task::spawn_blocking(move || drop(backend))
        .await
        .expect("stop serve");
    Audit {
        team_written: team_entries / 2 * 2,
        team_kept: own_entries.len(),
        oldest_team_entry_kept,
        admin_first_kept,
        flood,
        flood_s,
        refused: refused.load(Ordering::Relaxed),
        other_answers: other.load(Ordering::Relaxed),
        dropped,
        unauthenticated_entries: unauthenticated.len(),
        counting_entries: counting.len(),
        counted_in_entries,
        total_entries: entries.len(),
        verify,
    }
}

/// What shape 3 measured.
struct Scrapes {
    seconds: u64,
    scrapers: usize,
    operator_ok: usize,
    operator_all: usize,
    operator_p50_ms: f64,
    operator_max_ms: f64,
    team_ok: usize,
    team_busy: usize,
    team_all: usize,
}

/// The status of one scrape with `token` (0: no answer).
fn scrape_status(addr: &str, token: &str) -> u16 {
    prom::get(addr, "/metrics", Some(token)).map_or(0, |a| a.status)
}

async fn scrapes(scrapers: usize, seconds: u64) -> Scrapes {
    let backend = tokio::task::spawn_blocking(|| {
        Backend::start_with_args(&["--metrics-listen", "127.0.0.1:0"])
    })
    .await
    .expect("start serve");
    let mut admin = backend.admin().await;
    let (_team, team_token) = create_tenant(&mut admin, "probe-scraper").await;
    let (addr, operator_token) = metrics_of(&backend);
    assert_eq!(
        scrape_status(&addr, &team_token),
        200,
        "the team's token reads its own view"
    );

    let done = Arc::new(AtomicBool::new(false));
    let (team_ok, team_busy, team_all) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let flood: Vec<_> = (0..scrapers)
        .map(|_| {
            let (addr, token, done) = (addr.clone(), team_token.clone(), done.clone());
            let (ok, busy, all) = (team_ok.clone(), team_busy.clone(), team_all.clone());
            std::thread::spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    match scrape_status(&addr, &token) {
                        200 => ok.fetch_add(1, Ordering::Relaxed),
                        503 => busy.fetch_add(1, Ordering::Relaxed),
                        _ => 0,
                    };
                    all.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let operator = {
        let (addr, done) = (addr.clone(), done.clone());
        std::thread::spawn(move || {
            let until = Instant::now() + Duration::from_secs(seconds);
            let mut answers = Vec::new();
            while Instant::now() < until {
                let t0 = Instant::now();
                let status = scrape_status(&addr, &operator_token);
                answers.push((status, t0.elapsed()));
            }
            done.store(true, Ordering::Relaxed);
            answers
        })
    };
    let answers = tokio::task::spawn_blocking(move || operator.join().expect("operator"))
        .await
        .expect("operator scrapes");
    for f in flood {
        f.join().expect("team scraper");
    }
    let mut took: Vec<Duration> = answers.iter().map(|(_, d)| *d).collect();
    took.sort();
    drop(admin);
    tokio::task::spawn_blocking(move || drop(backend))
        .await
        .expect("stop serve");
    Scrapes {
        seconds,
        scrapers,
        operator_ok: answers.iter().filter(|(s, _)| *s == 200).count(),
        operator_all: answers.len(),
        operator_p50_ms: took
            .get(took.len() / 2)
            .map_or(0.0, |d| d.as_secs_f64() * 1e3),
        operator_max_ms: took.last().map_or(0.0, |d| d.as_secs_f64() * 1e3),
        team_ok: team_ok.load(Ordering::Relaxed),
        team_busy: team_busy.load(Ordering::Relaxed),
        team_all: team_all.load(Ordering::Relaxed),
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    // `cargo bench` passes `--bench`; no other arguments are taken.
    let held = env_usize("HELD", 300);
    let cli_calls = env_usize("CLI_CALLS", 20).max(1);
    let team_entries = env_usize("TEAM_ENTRIES", 136).max(2);
    let flood = env_usize("FLOOD", 210_048);
    let flood_clients = env_usize("FLOOD_CLIENTS", 8);
    let flood_tasks = env_usize("FLOOD_TASKS", 64);
    let scrapers = env_usize("SCRAPERS", 24).max(1);
    let scrape_s = env_usize("SCRAPE_S", 20).max(1) as u64;
    let agent = gpufleet_e2e::binaries::release_agent();
    assert!(
        agent.is_file(),
        "{} not found: build it with `cargo build --release -p gpufleet-agent --bins` or set {}",
        agent.display(),
        gpufleet_e2e::binaries::AGENT_ENV
    );
    std::env::set_var(gpufleet_e2e::binaries::AGENT_ENV, &agent);
    eprintln!("agent: {}", agent.display());

    let whole = Instant::now();
    eprintln!("==> N1: {held} refused connections held, then the CLI and the API");
    let c = connections(held, cli_calls).await;
    eprintln!("==> N2: {team_entries} team entries, then {flood} calls without a valid token");
    let a = audit(team_entries, flood, flood_clients, flood_tasks).await;
    eprintln!("==> N5: {scrapers} team scrapers for {scrape_s} s while the operator scrapes");
    let s = scrapes(scrapers, scrape_s).await;

    println!();
    println!(
        "Issue 40's probe on the release build ({:.0} s in all); the 'before' column is what issue 40 reported from the build before its fixes, not measured again",
        whole.elapsed().as_secs_f64()
    );
    println!();
    println!("| probe | before (reported in issue 40, not remeasured) | now (measured) |");
    println!("|---|---|---|");
    println!(
        "| N1: loopback connections held, each refused once (no valid token) | 255 | {} (opened and refused in {:.1} s; {} of them closed to make room) |",
        c.held, c.hold_s, c.evicted
    );
    println!(
        "| N1: `gpufleet-agent fleet` runs with the admin token that succeed while they are held | 0 of 147 CLI and gRPC connections, for 45 s | {} of {} ({:.0}%; p50 {:.0} ms, max {:.0} ms) |",
        c.cli_ok,
        c.cli_calls,
        percent(c.cli_ok, c.cli_calls),
        c.cli_p50_ms,
        c.cli_max_ms
    );
    println!(
        "| N1: a gRPC call with a valid token on a fresh connection | failed (as above) | {} |",
        match &c.grpc {
            Ok(()) => "succeeded".to_string(),
            Err(why) => format!("failed: {why}"),
        }
    );
    println!(
        "| N2: calls without a valid token in the flood | 210,048 in ~60 s | {} in {:.1} s ({:.0}/s; {} refused UNAUTHENTICATED, {} answered otherwise) |",
        a.flood,
        a.flood_s,
        a.flood as f64 / a.flood_s,
        a.refused,
        a.other_answers
    );
    println!(
        "| N2: audit entries the flood wrote | one per call, until the 200,000-entry log held nothing else | {} ({} recorded one by one, {} counting {} more); {} dropped from the queue |",
        a.unauthenticated_entries,
        a.unauthenticated_entries - a.counting_entries,
        a.counting_entries,
        a.counted_in_entries,
        a.dropped
    );
    println!(
        "| N2: the team's entries kept after the flood | 1 of 136 | {} of {} (its first two {}) |",
        a.team_kept,
        a.team_written,
        if a.oldest_team_entry_kept {
            "kept"
        } else {
            "gone"
        }
    );
    println!(
        "| N2: the admin's first entry (CreateTenant) kept | no: the admin's log started at entry 15 | {} ({} entries in the log) |",
        if a.admin_first_kept { "yes" } else { "no" },
        a.total_entries
    );
    println!(
        "| N2: `gpufleet-agent audit --verify` after the flood | no such check (no hash chain before 16ecb3a) | {} |",
        match &a.verify {
            Ok(line) => format!("passes: {line}"),
            Err(why) => format!("fails: {why}"),
        }
    );
    println!(
        "| N5: the operator's scrapes answered 200 during one team's scrape flood | 39% (61% answered 503) | {} of {} ({:.1}%; p50 {:.1} ms, max {:.0} ms) |",
        s.operator_ok,
        s.operator_all,
        percent(s.operator_ok, s.operator_all),
        s.operator_p50_ms,
        s.operator_max_ms
    );
    println!(
        "| N5: the team's scrapes ({} scrapers back to back for {} s) | not reported | {} answered 200, {} answered 503 ({:.0}%), {} otherwise |",
        s.scrapers,
        s.seconds,
        s.team_ok,
        s.team_busy,
        percent(s.team_busy, s.team_all),
        s.team_all - s.team_ok - s.team_busy
    );
    // A machine-readable line, as the other benches print.
    println!(
        "\nBENCH probe held={} cli_ok={} cli_calls={} grpc_ok={} flood={} flood_s={:.1} flood_entries={} team_kept={} team_written={} verify_ok={} operator_ok={} operator_all={}",
        c.held,
        c.cli_ok,
        c.cli_calls,
        c.grpc.is_ok(),
        a.flood,
        a.flood_s,
        a.unauthenticated_entries,
        a.team_kept,
        a.team_written,
        a.verify.is_ok(),
        s.operator_ok,
        s.operator_all,
    );
}
