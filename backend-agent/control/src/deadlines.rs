//! How long each kind of work order may take. An agent that heartbeats but never
//! answers (a stuck NVML call, a hung `--driver-install-cmd`) would otherwise hold a
//! cluster in `creating` forever; past its deadline an order fails like any failed
//! order, and whoever sent it undoes or carries forward its change.

use std::time::Duration;

use gpufleet_proto::v1::{work_order, WorkOrder};

/// The kinds `serve --order-deadline KIND=DURATION` names.
pub const KINDS: [&str; 6] = [
    "mig_layout",
    "driver",
    "check_quick",
    "check_medium",
    "check_long",
    "slurmd",
];

/// One bound per kind of order; a health check's bandwidth test adds its own duration
/// (per peer, since the ring runs its pairs one after another) on top of its level's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderDeadlines {
    pub mig_layout: Duration,
    pub driver: Duration,
    pub check_quick: Duration,
    pub check_medium: Duration,
    pub check_long: Duration,
    pub slurmd: Duration,
}

impl Default for OrderDeadlines {
    /// Generous for real hosts: a driver install builds kernel modules, a long check
    /// runs DCGM's level 3 diagnostics.
    fn default() -> Self {
        Self {
            mig_layout: Duration::from_secs(120),
            driver: Duration::from_secs(30 * 60),
            check_quick: Duration::from_secs(60),
            check_medium: Duration::from_secs(5 * 60),
            check_long: Duration::from_secs(60 * 60),
            slurmd: Duration::from_secs(60),
        }
    }
}

impl OrderDeadlines {
    /// Sets the deadline of `kind` (one of [`KINDS`]).
    pub fn set(&mut self, kind: &str, d: Duration) -> Result<(), String> {
        let slot = match kind {
            "mig_layout" => &mut self.mig_layout,
            "driver" => &mut self.driver,
            "check_quick" => &mut self.check_quick,
            "check_medium" => &mut self.check_medium,
            "check_long" => &mut self.check_long,
            "slurmd" => &mut self.slurmd,
            _ => {
                return Err(format!(
                    "unknown order kind '{kind}' (known: {})",
                    KINDS.join(", ")
                ))
            }
        };
        *slot = d;
        Ok(())
    }

    /// The order's kind as [`KINDS`] names it, and how long it may take.
    pub fn of(&self, order: &WorkOrder) -> (&'static str, Duration) {
        match &order.kind {
            Some(work_order::Kind::ApplyMigLayout(_)) => ("mig_layout", self.mig_layout),
            Some(work_order::Kind::InstallDriver(_)) => ("driver", self.driver),
            Some(work_order::Kind::RunHealthCheck(h)) => {
                let (kind, base) = match h.level.as_str() {
                    "long" => ("check_long", self.check_long),
                    "medium" => ("check_medium", self.check_medium),
                    _ => ("check_quick", self.check_quick),
                };
                let bandwidth = h.bandwidth.as_ref().map_or(Duration::ZERO, |b| {
                    // Twice per pair: the agent tries a pair that got no data once more.
                    let pairs = b.peers.len().max(1) as u32;
                    Duration::from_millis(u64::from(b.duration_ms)).saturating_mul(pairs * 2)
                });
                (kind, base.saturating_add(bandwidth))
            }
            Some(work_order::Kind::StartSlurmd(_)) | Some(work_order::Kind::StopSlurmd(_)) => {
                ("slurmd", self.slurmd)
            }
            // A question to a controller: a node that does not answer it is not broken
            // for it (the controller may be what is down), so it has a kind of its own.
            Some(work_order::Kind::SlurmQuery(_)) => ("slurm_query", self.slurmd),
            // A bind mount or two: as long as the node's daemons may take.
            Some(work_order::Kind::SetVolumes(_)) => ("volumes", self.slurmd),
            None => ("unknown", self.check_quick),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufleet_proto::v1;

    #[test]
    fn a_check_with_a_bandwidth_test_gets_its_duration_on_top() {
        let d = OrderDeadlines::default();
        let order = WorkOrder {
            id: "o".into(),
            epoch: 0,
            kind: Some(work_order::Kind::RunHealthCheck(v1::RunHealthCheck {
                level: "medium".into(),
                bandwidth: Some(v1::BandwidthTest {
                    peers: vec![Default::default(), Default::default()],
                    duration_ms: 1500,
                    ..Default::default()
                }),
                ..Default::default()
            })),
        };
        assert_eq!(
            d.of(&order),
            ("check_medium", d.check_medium + Duration::from_secs(6))
        );
    }

    #[test]
    fn setting_an_unknown_kind_names_the_known_ones() {
        let mut d = OrderDeadlines::default();
        d.set("driver", Duration::from_secs(5)).unwrap();
        assert_eq!(d.driver, Duration::from_secs(5));
        let e = d.set("drivers", Duration::from_secs(5)).unwrap_err();
        assert!(e.contains("mig_layout") && e.contains("slurmd"), "{e}");
    }
}
