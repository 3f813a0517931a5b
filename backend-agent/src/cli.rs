//! Command-line flags and their environment equivalents.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(
    name = "gpufleet-agent",
    version,
    about = "The gpufleet control plane and node agent"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the control plane (gRPC API over the simulated or real fleet).
    Serve(ServeArgs),
    /// Show the GPU types of the fleet with pool, on-demand and free node counts.
    Fleet(ClientArgs),
    /// Show every node of the fleet.
    Nodes(ClientArgs),
    /// Print a read-only report of this host's GPUs (inventory, MIG mode, driver, health).
    HwCheck(HwCheckArgs),
}

/// Which GPU backend the agent drives.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hardware {
    /// Simulated nodes that enforce the MIG rules like the hardware does.
    Sim,
    /// This host's NVIDIA GPUs through NVML as the fleet's one node (needs the driver).
    Nvml,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks a free port; the real one is printed).
    #[arg(long, env = "GPUFLEET_LISTEN", default_value = "127.0.0.1:7700")]
    pub listen: SocketAddr,
    /// Directory holding the state database, the admin token and the volumes.
    #[arg(long, env = "GPUFLEET_DATA_DIR", default_value = "./.gpufleet")]
    pub data_dir: PathBuf,
    /// Fleet file (TOML with [[pool]] and [[on_demand]] tables); built-in default when absent.
    /// Only with --hardware sim.
    #[arg(long, env = "GPUFLEET_FLEET")]
    pub fleet: Option<PathBuf>,
    /// Admin bearer token; when absent one is generated into <data-dir>/admin.token.
    #[arg(long, env = "GPUFLEET_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// GPU backend.
    #[arg(long, value_enum, default_value = "sim")]
    pub hardware: Hardware,
    /// PEM certificate (chain) to serve the API over TLS; needs --tls-key.
    #[arg(long, env = "GPUFLEET_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert; needs --tls-cert.
    #[arg(long, env = "GPUFLEET_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct ClientArgs {
    /// The control plane's address.
    #[arg(
        long,
        env = "GPUFLEET_ENDPOINT",
        default_value = "http://127.0.0.1:7700"
    )]
    pub endpoint: String,
    /// Bearer token; default: the admin token in <data-dir>/admin.token.
    #[arg(long, env = "GPUFLEET_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Data directory whose admin.token is used when no token is given.
    #[arg(long, env = "GPUFLEET_DATA_DIR", default_value = "./.gpufleet")]
    pub data_dir: PathBuf,
    /// PEM of the CA that signed the control plane's certificate, for https endpoints.
    #[arg(long, env = "GPUFLEET_CA_CERT", value_name = "FILE")]
    pub ca_cert: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct HwCheckArgs {
    /// GPU backend to inspect.
    #[arg(long, value_enum, default_value = "sim")]
    pub hardware: Hardware,
}
