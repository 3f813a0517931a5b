//! `gpufleet-agent migrate` (issue 41): a store that a real `serve` wrote through its API
//! (teams, quotas, a reservation, clusters on nodes, a deleted one, events, the audit log,
//! usage) is copied into a real PostgreSQL server, whole; refused while serve runs, into a
//! database that already holds a store, and from a `--database-file` others can read; the
//! database's password is in none of its messages; and `check --postgres` finds the copy
//! as sound as `check` finds the SQLite file.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use common::*;
use gpufleet_sql::test_server::TestServer;

fn migrate(data: &Path, url: Option<&str>, extra: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpufleet-agent"));
    cmd.arg("migrate").arg("--data-dir").arg(data).args(extra);
    cmd.env_remove("GPUFLEET_DATABASE_URL");
    if let Some(url) = url {
        cmd.env("GPUFLEET_DATABASE_URL", url);
    }
    cmd.output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Rows per table of the store on SQLite (the same tables PostgreSQL has).
fn sqlite_counts(data: &Path, tables: &[String]) -> Vec<(String, i64)> {
    let conn = rusqlite::Connection::open(data.join("state.db")).unwrap();
    tables
        .iter()
        .map(|t| {
            let n = conn
                .query_row(&format!("SELECT COUNT(*) FROM \"{t}\""), [], |r| r.get(0))
                .unwrap();
            (t.clone(), n)
        })
        .collect()
}

// Synchronous: the postgres client runs its own runtime; the API calls get theirs below.
#[test]
fn a_store_serve_wrote_is_copied_whole_into_postgres() {
    let pg = TestServer::start().unwrap_or_else(|e| panic!("{e}"));
    let url = pg.database("gpufleet").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let agent = Agent::start(&data);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut admin = agent.admin().await;
        let (a, _) = admin.tenant("team-a").await;
        let (b, _) = admin.tenant("team-b").await;
        admin.quota(&a.id, "H100-80GB", 16, 8).await;
        admin.quota(&b.id, "A100-80GB", 8, 0).await;
        let start = now() + 3600;
        admin
            .create_reservation_from(Clients::reservation(
                &a.id,
                "H100-80GB",
                1,
                start,
                start + 7200,
            ))
            .await;
        let kept = admin
            .create_cluster(Clients::cluster(&a.id, "train", "H100-80GB", 1))
            .await;
        let gone = admin
            .create_cluster(Clients::cluster(&b.id, "infer", "A100-80GB", 1))
            .await;
        admin.delete_cluster(&gone.id).await;
        assert_eq!(admin.get_cluster(&kept.id).await.name, "train");

        // While serve runs, its store is not copied.
        let refused = migrate(&data, Some(&url), &[]);
        assert!(!refused.status.success());
        assert!(
            text(&refused).contains("stop serve before migrating its store"),
            "{}",
            text(&refused)
        );
    });
    agent.stop();

    // A --database-file others can read is refused, naming the fix.
    let file = dir.path().join("database.url");
    std::fs::write(&file, &url).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let open = migrate(&data, None, &["--database-file", file.to_str().unwrap()]);
    assert!(!open.status.success());
    assert!(text(&open).contains("chmod 600"), "{}", text(&open));
    // A wrong password: refused, and the password is in no message.
    let wrong = url.replacen("@127.0.0.1", "x@127.0.0.1", 1);
    let denied = migrate(&data, Some(&wrong), &[]);
    assert!(!denied.status.success());
    let password = wrong.split(':').nth(2).unwrap().split('@').next().unwrap();
    assert!(
        text(&denied).contains("password authentication failed")
            && !text(&denied).contains(password),
        "{}",
        text(&denied)
    );
    // Without any address: says how to give one.
    let none = migrate(&data, None, &[]);
    assert!(
        text(&none).contains("GPUFLEET_DATABASE_URL"),
        "{}",
        text(&none)
    );

    // The copy, from the file made private.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let done = migrate(&data, None, &["--database-file", file.to_str().unwrap()]);
    assert!(done.status.success(), "{}", text(&done));
    let out = text(&done);
    assert!(
        out.contains("the counters agree") && !out.contains(url.split('@').next().unwrap()),
        "{out}"
    );

    // Every table holds on PostgreSQL what it holds on SQLite.
    let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let tables: Vec<String> = client
        .query(
            "SELECT table_name::text FROM information_schema.tables
             WHERE table_schema = 'public' AND table_name <> 'schema_version' ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let on_sqlite = sqlite_counts(&data, &tables);
    let on_postgres: Vec<(String, i64)> = tables
        .iter()
        .map(|t| {
            let n: i64 = client
                .query_one(&format!("SELECT COUNT(*) FROM \"{t}\""), &[])
                .unwrap()
                .get(0);
            (t.clone(), n)
        })
        .collect();
    assert_eq!(on_postgres, on_sqlite);
    let nonempty = on_sqlite.iter().filter(|(_, n)| *n > 0).count();
    eprintln!("{out}\n{nonempty} of {} tables hold rows", tables.len());
    // What serve wrote is there: the teams, the kept cluster on its node, the deleted
    // one's events, the audit log.
    let clusters: Vec<(String, String)> = client
        .query(
            "SELECT c.name, n.hostname FROM clusters c JOIN nodes n ON n.cluster_id = c.id ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(clusters.len(), 1, "{clusters:?}");
    assert_eq!(clusters[0].0, "train");
    for table in [
        "tenants",
        "quotas",
        "reservations",
        "events",
        "audit_log",
        "usage_intervals",
        "nodes",
        "gpus",
    ] {
        let n = on_sqlite.iter().find(|(t, _)| t == table).unwrap().1;
        assert!(n > 0, "serve wrote no {table}");
    }

    // The invariants hold on the copy as on the original.
    let check = |extra: &[&str], url: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpufleet-agent"));
        cmd.arg("check").arg("--data-dir").arg(&data).args(extra);
        cmd.env_remove("GPUFLEET_DATABASE_URL");
        if let Some(url) = url {
            cmd.env("GPUFLEET_DATABASE_URL", url);
        }
        cmd.output().unwrap()
    };
    let on_sqlite = check(&[], None);
    let on_postgres = check(&["--postgres"], Some(&url));
    assert!(on_sqlite.status.success(), "{}", text(&on_sqlite));
    assert!(on_postgres.status.success(), "{}", text(&on_postgres));
    assert!(
        text(&on_postgres).contains("postgres://gpufleet:***@")
            && text(&on_postgres).contains("no violation (capacity, quota, membership, sequences)"),
        "{}",
        text(&on_postgres)
    );

    // A second copy into the same database is refused.
    let again = migrate(&data, Some(&url), &[]);
    assert!(!again.status.success());
    assert!(
        text(&again).contains("already holds a store"),
        "{}",
        text(&again)
    );
}
