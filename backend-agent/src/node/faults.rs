//! Fault injection for simulated nodes (tests only): `sim-faults.toml`, read afresh
//! before every order. Only an agent with simulated hardware ever reads it, so it can
//! never act on real GPUs.
//!
//! ```toml
//! fail_create_after = 2              # the 3rd MIG instance create of an order fails
//! in_use = ["h100-80gb-pool-01:0"]   # "<node name>:<gpu index>": these GPUs report work running
//! driver_install_fails = ["h100-80gb-pool-02"]  # these nodes fail a driver install
//! driver_not_applied = ["h100-80gb-pool-03"]    # these nodes keep their old driver after one
//! ```

use std::path::Path;

use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Faults {
    pub fail_create_after: Option<u32>,
    #[serde(default)]
    pub in_use: Vec<String>,
    #[serde(default)]
    pub driver_install_fails: Vec<String>,
    #[serde(default)]
    pub driver_not_applied: Vec<String>,
}

impl Faults {
    /// The file's faults, none when it does not exist; a malformed file is an error.
    pub fn read(path: &Path) -> Result<Self, String> {
        match std::fs::read_to_string(path) {
            Ok(text) => toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display())),
            Err(_) => Ok(Self::default()),
        }
    }

    /// Whether `node`'s GPU `gpu` is marked busy.
    pub fn in_use(&self, node: &str, gpu: u32) -> bool {
        self.in_use.contains(&format!("{node}:{gpu}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_are_refused_and_a_missing_file_is_no_fault() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sim-faults.toml");
        assert!(Faults::read(&path).unwrap().in_use.is_empty());
        std::fs::write(&path, "in_use = [\"n1:2\"]\n").unwrap();
        let f = Faults::read(&path).unwrap();
        assert!(f.in_use("n1", 2) && !f.in_use("n1", 1) && !f.in_use("n2", 2));
        std::fs::write(&path, "typo = 1\n").unwrap();
        assert!(Faults::read(&path).unwrap_err().contains("typo"));
    }
}
