//! What the commit record and the durability setting cost the group-commit writer
//! (issue 19), measured in-process on a real database file.
//!
//! Each configuration opens a fresh store as `serve` does (`store::open_checked`) and runs
//! `WRITES` small writes (one event row each, the size of a heartbeat-driven state change)
//! through `GroupCommit`, first one at a time (every write its own transaction: the worst
//! case for a per-commit cost) and then from `CLIENTS` concurrent tasks (batched as under
//! load). The baseline, in the same run, is the writer as it was before the record:
//! `synchronous=NORMAL` and no record.
//!
//! Then what the start-up check costs: a store of a size a long-running fleet reaches
//! (`STORE_RESERVATIONS` reservations, `STORE_EVENTS` events, `STORE_HEALTH` health
//! results, 1,000 nodes of 8 GPUs) is opened as `serve` opens it (`quick_check` and the
//! commit record), against the plain open of before, in the same run (page cache warm:
//! the store was just written). Prints tables; nothing is asserted.
//!
//! `cargo bench -p gpufleet-control --bench group_commit`
//! Environment: `WRITES` (default 2000), `CLIENTS` (default 8), `DIR` (where the
//! databases go; default a temp dir, so the disk under /tmp is the one measured),
//! `STORE_RESERVATIONS` (default 100000), `STORE_EVENTS` (default 1000000),
//! `STORE_HEALTH` (default 200000).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpufleet_control::group_commit::GroupCommit;
use gpufleet_control::store::{self, commit_record::OnLoss, Durability, OpenOptions};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Measured {
    per_second: f64,
    p50: Duration,
    p99: Duration,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

async fn write(writer: &GroupCommit, i: usize) -> Duration {
    let t0 = Instant::now();
    writer
        .write(move |sp| -> Result<(), gpufleet_control::error::Error> {
            sp.execute(
                "INSERT INTO events (at, object_id, tenant_id, kind, node, message)
                 VALUES (?1, ?2, 'tenant', 'bench', 'node', 'a state change of about this size')",
                gpufleet_sql::params![i as i64, format!("object-{}", i % 100)],
            )?;
            sp.commit()?;
            Ok(())
        })
        .await
        .expect("a write");
    t0.elapsed()
}

/// `writes` writes from `clients` tasks on a fresh store.
async fn measure(
    dir: &std::path::Path,
    durability: Durability,
    record: bool,
    clients: usize,
    writes: usize,
) -> Measured {
    let path = dir.join(format!("bench-{}.db", rand_suffix()));
    let options = OpenOptions {
        durability,
        on_loss: OnLoss::Refuse,
    };
    let (conn, commit_record) = store::open_checked(&path, options).expect("open the store");
    let writer = Arc::new(GroupCommit::start(
        Arc::new(Mutex::new(conn)),
        record.then_some(commit_record),
    ));
    let started = Instant::now();
    let mut tasks = Vec::new();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for _ in 0..clients {
        let (writer, next) = (writer.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut took = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= writes {
                    break took;
                }
                took.push(write(&writer, i).await);
            }
        }));
    }
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.expect("a client task"));
    }
    let wall = started.elapsed();
    latencies.sort();
    drop(writer);
    for suffix in ["", "-wal", "-shm", ".commits"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    Measured {
        per_second: writes as f64 / wall.as_secs_f64(),
        p50: percentile(&latencies, 50.0),
        p99: percentile(&latencies, 99.0),
    }
}

fn rand_suffix() -> String {
    format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

/// Fills a store at `path` with `reservations`, `events` and `health` rows and 1,000
/// nodes of 8 GPUs, as a fleet that has run a long time holds.
fn fill_store(path: &std::path::Path, reservations: usize, events: usize, health: usize) {
    let conn = store::open(path).expect("open the store to fill");
    conn.execute_batch(
        "BEGIN;
         WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 15)
         INSERT INTO tenants (id, name, display_name, labels, token_hash, created_at)
             SELECT 'tenant-' || i, 'team-' || i, 'Team ' || i, '{}', hex(randomblob(32)), 0 FROM n;
         WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 999)
         INSERT INTO nodes (id, hostname, gpu_type, capacity, gpu_count, driver_version, cuda_version)
             SELECT 'node-' || i, 'node-' || i, 'H100-80GB', 'pool', 8, '550.54.15', '12.4' FROM n;
         WITH RECURSIVE g(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM g WHERE i < 7999)
         INSERT INTO gpus (node_id, idx, uuid, model, memory_mib, mig_enabled)
             SELECT 'node-' || (i / 8), i % 8, 'GPU-' || hex(randomblob(16)), 'H100-80GB', 81559, 0 FROM g;
         COMMIT;",
    )
    .expect("seed tenants and nodes");
    conn.execute(
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < ?1 - 1)
         INSERT INTO reservations (id, tenant_id, gpu_type, node_count, start_time, end_time,
             allow_on_demand, pool_nodes, on_demand_nodes)
         SELECT lower(hex(randomblob(16))), 'tenant-' || (i % 16), 'H100-80GB', 1,
             1700000000 + i * 600, 1700000000 + i * 600 + 3600 + abs(random() % 170000), 0, 1, 0
         FROM n",
        [reservations as i64],
    )
    .expect("seed reservations");
    conn.execute(
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < ?1 - 1)
         INSERT INTO events (at, object_id, tenant_id, kind, node, message)
         SELECT 1700000000 + i, 'cluster-' || (i % 5000), 'tenant-' || (i % 16), 'partitioning',
             'node-' || (i % 1000), 'node node-' || (i % 1000) || ': applying the cluster''s MIG layout'
         FROM n",
        [events as i64],
    )
    .expect("seed events");
    conn.execute(
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < ?1 - 1)
         INSERT INTO health_results (run_id, node_id, node, cluster_id, tenant_id, level, verdict,
             summary, checks, action, finished_at)
         SELECT lower(hex(randomblob(16))), 'node-' || (i % 1000), 'node-' || (i % 1000), '', '',
             'quick', 'passed', 'all checks passed',
             '[{\"name\":\"gpu_count\",\"passed\":true},{\"name\":\"ecc\",\"passed\":true}]', 'none',
             1700000000 + i
         FROM n",
        [health as i64],
    )
    .expect("seed health results");
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .expect("checkpoint");
}

/// The median of 3 timings of `open`.
fn time_open(open: impl Fn()) -> Duration {
    let mut took: Vec<Duration> = (0..3)
        .map(|_| {
            let t0 = Instant::now();
            open();
            t0.elapsed()
        })
        .collect();
    took.sort();
    took[1]
}

fn startup_check(dir: &std::path::Path) {
    let (reservations, events, health) = (
        env_usize("STORE_RESERVATIONS", 100_000),
        env_usize("STORE_EVENTS", 1_000_000),
        env_usize("STORE_HEALTH", 200_000),
    );
    let path = dir.join(format!("startup-{}.db", rand_suffix()));
    let filling = Instant::now();
    fill_store(&path, reservations, events, health);
    eprintln!(
        "filled the store in {:.1} s",
        filling.elapsed().as_secs_f64()
    );
    let bytes = std::fs::metadata(&path).unwrap().len();
    let plain = time_open(|| drop(store::open(&path).expect("open")));
    let checked = time_open(|| {
        drop(store::open_checked(&path, OpenOptions::default()).expect("open checked"))
    });
    println!();
    println!(
        "Start-up check: a store of {reservations} reservations, {events} events, {health} health results, 1,000 nodes of 8 GPUs ({:.0} MiB); median of 3 opens, page cache warm",
        bytes as f64 / (1 << 20) as f64
    );
    println!();
    println!("| open | time | ratio |");
    println!("|---|---|---|");
    println!(
        "| plain open and migrations (baseline: before issue 19) | {:.1} ms | 1.00x |",
        ms(plain)
    );
    println!(
        "| as serve opens it: quick_check and the commit record | {:.1} ms | {:.2}x |",
        ms(checked),
        ms(checked) / ms(plain)
    );
    for suffix in ["", "-wal", "-shm", ".commits"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let writes = env_usize("WRITES", 2000);
    let clients = env_usize("CLIENTS", 8).max(1);
    let temp = tempfile::tempdir().unwrap();
    let dir = std::env::var_os("DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| temp.path().to_path_buf());
    let configs = [
        (
            "NORMAL, no record (baseline: before issue 19)",
            Durability::Normal,
            false,
        ),
        ("NORMAL, commit record", Durability::Normal, true),
        ("FULL, no record", Durability::Full, false),
        ("FULL, commit record", Durability::Full, true),
    ];
    let mut rows = Vec::new();
    for (name, durability, record) in configs {
        // Alternating the order per repetition would be fairer; three repetitions and
        // the median are enough to see the steps between these four.
        let mut one = Vec::new();
        let mut many = Vec::new();
        for _ in 0..3 {
            one.push(measure(&dir, durability, record, 1, writes / 4).await);
            many.push(measure(&dir, durability, record, clients, writes).await);
        }
        let median = |mut v: Vec<Measured>| {
            v.sort_by(|a, b| a.per_second.total_cmp(&b.per_second));
            v.swap_remove(1)
        };
        rows.push((name, median(one), median(many)));
    }
    println!();
    println!(
        "Group commit: small writes (one event row each) through the writer on a database file under {}; one client ({} writes, each its own commit) and {clients} clients ({writes} writes, batched); medians of 3",
        dir.display(),
        writes / 4
    );
    println!();
    println!("| writer | 1 client: writes/s | p50 | p99 | {clients} clients: writes/s | p50 | p99 | ratio to baseline ({clients} clients, writes/s) |");
    println!("|---|---|---|---|---|---|---|---|");
    let base = rows[0].2.per_second;
    for (name, one, many) in &rows {
        println!(
            "| {name} | {:.0} | {:.2} ms | {:.2} ms | {:.0} | {:.2} ms | {:.2} ms | {:.2}x |",
            one.per_second,
            ms(one.p50),
            ms(one.p99),
            many.per_second,
            ms(many.p50),
            ms(many.p99),
            many.per_second / base
        );
    }
    startup_check(&dir);
}
