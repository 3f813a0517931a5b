//! `gpufleet-agent`: the gpufleet control plane (`serve`), the node agent of each GPU
//! host (`node`, `node-status`), its small admin client (`fleet`, `nodes`), the
//! certificates for mutual TLS (`pki`), the read-only hardware check (`hw-check`) and the
//! store's invariants (`check`):
//! a thin binary over the `gpufleet_agent` library, which composes the crates.

use clap::Parser;
use gpufleet_agent::{access, check, cli, client, exit, lists, migrate, replay, serve, usage};

/// A token given as a flag is in the process's command line, which every local user reads
/// (`/proc/PID/cmdline`), a tenant's jobs on a node included; the environment and the
/// generated token files are not readable by them.
fn warn_of_tokens_in_argv() {
    for flag in ["--admin-token", "--join-token"] {
        let given = std::env::args().any(|a| a == flag || a.starts_with(&format!("{flag}=")));
        if given {
            let var = flag
                .trim_start_matches("--")
                .replace('-', "_")
                .to_uppercase();
            tracing::warn!(
                "{flag} is on the command line, which every local user can read; give it in GPUFLEET_{var} instead (or let serve generate the token file)"
            );
        }
    }
}

fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    // A replay opens stores of its own: their start-up lines are not its output.
    let quiet = matches!(
        cli.command,
        cli::Command::Replay(_) | cli::Command::ReplaySynthetic(_)
    );
    let default_filter = if quiet { "warn" } else { "info" };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter)),
        )
        .init();
    warn_of_tokens_in_argv();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let is_node = matches!(cli.command, cli::Command::Node(_));
    let result = runtime.block_on(async move {
        match cli.command {
            cli::Command::Serve(args) => serve::run(*args).await,
            cli::Command::Fleet(args) => client::print_fleet(args).await,
            cli::Command::Nodes(args) => lists::print_nodes(args).await,
            cli::Command::HwCheck(args) => client::hw_check(args),
            cli::Command::Node(args) => gpufleet_node::run(args.config()).await,
            cli::Command::NodeStatus(args) => gpufleet_node::print_status(&args.data_dir),
            cli::Command::NodeReturn(args) => client::return_node(args).await,
            cli::Command::NodeForgetSecret(args) => client::forget_node_secret(args).await,
            cli::Command::Events(args) => client::print_events(args).await,
            cli::Command::Tenants(args) => lists::print_tenants(args).await,
            cli::Command::Clusters(args) => lists::print_clusters(args).await,
            cli::Command::Reservations(args) => lists::print_reservations(args).await,
            cli::Command::Token(cli::TokenCommand::List(args)) => access::list(args).await,
            cli::Command::Token(cli::TokenCommand::Create(args)) => access::create(args).await,
            cli::Command::Token(cli::TokenCommand::Rotate(args)) => access::rotate(args).await,
            cli::Command::Token(cli::TokenCommand::Revoke(args)) => access::revoke(args).await,
            cli::Command::Audit(args) => access::print_audit(args).await,
            cli::Command::Usage(args) => usage::print(args).await,
            cli::Command::Breaker(cli::BreakerCommand::List(args)) => {
                client::print_breakers(args).await
            }
            cli::Command::Breaker(cli::BreakerCommand::Reset(args)) => {
                client::reset_breaker(args).await
            }
            cli::Command::Pki(args) => print_issued(&args),
            cli::Command::Check(args) => check::run(args).await,
            cli::Command::Migrate(args) => migrate::run(args).await,
            cli::Command::Replay(args) => replay::run(args).await,
            cli::Command::ReplaySynthetic(args) => replay::synthetic(args),
            cli::Command::LoadProbe(args) => {
                println!("{}", gpufleet_gpu::load::cuda::probe_main(&args.args));
                Ok(())
            }
        }
    });
    // Connection tasks are dropped here; nothing may keep the process alive after the
    // server has stopped.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            if is_node {
                std::process::ExitCode::from(exit::of_node(&e))
            } else {
                std::process::ExitCode::FAILURE
            }
        }
    }
}

/// `pki`: issues the certificates and prints one line per file written.
fn print_issued(args: &cli::PkiArgs) -> anyhow::Result<()> {
    let written = if args.revoke.is_empty() {
        let mut written = gpufleet_wire::pki::issue(&args.dir, &args.server_names, &args.agents)?;
        written.extend(gpufleet_wire::revocation::ensure_list(&args.dir)?);
        written
    } else {
        gpufleet_wire::revocation::revoke(&args.dir, &args.revoke)?
    };
    for path in written {
        println!("wrote {}", path.display());
    }
    Ok(())
}
