//! A small certificate authority for mutual TLS between the control plane and the
//! node agents. The first run creates the CA (`ca.pem`, `ca.key`) in `--dir` and the control
//! plane's server certificate (`server.pem`, `server.key`); every run issues a client
//! certificate per `--agent` (`agent-<NAME>.pem`, `agent-<NAME>.key`), all signed by that
//! CA. The server certificate is issued again for the `--server-name`s when they are given,
//! renewed with the names it already has when a run asks for nothing else, and left as it
//! is when a run only issues agent certificates: `serve` reloads it, and a certificate
//! rewritten for other names would cut off every remote client. Later runs reuse the CA
//! as it is on disk, so certificates issued earlier stay valid. Private keys are written
//! with mode 0600. Every error names the file or the flag.

use std::fs::{self, OpenOptions, Permissions};
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use time::{Duration, OffsetDateTime};

/// The CA's common name; its whole subject is this one attribute.
const CA_COMMON_NAME: &str = "gpufleet CA";
/// How long the CA is valid: longer than what it issues, so that a certificate issued late
/// in the CA's life does not outlive it.
const CA_VALIDITY: Duration = Duration::days(3650);
/// How long the server and agent certificates are valid.
const CERT_VALIDITY: Duration = Duration::days(365);
/// Certificates are valid from this long before they are issued, for clocks that lag.
const CLOCK_SKEW: Duration = Duration::hours(1);
/// The server certificate's names when `--server-name` is not given.
const DEFAULT_SERVER_NAMES: [&str; 2] = ["localhost", "127.0.0.1"];

const KEY_MODE: u32 = 0o600;
pub(crate) const CERT_MODE: u32 = 0o644;
/// The mode of `--dir` when this creates it.
const DIR_MODE: u32 = 0o700;

/// `issue` with the default server names: a CA, a server certificate for
/// localhost and 127.0.0.1, and a client certificate per agent in `dir`.
#[cfg(test)]
pub fn issue_for_tests(dir: &Path, agents: &[&str]) -> anyhow::Result<()> {
    let agents: Vec<String> = agents.iter().map(|a| a.to_string()).collect();
    issue(dir, &[], &agents).map(|_| ())
}

/// Creates the CA in `dir` when it is not there yet, then issues the server certificate
/// (for `server_names`, and always localhost and 127.0.0.1; see `server_names_to_issue`
/// for when it is kept) and one client certificate per agent name: the paths of the files
/// written, in order. The names are checked before anything is written.
pub fn issue(
    dir: &Path,
    server_names: &[String],
    agents: &[String],
) -> anyhow::Result<Vec<PathBuf>> {
    let agents = agent_names(agents)?;
    let server_sans = match server_names_to_issue(dir, server_names, !agents.is_empty())? {
        Some(names) => Some(server_sans(&names)?),
        None => None,
    };

    if !dir.is_dir() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(dir)
            .with_context(|| format!("--dir: cannot create {}", dir.display()))?;
    }
    let mut written = Vec::new();
    let now = OffsetDateTime::now_utc();
    let (ca, ca_key) = load_or_create_ca(dir, now, &mut written)?;

    if let Some(server_sans) = server_sans {
        // The server: its first name is also its common name.
        let common_name = match &server_sans[0] {
            SanType::DnsName(name) => name.as_str().to_string(),
            SanType::IpAddress(ip) => ip.to_string(),
            other => unreachable!("server names are DNS names or IPs, not {other:?}"),
        };
        let params = leaf_params(
            now,
            &common_name,
            server_sans,
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        issue_leaf(dir, "server", params, &ca, &ca_key, &mut written)?;
    }

    for agent in agents {
        let san =
            SanType::DnsName(agent.try_into().with_context(|| {
                format!("--agent: {agent:?} is not a name a certificate can hold")
            })?);
        let params = leaf_params(now, agent, vec![san], ExtendedKeyUsagePurpose::ClientAuth);
        issue_leaf(
            dir,
            &format!("agent-{agent}"),
            params,
            &ca,
            &ca_key,
            &mut written,
        )?;
    }
    Ok(written)
}

/// The names to issue the server certificate for, or None to keep `server.pem` as it is.
/// Given `--server-name`s win; without them the first run takes the defaults, a run that
/// only issues agent certificates keeps the server certificate, and a run that asks for
/// nothing else renews it with the names it has. A server certificate whose names cannot
/// be read back is refused rather than renewed for localhost only.
fn server_names_to_issue(
    dir: &Path,
    given: &[String],
    agents_asked: bool,
) -> anyhow::Result<Option<Vec<String>>> {
    let path = dir.join("server.pem");
    if !given.is_empty() || !path.exists() {
        return Ok(Some(given.to_vec()));
    }
    if agents_asked {
        return Ok(None);
    }
    let names = fs::read_to_string(&path)
        .ok()
        .and_then(|pem| pem_der(&pem))
        .and_then(|der| subject_alt_names(&der))
        .filter(|names| !names.is_empty());
    match names {
        Some(names) => Ok(Some(names)),
        None => bail!(
            "{}: cannot read the names this server certificate is valid for, so it cannot be renewed with them; give them with --server-name (DNS names or IP addresses)",
            path.display()
        ),
    }
}

/// The CA's parameters. Everything a certificate it signs takes from it (the subject, the
/// key identifier method and the key usages) is the same on every run, so the CA loaded
/// from `ca.pem`/`ca.key` signs exactly as the one that created them.
fn ca_params(now: OffsetDateTime) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, CA_COMMON_NAME);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = now - CLOCK_SKEW;
    params.not_after = now + CA_VALIDITY;
    params
}

/// The CA in `dir`: loaded from `ca.pem` and `ca.key` when both are there, created (and
/// both written) when neither is; one without the other is an error.
pub(crate) fn load_or_create_ca(
    dir: &Path,
    now: OffsetDateTime,
    written: &mut Vec<PathBuf>,
) -> anyhow::Result<(Certificate, KeyPair)> {
    let cert_path = dir.join("ca.pem");
    let key_path = dir.join("ca.key");
    match (cert_path.exists(), key_path.exists()) {
        (true, true) => load_ca(&cert_path, &key_path, now),
        (false, false) => {
            let key = KeyPair::generate().context("cannot generate the CA's key")?;
            let cert = ca_params(now)
                .self_signed(&key)
                .context("cannot self-sign the CA certificate")?;
            write_file(&key_path, &key.serialize_pem(), KEY_MODE)?;
            written.push(key_path);
            write_file(&cert_path, &cert.pem(), CERT_MODE)?;
            written.push(cert_path);
            Ok((cert, key))
        }
        (true, false) => bail!(
            "{}: missing, but {} is there; restore the CA's key, or remove {} to create a new CA (which invalidates every certificate issued so far)",
            key_path.display(),
            cert_path.display(),
            cert_path.display()
        ),
        (false, true) => bail!(
            "{}: missing, but {} is there; restore the CA certificate, or remove {} to create a new CA (which invalidates every certificate issued so far)",
            cert_path.display(),
            key_path.display(),
            key_path.display()
        ),
    }
}

/// The CA of `ca.pem` and `ca.key`, to sign with. The certificate on disk is left as it
/// is; the one returned is rebuilt from `ca_params` and the key, after checking that
/// `ca.pem` has the same subject and public key (so what it signs chains to `ca.pem`).
fn load_ca(
    cert_path: &Path,
    key_path: &Path,
    now: OffsetDateTime,
) -> anyhow::Result<(Certificate, KeyPair)> {
    let key_pem = fs::read_to_string(key_path)
        .with_context(|| format!("{}: cannot read the CA's key", key_path.display()))?;
    let key = KeyPair::from_pem(&key_pem).map_err(|e| {
        anyhow::anyhow!(
            "{}: not a PEM private key rcgen can sign with: {e}",
            key_path.display()
        )
    })?;
    let cert_pem = fs::read_to_string(cert_path)
        .with_context(|| format!("{}: cannot read the CA certificate", cert_path.display()))?;
    let on_disk = pem_block(&cert_pem, "CERTIFICATE")
        .with_context(|| format!("{}: does not hold a PEM certificate", cert_path.display()))?;
    let (subject, public_key) = subject_and_public_key(&on_disk).with_context(|| {
        format!(
            "{}: its certificate is not a DER X.509 certificate",
            cert_path.display()
        )
    })?;

    let rebuilt = ca_params(now)
        .self_signed(&key)
        .context("cannot rebuild the CA certificate")?;
    let (want_subject, want_public_key) = subject_and_public_key(rebuilt.der())
        .context("cannot read back the rebuilt CA certificate")?;
    if public_key != want_public_key {
        bail!(
            "{}: its public key is not the one of {}; the CA certificate and its key do not belong together",
            cert_path.display(),
            key_path.display()
        );
    }
    if subject != want_subject {
        bail!(
            "{}: not a gpufleet CA (its subject is not CN={CA_COMMON_NAME})",
            cert_path.display()
        );
    }
    Ok((rebuilt, key))
}

/// The parameters of a server or agent certificate.
fn leaf_params(
    now: OffsetDateTime,
    common_name: &str,
    sans: Vec<SanType>,
    usage: ExtendedKeyUsagePurpose,
) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.subject_alt_names = sans;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![usage];
    params.use_authority_key_identifier_extension = true;
    params.not_before = now - CLOCK_SKEW;
    params.not_after = now + CERT_VALIDITY;
    params
}

/// Signs `params` with a new key and writes `<stem>.key` and `<stem>.pem`.
fn issue_leaf(
    dir: &Path,
    stem: &str,
    params: CertificateParams,
    ca: &Certificate,
    ca_key: &KeyPair,
    written: &mut Vec<PathBuf>,
) -> anyhow::Result<()> {
    let cert_path = dir.join(format!("{stem}.pem"));
    let key_path = dir.join(format!("{stem}.key"));
    let key = KeyPair::generate()
        .with_context(|| format!("{}: cannot generate the key", key_path.display()))?;
    let cert = params
        .signed_by(&key, ca, ca_key)
        .with_context(|| format!("{}: cannot sign the certificate", cert_path.display()))?;
    write_file(&key_path, &key.serialize_pem(), KEY_MODE)?;
    written.push(key_path);
    write_file(&cert_path, &cert.pem(), CERT_MODE)?;
    written.push(cert_path);
    Ok(())
}

/// The server certificate's subject alternative names from `--server-name` (the defaults
/// when none is given): IP addresses as IP names, the rest as DNS names. Duplicates are
/// dropped.
fn server_sans(names: &[String]) -> anyhow::Result<Vec<SanType>> {
    // The given names first (the first is the common name), then always the local ones:
    // admin commands on the control plane's own host connect to localhost.
    let names: Vec<&str> = names
        .iter()
        .map(String::as_str)
        .chain(DEFAULT_SERVER_NAMES)
        .collect();
    let mut sans = Vec::new();
    for name in names {
        let san = if let Ok(ip) = name.parse::<IpAddr>() {
            SanType::IpAddress(ip)
        } else if is_dns_name(name) {
            SanType::DnsName(name.try_into().with_context(|| {
                format!("--server-name: {name:?} is not a name a certificate can hold")
            })?)
        } else {
            bail!(
                "--server-name: {name:?} is neither an IP address nor a DNS name (dot-separated labels of 1 to 63 letters, digits and '-', the first of which may be '*')"
            );
        };
        if !sans.contains(&san) {
            sans.push(san);
        }
    }
    Ok(sans)
}

/// The `--agent` names, each checked to be a DNS label; duplicates are dropped.
pub(crate) fn agent_names(agents: &[String]) -> anyhow::Result<Vec<&str>> {
    let mut names = Vec::new();
    for agent in agents {
        if !is_agent_name(agent) {
            bail!(
                "--agent: {agent:?} is not a DNS label (1 to 63 lowercase letters, digits and '-', not starting or ending with '-')"
            );
        }
        if !names.contains(&agent.as_str()) {
            names.push(agent.as_str());
        }
    }
    Ok(names)
}

/// A DNS label in lowercase: 1 to 63 of `a-z`, `0-9` and `-`, not starting or ending with `-`.
fn is_agent_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// A DNS name: at most 253 characters of dot-separated labels, each 1 to 63 letters,
/// digits and `-` not starting or ending with `-`; the first label may be the wildcard `*`.
fn is_dns_name(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').enumerate().all(|(i, label)| {
            (i == 0 && label == "*" && name.len() > 1)
                || ((1..=63).contains(&label.len())
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                    && !label.starts_with('-')
                    && !label.ends_with('-'))
        })
}

/// Writes `contents` to `path` with `mode`, through a temporary file renamed over `path`,
/// so that `path` is never half-written and a key is never readable by others.
pub(crate) fn write_file(path: &Path, contents: &str, mode: u32) -> anyhow::Result<()> {
    let name = path
        .file_name()
        .with_context(|| format!("{}: not a file name", path.display()))?;
    let tmp = path.with_file_name(format!(".{}.tmp", name.to_string_lossy()));
    let result = (|| -> std::io::Result<()> {
        match fs::remove_file(&tmp) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        // The umask may have taken bits off the mode the file was created with.
        file.set_permissions(Permissions::from_mode(mode))?;
        file.write_all(contents.as_bytes())?;
        file.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("{}: cannot write", path.display()));
    }
    Ok(())
}

/// The DER bytes of the first PEM certificate in `text`.
pub fn pem_der(text: &str) -> Option<Vec<u8>> {
    pem_block(text, "CERTIFICATE")
}

/// The DER bytes of the first `-----BEGIN <label>-----` block of `text`.
pub(crate) fn pem_block(text: &str, label: &str) -> Option<Vec<u8>> {
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let start = text.find(&begin)? + begin.len();
    let len = text[start..].find(&end)?;
    base64_decode(&text[start..start + len])
}

/// Standard base64 (whitespace ignored, `=` padding only at the end).
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits, mut padding) = (0u32, 0u32, false);
    for c in text.bytes().filter(|c| !c.is_ascii_whitespace()) {
        let value = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => {
                padding = true;
                continue;
            }
            _ => return None,
        };
        if padding {
            return None;
        }
        acc = (acc << 6) | u32::from(value);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// One DER element at the start of `input`.
struct Der<'a> {
    tag: u8,
    /// The whole element: tag, length and contents.
    whole: &'a [u8],
    contents: &'a [u8],
    /// What follows the element.
    rest: &'a [u8],
}

/// The DER element at the start of `input` (definite lengths of up to 4 bytes).
fn der_element(input: &[u8]) -> Option<Der<'_>> {
    let (&tag, rest) = input.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 || rest.len() < count {
            return None;
        }
        let (bytes, after) = rest.split_at(count);
        rest = after;
        bytes.iter().fold(0, |len, &b| (len << 8) | usize::from(b))
    };
    if rest.len() < len {
        return None;
    }
    let header = input.len() - rest.len();
    Some(Der {
        tag,
        whole: &input[..header + len],
        contents: &rest[..len],
        rest: &rest[len..],
    })
}

/// The subject's common name (CN) of the X.509 certificate `der`: the node agent's name
/// in the certificates `pki --agent NAME` issues.
pub fn common_name(der: &[u8]) -> Option<String> {
    // The attribute type 2.5.4.3 (id-at-commonName) as DER, then a string element.
    const CN_OID: [u8; 5] = [0x06, 0x03, 0x55, 0x04, 0x03];
    let (subject, _) = subject_and_public_key(der)?;
    let at = subject.windows(CN_OID.len()).position(|w| w == CN_OID)?;
    let value = der_element(&subject[at + CN_OID.len()..])?;
    // UTF8String, PrintableString or IA5String.
    if ![0x0c, 0x13, 0x16].contains(&value.tag) {
        return None;
    }
    String::from_utf8(value.contents.to_vec()).ok()
}

/// The serial number of the X.509 certificate `der`: the INTEGER's contents, as a CRL
/// names the certificates it revokes.
pub fn serial(der: &[u8]) -> Option<Vec<u8>> {
    let fields = tbs_fields(der)?;
    match fields.first()? {
        (INTEGER, whole) => Some(der_element(whole)?.contents.to_vec()),
        _ => None,
    }
}

/// The subject alternative names of the X.509 certificate `der`, in order: DNS names, and
/// IP addresses written as text. None when it has none, or a kind of name `pki` does not
/// issue (renewing would drop it).
pub fn subject_alt_names(der: &[u8]) -> Option<Vec<String>> {
    // The extension id 2.5.29.17 (id-ce-subjectAltName) as DER.
    const SAN_OID: [u8; 5] = [0x06, 0x03, 0x55, 0x1d, 0x11];
    const EXTENSIONS: u8 = 0xa3;
    const BOOLEAN: u8 = 0x01;
    const OCTET_STRING: u8 = 0x04;
    const DNS_NAME: u8 = 0x82;
    const IP_ADDRESS: u8 = 0x87;
    let fields = tbs_fields(der)?;
    let (_, explicit) = fields.iter().find(|(tag, _)| *tag == EXTENSIONS)?;
    let extensions = der_element(der_element(explicit)?.contents)?;
    let mut rest = extensions.contents;
    while !rest.is_empty() {
        let extension = der_element(rest)?;
        rest = extension.rest;
        let id = der_element(extension.contents)?;
        if id.whole != SAN_OID {
            continue;
        }
        // critical BOOLEAN DEFAULT FALSE, then the value.
        let mut value = der_element(id.rest)?;
        if value.tag == BOOLEAN {
            value = der_element(value.rest)?;
        }
        let general_names = der_element(value.contents)?;
        if value.tag != OCTET_STRING || general_names.tag != SEQUENCE {
            return None;
        }
        let mut names = Vec::new();
        let mut rest = general_names.contents;
        while !rest.is_empty() {
            let name = der_element(rest)?;
            rest = name.rest;
            let text = match (name.tag, name.contents.len()) {
                (DNS_NAME, _) => String::from_utf8(name.contents.to_vec()).ok()?,
                (IP_ADDRESS, 4) => {
                    IpAddr::from(<[u8; 4]>::try_from(name.contents).ok()?).to_string()
                }
                (IP_ADDRESS, 16) => {
                    IpAddr::from(<[u8; 16]>::try_from(name.contents).ok()?).to_string()
                }
                _ => return None,
            };
            names.push(text);
        }
        return Some(names);
    }
    None
}

const SEQUENCE: u8 = 0x30;
const INTEGER: u8 = 0x02;

/// The subject name and the subject public key info (each a whole DER element) of the
/// X.509 certificate `der`.
fn subject_and_public_key(der: &[u8]) -> Option<(&[u8], &[u8])> {
    // serialNumber, signature, issuer, validity, subject, subjectPublicKeyInfo
    match tbs_fields(der)?.get(4..6)? {
        [(SEQUENCE, subject), (SEQUENCE, public_key)] => Some((subject, public_key)),
        _ => None,
    }
}

/// The fields of the certificate's to-be-signed part after the version (tag and whole
/// element each), from serialNumber on.
fn tbs_fields(der: &[u8]) -> Option<Vec<(u8, &[u8])>> {
    const VERSION: u8 = 0xa0;
    let certificate = der_element(der)?;
    let tbs = der_element(certificate.contents)?;
    if certificate.tag != SEQUENCE || tbs.tag != SEQUENCE {
        return None;
    }
    let mut fields = Vec::new();
    let mut rest = tbs.contents;
    while !rest.is_empty() {
        let field = der_element(rest)?;
        fields.push((field.tag, field.whole));
        rest = field.rest;
    }
    if fields.first()?.0 == VERSION {
        fields.remove(0);
    }
    Some(fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    use tokio_stream::wrappers::TcpListenerStream;
    use tonic::transport::{
        Certificate as TlsCertificate, Channel, ClientTlsConfig, Identity, Server, ServerTlsConfig,
    };

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn mode(path: &Path) -> u32 {
        fs::metadata(path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .permissions()
            .mode()
            & 0o777
    }

    fn file_names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn first_run_writes_the_ca_server_and_agents_with_private_keys_0600() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("nested/pki");
        let written = issue(&dir, &[], &names(&["node-1", "gpu2", "node-1"])).unwrap();
        let expected = [
            "ca.key",
            "ca.pem",
            "server.key",
            "server.pem",
            "agent-node-1.key",
            "agent-node-1.pem",
            "agent-gpu2.key",
            "agent-gpu2.pem",
        ];
        let expected: Vec<PathBuf> = expected.iter().map(|f| dir.join(f)).collect();
        assert_eq!(written, expected);
        assert_eq!(
            file_names(&dir).len(),
            expected.len(),
            "no temporary files left"
        );
        assert_eq!(mode(&dir), DIR_MODE);
        for path in &expected {
            let text = fs::read_to_string(path).unwrap();
            if path.extension().unwrap() == "key" {
                assert_eq!(mode(path), 0o600, "{}", path.display());
                KeyPair::from_pem(&text).expect("a PEM private key");
            } else {
                assert_eq!(mode(path), 0o644, "{}", path.display());
                let der = pem_block(&text, "CERTIFICATE").expect("a PEM certificate");
                subject_and_public_key(&der).expect("an X.509 certificate");
            }
        }
        // Each certificate holds the public key of the key file next to it.
        for stem in ["ca", "server", "agent-node-1", "agent-gpu2"] {
            let key =
                KeyPair::from_pem(&fs::read_to_string(dir.join(format!("{stem}.key"))).unwrap())
                    .unwrap();
            let pem = fs::read_to_string(dir.join(format!("{stem}.pem"))).unwrap();
            let der = pem_block(&pem, "CERTIFICATE").unwrap();
            let (_, public_key) = subject_and_public_key(&der).unwrap();
            assert_eq!(public_key, key.public_key_der(), "{stem}");
        }
    }

    #[test]
    fn the_ca_subject_is_gpufleet_ca() {
        let tmp = tempfile::tempdir().unwrap();
        issue_for_tests(tmp.path(), &[]).unwrap();
        let der = pem_block(
            &fs::read_to_string(tmp.path().join("ca.pem")).unwrap(),
            "CERTIFICATE",
        )
        .unwrap();
        let (subject, _) = subject_and_public_key(&der).unwrap();
        // SEQUENCE { SET { SEQUENCE { OID 2.5.4.3 (commonName), UTF8String "gpufleet CA" } } }
        let mut want = vec![
            0x30, 0x16, 0x31, 0x14, 0x30, 0x12, 0x06, 0x03, 0x55, 0x04, 0x03, 0x0c, 0x0b,
        ];
        want.extend_from_slice(b"gpufleet CA");
        assert_eq!(subject, want.as_slice());
    }

    #[test]
    fn a_second_run_reuses_the_ca_unchanged() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        issue_for_tests(dir, &["a"]).unwrap();
        let ca_pem = fs::read(dir.join("ca.pem")).unwrap();
        let ca_key = fs::read(dir.join("ca.key")).unwrap();
        let server_pem = fs::read(dir.join("server.pem")).unwrap();

        // Only an agent asked for: the server certificate is left as it is.
        let written = issue(dir, &[], &names(&["b"])).unwrap();
        assert_eq!(
            written,
            ["agent-b.key", "agent-b.pem"]
                .iter()
                .map(|f| dir.join(f))
                .collect::<Vec<_>>()
        );
        assert_eq!(fs::read(dir.join("ca.pem")).unwrap(), ca_pem);
        assert_eq!(fs::read(dir.join("ca.key")).unwrap(), ca_key);
        assert_eq!(fs::read(dir.join("server.pem")).unwrap(), server_pem);
        assert!(dir.join("agent-a.pem").exists() && dir.join("agent-b.pem").exists());

        // Nothing asked for: the server certificate is renewed.
        let written = issue(dir, &[], &[]).unwrap();
        assert_eq!(written, [dir.join("server.key"), dir.join("server.pem")]);
        assert_ne!(fs::read(dir.join("server.pem")).unwrap(), server_pem);
        assert_eq!(fs::read(dir.join("ca.pem")).unwrap(), ca_pem);
    }

    fn server_names_on_disk(dir: &Path) -> Vec<String> {
        let pem = fs::read_to_string(dir.join("server.pem")).unwrap();
        subject_alt_names(&pem_der(&pem).unwrap()).unwrap()
    }

    #[test]
    fn runs_without_server_names_keep_the_server_certificates_names() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        issue(
            dir,
            &names(&["cp.example", "10.99.51.5", "fd00::5"]),
            &names(&["a"]),
        )
        .unwrap();
        let want = names(&[
            "cp.example",
            "10.99.51.5",
            "fd00::5",
            "localhost",
            "127.0.0.1",
        ]);
        assert_eq!(server_names_on_disk(dir), want);

        // Adding or renewing an agent certificate, as the guide does.
        for agent in ["b", "a"] {
            issue(dir, &[], &names(&[agent])).unwrap();
            assert_eq!(server_names_on_disk(dir), want, "after --agent {agent}");
        }
        // Renewing the server certificate without its names: the same names, a new key.
        let key = fs::read(dir.join("server.key")).unwrap();
        issue(dir, &[], &[]).unwrap();
        assert_eq!(server_names_on_disk(dir), want);
        assert_ne!(fs::read(dir.join("server.key")).unwrap(), key);
        // Given names still replace them.
        issue(dir, &names(&["new.example"]), &[]).unwrap();
        assert_eq!(
            server_names_on_disk(dir),
            names(&["new.example", "localhost", "127.0.0.1"])
        );
    }

    #[test]
    fn a_server_certificate_whose_names_cannot_be_read_is_not_renewed_without_server_names() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        issue_for_tests(dir, &[]).unwrap();
        fs::write(dir.join("server.pem"), "not a certificate").unwrap();
        let err = format!("{:#}", issue(dir, &[], &[]).unwrap_err());
        assert!(
            err.starts_with(&format!("{}: ", dir.join("server.pem").display())),
            "{err}"
        );
        assert!(err.contains("--server-name"), "{err}");
        assert_eq!(
            fs::read_to_string(dir.join("server.pem")).unwrap(),
            "not a certificate",
            "nothing written"
        );
        // An agent certificate alone does not need them; --server-name replaces it.
        issue(dir, &[], &names(&["a"])).unwrap();
        issue(dir, &names(&["cp.example"]), &[]).unwrap();
        assert_eq!(server_names_on_disk(dir)[0], "cp.example");
    }

    #[test]
    fn bad_agent_names_are_refused_before_anything_is_written() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("pki");
        let long = "a".repeat(64);
        for bad in [
            "",
            "Node1",
            "node_1",
            "node.1",
            "-node",
            "node-",
            "../x",
            "nöde",
            long.as_str(),
        ] {
            let err = issue(&dir, &[], &names(&["ok", bad])).unwrap_err();
            let text = format!("{err:#}");
            assert!(text.starts_with("--agent: "), "{bad:?}: {text}");
            assert!(!dir.exists(), "{bad:?}: nothing may be written");
        }
        assert!(issue(&dir, &[], &names(&[&"a".repeat(63), "0", "a-1"])).is_ok());
    }

    #[test]
    fn bad_server_names_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("pki");
        for bad in ["", "a..b", "-a.example", "a b", "*", "a.*.b", "x_y.example"] {
            let err = issue(&dir, &names(&[bad]), &[]).unwrap_err();
            let text = format!("{err:#}");
            assert!(text.starts_with("--server-name: "), "{bad:?}: {text}");
            assert!(!dir.exists(), "{bad:?}: nothing may be written");
        }
        let sans =
            server_sans(&names(&["gpu.example.com", "10.0.0.5", "::1", "*.example"])).unwrap();
        assert!(matches!(sans[1], SanType::IpAddress(ip) if ip.to_string() == "10.0.0.5"));
        assert!(matches!(sans[2], SanType::IpAddress(ip) if ip.is_ipv6()));
        assert!(matches!(&sans[0], SanType::DnsName(n) if n.as_str() == "gpu.example.com"));
        // The local names are always there, once.
        assert!(matches!(&sans[4], SanType::DnsName(n) if n.as_str() == "localhost"));
        assert!(matches!(sans[5], SanType::IpAddress(ip) if ip.to_string() == "127.0.0.1"));
        let again = server_sans(&names(&["localhost", "cp.example"])).unwrap();
        assert_eq!(again.len(), 3, "{again:?}");
    }

    #[test]
    fn a_ca_that_does_not_fit_is_an_error_naming_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let (one, other) = (tmp.path().join("one"), tmp.path().join("other"));
        issue_for_tests(&one, &[]).unwrap();
        issue_for_tests(&other, &[]).unwrap();

        // A key that is not the CA certificate's.
        fs::copy(other.join("ca.key"), one.join("ca.key")).unwrap();
        let err = format!("{:#}", issue_for_tests(&one, &[]).unwrap_err());
        assert!(
            err.contains(&format!("{}:", one.join("ca.pem").display())),
            "{err}"
        );
        assert!(err.contains("do not belong together"), "{err}");

        // Half a CA.
        fs::remove_file(one.join("ca.key")).unwrap();
        let err = format!("{:#}", issue_for_tests(&one, &[]).unwrap_err());
        assert!(
            err.starts_with(&format!("{}: missing", one.join("ca.key").display())),
            "{err}"
        );
        fs::remove_file(one.join("ca.pem")).unwrap();
        fs::copy(other.join("ca.key"), one.join("ca.key")).unwrap();
        let err = format!("{:#}", issue_for_tests(&one, &[]).unwrap_err());
        assert!(
            err.starts_with(&format!("{}: missing", one.join("ca.pem").display())),
            "{err}"
        );

        // Not PEM.
        fs::write(one.join("ca.pem"), "hello").unwrap();
        let err = format!("{:#}", issue_for_tests(&one, &[]).unwrap_err());
        assert!(err.contains("does not hold a PEM certificate"), "{err}");
        fs::copy(other.join("ca.pem"), one.join("ca.pem")).unwrap();
        fs::write(one.join("ca.key"), "hello").unwrap();
        let err = format!("{:#}", issue_for_tests(&one, &[]).unwrap_err());
        assert!(
            err.starts_with(&format!("{}:", one.join("ca.key").display())),
            "{err}"
        );

        // A CA with another subject, even with the right key.
        let key = KeyPair::from_pem(&fs::read_to_string(other.join("ca.key")).unwrap()).unwrap();
        let mut params = ca_params(OffsetDateTime::now_utc());
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, "someone else");
        fs::write(one.join("ca.pem"), params.self_signed(&key).unwrap().pem()).unwrap();
        fs::copy(other.join("ca.key"), one.join("ca.key")).unwrap();
        let err = format!("{:#}", issue_for_tests(&one, &[]).unwrap_err());
        assert!(err.contains("not a gpufleet CA"), "{err}");
    }

    #[test]
    fn base64_and_der_helpers() {
        assert_eq!(base64_decode("aGVs\nbG8=").unwrap(), b"hello");
        assert_eq!(base64_decode("").unwrap(), b"");
        assert!(base64_decode("aGVs*").is_none());
        assert!(base64_decode("aG=Vs").is_none());
        assert!(der_element(&[0x30, 0x05, 1]).is_none());
        assert!(der_element(&[0x30]).is_none());
        let der = der_element(&[0x04, 0x01, 7, 9]).unwrap();
        assert_eq!(
            (der.tag, der.whole, der.contents, der.rest),
            (0x04, &[0x04, 0x01, 7][..], &[7][..], &[9][..])
        );
        let long = [&[0x04, 0x81, 0x80][..], &[1; 0x80][..]].concat();
        let der = der_element(&long).unwrap();
        assert_eq!((der.whole.len(), der.contents.len()), (0x83, 0x80));
        assert!(subject_and_public_key(b"\x30\x00").is_none());
    }

    /// A TLS server on 127.0.0.1 with `server_dir`'s server certificate that requires
    /// client certificates from `server_dir`'s CA; a client that trusts `server_dir`'s CA,
    /// checks the name `host`, and presents `client_dir`'s `agent-<agent>` certificate. Ok
    /// when a gRPC call gets through to the server (which answers Unimplemented).
    async fn mtls_call(
        server_dir: &Path,
        client_dir: &Path,
        agent: &str,
        host: &str,
    ) -> Result<(), String> {
        let read = |path: PathBuf| fs::read(&path).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server_tls = ServerTlsConfig::new()
            .identity(Identity::from_pem(
                read(server_dir.join("server.pem")),
                read(server_dir.join("server.key")),
            ))
            .client_ca_root(TlsCertificate::from_pem(read(server_dir.join("ca.pem"))));
        let server = Server::builder()
            .tls_config(server_tls)
            .unwrap()
            .add_routes(tonic::service::Routes::default())
            .serve_with_incoming(TcpListenerStream::new(listener));
        let server = tokio::spawn(server);

        let client_tls = ClientTlsConfig::new()
            .ca_certificate(TlsCertificate::from_pem(read(server_dir.join("ca.pem"))))
            .identity(Identity::from_pem(
                read(client_dir.join(format!("agent-{agent}.pem"))),
                read(client_dir.join(format!("agent-{agent}.key"))),
            ))
            .domain_name(host);
        let call = async {
            let channel = Channel::from_shared(format!("https://127.0.0.1:{port}"))
                .unwrap()
                .tls_config(client_tls)
                .map_err(|e| format!("{e:?}"))?
                .connect()
                .await
                .map_err(|e| format!("connect: {e:?}"))?;
            let mut grpc = tonic::client::Grpc::new(channel);
            grpc.ready().await.map_err(|e| format!("ready: {e:?}"))?;
            let status = grpc
                .unary::<(), (), _>(
                    tonic::Request::new(()),
                    tonic::codegen::http::uri::PathAndQuery::from_static("/pki.Test/Call"),
                    tonic::codec::ProstCodec::default(),
                )
                .await
                .expect_err("no service answers /pki.Test/Call");
            match status.code() {
                tonic::Code::Unimplemented => Ok(()),
                _ => Err(format!("call: {status:?}")),
            }
        };
        let result = tokio::time::timeout(std::time::Duration::from_secs(20), call)
            .await
            .unwrap_or_else(|_| Err("timed out".to_string()));
        server.abort();
        result
    }

    #[tokio::test]
    async fn issued_certificates_complete_a_mutual_tls_handshake() {
        let tmp = tempfile::tempdir().unwrap();
        let (dir, other) = (tmp.path().join("pki"), tmp.path().join("other"));
        issue_for_tests(&dir, &["node-1"]).unwrap();
        issue_for_tests(&other, &["node-1"]).unwrap();

        // Both default names of the server certificate.
        for host in ["localhost", "127.0.0.1"] {
            mtls_call(&dir, &dir, "node-1", host)
                .await
                .unwrap_or_else(|e| panic!("{host}: {e}"));
        }
        // A name the server certificate does not hold.
        let err = mtls_call(&dir, &dir, "node-1", "example.com")
            .await
            .unwrap_err();
        assert!(err.contains("NotValidForName"), "{err}");
        // An agent certificate from another CA is refused by the server.
        assert!(mtls_call(&dir, &other, "node-1", "localhost")
            .await
            .is_err());

        // A second run signs with the CA loaded from disk: its new server certificate (for
        // other names) and agent certificate chain to the same ca.pem, and the agent
        // certificate of the first run still works.
        issue(
            &dir,
            &names(&["gpu.example.com", "10.0.0.5"]),
            &names(&["node-2"]),
        )
        .unwrap();
        for agent in ["node-1", "node-2"] {
            mtls_call(&dir, &dir, agent, "gpu.example.com")
                .await
                .unwrap_or_else(|e| panic!("{agent}: {e}"));
        }
        // The local names stay in it (admin commands on the control plane's own host),
        // and a name it was not issued for is refused.
        mtls_call(&dir, &dir, "node-2", "localhost")
            .await
            .unwrap_or_else(|e| panic!("localhost: {e}"));
        let err = mtls_call(&dir, &dir, "node-2", "other.example.com")
            .await
            .unwrap_err();
        assert!(err.contains("NotValidForName"), "{err}");
    }
}
