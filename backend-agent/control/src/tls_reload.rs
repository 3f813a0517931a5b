//! The API's TLS, reloaded while it serves: a renewed certificate and key, a new agent CA
//! or revocation list take effect for the next connection, without a restart. The
//! watcher looks at the files every `--tls-reload-every` and at once on SIGHUP
//! (`systemctl reload`); it reloads only when their contents changed. A change that does
//! not load (a key that does not match its certificate, a file half-copied) is logged
//! and the configuration in use is kept: a bad renewal never takes the API down.
//!
//! Open connections keep the certificates they were made with, except one thing: when
//! the revocation list names a node agent's certificate, that agent's session is ended
//! (the agents service watches [`ReloadableTls::revocations`]).

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use gpufleet_process::signals::stopped;
use gpufleet_wire::server_tls::{RevokedCerts, ServerTlsFiles};
use tokio::sync::watch;
use tokio_rustls::rustls::ServerConfig;

/// The revocation list in force (None: no `--agent-crl`).
pub type Revocations = watch::Receiver<Option<Arc<RevokedCerts>>>;

pub struct ReloadableTls {
    files: ServerTlsFiles,
    current: RwLock<Arc<ServerConfig>>,
    /// The contents' digest when `current` was loaded.
    loaded_from: Mutex<[u8; 32]>,
    revoked: watch::Sender<Option<Arc<RevokedCerts>>>,
}

impl ReloadableTls {
    /// Loads the files. Blocking (reads them).
    pub fn open(files: ServerTlsFiles) -> anyhow::Result<Arc<Self>> {
        let fingerprint = files.fingerprint()?;
        let loaded = files.load()?;
        Ok(Arc::new(Self {
            files,
            current: RwLock::new(loaded.config),
            loaded_from: Mutex::new(fingerprint),
            revoked: watch::channel(loaded.revoked).0,
        }))
    }

    /// The configuration for the next connection's handshake.
    pub fn config(&self) -> Arc<ServerConfig> {
        self.current.read().expect("tls lock").clone()
    }

    pub fn revocations(&self) -> Revocations {
        self.revoked.subscribe()
    }

    /// Reloads when the files' contents changed since the last load: whether it did.
    /// Blocking (reads the files).
    pub fn reload_if_changed(&self) -> anyhow::Result<bool> {
        let fingerprint = self.files.fingerprint()?;
        if *self.loaded_from.lock().expect("tls lock") == fingerprint {
            return Ok(false);
        }
        let loaded = self.files.load()?;
        *self.current.write().expect("tls lock") = loaded.config;
        *self.loaded_from.lock().expect("tls lock") = fingerprint;
        self.revoked.send_replace(loaded.revoked);
        Ok(true)
    }

    /// Reloads on every tick of `every` and on SIGHUP until `stop`.
    pub async fn watch(self: Arc<Self>, every: Duration, mut stop: watch::Receiver<bool>) {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hangup = match signal(SignalKind::hangup()) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch SIGHUP; TLS files are reloaded on the timer only");
                None
            }
        };
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            let asked = tokio::select! {
                _ = stopped(&mut stop) => return,
                _ = tick.tick() => false,
                _ = async {
                    match hangup.as_mut() {
                        Some(h) => { h.recv().await; }
                        None => std::future::pending::<()>().await,
                    }
                } => true,
            };
            let this = self.clone();
            match tokio::task::spawn_blocking(move || this.reload_if_changed()).await {
                Ok(Ok(true)) => tracing::info!("reloaded the API's TLS certificate, key, agent CA and revocation list"),
                Ok(Ok(false)) if asked => tracing::info!("SIGHUP: the API's TLS files are unchanged"),
                Ok(Ok(false)) => {}
                Ok(Err(e)) => tracing::error!(error = format!("{e:#}"), "the API's TLS files changed but do not load; still serving with the ones loaded before"),
                Err(e) => tracing::error!(error = %e, "reloading the API's TLS failed"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn files(dir: &Path) -> ServerTlsFiles {
        ServerTlsFiles::from_flags(
            Some(&dir.join("server.pem")),
            Some(&dir.join("server.key")),
            Some(&dir.join("ca.pem")),
            Some(&dir.join(gpufleet_wire::revocation::CRL_FILE)),
        )
        .unwrap()
        .unwrap()
    }

    #[test]
    fn reloads_a_renewal_keeps_what_it_has_when_a_change_does_not_load_and_publishes_revocations() {
        let dir = tempfile::tempdir().unwrap();
        let agents = vec!["gpu-a".to_string()];
        gpufleet_wire::pki::issue(dir.path(), &[], &agents).unwrap();
        gpufleet_wire::revocation::ensure_list(dir.path()).unwrap();
        let tls = ReloadableTls::open(files(dir.path())).unwrap();
        assert!(!tls.reload_if_changed().unwrap(), "nothing changed");
        let first = tls.config();

        // A half-written renewal: an error, and the configuration in use stays.
        std::fs::write(dir.path().join("server.key"), "not a key").unwrap();
        let err = format!("{:#}", tls.reload_if_changed().unwrap_err());
        assert!(err.starts_with("--tls-key:"), "{err}");
        assert!(Arc::ptr_eq(&tls.config(), &first));

        // The renewal done: loaded.
        gpufleet_wire::pki::issue(dir.path(), &[], &[]).unwrap();
        assert!(tls.reload_if_changed().unwrap());
        assert!(!Arc::ptr_eq(&tls.config(), &first));

        // A revocation reaches whoever watches the list.
        let watcher = tls.revocations();
        let pem = std::fs::read_to_string(dir.path().join("agent-gpu-a.pem")).unwrap();
        let der = gpufleet_wire::pki::pem_der(&pem).unwrap();
        assert!(!watcher.borrow().as_ref().unwrap().names(&der));
        gpufleet_wire::revocation::revoke(dir.path(), &agents).unwrap();
        assert!(tls.reload_if_changed().unwrap());
        assert!(watcher.borrow().as_ref().unwrap().names(&der));
    }
}
