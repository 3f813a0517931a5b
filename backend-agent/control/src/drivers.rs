//! The NVIDIA data-center drivers a cluster may run: each release with its branch, the
//! newest CUDA it runs and its end of life (from `shared/reference/driver-xid.md`), the
//! platform's offer (all of them, or the fleet file's `drivers = [...]`), and the one rule
//! that picks or checks a cluster's driver: new enough for the CUDA version, for the GPU
//! model (and for MIG on it), and offered. Returns the domain's typed errors.

use std::cmp::Ordering;

use gpufleet_gpu::catalog::{self, compare_driver_versions};

use crate::error::{Error, Result};

/// One data-center driver release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Release {
    pub version: &'static str,
    pub branch: &'static str,
    /// The newest CUDA version the branch runs natively.
    pub cuda: &'static str,
    pub end_of_life: &'static str,
}

const fn r(
    version: &'static str,
    branch: &'static str,
    cuda: &'static str,
    end_of_life: &'static str,
) -> Release {
    Release {
        version,
        branch,
        cuda,
        end_of_life,
    }
}

/// Data-center ("DC") builds per branch, oldest first (driver-xid.md, table 1b).
pub const RELEASES: &[Release] = &[
    r("535.54.03", "R535", "12.2", "June 2026"),
    r("535.104.05", "R535", "12.2", "June 2026"),
    r("535.129.03", "R535", "12.2", "June 2026"),
    r("535.161.07", "R535", "12.2", "June 2026"),
    r("535.183.01", "R535", "12.2", "June 2026"),
    r("535.216.03", "R535", "12.2", "June 2026"),
    r("535.247.01", "R535", "12.2", "June 2026"),
    r("535.288.01", "R535", "12.2", "June 2026"),
    r("535.309.01", "R535", "12.2", "June 2026"),
    r("550.54.14", "R550", "12.4", "ended"),
    r("550.54.15", "R550", "12.4", "ended"),
    r("550.90.07", "R550", "12.4", "ended"),
    r("550.127.05", "R550", "12.4", "ended"),
    r("550.144.03", "R550", "12.4", "ended"),
    r("550.163.01", "R550", "12.4", "ended"),
    r("560.35.03", "R560", "12.6", "ended"),
    r("570.86.15", "R570", "12.8", "February 2026"),
    r("570.124.06", "R570", "12.8", "February 2026"),
    r("570.133.20", "R570", "12.8", "February 2026"),
    r("570.158.01", "R570", "12.8", "February 2026"),
    r("570.195.03", "R570", "12.8", "February 2026"),
    r("570.211.01", "R570", "12.8", "February 2026"),
    r("575.57.08", "R575", "12.9", "ended"),
    r("580.65.06", "R580", "13.0", "August 2028"),
    r("580.82.07", "R580", "13.0", "August 2028"),
    r("580.95.05", "R580", "13.0", "August 2028"),
    r("580.105.08", "R580", "13.0", "August 2028"),
    r("580.126.09", "R580", "13.0", "August 2028"),
    r("580.159.03", "R580", "13.0", "August 2028"),
    r("580.173.02", "R580", "13.0", "August 2028"),
];

/// The first driver that supports each catalog model (the first release whose open kernel
/// modules list it; driver-xid.md table 2a). MIG may need a newer one:
/// `catalog::min_mig_driver`.
fn first_driver_for(model: &str) -> Option<&'static str> {
    Some(match model {
        "A100-40GB" | "A100-80GB" => "515.48.07",
        "H100-80GB" => "525.85.05",
        "H100-94GB" => "535.104.05",
        "H200-141GB" => "550.90.07",
        "GH200" => "535.129.03",
        "L40S" => "535.104.05",
        "B200" => "570.86.15",
        _ => return None,
    })
}

/// The minimum driver for a CUDA version ("12.4" -> 550.54.14), from NVIDIA's CUDA
/// release notes.
pub fn min_driver_for_cuda(cuda: &str) -> Option<&'static str> {
    catalog::CUDA_MIN_DRIVER
        .iter()
        .find(|(c, _)| *c == cuda)
        .map(|(_, d)| *d)
}

fn at_least(version: &str, min: &str) -> bool {
    compare_driver_versions(version, min) != Ordering::Less
}

pub fn release(version: &str) -> Option<&'static Release> {
    RELEASES.iter().find(|r| r.version == version)
}

/// What the platform offers: every release, or the fleet file's list.
#[derive(Debug, Clone)]
pub struct Offer {
    releases: Vec<&'static Release>,
}

impl Offer {
    pub fn all() -> Self {
        Self {
            releases: RELEASES.iter().collect(),
        }
    }

    /// The fleet file's `drivers = [...]`: every entry must be a known release.
    pub fn only(versions: &[String]) -> std::result::Result<Self, String> {
        let mut releases = Vec::new();
        for v in versions {
            let rel = release(v).ok_or_else(|| {
                format!(
                    "drivers: '{v}' is not a data-center driver release this version knows (e.g. {})",
                    RELEASES.last().map(|r| r.version).unwrap_or_default()
                )
            })?;
            releases.push(rel);
        }
        if releases.is_empty() {
            return Err(
                "drivers: list at least one driver, or leave the key out to offer all".into(),
            );
        }
        releases.sort_by(|a, b| compare_driver_versions(a.version, b.version));
        releases.dedup();
        Ok(Self { releases })
    }

    /// Offered drivers that suit `gpu_type` (when given) and run `cuda` (when given),
    /// newest first.
    pub fn list(&self, gpu_type: &str, cuda: &str) -> Result<Vec<&'static Release>> {
        let model_floor = if gpu_type.is_empty() {
            None
        } else {
            Some(first_driver_for(gpu_type).ok_or_else(|| {
                Error::Invalid(
                    crate::catalog::require_known("gpu_type", gpu_type)
                        .err()
                        .unwrap_or_else(|| format!("gpu_type: no driver data for {gpu_type}")),
                )
            })?)
        };
        let cuda_floor = if cuda.is_empty() {
            None
        } else {
            Some(cuda_floor(cuda)?)
        };
        Ok(self
            .releases
            .iter()
            .rev()
            .filter(|r| model_floor.is_none_or(|m| at_least(r.version, m)))
            .filter(|r| cuda_floor.is_none_or(|c| at_least(r.version, c)))
            .copied()
            .collect())
    }

    /// The driver for a cluster of `gpu_type`: with only `cuda`, the newest offered one
    /// that runs it; with `driver`, that one, which must run `cuda` (when given), support
    /// the model (and MIG on it, when `mig`) and be offered.
    pub fn resolve(
        &self,
        gpu_type: &str,
        cuda: &str,
        driver: &str,
        mig: bool,
    ) -> Result<&'static Release> {
        crate::catalog::require_known("gpu_type", gpu_type).map_err(Error::Invalid)?;
        let model_floor = first_driver_for(gpu_type)
            .ok_or_else(|| Error::Invalid(format!("gpu_type: no driver data for {gpu_type}")))?;
        let mig_floor = if mig {
            catalog::min_mig_driver(gpu_type)
        } else {
            None
        };
        if driver.is_empty() {
            if cuda.is_empty() {
                return Err(Error::Invalid(
                    "cuda_version: give cuda_version and/or driver_version".into(),
                ));
            }
            let floor = cuda_floor(cuda)?;
            return self
                .releases
                .iter()
                .rev()
                .find(|r| {
                    at_least(r.version, floor)
                        && at_least(r.version, model_floor)
                        && mig_floor.is_none_or(|m| at_least(r.version, m))
                })
                .copied()
                .ok_or_else(|| {
                    Error::Invalid(format!(
                        "cuda_version: no offered driver runs CUDA {cuda} on {gpu_type}{} (CUDA {cuda} needs at least {floor}; offered: {})",
                        if mig { " with MIG" } else { "" },
                        self.offered_text()
                    ))
                });
        }
        let rel = release(driver).ok_or_else(|| {
            Error::Invalid(format!(
                "driver_version: '{}' is not a data-center driver release (offered: {})",
                driver.chars().take(32).collect::<String>(),
                self.offered_text()
            ))
        })?;
        if !cuda.is_empty() {
            let floor = cuda_floor(cuda)?;
            if !at_least(driver, floor) {
                return Err(Error::Invalid(format!(
                    "driver_version: {driver} is too old for CUDA {cuda}, which needs at least {floor} (the {} branch runs CUDA up to {})",
                    rel.branch, rel.cuda
                )));
            }
        }
        if !at_least(driver, model_floor) {
            return Err(Error::Invalid(format!(
                "driver_version: the {} branch ({driver}) does not support {gpu_type}; it needs at least {model_floor}",
                rel.branch
            )));
        }
        if let Some(m) = mig_floor.filter(|m| !at_least(driver, m)) {
            return Err(Error::Invalid(format!(
                "driver_version: MIG on {gpu_type} needs at least {m} (got {driver}); choose a newer driver or leave mig_layout unset"
            )));
        }
        if !self.releases.contains(&rel) {
            return Err(Error::Invalid(format!(
                "driver_version: {driver} is not offered by this platform (offered: {})",
                self.offered_text()
            )));
        }
        Ok(rel)
    }

    fn offered_text(&self) -> String {
        let mut v: Vec<&str> = self.releases.iter().rev().map(|r| r.version).collect();
        if v.len() > 8 {
            v.truncate(8);
            v.push("...");
        }
        v.join(", ")
    }
}

fn cuda_floor(cuda: &str) -> Result<&'static str> {
    min_driver_for_cuda(cuda).ok_or_else(|| {
        let known: Vec<&str> = catalog::CUDA_MIN_DRIVER.iter().map(|(c, _)| *c).collect();
        Error::Invalid(format!(
            "cuda_version: unknown CUDA version '{}' (known: {})",
            cuda.chars().take(16).collect::<String>(),
            known.join(", ")
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(e: Error) -> String {
        e.to_string()
    }

    #[test]
    fn cuda_alone_picks_the_newest_driver_that_runs_it() {
        let offer =
            Offer::only(&["550.54.15".into(), "550.90.07".into(), "535.216.03".into()]).unwrap();
        assert_eq!(
            offer
                .resolve("H100-80GB", "12.4", "", false)
                .unwrap()
                .version,
            "550.90.07"
        );
        assert_eq!(
            offer
                .resolve("H100-80GB", "12.2", "", false)
                .unwrap()
                .version,
            "550.90.07"
        );
        let e = msg(offer.resolve("H100-80GB", "12.8", "", false).unwrap_err());
        assert!(
            e.starts_with("cuda_version:") && e.contains("570.26"),
            "{e}"
        );
    }

    #[test]
    fn an_exact_driver_must_fit_cuda_model_mig_and_offer() {
        let all = Offer::all();
        assert_eq!(
            all.resolve("H100-80GB", "12.4", "550.54.15", false)
                .unwrap()
                .branch,
            "R550"
        );
        let e = msg(all
            .resolve("H100-80GB", "12.4", "535.216.03", false)
            .unwrap_err());
        assert!(
            e.starts_with("driver_version:") && e.contains("at least 550.54.14"),
            "{e}"
        );
        let e = msg(all.resolve("B200", "", "550.54.15", false).unwrap_err());
        assert!(
            e.contains("does not support B200") && e.contains("570.86.15"),
            "{e}"
        );
        let e = msg(all
            .resolve("H200-141GB", "", "550.54.15", false)
            .unwrap_err());
        assert!(e.contains("550.90.07"), "{e}");
        let e = msg(all.resolve("B200", "", "570.86.15", true).unwrap_err());
        assert!(e.contains("MIG on B200"), "{e}");
        let some = Offer::only(&["550.54.15".into()]).unwrap();
        let e = msg(some
            .resolve("H100-80GB", "", "580.65.06", false)
            .unwrap_err());
        assert!(e.contains("not offered") && e.contains("550.54.15"), "{e}");
        let e = msg(all.resolve("H100-80GB", "", "999.1", false).unwrap_err());
        assert!(e.contains("not a data-center driver release"), "{e}");
        let e = msg(all.resolve("H100-80GB", "12.7", "", false).unwrap_err());
        assert!(e.contains("unknown CUDA version"), "{e}");
    }

    #[test]
    fn listing_filters_by_model_and_cuda_newest_first() {
        let all = Offer::all();
        let b200 = all.list("B200", "").unwrap();
        assert!(b200.iter().all(|r| at_least(r.version, "570.86.15")));
        assert_eq!(b200[0].version, RELEASES.last().unwrap().version);
        let cuda13 = all.list("", "13.0").unwrap();
        assert!(!cuda13.is_empty() && cuda13.iter().all(|r| r.branch == "R580"));
        assert!(Offer::only(&["1.2.3".into()])
            .unwrap_err()
            .starts_with("drivers:"));
        assert!(Offer::only(&[]).is_err());
    }
}
