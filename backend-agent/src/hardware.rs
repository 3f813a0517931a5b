//! The GPU backend behind `--hardware`.

use crate::cli::Hardware;

/// Fails with a clear message where no NVIDIA driver is present.
pub fn require_nvml() -> anyhow::Result<()> {
    anyhow::bail!(
        "--hardware nvml: the NVML backend is not available in this build yet; use --hardware sim"
    )
}

pub fn check_report(hardware: Hardware) -> anyhow::Result<String> {
    match hardware {
        Hardware::Nvml => require_nvml().map(|_| String::new()),
        Hardware::Sim => anyhow::bail!("hw-check is not available in this build yet"),
    }
}
