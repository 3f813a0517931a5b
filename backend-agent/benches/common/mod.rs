//! What the benches share: a control plane opened as `serve` opens it, over a simulated
//! pool.

use std::path::Path;

use gpufleet_control::serve::{Config, Fleet};

/// `serve`'s config for a data dir under `dir` whose fleet is `nodes` simulated 8-GPU
/// pool nodes of `model` (written as a fleet file there).
pub fn simulated_pool(dir: &Path, model: &str, nodes: u32) -> Config {
    let fleet_file = dir.join("fleet.toml");
    std::fs::write(
        &fleet_file,
        format!("[[pool]]\ngpu_type = \"{model}\"\nnodes = {nodes}\ngpus_per_node = 8\n"),
    )
    .expect("write the fleet file");
    Config::new(
        dir.join("data"),
        Fleet::Simulated {
            fleet_file: Some(fleet_file),
        },
    )
}
