//! TLS to PostgreSQL, with rustls (the postgres crate brings none).
//!
//! The address says it as libpq's does: `sslmode=require`, `verify-ca` or `verify-full`
//! with `sslrootcert=FILE`, the PEM of the CA that signed the server's certificate. Each
//! of them here verifies the chain and the server's name (the host of the address, one
//! of several for a cluster), as `verify-full` does: an encrypted connection to a server
//! nobody checked would hand the password to whoever sits between. A mode that asks for
//! TLS without `sslrootcert` is refused, naming it. Without `sslmode`, or with `disable`,
//! `allow` or `prefer`, the connection is plain, as before.

use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_rustls::rustls::{self, pki_types::ServerName};

use crate::error::{Error, Result};

/// How a connection is made: what [`split`] read off the address.
pub enum Transport {
    Plain,
    Tls(Rustls),
}

/// Takes libpq's `sslrootcert` off `url` (the postgres crate knows no such parameter) and
/// says how to connect: the address to give the postgres crate, and the transport.
pub fn split(url: &str) -> Result<(String, Transport)> {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, query),
        None => (url, ""),
    };
    let mut kept = Vec::new();
    let (mut mode, mut root) = (None, None);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("sslrootcert", file)) => root = Some(file.to_string()),
            Some(("sslmode", m)) => {
                mode = Some(m.to_string());
                kept.push(pair.to_string());
            }
            _ => kept.push(pair.to_string()),
        }
    }
    let wants_tls = match mode.as_deref() {
        None | Some("disable" | "allow" | "prefer") => false,
        Some("require" | "verify-ca" | "verify-full") => true,
        Some(other) => {
            return Err(Error::Address(format!(
                "sslmode={other}: give disable, prefer, require, verify-ca or verify-full"
            )))
        }
    };
    let transport = match (wants_tls, root) {
        (false, None) => Transport::Plain,
        (false, Some(_)) => {
            return Err(Error::Address(
                "sslrootcert: given without sslmode=verify-full (or require): the connection would not use it".into(),
            ))
        }
        (true, None) => {
            return Err(Error::Address(format!(
                "sslrootcert: missing; sslmode={} needs the CA that signed the database server's certificate (sslrootcert=/path/to/ca.pem)",
                mode.unwrap_or_default()
            )))
        }
        (true, Some(file)) => Transport::Tls(Rustls::trusting(Path::new(&file))?),
    };
    // The postgres crate understands `require`, and TLS is then this module's.
    let kept: Vec<String> = kept
        .into_iter()
        .map(|p| match p.split_once('=') {
            Some(("sslmode", _)) if wants_tls => "sslmode=require".to_string(),
            _ => p,
        })
        .collect();
    let url = if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((url, transport))
}

/// Connects with TLS, trusting one CA.
#[derive(Clone)]
pub struct Rustls {
    config: Arc<rustls::ClientConfig>,
}

impl Rustls {
    /// Trusts the CA certificates of the PEM file `ca`.
    pub fn trusting(ca: &Path) -> Result<Self> {
        let shown = ca.display();
        let pem =
            std::fs::read(ca).map_err(|e| Error::Address(format!("sslrootcert {shown}: {e}")))?;
        let mut roots = rustls::RootCertStore::empty();
        let mut found = 0;
        for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
            let cert = cert.map_err(|e| Error::Address(format!("sslrootcert {shown}: {e}")))?;
            roots
                .add(cert)
                .map_err(|e| Error::Address(format!("sslrootcert {shown}: {e}")))?;
            found += 1;
        }
        if found == 0 {
            return Err(Error::Address(format!(
                "sslrootcert {shown}: holds no PEM certificate"
            )));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Address(format!("TLS: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Self {
            config: Arc::new(config),
        })
    }
}

impl<S> MakeTlsConnect<S> for Rustls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = Stream<S>;
    type TlsConnect = Connect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, domain: &str) -> io::Result<Connect> {
        let name = ServerName::try_from(domain.to_string())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        Ok(Connect {
            connector: tokio_rustls::TlsConnector::from(self.config.clone()),
            name,
        })
    }
}

/// One connection's handshake, for one server name.
pub struct Connect {
    connector: tokio_rustls::TlsConnector,
    name: ServerName<'static>,
}

impl<S> TlsConnect<S> for Connect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = Stream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Stream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let tls = self.connector.connect(self.name, stream).await?;
            Ok(Stream(tls))
        })
    }
}

/// A connection under TLS.
pub struct Stream<S>(tokio_rustls::client::TlsStream<S>);

impl<S> postgres::tls::TlsStream for Stream<S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    fn channel_binding(&self) -> ChannelBinding {
        // No channel binding (SCRAM's tls-server-end-point needs the certificate's
        // digest): the handshake has verified the server's certificate already.
        ChannelBinding::none()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Stream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Stream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_server::TestServer;
    use crate::{params, Database};

    fn refused(url: &str) -> String {
        match split(url) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{url} was taken"),
        }
    }

    #[test]
    fn the_address_says_plain_or_verified_tls_and_a_half_said_one_is_refused() {
        let base = "postgres://u:p@db:5432/gpufleet";
        assert!(matches!(split(base), Ok((u, Transport::Plain)) if u == base));
        let prefer = format!("{base}?connect_timeout=5&sslmode=prefer");
        assert!(matches!(split(&prefer), Ok((u, Transport::Plain)) if u == prefer));
        for mode in ["require", "verify-ca", "verify-full"] {
            let e = refused(&format!("{base}?sslmode={mode}"));
            assert!(e.contains("sslrootcert: missing"), "{e}");
        }
        let e = refused(&format!("{base}?sslrootcert=/etc/ca.pem"));
        assert!(e.contains("sslrootcert: given without sslmode"), "{e}");
        let e = refused(&format!("{base}?sslmode=verify-everything"));
        assert!(e.contains("sslmode=verify-everything"), "{e}");
        let e = refused(&format!(
            "{base}?sslmode=verify-full&sslrootcert=/nowhere/ca.pem"
        ));
        assert!(e.contains("sslrootcert /nowhere/ca.pem"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate").unwrap();
        let e = refused(&format!(
            "{base}?sslmode=verify-full&sslrootcert={}",
            empty.display()
        ));
        assert!(e.contains("holds no PEM certificate"), "{e}");
    }

    /// A CA, and a certificate it signed for 127.0.0.1 with its key: (CA PEM, cert PEM,
    /// key PEM).
    fn authority() -> (String, String, String) {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = ca.self_signed(&ca_key).unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
            .unwrap()
            .signed_by(&key, &ca, &ca_key)
            .unwrap();
        (ca.pem(), cert.pem(), key.serialize_pem())
    }

    #[test]
    fn a_verified_tls_connection_reaches_the_server_and_a_stranger_ca_is_refused() {
        let server = TestServer::start().unwrap_or_else(|e| panic!("{e}"));
        let (ca, cert, key) = authority();
        server.enable_tls(&cert, &key).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, &ca).unwrap();
        let url = format!(
            "{}&sslmode=verify-full&sslrootcert={}",
            server.url("postgres"),
            ca_file.display()
        );
        let mut db = Database::postgres(&url).unwrap();
        let encrypted: bool = db
            .read(|c| {
                c.query_row(
                    "SELECT CAST(CASE WHEN ssl THEN 1 ELSE 0 END AS BIGINT) FROM pg_stat_ssl
                     WHERE pid = pg_backend_pid()",
                    params![],
                    |r| r.get::<bool>(0),
                )
            })
            .unwrap();
        assert!(encrypted, "the session is not encrypted");

        // A CA that did not sign the server's certificate: no connection, saying why.
        let (stranger, _, _) = authority();
        let stranger_file = dir.path().join("stranger.pem");
        std::fs::write(&stranger_file, &stranger).unwrap();
        let url = format!(
            "{}&sslmode=verify-full&sslrootcert={}",
            server.url("postgres"),
            stranger_file.display()
        );
        let e = Database::postgres(&url).unwrap_err().to_string();
        assert!(e.to_lowercase().contains("certificate"), "{e}");
    }
}
