//! How the agent reaches the control plane: its addresses, the TLS files and the join
//! token. The files are read again at every connection, so a renewed agent certificate
//! (`pki --agent NAME` again), a new CA or a rotated join token written to
//! `--join-token-file` take effect at the next session without restarting the agent
//! (which would end the Slurm daemons and jobs of its clusters).
//!
//! `--control-plane` may name several addresses of the same control plane (replicas
//! behind one store, or where it may be restarted): a connection goes to the current
//! one, and when it fails or drops the agent moves to the next, round robin
//! ([`Link::advance`]). What the agent registers and how is the same at every address.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use anyhow::Context;

/// At most this many `--control-plane` addresses.
pub const MAX_CONTROL_PLANES: usize = 8;

/// The control plane's addresses and what the agent presents to it.
#[derive(Clone)]
pub struct Link {
    /// Without TLS: that is added at each connection from `tls`. At least one.
    targets: Arc<[Target]>,
    /// The index in `targets` the next connection goes to (shared by the clones).
    current: Arc<AtomicUsize>,
    tls: Option<TlsFiles>,
    join: JoinSecret,
}

/// One address of the control plane.
struct Target {
    url: String,
    base: tonic::transport::Endpoint,
    /// The name the server's certificate must hold (the URL's host).
    host: String,
}

#[derive(Clone)]
struct TlsFiles {
    ca_cert: Option<PathBuf>,
    /// The agent's certificate and key (mutual TLS).
    identity: Option<(PathBuf, PathBuf)>,
}

#[derive(Clone)]
enum JoinSecret {
    /// From GPUFLEET_JOIN_TOKEN.
    Given(String),
    /// `--join-token-file`: read at every connection.
    File(PathBuf),
    /// Whatever the control plane in this process holds now (embedded agents).
    Following(std::sync::Arc<dyn Fn() -> String + Send + Sync>),
}

/// What one connection uses.
pub struct Resolved {
    pub endpoint: tonic::transport::Endpoint,
    pub join_token: String,
    /// The control plane's address it goes to, as given.
    pub url: String,
}

/// The `--control-plane` addresses as given (each flag's value split at commas): each one
/// an http:// or https:// URL with a host, without a trailing slash, all of one scheme,
/// none twice, at least one and at most [`MAX_CONTROL_PLANES`].
pub fn control_plane_urls(given: &[String]) -> anyhow::Result<Vec<String>> {
    let urls: Vec<String> = given
        .iter()
        .flat_map(|g| g.split(','))
        .map(|u| u.trim().trim_end_matches('/').to_string())
        .collect();
    if urls.len() > MAX_CONTROL_PLANES {
        anyhow::bail!(
            "--control-plane: at most {MAX_CONTROL_PLANES} addresses (got {})",
            urls.len()
        );
    }
    if urls.is_empty() || urls.iter().any(String::is_empty) {
        anyhow::bail!("--control-plane: an empty address (give URLs separated by commas, e.g. http://10.0.0.5:7700,http://10.0.0.6:7700)");
    }
    for (i, url) in urls.iter().enumerate() {
        let shown: String = url.chars().take(80).collect();
        let uri: tonic::transport::Uri = url
            .parse()
            .map_err(|_| anyhow::anyhow!("--control-plane: '{shown}' is not a URL"))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
            anyhow::bail!(
                "--control-plane: '{shown}' is not an http:// or https:// URL with a host"
            );
        }
        if urls[..i].contains(url) {
            anyhow::bail!("--control-plane: '{shown}' is given twice");
        }
    }
    let https = |u: &String| u.starts_with("https://");
    if urls.iter().any(https) && !urls.iter().all(https) {
        anyhow::bail!("--control-plane: mixes http:// and https:// addresses; give every address of the control plane with the same scheme");
    }
    Ok(urls)
}

impl Link {
    /// A link over plain http with a fixed join token (embedded agents, tests).
    pub fn plain(endpoint: tonic::transport::Endpoint, join_token: impl Into<String>) -> Self {
        Self::one(endpoint, None, JoinSecret::Given(join_token.into()))
    }

    fn one(endpoint: tonic::transport::Endpoint, tls: Option<TlsFiles>, join: JoinSecret) -> Self {
        let url = endpoint.uri().to_string();
        let host = endpoint.uri().host().unwrap_or_default().to_string();
        Self {
            targets: Arc::new([Target {
                url: url.trim_end_matches('/').to_string(),
                base: endpoint,
                host,
            }]),
            current: Arc::new(AtomicUsize::new(0)),
            tls,
            join,
        }
    }

    /// A link over plain http that presents whatever `current` says at each connection
    /// (embedded agents follow their control plane's rotations).
    pub fn following(
        endpoint: tonic::transport::Endpoint,
        current: std::sync::Arc<dyn Fn() -> String + Send + Sync>,
    ) -> Self {
        Self::one(endpoint, None, JoinSecret::Following(current))
    }

    /// The link the flags describe: `targets` are the control plane's addresses (from
    /// [`control_plane_urls`]) and their endpoints, in order. Checked once by resolving
    /// every address (a bad flag fails the start rather than every reconnection).
    /// Blocking (reads the files).
    pub fn from_flags(
        targets: Vec<(String, tonic::transport::Endpoint)>,
        ca_cert: Option<&Path>,
        cert: Option<&Path>,
        key: Option<&Path>,
        join_token: &str,
        join_token_file: Option<&Path>,
    ) -> anyhow::Result<Self> {
        let Some((first, _)) = targets.first() else {
            anyhow::bail!("--control-plane: no address");
        };
        let tls = if first.starts_with("https://") {
            let identity = match (cert, key) {
                (Some(c), Some(k)) => Some((c.to_path_buf(), k.to_path_buf())),
                (None, None) => None,
                _ => anyhow::bail!(
                    "--cert and --key: give both (the agent's certificate and its key) or neither"
                ),
            };
            Some(TlsFiles {
                ca_cert: ca_cert.map(Path::to_path_buf),
                identity,
            })
        } else if cert.is_some() || key.is_some() {
            anyhow::bail!("--cert/--key: the control plane {first} is plain http; use an https:// --control-plane for mutual TLS");
        } else {
            None
        };
        let targets: Arc<[Target]> = targets
            .into_iter()
            .map(|(url, base)| Target {
                host: base.uri().host().unwrap_or_default().to_string(),
                url,
                base,
            })
            .collect();
        let join = match (join_token.trim(), join_token_file) {
            ("", Some(file)) => JoinSecret::File(file.to_path_buf()),
            ("", None) => anyhow::bail!("--join-token-file or GPUFLEET_JOIN_TOKEN: missing; the control plane's <data-dir>/join.token holds the join token"),
            (_, Some(_)) => anyhow::bail!("--join-token-file and GPUFLEET_JOIN_TOKEN: give one of them (the file is read at every connection, so a rotated token needs no restart)"),
            (token, None) => JoinSecret::Given(token.to_string()),
        };
        let link = Self {
            targets,
            current: Arc::new(AtomicUsize::new(0)),
            tls,
            join,
        };
        for i in 0..link.targets.len() {
            link.resolve_at(i)?;
        }
        Ok(link)
    }

    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// How many addresses the control plane has here.
    pub fn addresses(&self) -> usize {
        self.targets.len()
    }

    /// The address the next connection goes to.
    pub fn current(&self) -> &str {
        &self.targets[self.current.load(Ordering::Relaxed) % self.targets.len()].url
    }

    /// After the connection to the current address failed or dropped: the next address
    /// (round robin; the same one when there is only one), which it returns.
    pub fn advance(&self) -> &str {
        let n = self.targets.len();
        let next = (self.current.load(Ordering::Relaxed) + 1) % n;
        self.current.store(next, Ordering::Relaxed);
        &self.targets[next].url
    }

    /// The endpoint and join token for the next connection (to the current address),
    /// from the files as they are now. Blocking (reads the files).
    pub fn resolve(&self) -> anyhow::Result<Resolved> {
        self.resolve_at(self.current.load(Ordering::Relaxed) % self.targets.len())
    }

    fn resolve_at(&self, index: usize) -> anyhow::Result<Resolved> {
        let target = &self.targets[index];
        let join_token = match &self.join {
            JoinSecret::Given(t) => t.clone(),
            JoinSecret::Following(current) => current(),
            JoinSecret::File(path) => {
                let text = std::fs::read_to_string(path).with_context(|| {
                    format!("--join-token-file: cannot read {}", path.display())
                })?;
                let token = text.trim().to_string();
                if token.is_empty() || token.contains(char::is_whitespace) {
                    anyhow::bail!(
                        "--join-token-file: {} does not hold one token (the control plane's join.token)",
                        path.display()
                    );
                }
                token
            }
        };
        let mut endpoint = target.base.clone();
        if let Some(tls) = &self.tls {
            let url = endpoint.uri().to_string();
            let mut config =
                gpufleet_wire::tls::client_config(&url, &target.host, tls.ca_cert.as_deref())?
                    .expect("an https endpoint");
            if let Some((cert, key)) = &tls.identity {
                let read = |flag: &str, p: &Path| {
                    std::fs::read_to_string(p)
                        .with_context(|| format!("{flag}: cannot read {}", p.display()))
                };
                config = config.identity(tonic::transport::Identity::from_pem(
                    read("--cert", cert)?,
                    read("--key", key)?,
                ));
            }
            endpoint = endpoint.tls_config(config).map_err(|e| {
                anyhow::anyhow!("--ca-cert/--cert/--key: {}", gpufleet_wire::tls::causes(&e))
            })?;
        }
        Ok(Resolved {
            endpoint,
            join_token,
            url: target.url.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn urls(given: &[&str]) -> anyhow::Result<Vec<String>> {
        control_plane_urls(&given.iter().map(|g| g.to_string()).collect::<Vec<_>>())
    }

    fn error(given: &[&str]) -> String {
        format!("{:#}", urls(given).unwrap_err())
    }

    #[test]
    fn control_plane_addresses_come_comma_separated_or_repeated_in_order() {
        assert_eq!(
            urls(&["http://a:7700, http://b:7700/", "http://c:7700"]).unwrap(),
            ["http://a:7700", "http://b:7700", "http://c:7700"]
        );
        assert_eq!(urls(&["https://cp:7700"]).unwrap(), ["https://cp:7700"]);
        let eight: Vec<String> = (0..8).map(|i| format!("http://10.0.0.{i}:7700")).collect();
        assert_eq!(urls(&[&eight.join(",")]).unwrap(), eight);
    }

    #[test]
    fn control_plane_addresses_are_bounded_and_each_checked_naming_the_flag() {
        let nine: Vec<String> = (0..9).map(|i| format!("http://10.0.0.{i}:7700")).collect();
        assert_eq!(
            error(&[&nine.join(",")]),
            "--control-plane: at most 8 addresses (got 9)"
        );
        assert!(error(&["http://a:7700,,http://b:7700"])
            .starts_with("--control-plane: an empty address"));
        assert!(error(&[""]).starts_with("--control-plane: an empty address"));
        assert_eq!(
            error(&["http://a:7700,not a url"]),
            "--control-plane: 'not a url' is not a URL"
        );
        assert_eq!(
            error(&["ftp://a:21"]),
            "--control-plane: 'ftp://a:21' is not an http:// or https:// URL with a host"
        );
        assert_eq!(
            error(&["10.0.0.5:7700"]),
            "--control-plane: '10.0.0.5:7700' is not an http:// or https:// URL with a host"
        );
        assert_eq!(
            error(&["http://a:7700", "http://a:7700/"]),
            "--control-plane: 'http://a:7700' is given twice"
        );
        assert!(error(&["https://a:7700,http://b:7700"])
            .starts_with("--control-plane: mixes http:// and https://"));
        let long = format!("http://{}", "a".repeat(500));
        assert!(
            error(&[&format!("{long} x")]).len() < 200,
            "a long value is cut"
        );
    }

    fn link(given: &[&str]) -> Link {
        let targets = urls(given)
            .unwrap()
            .into_iter()
            .map(|u| {
                let endpoint = tonic::transport::Endpoint::from_shared(u.clone()).unwrap();
                (u, endpoint)
            })
            .collect();
        Link::from_flags(targets, None, None, None, "t", None).unwrap()
    }

    #[test]
    fn a_lost_connection_moves_to_the_next_address_round_robin() {
        let link = link(&["http://a:7700,http://b:7700,http://c:7700"]);
        assert_eq!(link.addresses(), 3);
        assert_eq!(link.resolve().unwrap().url, "http://a:7700");
        let moved: Vec<String> = (0..4).map(|_| link.advance().to_string()).collect();
        assert_eq!(
            moved,
            [
                "http://b:7700",
                "http://c:7700",
                "http://a:7700",
                "http://b:7700"
            ]
        );
        // Every clone (the one each connection resolves on) follows.
        let clone = link.clone();
        assert_eq!(clone.resolve().unwrap().url, "http://b:7700");
        clone.advance();
        assert_eq!(link.current(), "http://c:7700");
        assert_eq!(link.resolve().unwrap().endpoint.uri().host(), Some("c"));
    }

    #[test]
    fn one_address_stays_where_it_is() {
        let link = link(&["http://cp:7700"]);
        assert_eq!(link.advance(), "http://cp:7700");
        assert_eq!(link.resolve().unwrap().url, "http://cp:7700");
        let embedded = Link::plain(
            tonic::transport::Endpoint::from_static("http://127.0.0.1:9"),
            "t",
        );
        assert_eq!(embedded.current(), "http://127.0.0.1:9");
        assert_eq!(embedded.advance(), "http://127.0.0.1:9");
    }

    #[test]
    fn client_certificates_need_https_addresses() {
        let targets = vec![(
            "http://cp:7700".to_string(),
            tonic::transport::Endpoint::from_static("http://cp:7700"),
        )];
        let cert = Path::new("agent.pem");
        let err = Link::from_flags(targets, None, Some(cert), Some(cert), "t", None)
            .err()
            .unwrap();
        assert!(format!("{err}")
            .starts_with("--cert/--key: the control plane http://cp:7700 is plain http"));
    }
}
