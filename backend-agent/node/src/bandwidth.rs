//! Network bandwidth between node agents: each agent listens for test streams
//! (`--bandwidth-listen`, reported as `RegisterNode.bandwidth_addr`), and a
//! `RunHealthCheck` order with a `BandwidthTest` sends real data over TCP to each peer for
//! the test's duration and reports the throughput the peer acknowledged.
//!
//! One stream, on the wire (integers big-endian):
//! 1. sender: `b"GFBW"`, version `1`, token length (u8), token, duration in ms (u32);
//! 2. receiver: one status byte: 0 accepted, 1 unknown token (its own order for the
//!    test has not arrived: the sender retries for a while), 2 busy, 3 bad request;
//! 3. sender: data for the duration, then it closes its write side;
//! 4. receiver: the number of bytes it read (u64), then it closes.
//!
//! Throughput is the acknowledged bytes over the time from the first byte to the
//! acknowledgement, in Gbit/s. A listener accepts only tokens of tests it has an order
//! for ([`Listener::arm`]); reads are bounded and time out. The simulated slow-network
//! fault paces this node's sender and receiver to N Mbit/s.
//!
//! Blocking (std threads and sockets): the executor runs on a blocking thread.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpufleet_proto::v1::{BandwidthTest, CheckResult};

use super::health::checks::{result, FAIL, PASS};

const MAGIC: &[u8; 4] = b"GFBW";
const VERSION: u8 = 1;
const ACCEPTED: u8 = 0;
const UNKNOWN_TOKEN: u8 = 1;
const BUSY: u8 = 2;
const BAD_REQUEST: u8 = 3;

/// Bounds on what the wire may carry.
pub const MIN_TOKEN: usize = 16;
pub const MAX_TOKEN: usize = 128;
pub const MAX_DURATION_MS: u32 = 60_000;
pub const MAX_PEERS: usize = 64;
pub const MAX_MIN_GBPS: f64 = 1_000_000.0;
/// Streams a listener serves at once.
const MAX_STREAMS: usize = 32;
/// Idle limit of every read and write.
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a receiver reads past the announced duration (a throttled receiver drains
/// the sender's socket buffers slowly) before it gives up on the stream.
const RECEIVE_GRACE: Duration = Duration::from_secs(60);
/// How long a sender waits for the acknowledgement after its last byte.
const ACK_WAIT: Duration = Duration::from_secs(90);
/// How long a sender retries a peer that does not know the token yet (its order is late).
pub const WAIT_ARMED: Duration = Duration::from_secs(30);
const CHUNK: usize = 256 * 1024;

/// The all-reduce bus bandwidth equivalent of an algorithm bandwidth over `n` ranks
/// (nccl-tests: busbw = algbw x 2(n-1)/n); 0 for fewer than two ranks.
pub fn bus_bandwidth_gbps(algbw_gbps: f64, n: u32) -> f64 {
    if n < 2 {
        return 0.0;
    }
    algbw_gbps * 2.0 * f64::from(n - 1) / f64::from(n)
}

/// The slow-network limit (Mbit/s) of this node's streams now, if any.
pub type Throttle = Arc<dyn Fn() -> Option<u64> + Send + Sync>;

/// No limit (real hosts).
pub fn unthrottled() -> Throttle {
    Arc::new(|| None)
}

/// Paces a stream to a rate: after `n` bytes it sleeps until those bytes are due.
struct Pacer {
    bytes_per_sec: f64,
    start: Instant,
    done: u64,
}

impl Pacer {
    fn new(mbps: Option<u64>) -> Option<Self> {
        mbps.map(|m| Pacer {
            bytes_per_sec: m.max(1) as f64 * 1e6 / 8.0,
            start: Instant::now(),
            done: 0,
        })
    }

    /// Chunks small enough that the rate holds within ~20 ms.
    fn chunk(p: &Option<Self>) -> usize {
        match p {
            Some(p) => ((p.bytes_per_sec / 50.0) as usize).clamp(1024, CHUNK),
            None => CHUNK,
        }
    }

    fn pace(p: &mut Option<Self>, n: usize) {
        if let Some(p) = p {
            p.done += n as u64;
            let due = Duration::from_secs_f64(p.done as f64 / p.bytes_per_sec);
            let elapsed = p.start.elapsed();
            if due > elapsed {
                std::thread::sleep(due - elapsed);
            }
        }
    }
}

struct Shared {
    /// Tokens this node has an order for, until when.
    tokens: Mutex<HashMap<String, Instant>>,
    throttle: Throttle,
    streams: AtomicUsize,
    stop: AtomicBool,
}

/// A running bandwidth listener; stops when dropped.
pub struct Listener {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("addr", &self.addr)
            .finish()
    }
}

impl Listener {
    /// Binds `addr` (port 0 picks one) and serves test streams on std threads.
    pub fn start(addr: SocketAddr, throttle: Throttle) -> std::io::Result<Arc<Self>> {
        let socket = TcpListener::bind(addr)?;
        let addr = socket.local_addr()?;
        let shared = Arc::new(Shared {
            tokens: Mutex::new(HashMap::new()),
            throttle,
            streams: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
        });
        let accept = shared.clone();
        std::thread::Builder::new()
            .name("bandwidth-listener".into())
            .spawn(move || accept_loop(socket, accept))?;
        Ok(Arc::new(Self { addr, shared }))
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Accepts streams carrying `token` for `ttl` from now.
    pub fn arm(&self, token: &str, ttl: Duration) {
        let now = Instant::now();
        let mut tokens = self.shared.tokens.lock().unwrap_or_else(|p| p.into_inner());
        tokens.retain(|_, until| *until > now);
        let until = now + ttl;
        let e = tokens.entry(token.to_string()).or_insert(until);
        *e = (*e).max(until);
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
    }
}

fn accept_loop(socket: TcpListener, shared: Arc<Shared>) {
    for stream in socket.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(mut stream) = stream else {
            // Out of descriptors or similar: do not spin.
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        if shared.streams.fetch_add(1, Ordering::SeqCst) >= MAX_STREAMS {
            shared.streams.fetch_sub(1, Ordering::SeqCst);
            let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
            let _ = stream.write_all(&[BUSY]);
            continue;
        }
        let s = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("bandwidth-stream".into())
            .spawn(move || {
                if let Err(e) = receive(stream, &s) {
                    tracing::debug!(error = %e, "bandwidth stream ended early");
                }
                s.streams.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            shared.streams.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Serves one stream: header, token, data counted until the sender closes, count back.
fn receive(mut stream: TcpStream, shared: &Shared) -> std::io::Result<()> {
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut head = [0u8; 6];
    stream.read_exact(&mut head)?;
    let token_len = head[5] as usize;
    if &head[..4] != MAGIC || head[4] != VERSION || !(MIN_TOKEN..=MAX_TOKEN).contains(&token_len) {
        return stream.write_all(&[BAD_REQUEST]);
    }
    let mut token = vec![0u8; token_len];
    stream.read_exact(&mut token)?;
    let mut duration = [0u8; 4];
    stream.read_exact(&mut duration)?;
    let duration_ms = u32::from_be_bytes(duration);
    if duration_ms == 0 || duration_ms > MAX_DURATION_MS {
        return stream.write_all(&[BAD_REQUEST]);
    }
    let armed = {
        let tokens = shared.tokens.lock().unwrap_or_else(|p| p.into_inner());
        std::str::from_utf8(&token)
            .ok()
            .and_then(|t| tokens.get(t))
            .is_some_and(|until| *until > Instant::now())
    };
    if !armed {
        return stream.write_all(&[UNKNOWN_TOKEN]);
    }
    stream.write_all(&[ACCEPTED])?;
    let deadline = Instant::now() + Duration::from_millis(u64::from(duration_ms)) + RECEIVE_GRACE;
    let mut pacer = Pacer::new((shared.throttle)());
    let mut buf = vec![0u8; Pacer::chunk(&pacer)];
    let mut count: u64 = 0;
    loop {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        count = count.saturating_add(n as u64);
        if Instant::now() > deadline {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the sender did not stop after the test's duration",
            ));
        }
        Pacer::pace(&mut pacer, n);
    }
    stream.write_all(&count.to_be_bytes())?;
    stream.flush()
}

/// One measured stream.
#[derive(Debug, Clone, Copy)]
pub struct Measured {
    /// Bytes the receiver acknowledged.
    pub bytes: u64,
    /// From the first byte sent to the acknowledgement.
    pub elapsed: Duration,
}

impl Measured {
    pub fn gbps(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs <= 0.0 {
            return 0.0;
        }
        self.bytes as f64 * 8.0 / secs / 1e9
    }
}

/// Data that is not all zeros (no layer may shortcut it).
fn payload(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Sends to `addr` for `duration` and returns what the receiver acknowledged. A peer
/// that does not know the token yet is retried for `wait_armed`.
pub fn measure(
    addr: &str,
    token: &str,
    duration: Duration,
    throttle_mbps: Option<u64>,
    wait_armed: Duration,
) -> Result<Measured, String> {
    if !(MIN_TOKEN..=MAX_TOKEN).contains(&token.len()) {
        return Err(format!("token: must be {MIN_TOKEN} to {MAX_TOKEN} bytes"));
    }
    let duration_ms = u32::try_from(duration.as_millis())
        .ok()
        .filter(|ms| (1..=MAX_DURATION_MS).contains(ms))
        .ok_or_else(|| format!("duration: must be 1 to {MAX_DURATION_MS} ms"))?;
    let target = addr
        .to_socket_addrs()
        .map_err(|e| format!("address {addr}: {e}"))?
        .next()
        .ok_or_else(|| format!("address {addr}: resolves to nothing"))?;
    let mut header = Vec::with_capacity(10 + token.len());
    header.extend_from_slice(MAGIC);
    header.push(VERSION);
    header.push(token.len() as u8);
    header.extend_from_slice(token.as_bytes());
    header.extend_from_slice(&duration_ms.to_be_bytes());
    let waiting_since = Instant::now();
    let mut stream = loop {
        let mut stream = TcpStream::connect_timeout(&target, Duration::from_secs(5))
            .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
        stream
            .set_read_timeout(Some(IO_TIMEOUT))
            .and_then(|_| stream.set_write_timeout(Some(IO_TIMEOUT)))
            .map_err(|e| e.to_string())?;
        stream
            .write_all(&header)
            .map_err(|e| format!("{addr}: sending the test header: {e}"))?;
        let mut status = [0u8; 1];
        stream
            .read_exact(&mut status)
            .map_err(|e| format!("{addr}: no answer to the test header: {e}"))?;
        match status[0] {
            ACCEPTED => break stream,
            UNKNOWN_TOKEN | BUSY if waiting_since.elapsed() < wait_armed => {
                std::thread::sleep(Duration::from_millis(100));
            }
            UNKNOWN_TOKEN => {
                return Err(format!(
                    "{addr} does not accept this test's token (it got no order for this test within {}s)",
                    wait_armed.as_secs()
                ))
            }
            BUSY => return Err(format!("{addr} is serving too many test streams")),
            other => return Err(format!("{addr} refused the test (status {other})")),
        }
    };
    let mut pacer = Pacer::new(throttle_mbps);
    let data = payload(Pacer::chunk(&pacer));
    let start = Instant::now();
    while start.elapsed() < duration {
        stream
            .write_all(&data)
            .map_err(|e| format!("{addr}: sending: {e}"))?;
        Pacer::pace(&mut pacer, data.len());
    }
    stream
        .shutdown(Shutdown::Write)
        .map_err(|e| format!("{addr}: closing the data: {e}"))?;
    stream
        .set_read_timeout(Some(ACK_WAIT))
        .map_err(|e| e.to_string())?;
    let mut ack = [0u8; 8];
    stream
        .read_exact(&mut ack)
        .map_err(|e| format!("{addr}: no acknowledgement of the data: {e}"))?;
    Ok(Measured {
        bytes: u64::from_be_bytes(ack),
        elapsed: start.elapsed(),
    })
}

/// Checks a test's numbers before anything is sent.
pub fn validate(test: &BandwidthTest) -> Result<(), String> {
    if test.peers.len() > MAX_PEERS {
        return Err(format!("bandwidth.peers: at most {MAX_PEERS}"));
    }
    for (i, p) in test.peers.iter().enumerate() {
        if p.node.is_empty() || p.node.len() > 63 {
            return Err(format!("bandwidth.peers[{i}].node: 1 to 63 characters"));
        }
        if p.addr.is_empty() || p.addr.len() > 255 {
            return Err(format!(
                "bandwidth.peers[{i}].addr: host:port, at most 255 characters"
            ));
        }
    }
    if test.duration_ms == 0 || test.duration_ms > MAX_DURATION_MS {
        return Err(format!("bandwidth.duration_ms: 1 to {MAX_DURATION_MS}"));
    }
    if !(MIN_TOKEN..=MAX_TOKEN).contains(&test.token.len())
        || !test.token.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(format!(
            "bandwidth.token: {MIN_TOKEN} to {MAX_TOKEN} printable ASCII characters"
        ));
    }
    if !test.min_gbps.is_finite() || !(0.0..=MAX_MIN_GBPS).contains(&test.min_gbps) {
        return Err(format!("bandwidth.min_gbps: 0 to {MAX_MIN_GBPS}"));
    }
    Ok(())
}

/// How long this node's listener must accept the test's token: long enough for every
/// peer's streams to this node, one after another, and their retries.
pub fn arm_for(test: &BandwidthTest) -> Duration {
    let per = Duration::from_millis(u64::from(test.duration_ms.min(MAX_DURATION_MS)));
    per * (MAX_PEERS as u32 + 1) + WAIT_ARMED + RECEIVE_GRACE
}

/// Measures each peer in turn (one stream at a time, so pairs do not share this node's
/// link) and judges each against `min_gbps` (0: reported, not judged).
pub fn run_test(test: &BandwidthTest, throttle_mbps: Option<u64>) -> Vec<CheckResult> {
    let duration = Duration::from_millis(u64::from(test.duration_ms));
    let threshold = if test.min_gbps > 0.0 {
        format!(">= {:.2} Gbit/s", test.min_gbps)
    } else {
        "not judged (min_gbps 0)".to_string()
    };
    test.peers
        .iter()
        .map(|peer| {
            let (measured, retried) =
                once_more(|| measure(&peer.addr, &test.token, duration, throttle_mbps, WAIT_ARMED));
            // Said in the detail: a pair that needed a second try is worth a look.
            let retried = retried
                .map(|first| format!(" (retried once: the first try got {first})"))
                .unwrap_or_default();
            let mut r = match measured {
                Ok(m) => {
                    let gbps = m.gbps();
                    let low = test.min_gbps > 0.0 && gbps < test.min_gbps;
                    let mut r = result(
                        "bandwidth",
                        "",
                        if low || m.bytes == 0 { FAIL } else { PASS },
                        format!("{gbps:.3} Gbit/s"),
                        threshold.clone(),
                        format!(
                            "to {} ({}): {} bytes acknowledged in {:.3} s{retried}{}",
                            peer.node,
                            peer.addr,
                            m.bytes,
                            m.elapsed.as_secs_f64(),
                            if low {
                                ": below the cluster's threshold; check this pair's network path"
                            } else {
                                ""
                            }
                        ),
                    );
                    r.gbps = gbps;
                    r
                }
                Err(e) => result(
                    "bandwidth",
                    "",
                    FAIL,
                    gpufleet_wire::checks::BANDWIDTH_NO_DATA,
                    threshold.clone(),
                    format!("to {} ({}): {e}{retried}", peer.node, peer.addr),
                ),
            };
            r.peer = peer.node.clone();
            r
        })
        .collect()
}

/// One measurement, and a second when the first got no data (an error, or nothing
/// acknowledged): under load a stream can run out of its own time, which says nothing
/// of the pair's path. Returns the last try and, when there were two, what the first got.
fn once_more(
    mut measure: impl FnMut() -> Result<Measured, String>,
) -> (Result<Measured, String>, Option<String>) {
    match measure() {
        Ok(m) if m.bytes > 0 => (Ok(m), None),
        Ok(_) => (measure(), Some("no bytes acknowledged".into())),
        // The peer's own refusal (after `measure` already waited for it) is its answer.
        Err(e) if peer_refused(&e) => (Err(e), None),
        Err(e) => (measure(), Some(e)),
    }
}

/// Whether `measure`'s error is the peer's answer to the test header (no token, busy,
/// another status), not a stream cut short.
fn peer_refused(e: &str) -> bool {
    [
        "does not accept this test's token",
        "is serving too many test streams",
        "refused the test (status",
    ]
    .iter()
    .any(|said| e.contains(said))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufleet_proto::v1::BandwidthPeer;

    #[test]
    fn a_measurement_without_data_is_tried_once_more_saying_what_the_first_got() {
        let got = |bytes| Measured {
            bytes,
            elapsed: Duration::from_millis(100),
        };
        let mut tries = vec![Ok(got(1000)), Err("timed out".to_string())];
        let (m, first) = once_more(|| tries.pop().unwrap());
        assert_eq!(
            (m.unwrap().bytes, first.as_deref()),
            (1000, Some("timed out"))
        );
        let mut tries = vec![Err("still nothing".to_string()), Ok(got(0))];
        let (m, first) = once_more(|| tries.pop().unwrap());
        assert_eq!(m.unwrap_err(), "still nothing");
        assert_eq!(first.as_deref(), Some("no bytes acknowledged"));
        // The peer refused the test: its answer, not tried again.
        let mut calls = 0;
        let (m, first) = once_more(|| {
            calls += 1;
            Err("127.0.0.1:9 does not accept this test's token (it got no order for this test within 30s)".into())
        });
        assert!(m.is_err() && first.is_none() && calls == 1);
        // Data at the first try: one try, nothing said.
        let mut calls = 0;
        let (m, first) = once_more(|| {
            calls += 1;
            Ok(got(5))
        });
        assert_eq!((m.unwrap().bytes, first, calls), (5, None, 1));
    }

    const TOKEN: &str = "0123456789abcdef0123";

    fn listener(mbps: Option<u64>) -> Arc<Listener> {
        let l = Listener::start("127.0.0.1:0".parse().unwrap(), Arc::new(move || mbps)).unwrap();
        l.arm(TOKEN, Duration::from_secs(60));
        l
    }

    #[test]
    fn bus_bandwidth_is_algbw_times_2_n_minus_1_over_n() {
        assert_eq!(bus_bandwidth_gbps(10.0, 2), 10.0);
        assert_eq!(bus_bandwidth_gbps(10.0, 4), 15.0);
        assert!((bus_bandwidth_gbps(100.0, 64) - 196.875).abs() < 1e-9);
        assert_eq!(bus_bandwidth_gbps(10.0, 1), 0.0);
        assert_eq!(bus_bandwidth_gbps(10.0, 0), 0.0);
    }

    #[test]
    fn two_listeners_measure_each_other_and_a_threshold_judges() {
        let (a, b) = (listener(None), listener(None));
        let test = |addr: SocketAddr, min_gbps: f64| BandwidthTest {
            peers: vec![BandwidthPeer {
                node: "peer".into(),
                addr: addr.to_string(),
            }],
            duration_ms: 300,
            token: TOKEN.into(),
            min_gbps,
        };
        let to_b = run_test(&test(b.addr(), 0.001), None);
        let to_a = run_test(&test(a.addr(), 1e5), None);
        assert_eq!((to_b.len(), to_a.len()), (1, 1));
        assert_eq!(to_b[0].verdict, PASS, "{:?}", to_b[0]);
        assert!(to_b[0].gbps > 0.0 && to_b[0].peer == "peer");
        assert!(
            to_b[0].detail.contains("bytes acknowledged"),
            "{}",
            to_b[0].detail
        );
        // Nothing on loopback reaches 100 Tbit/s: the threshold fails the pair.
        assert_eq!(to_a[0].verdict, FAIL);
        assert!(to_a[0].gbps > 0.0);
        assert_eq!(to_a[0].threshold, ">= 100000.00 Gbit/s");
    }

    #[test]
    fn the_slow_network_fault_throttles_sender_and_receiver() {
        let fast = listener(None);
        let slow = listener(Some(20));
        let d = Duration::from_millis(500);
        let open = measure(&fast.addr().to_string(), TOKEN, d, None, WAIT_ARMED).unwrap();
        // The slow node receiving: its reads are paced.
        let into_slow = measure(&slow.addr().to_string(), TOKEN, d, None, WAIT_ARMED).unwrap();
        // The slow node sending.
        let from_slow = measure(&fast.addr().to_string(), TOKEN, d, Some(20), WAIT_ARMED).unwrap();
        assert!(open.bytes > 0 && into_slow.bytes > 0 && from_slow.bytes > 0);
        // A pacer never runs ahead of its rate by more than one chunk, whatever the
        // machine's speed: 20 Mbit/s plus one chunk over at least 0.5 s stays under 30.
        for m in [into_slow, from_slow] {
            assert!(
                m.gbps() < 0.030,
                "throttled to 20 Mbit/s, measured {} Gbit/s",
                m.gbps()
            );
        }
        // The same run's unthrottled figure is far above it.
        assert!(
            open.gbps() > 10.0 * from_slow.gbps(),
            "open {} vs throttled {}",
            open.gbps(),
            from_slow.gbps()
        );
    }

    #[test]
    fn streams_without_an_armed_token_are_refused() {
        let l = Listener::start("127.0.0.1:0".parse().unwrap(), unthrottled()).unwrap();
        let addr = l.addr().to_string();
        let e = measure(
            &addr,
            TOKEN,
            Duration::from_millis(50),
            None,
            Duration::ZERO,
        )
        .unwrap_err();
        assert!(e.contains("does not accept this test's token"), "{e}");
        // Armed while the sender waits: accepted.
        let armer = {
            let l = l.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(200));
                l.arm(TOKEN, Duration::from_secs(10));
            })
        };
        let m = measure(
            &addr,
            TOKEN,
            Duration::from_millis(50),
            None,
            Duration::from_secs(10),
        )
        .unwrap();
        armer.join().unwrap();
        assert!(m.bytes > 0);
        // Garbage is refused with "bad request", and the listener keeps serving.
        let mut s = TcpStream::connect(l.addr()).unwrap();
        s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        let mut status = [0u8; 1];
        s.read_exact(&mut status).unwrap();
        assert_eq!(status[0], BAD_REQUEST);
        assert!(measure(
            &addr,
            TOKEN,
            Duration::from_millis(20),
            None,
            Duration::ZERO
        )
        .is_ok());
    }

    #[test]
    fn unreachable_peers_fail_and_bad_tests_are_refused() {
        let gone = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let test = BandwidthTest {
            peers: vec![BandwidthPeer {
                node: "n2".into(),
                addr: gone.to_string(),
            }],
            duration_ms: 50,
            token: TOKEN.into(),
            min_gbps: 1.0,
        };
        let r = run_test(&test, None);
        assert_eq!(
            (r[0].verdict.as_str(), r[0].gbps, r[0].peer.as_str()),
            (FAIL, 0.0, "n2")
        );
        assert!(r[0].detail.contains("cannot connect"), "{}", r[0].detail);
        assert!(validate(&test).is_ok());
        let short = BandwidthTest {
            token: "x".into(),
            ..test.clone()
        };
        assert!(validate(&short).unwrap_err().contains("bandwidth.token"));
        let long = BandwidthTest {
            duration_ms: 600_000,
            ..test.clone()
        };
        assert!(validate(&long).unwrap_err().contains("duration_ms"));
        let nan = BandwidthTest {
            min_gbps: f64::NAN,
            ..test
        };
        assert!(validate(&nan).unwrap_err().contains("min_gbps"));
    }
}
