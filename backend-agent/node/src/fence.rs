//! The agent's side of the control plane's lease: the highest epoch it has seen on a work
//! order (`WorkOrder.epoch`), kept in `<data-dir>/epoch` (0600) so that a restart keeps
//! it. An order from an older epoch comes from a control-plane replica that has lost the
//! singletons' lease (paused, partitioned) and is refused unrun; an order without an
//! epoch (0, from a control plane of a release before epochs) is taken as before. The
//! refusal's `error_kind` is `gpufleet_wire::protocol_version::STALE_EPOCH`.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub struct Fence {
    path: PathBuf,
    highest: Mutex<u64>,
}

impl Fence {
    /// The fence of the agent on `data_dir`, with the epoch it kept (0: none yet). A file
    /// that is not one number is an error naming it: starting from 0 would let a former
    /// leader's orders through.
    pub fn open(data_dir: &Path) -> anyhow::Result<Self> {
        let path = data_dir.join("epoch");
        let highest = match std::fs::read_to_string(&path) {
            Ok(text) => text.trim().parse::<u64>().map_err(|e| {
                anyhow::anyhow!(
                    "{}: not an epoch ({e}); it holds the highest epoch of the control plane's lease this agent has seen",
                    path.display()
                )
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => anyhow::bail!("cannot read {}: {e}", path.display()),
        };
        Ok(Self {
            path,
            highest: Mutex::new(highest),
        })
    }

    /// The highest epoch seen.
    pub fn highest(&self) -> u64 {
        *self.highest.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether order `order_id` of `epoch` may run: refused (the sentence says why) when
    /// it is older than the highest seen. A newer epoch is kept on disk before the order
    /// runs; one that cannot be kept refuses the order (a restart would forget it).
    pub fn admit(&self, order_id: &str, epoch: u64) -> Result<(), String> {
        if epoch == 0 {
            return Ok(());
        }
        let mut highest = self.highest.lock().unwrap_or_else(|p| p.into_inner());
        if epoch < *highest {
            return Err(format!(
                "order {order_id}: its epoch {epoch} of the control plane's lease is older than epoch {} this agent has seen: it comes from a control-plane replica that no longer holds the lease, and was not run",
                *highest
            ));
        }
        if epoch > *highest {
            gpufleet_process::data_dir::keep_private(&self.path, &epoch.to_string()).map_err(
                |e| {
                    format!(
                        "order {order_id}: cannot keep its epoch {epoch} in {}: {e}; not run",
                        self.path.display()
                    )
                },
            )?;
            tracing::info!(
                epoch,
                before = *highest,
                "a newer epoch of the control plane's lease"
            );
            *highest = epoch;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn an_older_epoch_is_refused_and_the_highest_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let fence = Fence::open(dir.path()).unwrap();
        assert_eq!(fence.highest(), 0);
        fence.admit("o1", 5).unwrap();
        fence.admit("o2", 5).unwrap();
        let refused = fence.admit("o3", 4).unwrap_err();
        assert!(
            refused.starts_with("order o3: its epoch 4") && refused.contains("older than epoch 5"),
            "{refused}"
        );
        // An order of a control plane from before epochs is taken as before.
        fence.admit("o4", 0).unwrap();
        fence.admit("o5", 7).unwrap();
        let file = dir.path().join("epoch");
        assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), "7");
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        drop(fence);
        // A restart keeps it.
        let fence = Fence::open(dir.path()).unwrap();
        assert_eq!(fence.highest(), 7);
        assert!(fence.admit("o6", 5).is_err());
        fence.admit("o7", 7).unwrap();
    }

    #[test]
    fn a_damaged_epoch_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("epoch"), "seven\n").unwrap();
        let e = Fence::open(dir.path()).err().unwrap().to_string();
        assert!(e.contains("epoch: not an epoch"), "{e}");
    }
}
