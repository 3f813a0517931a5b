//! AutoMTLS: the server's own certificate, made at start, and the check that a connection
//! presents the client certificate Terraform gave in `PLUGIN_CLIENT_CERT`.
//!
//! go-plugin's client makes a fresh self-signed certificate per plugin start and requires
//! the server's to be the one in the handshake line; the server, in turn, requires the
//! client's (go-plugin servers use `RequireAndVerifyClientCert` with that certificate as the
//! only root). Here a connection must present exactly that certificate and prove it holds
//! its key (the TLS handshake signature): anyone else on the machine who can reach the
//! socket is refused before any gRPC is served.
//!
//! Terraform's certificate is ECDSA P-521 with SHA-512, which ring (rustls' provider here)
//! does not verify, so that one signature scheme is verified with RustCrypto's `p521`;
//! every other scheme is ring's.

use std::sync::Arc;

use anyhow::Context;
use tokio_rustls::rustls;
use tokio_rustls::rustls::client::danger::HandshakeSignatureValid;
use tokio_rustls::rustls::crypto::WebPkiSupportedAlgorithms;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{
    alg_id, AlgorithmIdentifier, CertificateDer, InvalidSignature, PrivateKeyDer,
    PrivatePkcs8KeyDer, SignatureVerificationAlgorithm, UnixTime,
};
use tokio_rustls::rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use tokio_rustls::rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, SignatureScheme,
};

/// ECDSA over P-521 with SHA-512, for webpki's signature checks.
#[derive(Debug)]
struct EcdsaP521Sha512;

impl SignatureVerificationAlgorithm for EcdsaP521Sha512 {
    fn verify_signature(
        &self,
        public_key: &[u8],
        message: &[u8],
        signature: &[u8],
    ) -> Result<(), InvalidSignature> {
        use p521::ecdsa::signature::Verifier;
        let key =
            p521::ecdsa::VerifyingKey::from_sec1_bytes(public_key).map_err(|_| InvalidSignature)?;
        let signature =
            p521::ecdsa::Signature::from_der(signature).map_err(|_| InvalidSignature)?;
        key.verify(message, &signature)
            .map_err(|_| InvalidSignature)
    }

    fn public_key_alg_id(&self) -> AlgorithmIdentifier {
        alg_id::ECDSA_P521
    }

    fn signature_alg_id(&self) -> AlgorithmIdentifier {
        alg_id::ECDSA_SHA512
    }
}

static ECDSA_P521_SHA512: EcdsaP521Sha512 = EcdsaP521Sha512;
static P521_ONLY: [&dyn SignatureVerificationAlgorithm; 1] = [&ECDSA_P521_SHA512];

/// ring's signature algorithms plus P-521 (made once per process: rustls wants them
/// `'static`).
fn algorithms() -> WebPkiSupportedAlgorithms {
    static ALGORITHMS: std::sync::OnceLock<WebPkiSupportedAlgorithms> = std::sync::OnceLock::new();
    *ALGORITHMS.get_or_init(|| {
        let ring = rustls::crypto::ring::default_provider().signature_verification_algorithms;
        let mut all = ring.all.to_vec();
        all.push(&ECDSA_P521_SHA512);
        let mut mapping = ring.mapping.to_vec();
        mapping.push((SignatureScheme::ECDSA_NISTP521_SHA512, &P521_ONLY[..]));
        WebPkiSupportedAlgorithms {
            all: Box::leak(all.into_boxed_slice()),
            mapping: Box::leak(mapping.into_boxed_slice()),
        }
    })
}

/// Accepts exactly one client certificate, required on every connection.
#[derive(Debug)]
struct PinnedClientCert {
    der: CertificateDer<'static>,
}

impl ClientCertVerifier for PinnedClientCert {
    fn client_auth_mandatory(&self) -> bool {
        true
    }

    /// No hints: Go's client then offers its only certificate.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        if end_entity.as_ref() == self.der.as_ref() {
            Ok(ClientCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::UnknownIssuer,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &algorithms())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &algorithms())
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        algorithms().supported_schemes()
    }
}

/// The server's side of AutoMTLS.
pub struct ServerTls {
    pub config: Arc<rustls::ServerConfig>,
    /// The server's certificate (DER), for the handshake line.
    pub cert_der: Vec<u8>,
}

/// A fresh self-signed server certificate for `localhost` (what go-plugin's client checks
/// the name against), and a TLS 1.2+ configuration that requires `client_cert_pem`.
pub fn server(client_cert_pem: &str) -> anyhow::Result<ServerTls> {
    let client = CertificateDer::from_pem_slice(client_cert_pem.as_bytes())
        .context("PLUGIN_CLIENT_CERT is not a PEM certificate")?;

    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()])?;
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::seconds(30);
    params.not_after = now + time::Duration::days(365);
    let mut name = rcgen::DistinguishedName::new();
    name.push(rcgen::DnType::OrganizationName, "gpufleet");
    name.push(rcgen::DnType::CommonName, "localhost");
    params.distinguished_name = name;
    // The client trusts exactly this certificate (its only root for the connection). It
    // is no CA: Go's client accepts a leaf that is itself in its roots, and webpki-based
    // clients refuse a CA certificate used as the server's own.
    params.is_ca = rcgen::IsCa::ExplicitNoCa;
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::DigitalSignature,
        rcgen::KeyUsagePurpose::KeyEncipherment,
        rcgen::KeyUsagePurpose::KeyAgreement,
    ];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384)?;
    let cert = params.self_signed(&key)?;
    let cert_der = cert.der().to_vec();

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(Arc::new(PinnedClientCert {
            der: client.into_owned(),
        }))
        .with_single_cert(
            vec![CertificateDer::from(cert_der.clone())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )?;
    // gRPC clients (grpc-go since 1.67) require HTTP/2 negotiated through ALPN.
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(ServerTls {
        config: Arc::new(config),
        cert_der,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use p521::ecdsa::signature::Signer;

    #[test]
    fn p521_signatures_verify_and_a_forged_one_does_not() {
        let secret = [7u8; 66];
        let mut secret = secret;
        secret[0] = 0; // below the group order
        let signing = p521::ecdsa::SigningKey::from_slice(&secret).unwrap();
        let verifying = p521::ecdsa::VerifyingKey::from(&signing);
        let public = verifying.to_encoded_point(false);
        let message = b"TLS 1.3, client CertificateVerify";
        let signature: p521::ecdsa::Signature = signing.sign(message);
        let der = signature.to_der();
        assert!(ECDSA_P521_SHA512
            .verify_signature(public.as_bytes(), message, der.as_bytes())
            .is_ok());
        assert!(ECDSA_P521_SHA512
            .verify_signature(public.as_bytes(), b"another message", der.as_bytes())
            .is_err());
    }

    #[test]
    fn only_the_pinned_certificate_is_accepted() {
        let make = || {
            let key = rcgen::KeyPair::generate().unwrap();
            rcgen::CertificateParams::new(vec!["localhost".into()])
                .unwrap()
                .self_signed(&key)
                .unwrap()
        };
        let ours = make();
        let theirs = make();
        let verifier = PinnedClientCert {
            der: ours.der().clone(),
        };
        assert!(verifier.client_auth_mandatory());
        let now = UnixTime::now();
        assert!(verifier.verify_client_cert(ours.der(), &[], now).is_ok());
        assert!(verifier.verify_client_cert(theirs.der(), &[], now).is_err());
        assert!(verifier
            .supported_verify_schemes()
            .contains(&SignatureScheme::ECDSA_NISTP521_SHA512));
    }

    #[test]
    fn the_server_config_requires_h2_and_takes_a_pem_client_certificate() {
        let key = rcgen::KeyPair::generate().unwrap();
        let client = rcgen::CertificateParams::new(vec!["localhost".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let tls = server(&client.pem()).unwrap();
        assert_eq!(tls.config.alpn_protocols, vec![b"h2".to_vec()]);
        assert!(!tls.cert_der.is_empty());
        assert!(server("not a certificate").is_err());
    }
}
