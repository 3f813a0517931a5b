//! Revoking node agents' certificates: `gpufleet-agent pki --revoke NAME` adds the serial
//! of `agent-NAME.pem` to the CA's revocation list, `agents.crl` (PEM, signed by the CA),
//! which `serve --agent-crl` reads, and reloads when it changes: a revoked certificate is
//! refused at the TLS handshake, and the session it already holds is ended.
//!
//! The revoked serials are kept in `revoked-agents` (one line each: serial in hex, unix
//! time, agent name) beside the CA, and every revocation signs the whole list again, so
//! the CRL never loses an entry. Issuing a new certificate for the same name
//! (`pki --agent NAME`) gives it a new serial: the node can come back with it.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use rcgen::{
    Certificate, CertificateRevocationListParams, KeyIdMethod, KeyPair, RevocationReason,
    RevokedCertParams, SerialNumber,
};
use time::{Duration, OffsetDateTime};

use crate::pki;

/// The CA's revocation list of agent certificates, in the pki directory.
pub const CRL_FILE: &str = "agents.crl";
/// The serials revoked so far, the source the CRL is signed from.
const LIST_FILE: &str = "revoked-agents";
/// The date by which the list claims the next one will be issued. Nothing reads it as an
/// expiry (rustls ignores it by default); a year keeps strict readers happy.
const NEXT_UPDATE: Duration = Duration::days(365);

/// One revoked certificate.
struct Entry {
    serial: Vec<u8>,
    at: i64,
    agent: String,
}

/// Revokes the current certificate of each agent in `agents` (`agent-NAME.pem` in
/// `dir`) and signs the list again: the paths written.
pub fn revoke(dir: &Path, agents: &[String]) -> anyhow::Result<Vec<PathBuf>> {
    if !dir.join("ca.pem").exists() {
        bail!(
            "--dir: {} holds no CA (ca.pem); revoke with the --dir that issued the certificate",
            dir.display()
        );
    }
    let now = OffsetDateTime::now_utc();
    let mut written = Vec::new();
    let (ca, ca_key) = pki::load_or_create_ca(dir, now, &mut written)?;
    let agents = pki::agent_names(agents)
        .map_err(|e| anyhow::anyhow!("{}", e.to_string().replacen("--agent:", "--revoke:", 1)))?;
    let mut entries = read_list(dir)?;
    for agent in agents {
        let path = dir.join(format!("agent-{agent}.pem"));
        let text = fs::read_to_string(&path).with_context(|| {
            format!(
                "--revoke: {agent}: cannot read {} (the agent's certificate as pki issued it)",
                path.display()
            )
        })?;
        let serial = pki::pem_block(&text, "CERTIFICATE")
            .as_deref()
            .and_then(pki::serial)
            .with_context(|| {
                format!(
                    "--revoke: {agent}: {} holds no X.509 certificate",
                    path.display()
                )
            })?;
        if !entries.iter().any(|e| e.serial == serial) {
            entries.push(Entry {
                serial,
                at: now.unix_timestamp(),
                agent: agent.to_string(),
            });
        }
    }
    write_list(dir, &entries, &mut written)?;
    sign(dir, &entries, &ca, &ca_key, now, &mut written)?;
    Ok(written)
}

/// Writes the CA's list, empty, when it has none yet (`pki` runs this after issuing, so
/// serve's --agent-crl always has a list to read): the paths written.
pub fn ensure_list(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    if dir.join(CRL_FILE).exists() {
        return Ok(written);
    }
    let now = OffsetDateTime::now_utc();
    let (ca, ca_key) = pki::load_or_create_ca(dir, now, &mut written)?;
    let entries = read_list(dir)?;
    sign(dir, &entries, &ca, &ca_key, now, &mut written)?;
    Ok(written)
}

fn sign(
    dir: &Path,
    entries: &[Entry],
    ca: &Certificate,
    ca_key: &KeyPair,
    now: OffsetDateTime,
    written: &mut Vec<PathBuf>,
) -> anyhow::Result<()> {
    let revoked_certs = entries
        .iter()
        .map(|e| RevokedCertParams {
            serial_number: SerialNumber::from_slice(&e.serial),
            revocation_time: OffsetDateTime::from_unix_timestamp(e.at).unwrap_or(now),
            reason_code: Some(RevocationReason::Superseded),
            invalidity_date: None,
        })
        .collect();
    let params = CertificateRevocationListParams {
        this_update: now,
        next_update: now + NEXT_UPDATE,
        // Monotonic across runs as long as the clock is: each list supersedes the last.
        crl_number: SerialNumber::from(now.unix_timestamp().max(0) as u64),
        issuing_distribution_point: None,
        revoked_certs,
        key_identifier_method: KeyIdMethod::Sha256,
    };
    let crl = params
        .signed_by(ca, ca_key)
        .context("cannot sign the revocation list")?;
    let path = dir.join(CRL_FILE);
    pki::write_file(
        &path,
        &crl.pem().context("cannot encode the revocation list")?,
        pki::CERT_MODE,
    )?;
    written.push(path);
    Ok(())
}

fn read_list(dir: &Path) -> anyhow::Result<Vec<Entry>> {
    let path = dir.join(LIST_FILE);
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("{}: cannot read", path.display())),
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, line)| {
            let mut words = line.split_whitespace();
            let parsed = (|| {
                let serial = hex::decode(words.next()?).ok()?;
                let at = words.next()?.parse().ok()?;
                let agent = words.next()?.to_string();
                Some(Entry { serial, at, agent })
            })();
            parsed.with_context(|| {
                format!(
                    "{}: line {} is not `SERIAL-HEX UNIX-TIME AGENT`",
                    path.display(),
                    i + 1
                )
            })
        })
        .collect()
}

fn write_list(dir: &Path, entries: &[Entry], written: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let path = dir.join(LIST_FILE);
    let text: String = entries
        .iter()
        .map(|e| format!("{} {} {}\n", hex::encode(&e.serial), e.at, e.agent))
        .collect();
    pki::write_file(&path, &text, pki::CERT_MODE)?;
    written.push(path);
    Ok(())
}
