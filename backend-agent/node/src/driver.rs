//! How an agent changes its node's driver. Simulated nodes model the install (it takes a
//! set time, `sim-faults.toml` can make it fail or not take effect) and remember the
//! version; real hosts run the operator's `--driver-install-cmd` (a package manager, a
//! driver-container switch) and the version is then read back through NVML.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use gpufleet_gpu::hardware::{GpuBackend, HwError};

use super::faults::Faults;

pub enum Installer {
    Sim(SimDriver),
    /// The operator's command; None: driver changes are refused on this host.
    Command(Option<String>),
}

/// A simulated node's installed driver.
pub struct SimDriver {
    version: Mutex<String>,
    /// Where an external agent keeps it across restarts (`<data-dir>/driver-version`).
    file: Option<PathBuf>,
    /// How long an install takes.
    delay: Duration,
}

impl SimDriver {
    pub fn new(initial: &str, file: Option<PathBuf>, delay: Duration) -> Self {
        let recorded = file
            .as_ref()
            .and_then(|f| std::fs::read_to_string(f).ok())
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty());
        Self {
            version: Mutex::new(recorded.unwrap_or_else(|| initial.to_string())),
            file,
            delay,
        }
    }

    pub fn version(&self) -> String {
        self.version
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn install(&self, version: &str, faults: &Faults, node: &str) -> Result<(), String> {
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        if faults.driver_install_fails.iter().any(|n| n == node) {
            return Err(format!(
                "installing driver {version} failed (sim-faults.toml: driver_install_fails)"
            ));
        }
        if faults.driver_not_applied.iter().any(|n| n == node) {
            return Ok(()); // the install "succeeds" but the old driver stays loaded
        }
        *self.version.lock().unwrap_or_else(|p| p.into_inner()) = version.to_string();
        if let Some(file) = &self.file {
            std::fs::write(file, version)
                .map_err(|e| format!("cannot record the driver in {}: {e}", file.display()))?;
        }
        Ok(())
    }
}

impl Installer {
    /// The driver the node runs now.
    pub fn reported(&self, backend: &dyn GpuBackend) -> Result<String, HwError> {
        match self {
            Installer::Sim(sim) => Ok(sim.version()),
            Installer::Command(_) => backend.driver_version(),
        }
    }

    /// Installs `version` (blocking).
    pub fn install(&self, version: &str, faults: &Faults, node: &str) -> Result<(), String> {
        match self {
            Installer::Sim(sim) => sim.install(version, faults, node),
            Installer::Command(None) => Err(
                "this host changes its driver only through an operator command: start the agent with --driver-install-cmd".into(),
            ),
            Installer::Command(Some(cmd)) => {
                // The version is the command's $1 and GPUFLEET_DRIVER_VERSION.
                let out = std::process::Command::new("sh")
                    .arg("-c")
                    .arg(cmd)
                    .arg("gpufleet-driver-install")
                    .arg(version)
                    .env("GPUFLEET_DRIVER_VERSION", version)
                    .output()
                    .map_err(|e| format!("--driver-install-cmd: cannot run it: {e}"))?;
                if out.status.success() {
                    Ok(())
                } else {
                    let err = String::from_utf8_lossy(&out.stderr);
                    Err(format!(
                        "--driver-install-cmd exited with {} installing {version}: {}",
                        out.status,
                        err.trim().chars().take(300).collect::<String>()
                    ))
                }
            }
        }
    }
}

/// A driver version as the wire may carry it: dotted numbers, short.
pub fn valid_version(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 32
        && v.split('.')
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_simulated_install_is_remembered_and_faults_apply_per_node() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("driver-version");
        let sim = SimDriver::new("550.54.15", Some(file.clone()), Duration::ZERO);
        let mut faults = Faults::default();
        sim.install("570.133.20", &faults, "n1").unwrap();
        assert_eq!(
            SimDriver::new("550.54.15", Some(file), Duration::ZERO).version(),
            "570.133.20"
        );
        faults.driver_install_fails = vec!["n1".into()];
        assert!(sim
            .install("580.65.06", &faults, "n1")
            .unwrap_err()
            .contains("failed"));
        assert!(sim.install("580.65.06", &faults, "n2").is_ok());
        faults.driver_not_applied = vec!["n1".into()];
        faults.driver_install_fails.clear();
        sim.install("535.216.03", &faults, "n1").unwrap();
        assert_eq!(sim.version(), "580.65.06");
    }

    #[test]
    fn a_real_host_needs_a_command_and_its_exit_status_counts() {
        let faults = Faults::default();
        let none = Installer::Command(None);
        assert!(none
            .install("570.133.20", &faults, "h")
            .unwrap_err()
            .contains("--driver-install-cmd"));
        let ok = Installer::Command(Some("test \"$1\" = 570.133.20".into()));
        assert!(ok.install("570.133.20", &faults, "h").is_ok());
        assert!(ok
            .install("580.65.06", &faults, "h")
            .unwrap_err()
            .contains("exited"));
    }

    #[test]
    fn versions_are_dotted_numbers() {
        assert!(valid_version("550.54.15") && valid_version("570.26"));
        assert!(!valid_version("") && !valid_version("5a0") && !valid_version("1..2"));
        assert!(!valid_version(&"9".repeat(40)));
    }
}
