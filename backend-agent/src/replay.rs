//! `replay` and `replay-synthetic`: what pooling buys, from a demand trace
//! (`gpufleet-economics`). The replay is SQLite and arithmetic, run on a blocking thread.

use crate::cli::{ReplayArgs, ReplayFormat, ReplaySyntheticArgs};

pub async fn run(args: ReplayArgs) -> anyhow::Result<()> {
    let inputs = gpufleet_economics::Inputs {
        trace: args.trace,
        fleet: args.fleet,
        prices: args.prices,
    };
    let report = tokio::task::spawn_blocking(move || gpufleet_economics::run(&inputs)).await??;
    match args.format {
        ReplayFormat::Table => print!("{}", gpufleet_economics::render::table(&report)),
        ReplayFormat::Json => println!("{}", gpufleet_economics::render::json(&report)),
    }
    Ok(())
}

pub fn synthetic(args: ReplaySyntheticArgs) -> anyhow::Result<()> {
    let fleet = gpufleet_economics::fleet::load(&args.fleet)?;
    print!(
        "{}",
        gpufleet_economics::synthetic::generate(&fleet, args.rows as usize, args.seed)
    );
    Ok(())
}
