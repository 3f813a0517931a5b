//! TLS for the API: the server identity from `--tls-cert`/`--tls-key`, and the CA that the
//! admin client (`fleet`, `nodes`) trusts from `--ca-cert`. Every error names the flag.

use std::path::Path;

use anyhow::{bail, Context};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, Server, ServerTlsConfig};

const PEM_CERTIFICATE: &str = "-----BEGIN CERTIFICATE-----";
/// Ends the BEGIN line of every PEM private key (PKCS#8, RSA, EC).
const PEM_PRIVATE_KEY: &str = "PRIVATE KEY-----";

/// The server's TLS setting, checked before anything else starts: `None` serves plain
/// http; a certificate without a key (or the reverse), an unreadable file, or a pair rustls
/// refuses (not PEM, a key that does not match the certificate) is an error.
/// With `agent_ca`, clients may also present a certificate, which must be signed by that
/// CA (node agents must; the Terraform provider and the CLI need not).
pub fn server_config(
    cert: Option<&Path>,
    key: Option<&Path>,
    agent_ca: Option<&Path>,
) -> anyhow::Result<Option<Server>> {
    let (cert_path, key_path) = match (cert, key) {
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
    let cert = read_pem(
        "--tls-cert",
        cert_path,
        PEM_CERTIFICATE,
        "a PEM certificate",
    )?;
    let key = read_pem("--tls-key", key_path, PEM_PRIVATE_KEY, "a PEM private key")?;
    let mut tls = ServerTlsConfig::new().identity(Identity::from_pem(cert, key));
    if let Some(ca_path) = agent_ca {
        let ca = read_pem("--agent-ca", ca_path, PEM_CERTIFICATE, "a PEM certificate")?;
        tls = tls
            .client_ca_root(Certificate::from_pem(ca))
            .client_auth_optional(true);
    }
    let server = Server::builder().tls_config(tls).map_err(|e| {
        anyhow::anyhow!(
            "--tls-cert/--tls-key: {} and {} are not a usable certificate and key: {}",
            cert_path.display(),
            key_path.display(),
            causes(&e)
        )
    })?;
    Ok(Some(server))
}

/// The client's TLS setting for `endpoint`: the CA from `--ca-cert` for https, nothing
/// for http. The server's name is checked against the endpoint's host.
pub fn client_config(
    endpoint: &str,
    host: &str,
    ca_cert: Option<&Path>,
) -> anyhow::Result<Option<ClientTlsConfig>> {
    if !endpoint.starts_with("https://") {
        return Ok(None);
    }
    let Some(path) = ca_cert else {
        bail!("--ca-cert: missing; the https endpoint {endpoint} needs the CA certificate that signed the server's certificate (or GPUFLEET_CA_CERT)");
    };
    let ca = read_pem("--ca-cert", path, PEM_CERTIFICATE, "a PEM certificate")?;
    Ok(Some(
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca))
            .domain_name(host),
    ))
}

/// The file's text, which must contain `marker` (the PEM block it should hold).
fn read_pem(flag: &str, path: &Path, marker: &str, what: &str) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("{flag}: cannot read {}", path.display()))?;
    if !text.contains(marker) {
        bail!(
            "{flag}: {} does not hold {what} (no {marker} line)",
            path.display()
        );
    }
    Ok(text)
}

/// An error and its sources in one line: tonic's own text ("transport error") says
/// nothing, the reason is in the chain.
pub fn causes(err: &dyn std::error::Error) -> String {
    let mut words = vec![err.to_string()];
    let mut source = err.source();
    while let Some(e) = source {
        words.push(e.to_string());
        source = e.source();
    }
    words.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn no_flags_is_plain_http() {
        assert!(server_config(None, None, None).unwrap().is_none());
    }

    #[test]
    fn one_flag_without_the_other_names_the_missing_one() {
        let p = Path::new("/x.pem");
        let err = server_config(Some(p), None, None)
            .err()
            .unwrap()
            .to_string();
        assert!(err.starts_with("--tls-key: missing"), "{err}");
        let err = server_config(None, Some(p), None)
            .err()
            .unwrap()
            .to_string();
        assert!(err.starts_with("--tls-cert: missing"), "{err}");
    }

    #[test]
    fn unreadable_or_non_pem_files_name_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        let absent = dir.path().join("absent.pem");
        let text = write(dir.path(), "text.pem", "not a certificate\n");
        let err = format!(
            "{:#}",
            server_config(Some(&absent), Some(&text), None)
                .err()
                .unwrap()
        );
        assert!(err.starts_with("--tls-cert: cannot read"), "{err}");
        let err = format!(
            "{:#}",
            server_config(Some(&text), Some(&text), None).err().unwrap()
        );
        assert!(
            err.starts_with("--tls-cert:") && err.contains("PEM certificate"),
            "{err}"
        );
        let cert = write(
            dir.path(),
            "c.pem",
            "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n",
        );
        let err = format!(
            "{:#}",
            server_config(Some(&cert), Some(&text), None).err().unwrap()
        );
        assert!(
            err.starts_with("--tls-key:") && err.contains("PEM private key"),
            "{err}"
        );
    }

    #[test]
    fn https_client_needs_a_ca_and_http_needs_none() {
        assert!(client_config("http://h:1", "h", None).unwrap().is_none());
        let err = client_config("https://h:1", "h", None)
            .err()
            .unwrap()
            .to_string();
        assert!(err.starts_with("--ca-cert: missing"), "{err}");
    }
}
