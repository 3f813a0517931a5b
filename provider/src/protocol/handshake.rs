//! go-plugin's handshake, the server's side: what the client's environment must say before
//! the provider serves anything, and the line that tells the client where to connect.
//!
//! - `TF_PLUGIN_MAGIC_COOKIE` must carry Terraform's cookie: without it the binary was not
//!   started by Terraform and refuses to run.
//! - `PLUGIN_PROTOCOL_VERSIONS` lists the plugin protocol versions the client speaks; the
//!   provider speaks 6 only, and refuses a client that does not.
//! - `PLUGIN_CLIENT_CERT` is the client's certificate (AutoMTLS): connections must present
//!   it. A client that disabled TLS (`TF_DISABLE_PLUGIN_TLS`) is refused: a provider that
//!   holds a backend token serves no one it cannot authenticate.
//! - The line is `CORE|APP|NETWORK|ADDRESS|PROTOCOL|CERT`: go-plugin's core protocol 1,
//!   plugin protocol 6, `unix` and the socket's path, `grpc`, and the server's certificate
//!   (DER, standard base64 without padding).

use base64::Engine;

pub const MAGIC_COOKIE_KEY: &str = "TF_PLUGIN_MAGIC_COOKIE";
pub const MAGIC_COOKIE_VALUE: &str =
    "d602bf8f470bc67ca7faa0386276bbdd4330efaf76d1a219cb4d6991ca9872b2";
/// go-plugin's own protocol version (the first field of the handshake line).
const CORE_PROTOCOL_VERSION: u32 = 1;
/// The Terraform plugin protocol this provider speaks.
pub const PLUGIN_PROTOCOL_VERSION: u32 = 6;

/// What the client's environment settles.
#[derive(Debug, PartialEq, Eq)]
pub struct Negotiated {
    /// The client's certificate (PEM) that every connection must present.
    pub client_cert_pem: String,
}

/// Checks the client's environment (`env` reads one variable). The error is the message
/// for whoever started the binary.
pub fn negotiate(env: impl Fn(&str) -> Option<String>) -> Result<Negotiated, String> {
    if env(MAGIC_COOKIE_KEY).as_deref() != Some(MAGIC_COOKIE_VALUE) {
        return Err(
            "This binary is a Terraform provider plugin: Terraform starts it. It is not \
             meant to be run directly; run terraform, which loads it."
                .to_string(),
        );
    }
    // An absent list means a client that predates negotiation: it speaks the version the
    // plugin announces, as go-plugin's own servers assume.
    if let Some(versions) = env("PLUGIN_PROTOCOL_VERSIONS").filter(|v| !v.trim().is_empty()) {
        let speaks_ours = versions
            .split(',')
            .any(|v| v.trim().parse::<u32>() == Ok(PLUGIN_PROTOCOL_VERSION));
        if !speaks_ours {
            return Err(format!(
                "Incompatible plugin protocol: this provider speaks version {PLUGIN_PROTOCOL_VERSION}, \
                 the client speaks {versions}. Use Terraform 1.0 or later."
            ));
        }
    }
    let client_cert_pem = env("PLUGIN_CLIENT_CERT")
        .filter(|c| !c.trim().is_empty())
        .ok_or_else(|| {
            "No client certificate (PLUGIN_CLIENT_CERT): this provider serves only over mutual \
             TLS. Do not set TF_DISABLE_PLUGIN_TLS."
                .to_string()
        })?;
    Ok(Negotiated { client_cert_pem })
}

/// The line printed on stdout once the server listens on the unix socket `path`.
pub fn line(path: &str, server_cert_der: &[u8]) -> String {
    let cert = base64::engine::general_purpose::STANDARD_NO_PAD.encode(server_cert_der);
    format!("{CORE_PROTOCOL_VERSION}|{PLUGIN_PROTOCOL_VERSION}|unix|{path}|grpc|{cert}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    const COOKIE: (&str, &str) = (MAGIC_COOKIE_KEY, MAGIC_COOKIE_VALUE);
    const CERT: (&str, &str) = ("PLUGIN_CLIENT_CERT", "-----BEGIN CERTIFICATE-----");

    #[test]
    fn without_the_cookie_it_refuses() {
        let err = negotiate(env(&[CERT])).unwrap_err();
        assert!(err.contains("not meant to be run directly"), "{err}");
        let wrong = negotiate(env(&[(MAGIC_COOKIE_KEY, "nope"), CERT]));
        assert!(wrong.is_err());
    }

    #[test]
    fn version_6_must_be_among_the_clients() {
        assert!(negotiate(env(&[COOKIE, CERT, ("PLUGIN_PROTOCOL_VERSIONS", "5,6")])).is_ok());
        assert!(negotiate(env(&[COOKIE, CERT])).is_ok(), "absent: assumed");
        let err = negotiate(env(&[COOKIE, CERT, ("PLUGIN_PROTOCOL_VERSIONS", "4,5")])).unwrap_err();
        assert!(err.contains("speaks version 6"), "{err}");
    }

    #[test]
    fn without_a_client_certificate_it_refuses() {
        let err = negotiate(env(&[COOKIE])).unwrap_err();
        assert!(err.contains("mutual TLS"), "{err}");
    }

    #[test]
    fn the_line_names_unix_and_the_certificate_without_padding() {
        assert_eq!(
            line("/tmp/x/plugin.sock", &[1, 2]),
            "1|6|unix|/tmp/x/plugin.sock|grpc|AQI"
        );
    }
}
