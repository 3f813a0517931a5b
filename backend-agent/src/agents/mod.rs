//! The control plane's side of the node agents: the registry of connected agents and
//! their orders, the NodeAgentService they connect to, registration against the store,
//! the watch over heartbeats and replacements, and the in-process agents of the
//! embedded mode.

pub mod admission;
pub mod embedded;
pub mod monitor;
pub mod registry;
pub mod service;
