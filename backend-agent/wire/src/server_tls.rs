//! The API's server TLS from files that can change while it runs: the certificate and key
//! (`--tls-cert`/`--tls-key`), the CA whose client certificates node agents present
//! (`--agent-ca`) and that CA's revocation list (`--agent-crl`). [`ServerTlsFiles::load`]
//! reads them into a rustls configuration; [`ServerTlsFiles::fingerprint`] is a cheap
//! digest of their contents, so a watcher reloads only when something changed. Every
//! error names the flag.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use sha2::{Digest, Sha256};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{
    CertificateDer, CertificateRevocationListDer, PrivateKeyDer,
};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};

/// The files of the server's TLS, as the flags name them.
#[derive(Clone, Debug)]
pub struct ServerTlsFiles {
    cert: PathBuf,
    key: PathBuf,
    agent_ca: Option<PathBuf>,
    agent_crl: Option<PathBuf>,
}

/// What the files said when they were loaded.
pub struct ServerTls {
    pub config: Arc<ServerConfig>,
    /// The agents' revocation list, to end the sessions of certificates it names.
    pub revoked: Option<Arc<RevokedCerts>>,
}

/// A CA's revocation list of client certificates.
pub struct RevokedCerts(webpki::CertRevocationList<'static>);

impl RevokedCerts {
    /// Whether the list names the certificate `der` (by serial number).
    pub fn names(&self, der: &[u8]) -> bool {
        crate::pki::serial(der)
            .is_some_and(|serial| matches!(self.0.find_serial(&serial), Ok(Some(_))))
    }
}

impl ServerTlsFiles {
    /// The server's TLS setting from the flags, checked before anything else starts:
    /// `None` serves plain http; a certificate without a key (or the reverse), or a
    /// revocation list without the CA it belongs to, is an error.
    pub fn from_flags(
        cert: Option<&Path>,
        key: Option<&Path>,
        agent_ca: Option<&Path>,
        agent_crl: Option<&Path>,
    ) -> anyhow::Result<Option<Self>> {
        if agent_crl.is_some() && agent_ca.is_none() {
            bail!("--agent-crl: a revocation list needs the CA whose certificates it revokes; give --agent-ca too");
        }
        let (cert, key) = match (cert, key) {
            (None, None) if agent_ca.is_some() => bail!(
                "--agent-ca: mutual TLS with node agents needs TLS; give --tls-cert and --tls-key too"
            ),
            (None, None) => return Ok(None),
            (Some(_), None) => bail!(
                "--tls-key: missing; --tls-cert needs the certificate's private key (set both to serve TLS, or neither for plain http)"
            ),
            (None, Some(_)) => bail!(
                "--tls-cert: missing; --tls-key needs the certificate it belongs to (set both to serve TLS, or neither for plain http)"
            ),
            (Some(cert), Some(key)) => (cert, key),
        };
        Ok(Some(Self {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            agent_ca: agent_ca.map(Path::to_path_buf),
            agent_crl: agent_crl.map(Path::to_path_buf),
        }))
    }

    /// Whether agents may present client certificates (mutual TLS).
    pub fn has_agent_ca(&self) -> bool {
        self.agent_ca.is_some()
    }

    /// A digest of every file's contents, in order. Blocking (reads the files).
    pub fn fingerprint(&self) -> anyhow::Result<[u8; 32]> {
        let mut digest = Sha256::new();
        for (flag, path) in self.paths() {
            let bytes = std::fs::read(path)
                .with_context(|| format!("{flag}: cannot read {}", path.display()))?;
            digest.update((bytes.len() as u64).to_be_bytes());
            digest.update(&bytes);
        }
        Ok(digest.finalize().into())
    }

    /// Reads the files into a server configuration. Blocking (reads the files).
    pub fn load(&self) -> anyhow::Result<ServerTls> {
        let certs = read_certs("--tls-cert", &self.cert)?;
        let key = PrivateKeyDer::from_pem_file(&self.key).map_err(|e| {
            anyhow::anyhow!(
                "--tls-key: {} does not hold a PEM private key: {e}",
                self.key.display()
            )
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .context("--tls-cert: no TLS version to serve")?;
        let mut revoked = None;
        let builder = match &self.agent_ca {
            None => builder.with_no_client_auth(),
            Some(ca_path) => {
                let mut roots = RootCertStore::empty();
                for ca in read_certs("--agent-ca", ca_path)? {
                    roots.add(ca).map_err(|e| {
                        anyhow::anyhow!(
                            "--agent-ca: {} is not a usable CA certificate: {e}",
                            ca_path.display()
                        )
                    })?;
                }
                // The provider and the CLI connect without a certificate; agents must
                // present one (the agent service checks that it did).
                let mut verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .allow_unauthenticated();
                if let Some(crl_path) = &self.agent_crl {
                    let crl = read_crl(crl_path)?;
                    let parsed =
                        webpki::OwnedCertRevocationList::from_der(crl.as_ref()).map_err(|e| {
                            anyhow::anyhow!(
                                "--agent-crl: {} is not a revocation list: {e:?}",
                                crl_path.display()
                            )
                        })?;
                    revoked = Some(Arc::new(RevokedCerts(parsed.into())));
                    verifier = verifier.with_crls([crl]);
                }
                let verifier = verifier.build().map_err(|e| {
                    anyhow::anyhow!("--agent-ca/--agent-crl: cannot verify agents with them: {e}")
                })?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder.with_single_cert(certs, key).map_err(|e| {
            anyhow::anyhow!(
                "--tls-cert/--tls-key: {} and {} are not a usable certificate and key: {e}",
                self.cert.display(),
                self.key.display()
            )
        })?;
        // gRPC is HTTP/2 only.
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(ServerTls {
            config: Arc::new(config),
            revoked,
        })
    }

    fn paths(&self) -> Vec<(&'static str, &Path)> {
        let mut paths = vec![
            ("--tls-cert", self.cert.as_path()),
            ("--tls-key", &self.key),
        ];
        if let Some(p) = &self.agent_ca {
            paths.push(("--agent-ca", p));
        }
        if let Some(p) = &self.agent_crl {
            paths.push(("--agent-crl", p));
        }
        paths
    }
}

fn read_certs(flag: &str, path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let text =
        std::fs::read(path).with_context(|| format!("{flag}: cannot read {}", path.display()))?;
    let certs = CertificateDer::pem_slice_iter(&text)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("{flag}: {} is not PEM: {e}", path.display()))?;
    if certs.is_empty() {
        bail!(
            "{flag}: {} does not hold a PEM certificate (no -----BEGIN CERTIFICATE----- line)",
            path.display()
        );
    }
    Ok(certs)
}

fn read_crl(path: &Path) -> anyhow::Result<CertificateRevocationListDer<'static>> {
    CertificateRevocationListDer::from_pem_file(path).map_err(|e| {
        anyhow::anyhow!(
            "--agent-crl: {} does not hold a PEM revocation list (-----BEGIN X509 CRL-----): {e}",
            path.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(dir: &Path, crl: bool) -> ServerTlsFiles {
        ServerTlsFiles::from_flags(
            Some(&dir.join("server.pem")),
            Some(&dir.join("server.key")),
            Some(&dir.join("ca.pem")),
            crl.then(|| dir.join(crate::revocation::CRL_FILE))
                .as_deref(),
        )
        .unwrap()
        .unwrap()
    }

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn err(r: anyhow::Result<impl Sized>) -> String {
        format!("{:#}", r.err().expect("an error"))
    }

    #[test]
    fn no_flags_is_plain_http() {
        assert!(ServerTlsFiles::from_flags(None, None, None, None)
            .unwrap()
            .is_none());
    }

    #[test]
    fn one_flag_without_the_other_names_the_missing_one() {
        let p = Path::new("/x.pem");
        let e = err(ServerTlsFiles::from_flags(Some(p), None, None, None));
        assert!(e.starts_with("--tls-key: missing"), "{e}");
        let e = err(ServerTlsFiles::from_flags(None, Some(p), None, None));
        assert!(e.starts_with("--tls-cert: missing"), "{e}");
        let e = err(ServerTlsFiles::from_flags(None, None, Some(p), None));
        assert!(e.starts_with("--agent-ca: mutual TLS"), "{e}");
        let e = err(ServerTlsFiles::from_flags(Some(p), Some(p), None, Some(p)));
        assert!(e.starts_with("--agent-crl:"), "{e}");
    }

    #[test]
    fn unreadable_or_non_pem_files_name_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        let absent = dir.path().join("absent.pem");
        let text = write(dir.path(), "text.pem", "not a certificate\n");
        let load = |cert: &Path, key: &Path| {
            ServerTlsFiles::from_flags(Some(cert), Some(key), None, None)
                .unwrap()
                .unwrap()
                .load()
        };
        let e = err(load(&absent, &text));
        assert!(e.starts_with("--tls-cert: cannot read"), "{e}");
        let e = err(load(&text, &text));
        assert!(
            e.starts_with("--tls-cert:") && e.contains("PEM certificate"),
            "{e}"
        );
        crate::pki::issue_for_tests(dir.path(), &[]).unwrap();
        let e = err(load(&dir.path().join("server.pem"), &text));
        assert!(
            e.starts_with("--tls-key:") && e.contains("PEM private key"),
            "{e}"
        );
        // A key that is not the certificate's.
        let e = err(load(
            &dir.path().join("server.pem"),
            &dir.path().join("ca.key"),
        ));
        assert!(e.starts_with("--tls-cert/--tls-key:"), "{e}");
    }

    #[test]
    fn a_revocation_names_the_revoked_certificate_only_and_changes_the_fingerprint() {
        let dir = tempfile::tempdir().unwrap();
        crate::pki::issue_for_tests(dir.path(), &["gpu-a", "gpu-b"]).unwrap();
        crate::revocation::ensure_list(dir.path()).unwrap();
        let files = files(dir.path(), true);
        let before = files.fingerprint().unwrap();
        let der = |name: &str| {
            let text =
                std::fs::read_to_string(dir.path().join(format!("agent-{name}.pem"))).unwrap();
            crate::pki::pem_block(&text, "CERTIFICATE").unwrap()
        };
        let loaded = files.load().unwrap();
        assert!(!loaded.revoked.as_ref().unwrap().names(&der("gpu-a")));

        crate::revocation::revoke(dir.path(), &["gpu-a".into()]).unwrap();
        assert_ne!(files.fingerprint().unwrap(), before);
        let loaded = files.load().unwrap();
        let revoked = loaded.revoked.unwrap();
        assert!(revoked.names(&der("gpu-a")));
        assert!(!revoked.names(&der("gpu-b")));

        // A new certificate for the same name is not revoked; the old stays revoked.
        let old = der("gpu-a");
        crate::pki::issue_for_tests(dir.path(), &["gpu-a"]).unwrap();
        let revoked = files.load().unwrap().revoked.unwrap();
        assert!(!revoked.names(&der("gpu-a")));
        assert!(revoked.names(&old));
    }
}
