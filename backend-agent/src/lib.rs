//! The `gpufleet-agent` binary's library: its flags (`cli`, the only place clap's types
//! live), the commands that compose the crates (`serve`, with the embedded node agents of
//! `embedded`) and their exit codes (`exit`), and the small admin client (`client`, `lists`, `access`: tokens and the audit log). The control plane
//! (`gpufleet-control`) and the node agent (`gpufleet-node`) meet only here, over their
//! protocol.

pub mod access;
pub mod check;
pub mod cli;
pub mod client;
pub mod database_url;
pub mod embedded;
pub mod exit;
pub mod lists;
pub mod migrate;
pub mod price_book;
pub mod replay;
pub mod serve;
pub mod usage;
