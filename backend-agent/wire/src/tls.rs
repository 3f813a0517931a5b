//! TLS for the API's clients: the CA that the admin client (`fleet`, `nodes`) and the node
//! agents trust from `--ca-cert`. (The server's side is `server_tls`.) Every error names
//! the flag.

use std::path::Path;

use anyhow::{bail, Context};
use tonic::transport::{Certificate, ClientTlsConfig};

const PEM_CERTIFICATE: &str = "-----BEGIN CERTIFICATE-----";

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
