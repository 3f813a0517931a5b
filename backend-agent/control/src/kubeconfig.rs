//! Credentials of a Kubernetes tenant cluster: a kubeconfig with the cluster's own CA and
//! a client certificate signed by it.
//!
//! No Kubernetes API server runs behind a cluster today (its control plane is simulated),
//! but the credentials are the real kind: a per-cluster CA (`certificate-authority-data`)
//! and a client certificate for the tenant (CN = tenant, O = `system:masters`: a team owns
//! its dedicated cluster). On a real head node `kubeadm init` would take this CA (its key
//! kept on that node) and serve the endpoint; the CA key is not kept by the control plane.

use anyhow::Context;
use base64::Engine;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use time::{Duration, OffsetDateTime};

/// How long the client certificate and its CA are valid.
const VALIDITY: Duration = Duration::days(365);
/// Leeway for clocks behind ours.
const CLOCK_SKEW: Duration = Duration::minutes(5);
/// The group that makes the tenant administrator of its own cluster.
const ADMIN_GROUP: &str = "system:masters";

/// The PEM texts a kubeconfig carries.
pub struct Issued {
    pub ca_pem: String,
    pub client_pem: String,
    pub client_key_pem: String,
}

/// A new CA for `cluster` and a client certificate for `tenant` signed by it.
pub fn issue(tenant: &str, cluster: &str) -> anyhow::Result<Issued> {
    let now = OffsetDateTime::now_utc();
    let mut ca = CertificateParams::default();
    ca.distinguished_name = DistinguishedName::new();
    ca.distinguished_name.push(
        DnType::CommonName,
        format!("gpufleet {tenant}/{cluster} CA"),
    );
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca.not_before = now - CLOCK_SKEW;
    ca.not_after = now + VALIDITY;
    let ca_key = KeyPair::generate().context("cannot generate the cluster CA's key")?;
    let ca_cert = ca
        .self_signed(&ca_key)
        .context("cannot sign the cluster CA")?;

    let mut client = CertificateParams::default();
    client.distinguished_name = DistinguishedName::new();
    client.distinguished_name.push(DnType::CommonName, tenant);
    client
        .distinguished_name
        .push(DnType::OrganizationName, ADMIN_GROUP);
    client.is_ca = IsCa::ExplicitNoCa;
    client.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    client.use_authority_key_identifier_extension = true;
    client.not_before = now - CLOCK_SKEW;
    client.not_after = now + VALIDITY;
    let client_key = KeyPair::generate().context("cannot generate the client key")?;
    let client_cert = client
        .signed_by(&client_key, &ca_cert, &ca_key)
        .context("cannot sign the client certificate")?;
    Ok(Issued {
        ca_pem: ca_cert.pem(),
        client_pem: client_cert.pem(),
        client_key_pem: client_key.serialize_pem(),
    })
}

/// The kubeconfig for `tenant` on `cluster` at `server`.
pub fn render(tenant: &str, cluster: &str, server: &str, issued: &Issued) -> String {
    let b64 = |pem: &str| base64::engine::general_purpose::STANDARD.encode(pem.as_bytes());
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {cluster}\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\ncontexts:\n- name: {tenant}@{cluster}\n  context:\n    cluster: {cluster}\n    user: {tenant}\ncurrent-context: {tenant}@{cluster}\nusers:\n- name: {tenant}\n  user:\n    client-certificate-data: {cert}\n    client-key-data: {key}\n",
        ca = b64(&issued.ca_pem),
        cert = b64(&issued.client_pem),
        key = b64(&issued.client_key_pem),
    )
}

#[cfg(test)]
mod tests {
    use base64::Engine;

    /// The base64 value of `field` in a kubeconfig, decoded.
    fn field(kubeconfig: &str, field: &str) -> String {
        let line = kubeconfig
            .lines()
            .find_map(|l| l.trim().strip_prefix(&format!("{field}: ")))
            .unwrap_or_else(|| panic!("{field} missing from\n{kubeconfig}"));
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(line)
            .unwrap();
        String::from_utf8(bytes).unwrap()
    }

    fn openssl(args: &[&str]) -> (bool, String) {
        let out = std::process::Command::new("openssl")
            .args(args)
            .output()
            .expect("openssl runs");
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }

    #[test]
    fn the_client_certificate_verifies_against_the_clusters_own_ca_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = |n: &str| dir.path().join(n).display().to_string();
        let a = super::issue("team-a", "train").unwrap();
        let config = super::render("team-a", "train", "https://train.example:6443", &a);
        assert!(config.contains("server: https://train.example:6443"));
        assert!(config.contains("current-context: team-a@train"));
        std::fs::write(path("ca.pem"), field(&config, "certificate-authority-data")).unwrap();
        std::fs::write(
            path("client.pem"),
            field(&config, "client-certificate-data"),
        )
        .unwrap();
        let key = field(&config, "client-key-data");
        assert!(key.starts_with("-----BEGIN PRIVATE KEY-----"));

        let (ok, out) = openssl(&["verify", "-CAfile", &path("ca.pem"), &path("client.pem")]);
        assert!(ok, "{out}");
        let (_, subject) = openssl(&["x509", "-noout", "-subject", "-in", &path("client.pem")]);
        assert!(
            subject.contains("CN = team-a") && subject.contains("O = system:masters"),
            "{subject}"
        );

        // Another cluster's CA does not vouch for this client.
        let other = super::issue("team-b", "train").unwrap();
        std::fs::write(path("other-ca.pem"), other.ca_pem).unwrap();
        let (ok, out) = openssl(&[
            "verify",
            "-CAfile",
            &path("other-ca.pem"),
            &path("client.pem"),
        ]);
        assert!(!ok, "another cluster's CA accepted the client: {out}");
    }
}
