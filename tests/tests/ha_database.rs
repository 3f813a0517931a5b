//! The control plane's database, highly available (issue 41): a three-member Patroni cluster
//! of PostgreSQL with synchronous replication on namespace hosts, reached from a fourth host
//! by a multi-host URL (`target_session_attrs=read-write`). A client writes rows in a loop;
//! the primary is killed (SIGKILL to Patroni and PostgreSQL, as a crash); the test holds
//! that a new primary is elected in bounded time and takes the writes, that every row whose
//! commit was acknowledged is on it, and that the killed member, started again, rejoins as
//! a replica with every row.
//!
//! Needs root with namespaces and Debian's postgresql and patroni (scripts/bootstrap.sh), as
//! CI runs; without them the test fails saying so. The failover time is printed, not held to.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use gpufleet_e2e::netns::{self, Network};
use gpufleet_e2e::patroni::{run_psql, PatroniCluster};

const MEMBERS: [&str; 3] = ["pg1", "pg2", "pg3"];
const CLIENT: &str = "client";

/// Rows acknowledged before the kill, so that the primary dies with a history behind it.
const ROWS_BEFORE: usize = 20;
/// Rows acknowledged by the new primary before the client stops.
const ROWS_AFTER: usize = 10;
/// A new primary within a leader key's life (10 s) and a few of Patroni's loops.
const ELECTION_LIMIT: Duration = Duration::from_secs(45);
/// The writer's progress, each stage.
const WRITE_LIMIT: Duration = Duration::from_secs(45);
/// The killed member back as a replica (pg_rewind or a new base backup).
const REJOIN_LIMIT: Duration = Duration::from_secs(60);
/// How often the test looks again, and the writer's pace after a failed write.
const POLL: Duration = Duration::from_millis(50);

/// One INSERT the client tried: `acked` when psql said its commit went through.
struct Write {
    id: u64,
    acked: bool,
    started: Instant,
    finished: Instant,
}

#[test]
fn a_killed_primary_loses_no_acknowledged_write_and_rejoins_as_a_replica() {
    netns::require("the highly available database test");
    let began = Instant::now();
    let mut hosts = MEMBERS.to_vec();
    hosts.push(CLIENT);
    let net = Network::new(&hosts);
    let client = net.host(CLIENT);

    let mut cluster = PatroniCluster::start(&net, &MEMBERS);
    eprintln!(
        "cluster of {:?} up in {:?}",
        cluster.members(),
        began.elapsed()
    );
    let url = cluster.url("postgres");
    cluster
        .psql(client, &url, "CREATE TABLE acked (id bigint PRIMARY KEY)")
        .unwrap_or_else(|e| panic!("CREATE TABLE through {url}: {e}"));

    let writes = Arc::new(Mutex::new(Vec::<Write>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (writes, stop) = (writes.clone(), stop.clone());
        let (launcher, psql, url) = (client.launcher(), cluster.psql_path(), url.clone());
        thread::spawn(move || {
            let mut id = 0;
            while !stop.load(Ordering::Relaxed) {
                id += 1;
                let sql = format!("INSERT INTO acked (id) VALUES ({id})");
                let started = Instant::now();
                let acked = run_psql(&launcher, &psql, &url, &sql).is_ok();
                let finished = Instant::now();
                writes.lock().unwrap().push(Write {
                    id,
                    acked,
                    started,
                    finished,
                });
                if !acked {
                    thread::sleep(POLL);
                }
            }
        })
    };
    // Writes the client began after `since`, acknowledged.
    let acked_since = |since: Instant| {
        writes
            .lock()
            .unwrap()
            .iter()
            .filter(|w| w.acked && w.started > since)
            .count()
    };
    wait_for("rows written before the kill", WRITE_LIMIT, || {
        acked_since(began) >= ROWS_BEFORE
    });

    // Commits wait for a standby: the primary names one, and Patroni promotes that one.
    let sync = cluster
        .sync_standby()
        .expect("a synchronous standby before the kill");
    let standby_names = cluster
        .psql(client, &url, "SHOW synchronous_standby_names")
        .unwrap_or_else(|e| panic!("SHOW synchronous_standby_names: {e}"));
    assert!(
        standby_names.contains(&sync),
        "synchronous_standby_names is {standby_names:?}, not naming the sync standby {sync}"
    );

    let killed_at = Instant::now();
    let old = cluster.kill_primary();
    // A write begun before the old primary's processes were all gone may have been its.
    let dead_at = Instant::now();
    let new = cluster.wait_for_primary_other_than(&old, ELECTION_LIMIT);
    let elected_in = killed_at.elapsed();
    assert_eq!(new, sync, "the new primary is not the synchronous standby");
    wait_for("a write the new primary takes", WRITE_LIMIT, || {
        acked_since(dead_at) >= 1
    });
    let first_write_after = writes
        .lock()
        .unwrap()
        .iter()
        .find(|w| w.acked && w.started > dead_at)
        .map(|w| w.finished - killed_at)
        .expect("an acknowledged write after the kill");
    wait_for("rows written after the failover", WRITE_LIMIT, || {
        acked_since(dead_at) >= ROWS_AFTER
    });
    stop.store(true, Ordering::Relaxed);
    writer.join().expect("the writer thread");
    eprintln!(
        "killed primary {old}: {new} primary after {elected_in:?}; first write acknowledged \
         {first_write_after:?} after the kill"
    );

    let (acked_ids, unknown): (BTreeSet<u64>, usize) = {
        let writes = writes.lock().unwrap();
        let acked = writes.iter().filter(|w| w.acked).map(|w| w.id).collect();
        (acked, writes.iter().filter(|w| !w.acked).count())
    };
    eprintln!(
        "{} writes acknowledged, {unknown} failed or unknown",
        acked_ids.len()
    );
    let on_new = ids_on(&cluster, client, &cluster.member_url(&new, "postgres"))
        .unwrap_or_else(|e| panic!("reading the rows on {new}: {e}"));
    let lost: Vec<&u64> = acked_ids.difference(&on_new).collect();
    assert!(
        lost.is_empty(),
        "acknowledged rows missing on the new primary {new}: {lost:?}"
    );

    cluster.restart(&old);
    cluster.wait_for_replica(&old, REJOIN_LIMIT);
    let old_url = cluster.member_url(&old, "postgres");
    // The member may restart PostgreSQL once more as it rejoins (after pg_rewind): errors
    // until then are waited out, the last one shown on a timeout.
    wait_until(
        "every acknowledged row on the rejoined member",
        REJOIN_LIMIT,
        || {
            let ids = ids_on(&cluster, client, &old_url)?;
            match acked_ids.difference(&ids).count() {
                0 => Ok(()),
                missing => Err(format!("{missing} of them missing")),
            }
        },
    );
    assert_eq!(
        cluster.primary().as_deref(),
        Some(new.as_str()),
        "the rejoined {old} took the primary back"
    );
    eprintln!(
        "{old} rejoined as a replica; test took {:?}",
        began.elapsed()
    );
}

/// The ids in table `acked` at `url`, read from `client`, or psql's error.
fn ids_on(
    cluster: &PatroniCluster,
    client: &netns::Host,
    url: &str,
) -> Result<BTreeSet<u64>, String> {
    let out = cluster.psql(client, url, "SELECT id FROM acked")?;
    Ok(out
        .lines()
        .map(|l| l.parse().unwrap_or_else(|e| panic!("id {l:?}: {e}")))
        .collect())
}

fn wait_for(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    wait_until(what, within, || {
        done().then_some(()).ok_or_else(|| "not yet".to_string())
    });
}

/// Polls `probe` until it is Ok; past `within` fails saying `what` and its last error.
fn wait_until(what: &str, within: Duration, mut probe: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + within;
    loop {
        let why = match probe() {
            Ok(()) => return,
            Err(why) => why,
        };
        assert!(
            Instant::now() < deadline,
            "still waiting for {what} after {within:?} (last: {why})"
        );
        thread::sleep(POLL);
    }
}
