//! The audit log against callers who want to hide or forge what happened:
//! - a refused call naming an object with a newline and terminal escapes is recorded, and
//!   shown by `gpufleet-agent audit`, on one line with those characters escaped;
//! - entries queued just before a clean stop are in the log after the restart;
//! - a flood of calls without a valid token is sampled and counted: the first of each peer
//!   and minute are recorded, one entry counts the rest, and a team's entries all stay;
//! - the admin's changes to a team's objects and the refusals of the team's expired token
//!   are in the team's own view; `audit --verify` finds the log whole, names an entry
//!   edited in the SQLite file and the gap a deleted one leaves, and still finds it whole
//!   after serve pruned it to the `--audit-keep-*` bounds.

mod common;

use std::time::{Duration, Instant};

use common::*;
use gpufleet_proto::v1::*;
use tonic::Code;

/// The longest any wait on a condition here may take before the test fails.
const BOUND: Duration = Duration::from_secs(30);

/// Every audit entry the admin may read, once `done` holds for them (a background task
/// writes them: wait on the condition, bounded).
async fn audit_until(admin: &mut Clients, done: impl Fn(&[AuditEntry]) -> bool) -> Vec<AuditEntry> {
    let deadline = Instant::now() + BOUND;
    loop {
        let mut entries = Vec::new();
        let mut page_token = String::new();
        loop {
            let page = admin
                .access
                .list_audit_entries(ListAuditEntriesRequest {
                    page_token,
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            entries.extend(page.entries);
            if page.next_page_token.is_empty() {
                break;
            }
            page_token = page.next_page_token;
        }
        if done(&entries) {
            return entries;
        }
        assert!(
            Instant::now() < deadline,
            "audit log never held what was expected: {entries:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn cli(agent: &Agent, token: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpufleet-agent"))
        .args(args)
        .env("GPUFLEET_ENDPOINT", &agent.endpoint)
        .env("GPUFLEET_TOKEN", token)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "gpufleet-agent {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test]
async fn a_newline_or_escape_in_a_refused_calls_id_cannot_forge_a_line_of_the_audit_log() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(&dir.path().join("data"));
    let mut admin = agent.admin().await;
    let (_team, token) = admin.tenant("team-a").await;
    let forged = "x\n15  2026-12-06T01:00:00Z  -  admin  TenantService/DeleteTenant  alpha  OK\u{1b}[2J\u{202e}";
    for caller in ["gft_not-a-token", token.as_str()] {
        let mut c = agent.clients(caller).await;
        let refused = c
            .tenants
            .delete_tenant(DeleteTenantRequest {
                id: forged.into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert!(
            matches!(
                refused.code(),
                Code::Unauthenticated | Code::PermissionDenied
            ),
            "{refused:?}"
        );
    }

    let entries = audit_until(&mut admin, |e| {
        e.iter()
            .filter(|e| e.method.ends_with("/DeleteTenant"))
            .count()
            == 2
    })
    .await;
    for e in entries
        .iter()
        .filter(|e| e.method.ends_with("/DeleteTenant"))
    {
        assert!(e.object.starts_with("x\\u{a}15  "), "{e:?}");
        assert!(
            !format!("{}{}", e.object, e.message).contains(|c: char| c.is_control()),
            "{e:?}"
        );
        assert!(e.object.contains("\\u{1b}[2J\\u{202e}"), "{e:?}");
    }

    // The CLI's table: one line per entry under the header, no escape byte.
    let table = cli(&agent, ADMIN, &["audit"]);
    assert_eq!(table.lines().count(), 1 + entries.len(), "{table}");
    assert!(!table.contains('\u{1b}'), "{table}");
    let forged_rows: Vec<&str> = table
        .lines()
        .filter(|l| l.contains("DeleteTenant"))
        .collect();
    assert_eq!(forged_rows.len(), 2, "{table}");
    assert!(
        forged_rows
            .iter()
            .all(|l| l.contains("UNAUTHENTICATED") || l.contains("PERMISSION_DENIED")),
        "{table}"
    );
}

#[tokio::test]
async fn entries_queued_just_before_a_clean_stop_are_in_the_log_after_the_restart() {
    const REFUSED: usize = 200;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let agent = Agent::start(&data);
    let mut admin = agent.admin().await;
    let (_team, token) = admin.tenant("team-a").await;
    let mut team = agent.clients(&token).await;
    // Each answer comes after its entry is queued; the stop follows the last at once.
    for i in 0..REFUSED {
        team.tenants
            .delete_tenant(DeleteTenantRequest {
                id: format!("not-mine-{i}"),
                ..Default::default()
            })
            .await
            .unwrap_err();
    }
    // The team's connection stays open across the stop: its copy of the audit layer once
    // kept the writer waiting out the grace period, and what was queued was lost.
    drop(admin);
    let stopping = Instant::now();
    assert!(agent
        .signal_and_wait(libc::SIGTERM, Duration::from_secs(60))
        .success());
    eprintln!("serve stopped {:?} after SIGTERM", stopping.elapsed());
    drop(team);
    let log = std::fs::read_to_string(data.with_extension("log")).unwrap();
    assert!(!log.contains("are lost"), "{log}");

    let agent = Agent::start(&data);
    let mut admin = agent.admin().await;
    let entries = audit_until(&mut admin, |_| true).await;
    let refused: Vec<&str> = entries
        .iter()
        .filter(|e| e.method.ends_with("/DeleteTenant"))
        .map(|e| e.object.as_str())
        .collect();
    let expected: Vec<String> = (0..REFUSED).map(|i| format!("not-mine-{i}")).collect();
    assert_eq!(refused, expected);
}

#[tokio::test]
async fn a_flood_of_calls_without_a_token_is_sampled_and_counted_and_a_teams_entries_stay() {
    const FLOOD: usize = 300;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let agent = Agent::start(&data);
    let mut admin = agent.admin().await;
    let (_team, token) = admin.tenant("team-a").await;
    let mut team = agent.clients(&token).await;
    for i in 0..5 {
        team.tenants
            .delete_tenant(DeleteTenantRequest {
                id: format!("before-{i}"),
                ..Default::default()
            })
            .await
            .unwrap_err();
    }
    let mut stranger = agent.clients("gft_not-a-token").await;
    for i in 0..FLOOD {
        let refused = stranger
            .tenants
            .delete_tenant(DeleteTenantRequest {
                id: format!("flood-{i}"),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::Unauthenticated);
    }
    drop((admin, team, stranger));
    // The minute's count is written at the latest when serve stops.
    assert!(agent
        .signal_and_wait(libc::SIGTERM, Duration::from_secs(60))
        .success());
    let agent = Agent::start(&data);
    let mut admin = agent.admin().await;
    let entries = audit_until(&mut admin, |_| true).await;
    let unidentified: Vec<&AuditEntry> =
        entries.iter().filter(|e| e.token_name.is_empty()).collect();
    let sampled = unidentified.iter().filter(|e| e.method != "*").count();
    assert_eq!(sampled, 10, "{unidentified:#?}");
    let counted: Vec<&&AuditEntry> = unidentified.iter().filter(|e| e.method == "*").collect();
    assert_eq!(counted.len(), 1, "{unidentified:#?}");
    assert_eq!(counted[0].object, "127.0.0.1");
    assert!(
        counted[0].message.starts_with(&format!(
            "{} more calls without a valid token from 127.0.0.1",
            FLOOD - 10
        )),
        "{:?}",
        counted[0]
    );
    let teams: Vec<&str> = entries
        .iter()
        .filter(|e| e.token_name == "default")
        .map(|e| e.object.as_str())
        .collect();
    assert_eq!(
        teams,
        (0..5).map(|i| format!("before-{i}")).collect::<Vec<_>>()
    );
}

fn ts(unix: i64) -> Option<prost_types::Timestamp> {
    Some(prost_types::Timestamp {
        seconds: unix,
        nanos: 0,
    })
}

/// `gpufleet-agent audit --verify` on the data dir: success, and its stdout or stderr.
fn verify(data: &std::path::Path) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpufleet-agent"))
        .args(["audit", "--verify", "--data-dir"])
        .arg(data)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(if out.status.success() {
        &out.stdout
    } else {
        &out.stderr
    })
    .into_owned();
    (out.status.success(), text)
}

fn sql(data: &std::path::Path, statement: &str) -> usize {
    let conn = rusqlite::Connection::open(data.join("state.db")).unwrap();
    conn.execute(statement, []).unwrap()
}

#[tokio::test]
async fn the_admins_changes_are_in_the_teams_view_and_verify_names_an_edited_or_deleted_entry() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let clock = dir.path().join("clock");
    let t0 = now();
    std::fs::write(&clock, t0.to_string()).unwrap();
    let clock_flag = ["--clock-file", clock.to_str().unwrap()];
    let agent = Agent::start_with(
        &data,
        &[&["--admin-token", ADMIN][..], &clock_flag].concat(),
    );
    let mut admin = agent.admin().await;
    let (team, token) = admin.tenant("team-a").await;
    // The admin's changes to the team's objects: a quota and a token that expires.
    admin.quota(&team.id, "H100-80GB", 8, 0).await;
    let expiring = admin
        .access
        .create_token(CreateTokenRequest {
            tenant_id: team.id.clone(),
            name: "ci".into(),
            scope: "write".into(),
            expires_at: ts(t0 + 60),
            request_id: "ci-1".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .secret;
    let mut own = agent.clients(&token).await;
    own.tenants
        .delete_tenant(DeleteTenantRequest {
            id: "not-mine".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    std::fs::write(&clock, (t0 + 120).to_string()).unwrap();
    let expired = agent
        .clients(&expiring)
        .await
        .tenants
        .delete_tenant(DeleteTenantRequest {
            id: "gone".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(expired.message().contains("expired at"), "{expired:?}");
    audit_until(&mut admin, |e| e.iter().any(|e| e.object == "gone")).await;

    // The team's own view, through the CLI with its token.
    let view = cli(&agent, &token, &["audit"]);
    let line = |method: &str| {
        view.lines()
            .find(|l| l.contains(method))
            .unwrap_or_else(|| panic!("no {method} in the team's view:\n{view}"))
            .to_string()
    };
    assert!(line("CreateGpuQuota").contains("admin (write)"), "{view}");
    assert!(line("CreateToken").contains("admin (write)"), "{view}");
    let refusal = line("gone");
    assert!(
        refusal.contains("ci (write)")
            && refusal.contains("UNAUTHENTICATED")
            && refusal.contains("expired at"),
        "{view}"
    );
    assert!(line("not-mine").contains("PERMISSION_DENIED"), "{view}");
    // The admin's own view shows each of its changes once.
    let all = cli(&agent, ADMIN, &["audit"]);
    assert_eq!(
        all.lines().filter(|l| l.contains("CreateGpuQuota")).count(),
        1,
        "{all}"
    );

    drop((admin, own));
    assert!(agent
        .signal_and_wait(libc::SIGTERM, Duration::from_secs(60))
        .success());
    let (whole, report) = verify(&data);
    assert!(whole, "{report}");
    assert!(report.starts_with("the audit log is whole: "), "{report}");
    // The chains hold the team's copies of the admin's calls beside the admin's own
    // entries; less those, they hold exactly what the admin's listing shows.
    let number_before = |word: &str| -> u64 {
        let head = report.lines().next().unwrap();
        let at = head
            .find(word)
            .unwrap_or_else(|| panic!("no '{word}' in {head}"));
        head[..at]
            .split_whitespace()
            .last()
            .and_then(|n| n.trim_start_matches('(').parse().ok())
            .unwrap_or_else(|| panic!("no number before '{word}' in {head}"))
    };
    let listed = all.lines().skip(1).filter(|l| !l.trim().is_empty()).count() as u64;
    assert_eq!(
        number_before(" entries in ") - number_before(" of them teams' copies"),
        listed,
        "{report}\n{all}"
    );

    // An entry edited in the file: verify names it, and exits 1.
    let refused_seq: i64 = rusqlite::Connection::open(data.join("state.db"))
        .unwrap()
        .query_row(
            "SELECT seq FROM audit_log WHERE object = 'not-mine'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(
        sql(
            &data,
            "UPDATE audit_log SET outcome = 'OK' WHERE object = 'not-mine'"
        ),
        1
    );
    let (whole, report) = verify(&data);
    assert!(!whole, "{report}");
    assert!(
        report.contains(&format!("the audit log is broken at entry {refused_seq}: ")),
        "{report}"
    );
    sql(
        &data,
        "UPDATE audit_log SET outcome = 'PERMISSION_DENIED' WHERE object = 'not-mine'",
    );
    assert!(
        verify(&data).0,
        "put back, the entry matches its hash again"
    );

    // The admin's entry of the quota deleted: the gap in its chain is named.
    let quota_seq: i64 = rusqlite::Connection::open(data.join("state.db"))
        .unwrap()
        .query_row(
            "SELECT seq FROM audit_log WHERE method LIKE '%CreateGpuQuota' AND tenant_id = ''",
            [],
            |r| r.get(0),
        )
        .unwrap();
    sql(
        &data,
        &format!("DELETE FROM audit_log WHERE seq = {quota_seq}"),
    );
    let (whole, report) = verify(&data);
    assert!(!whole, "{report}");
    assert!(
        report.contains("of the admin's chain are missing between entry")
            && report.contains("deleted"),
        "{report}"
    );

    // Serve prunes to its bounds (the first batch after a start prunes), and what it keeps
    // verifies: a fresh copy of the log, pruned.
    sql(&data, "DELETE FROM audit_log");
    sql(&data, "DELETE FROM audit_chains");
    let agent = Agent::start_with(
        &data,
        &[
            &["--admin-token", ADMIN, "--audit-keep-tenant-entries", "2"][..],
            &clock_flag,
        ]
        .concat(),
    );
    let mut own = agent.clients(&token).await;
    for i in 0..5 {
        own.tenants
            .delete_tenant(DeleteTenantRequest {
                id: format!("again-{i}"),
                ..Default::default()
            })
            .await
            .unwrap_err();
    }
    let mut admin = agent.admin().await;
    audit_until(&mut admin, |e| e.iter().any(|e| e.object == "again-4")).await;
    drop((admin, own));
    assert!(agent
        .signal_and_wait(libc::SIGTERM, Duration::from_secs(60))
        .success());
    // The first batch after a start prunes: one more refused call after the next start.
    let agent = Agent::start_with(
        &data,
        &[
            &["--admin-token", ADMIN, "--audit-keep-tenant-entries", "2"][..],
            &clock_flag,
        ]
        .concat(),
    );
    let mut c = agent.clients(&token).await;
    c.tenants
        .delete_tenant(DeleteTenantRequest {
            id: "again-5".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    let mut team_view = Vec::new();
    let deadline = Instant::now() + BOUND;
    while team_view
        .iter()
        .map(|e: &AuditEntry| e.object.as_str())
        .collect::<Vec<_>>()
        != ["again-4", "again-5"]
    {
        team_view = c
            .access
            .list_audit_entries(ListAuditEntriesRequest::default())
            .await
            .unwrap()
            .into_inner()
            .entries;
        assert!(
            Instant::now() < deadline,
            "never pruned to 2: {team_view:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(c);
    assert!(agent
        .signal_and_wait(libc::SIGTERM, Duration::from_secs(60))
        .success());
    let (whole, report) = verify(&data);
    assert!(whole, "{report}");
}
