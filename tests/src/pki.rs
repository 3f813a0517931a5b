//! Test certificates for a backend served over TLS: a CA and a server certificate it signed
//! for `localhost` and 127.0.0.1, as PEM text.

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};

/// The server's certificate and key, and the CA certificate clients must trust.
#[derive(Clone, Debug)]
pub struct ServerTls {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl ServerTls {
    /// A fresh CA named `name` and a server certificate it signed.
    pub fn generate(name: &str) -> ServerTls {
        let ca_key = KeyPair::generate().expect("generate the CA key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = ca_params.self_signed(&ca_key).expect("self-sign the CA");

        let key = KeyPair::generate().expect("generate the server key");
        let params = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .expect("server params");
        let cert = params
            .signed_by(&key, &ca, &ca_key)
            .expect("sign the server certificate");
        ServerTls {
            ca_pem: ca.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}
