//! How the agent reaches the control plane: its endpoint, the TLS files and the join
//! token. The files are read again at every connection, so a renewed agent certificate
//! (`pki --agent NAME` again), a new CA or a rotated join token written to
//! `--join-token-file` take effect at the next session without restarting the agent
//! (which would end the Slurm daemons and jobs of its clusters).

use std::path::{Path, PathBuf};

use anyhow::Context;

/// The control plane's address and what the agent presents to it.
#[derive(Clone)]
pub struct Link {
    /// Without TLS: that is added at each connection from `tls`.
    base: tonic::transport::Endpoint,
    tls: Option<TlsFiles>,
    join: JoinSecret,
}

#[derive(Clone)]
struct TlsFiles {
    /// The name the server's certificate must hold.
    host: String,
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
}

impl Link {
    /// A link over plain http with a fixed join token (embedded agents, tests).
    pub fn plain(endpoint: tonic::transport::Endpoint, join_token: impl Into<String>) -> Self {
        Self {
            base: endpoint,
            tls: None,
            join: JoinSecret::Given(join_token.into()),
        }
    }

    /// A link over plain http that presents whatever `current` says at each connection
    /// (embedded agents follow their control plane's rotations).
    pub fn following(
        endpoint: tonic::transport::Endpoint,
        current: std::sync::Arc<dyn Fn() -> String + Send + Sync>,
    ) -> Self {
        Self {
            base: endpoint,
            tls: None,
            join: JoinSecret::Following(current),
        }
    }

    /// The link the flags describe, checked once by resolving it (a bad flag fails the
    /// start rather than every reconnection). Blocking (reads the files).
    pub fn from_flags(
        base: tonic::transport::Endpoint,
        url: &str,
        ca_cert: Option<&Path>,
        cert: Option<&Path>,
        key: Option<&Path>,
        join_token: &str,
        join_token_file: Option<&Path>,
    ) -> anyhow::Result<Self> {
        let tls = if url.starts_with("https://") {
            let host = url
                .trim_start_matches("https://")
                .split([':', '/'])
                .next()
                .unwrap_or_default()
                .to_string();
            let identity = match (cert, key) {
                (Some(c), Some(k)) => Some((c.to_path_buf(), k.to_path_buf())),
                (None, None) => None,
                _ => anyhow::bail!(
                    "--cert and --key: give both (the agent's certificate and its key) or neither"
                ),
            };
            Some(TlsFiles {
                host,
                ca_cert: ca_cert.map(Path::to_path_buf),
                identity,
            })
        } else if cert.is_some() || key.is_some() {
            anyhow::bail!("--cert/--key: the control plane {url} is plain http; use an https:// --control-plane for mutual TLS");
        } else {
            None
        };
        let join = match (join_token.trim(), join_token_file) {
            ("", Some(file)) => JoinSecret::File(file.to_path_buf()),
            ("", None) => anyhow::bail!("--join-token-file or GPUFLEET_JOIN_TOKEN: missing; the control plane's <data-dir>/join.token holds the join token"),
            (_, Some(_)) => anyhow::bail!("--join-token-file and GPUFLEET_JOIN_TOKEN: give one of them (the file is read at every connection, so a rotated token needs no restart)"),
            (token, None) => JoinSecret::Given(token.to_string()),
        };
        let link = Self { base, tls, join };
        link.resolve()?;
        Ok(link)
    }

    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The endpoint and join token for the next connection, from the files as they are
    /// now. Blocking (reads the files).
    pub fn resolve(&self) -> anyhow::Result<Resolved> {
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
        let mut endpoint = self.base.clone();
        if let Some(tls) = &self.tls {
            let url = endpoint.uri().to_string();
            let mut config =
                gpufleet_wire::tls::client_config(&url, &tls.host, tls.ca_cert.as_deref())?
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
        })
    }
}
