//! Prometheus for the metrics tests: the `/metrics` address an agent logs, a plain HTTP GET,
//! `promtool check metrics`, a real `prometheus` server (Debian's, which
//! `scripts/bootstrap.sh` installs) scraping given targets, queried through its HTTP API,
//! and the metric names a Grafana dashboard's queries use.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// What the agents log when `--metrics-listen` is given: "... Prometheus metrics on
/// http://HOST:PORT/metrics".
const METRICS_LOG: &str = "Prometheus metrics on http://";

/// The `host:port` of the metrics listener an agent logged, if it has yet.
pub fn metrics_addr(log: &str) -> Option<String> {
    let rest = &log[log.find(METRICS_LOG)? + METRICS_LOG.len()..];
    let addr = rest.split("/metrics").next()?;
    (!addr.is_empty() && !addr.contains(char::is_whitespace)).then(|| addr.to_string())
}

/// Waits (polling `log`) for the metrics address an agent logs.
pub fn wait_for_metrics_addr(what: &str, log: impl Fn() -> String) -> String {
    crate::node_agent::wait_for(
        &format!("{what} to log its metrics address"),
        Duration::from_secs(30),
        || metrics_addr(&log()),
    )
}

/// An HTTP answer: the status code, the head (status line and headers) and the body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub head: String,
    pub body: String,
}

/// `GET http://{addr}{path}`, with `Authorization: Bearer {token}` when given.
pub fn get(addr: &str, path: &str, token: Option<&str>) -> Result<Answer, String> {
    let mut stream = TcpStream::connect(addr).map_err(|e| format!("connect to {addr}: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    // HTTP/1.0: the server closes the connection after the answer, without chunking.
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: */*\r\n{auth}\r\n"
    )
    .map_err(|e| format!("send to {addr}: {e}"))?;
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .map_err(|e| format!("read from {addr}: {e}"))?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("GET {addr}{path}: not an HTTP answer: {text}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("GET {addr}{path}: no status in {head}"))?;
    Ok(Answer {
        status,
        head: head.to_string(),
        body: body.to_string(),
    })
}

/// `GET http://{addr}{path}`: the body of a 200 answer, or why not.
pub fn http_get(addr: &str, path: &str) -> Result<String, String> {
    let answer = get(addr, path, None)?;
    if answer.status != 200 {
        return Err(format!(
            "GET {addr}{path}: {}: {}",
            answer.head, answer.body
        ));
    }
    Ok(answer.body)
}

/// A metrics endpoint's text (an open one: the node agents'), panicking with why when it
/// cannot be read.
pub fn scrape(addr: &str) -> String {
    http_get(addr, "/metrics").unwrap_or_else(|e| panic!("scrape {addr}: {e}"))
}

/// The control plane's metrics, scraped with its metrics token.
pub fn scrape_with(addr: &str, token: &str) -> String {
    let answer =
        get(addr, "/metrics", Some(token)).unwrap_or_else(|e| panic!("scrape {addr}: {e}"));
    assert_eq!(
        answer.status, 200,
        "scrape {addr} with the token: {answer:?}"
    );
    answer.body
}

/// A scrape target group for [`Prometheus::start`]: a job, its `host:port` targets, and
/// the file holding the bearer token it presents (`authorization: credentials_file:`).
pub struct Job<'a> {
    pub name: &'a str,
    pub targets: Vec<String>,
    pub credentials_file: Option<&'a Path>,
}

/// Percent-encodes a query parameter.
pub fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A free loopback port (bound and released; the tests' only race with other processes).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a free loopback port")
        .port()
}

/// An executable from PATH, else from /usr/bin; panics saying how to install it.
pub fn tool(name: &str) -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "`{name}` is not installed: the metrics tests need Debian's prometheus package \
                 (it provides prometheus and promtool); run scripts/bootstrap.sh, or \
                 apt-get install --no-install-recommends prometheus"
            )
        })
}

/// Runs `promtool check metrics` on `text`; panics with promtool's findings when it fails.
pub fn promtool_check(what: &str, text: &str) {
    let mut child = Command::new(tool("promtool"))
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(text.as_bytes())
        .expect("write to promtool");
    let out = child.wait_with_output().expect("wait for promtool");
    assert!(
        out.status.success(),
        "promtool check metrics failed on {what} ({}):\n{}{}\n--- metrics ---\n{text}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A `prometheus` server on a free loopback port with its own config and storage in a temp
/// dir, scraping every target each second; killed on drop.
pub struct Prometheus {
    child: Child,
    pub addr: String,
    root: tempfile::TempDir,
}

impl Prometheus {
    /// Starts prometheus scraping `jobs` every second and waits until it is ready.
    pub fn start(jobs: &[Job]) -> Prometheus {
        let mut config = String::new();
        for job in jobs {
            let list: Vec<String> = job.targets.iter().map(|t| format!("'{t}'")).collect();
            config.push_str(&format!(
                "  - job_name: '{}'\n    static_configs:\n      - targets: [{}]\n",
                job.name,
                list.join(", ")
            ));
            if let Some(file) = job.credentials_file {
                config.push_str(&format!(
                    "    authorization:\n      type: Bearer\n      credentials_file: '{}'\n",
                    file.display()
                ));
            }
        }
        Prometheus::start_with_scrape_configs(&config)
    }

    /// Starts prometheus with `scrape_configs` (YAML: the list's items, as written, e.g.
    /// a job the provider generated), each job scraping every second unless it says
    /// otherwise, and waits until it is ready.
    pub fn start_with_scrape_configs(scrape_configs: &str) -> Prometheus {
        let binary = tool("prometheus");
        let root = tempfile::Builder::new()
            .prefix("gpufleet-prometheus-")
            .tempdir()
            .expect("create prometheus' temp dir");
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\nscrape_configs:\n{scrape_configs}"
        );
        let config_file = root.path().join("prometheus.yml");
        std::fs::write(&config_file, config).expect("write prometheus.yml");
        let addr = format!("127.0.0.1:{}", free_port());
        let log = std::fs::File::create(root.path().join("prometheus.log"))
            .expect("create prometheus' log");
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                root.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone the log handle"))
            .stderr(log)
            .spawn()
            .expect("spawn prometheus");
        let mut prometheus = Prometheus { child, addr, root };
        let deadline = Instant::now() + Duration::from_secs(30);
        while http_get(&prometheus.addr, "/-/ready").is_err() {
            if let Ok(Some(status)) = prometheus.child.try_wait() {
                panic!("prometheus exited ({status}):\n{}", prometheus.log());
            }
            assert!(
                Instant::now() < deadline,
                "prometheus not ready within 30s:\n{}",
                prometheus.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        prometheus
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.root.path().join("prometheus.log")).unwrap_or_default()
    }

    /// The result vector of an instant query: each series' labels and value.
    pub fn query(&self, expr: &str) -> Result<Vec<(Value, f64)>, String> {
        let body = http_get(
            &self.addr,
            &format!("/api/v1/query?query={}", url_encode(expr)),
        )?;
        let answer: Value =
            serde_json::from_str(&body).map_err(|e| format!("query {expr}: {e}: {body}"))?;
        if answer["status"] != "success" {
            return Err(format!("query {expr}: {body}"));
        }
        Ok(answer["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|s| {
                let value = s["value"][1].as_str()?.parse().ok()?;
                Some((s["metric"].clone(), value))
            })
            .collect())
    }

    /// The value of a query that yields one series, once it does.
    pub fn value(&self, expr: &str) -> Option<f64> {
        match self.query(expr) {
            Ok(series) if series.len() == 1 => Some(series[0].1),
            _ => None,
        }
    }

    /// Waits until `expr` yields exactly one series whose value is `want`.
    pub fn wait_for_value(&self, expr: &str, want: f64) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let got = self.query(expr);
            if matches!(&got, Ok(s) if s.len() == 1 && s[0].1 == want) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "prometheus: {expr} is {got:?}, not {want}, after 20s\n--- prometheus log ---\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every `expr` of a Grafana dashboard's panels (rows' nested panels included).
pub fn dashboard_exprs(dashboard: &Value) -> Vec<String> {
    fn walk(panels: &Value, out: &mut Vec<String>) {
        for panel in panels.as_array().into_iter().flatten() {
            for target in panel["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = target["expr"].as_str() {
                    out.push(expr.to_string());
                }
            }
            walk(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// The metric names a PromQL expression uses: identifiers outside label matchers, string
/// literals, ranges and grouping clauses that are neither functions, keywords nor Grafana
/// variables.
pub fn promql_metric_names(expr: &str) -> BTreeSet<String> {
    // Aggregations may be followed by their grouping clause before the parenthesis.
    const KEYWORDS: &[&str] = &[
        "and",
        "or",
        "unless",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "offset",
        "bool",
        "inf",
        "nan",
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
        "limitk",
        "limit_ratio",
    ];
    const GROUPING: &[&str] = &[
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    let is_start = |c: char| c.is_ascii_alphabetic() || c == '_' || c == ':';
    let is_part = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let skip_to = |from: usize, close: char| {
        let mut j = from + 1;
        let mut quoted = false;
        while j < chars.len() {
            match chars[j] {
                '"' => quoted = !quoted,
                '\\' if quoted => j += 1,
                c if c == close && !quoted => break,
                _ => {}
            }
            j += 1;
        }
        j + 1
    };
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' {
            let mut j = i + 1;
            while j < chars.len() && chars[j] != c {
                if chars[j] == '\\' {
                    j += 1;
                }
                j += 1;
            }
            i = j + 1;
        } else if c == '{' {
            i = skip_to(i, '}');
        } else if c == '[' {
            i = skip_to(i, ']');
        } else if c == '$' {
            // A Grafana variable ($__rate_interval, ${tenant}).
            i += 1;
            while i < chars.len() && (is_part(chars[i]) || chars[i] == '{' || chars[i] == '}') {
                i += 1;
            }
        } else if c.is_ascii_digit() || c == '.' {
            // A number (1e3, 0.99) or a duration (5m) is not a name.
            while i < chars.len() && (is_part(chars[i]) || chars[i] == '.') {
                i += 1;
            }
        } else if is_start(c) {
            let start = i;
            while i < chars.len() && is_part(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut next = i;
            while next < chars.len() && chars[next].is_whitespace() {
                next += 1;
            }
            let call = next < chars.len() && chars[next] == '(';
            if GROUPING.contains(&word.as_str()) && call {
                i = skip_to(next, ')');
            } else if !call && !KEYWORDS.contains(&word.to_ascii_lowercase().as_str()) {
                names.insert(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

/// Whether the exposition `text` has metric `name` (a histogram's `_bucket`, `_sum` and
/// `_count` series count as its family's).
pub fn exposes(text: &str, name: &str) -> bool {
    let declared = |family: &str, kind: Option<&str>| {
        text.lines().any(|l| {
            let mut parts = l.split_whitespace();
            parts.next() == Some("#")
                && parts.next() == Some("TYPE")
                && parts.next() == Some(family)
                && kind.is_none_or(|k| parts.next() == Some(k))
        })
    };
    if declared(name, None) {
        return true;
    }
    ["_bucket", "_sum", "_count"].iter().any(|suffix| {
        name.strip_suffix(suffix)
            .is_some_and(|family| declared(family, Some("histogram")))
    })
}

/// The dashboard file's JSON.
pub fn read_dashboard(path: &Path) -> Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_names_of_promql() {
        let names = promql_metric_names(
            r#"histogram_quantile(0.99, sum by (le) (rate(gpufleet_api_request_seconds_bucket{code!~"OK|x"}[$__rate_interval]))) / on(node) group_left(a) max without (x) (gpufleet_nodes offset 5m) > bool 2"#,
        );
        assert_eq!(
            names.into_iter().collect::<Vec<_>>(),
            vec!["gpufleet_api_request_seconds_bucket", "gpufleet_nodes"]
        );
        assert_eq!(
            metrics_addr(
                "x INFO serving node agent Prometheus metrics on http://127.0.0.1:4321/metrics"
            ),
            Some("127.0.0.1:4321".into())
        );
        let text = "# TYPE h histogram\nh_bucket{le=\"1\"} 0\n# TYPE g gauge\ng 1\n";
        assert!(exposes(text, "h_bucket") && exposes(text, "g") && !exposes(text, "g_sum"));
    }
}
