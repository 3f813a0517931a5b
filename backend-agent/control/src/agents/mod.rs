//! The control plane's side of the node agents: the NodeAgentService they connect to,
//! registration against the store, what a session may send, and the watch over heartbeats and replacements (the
//! agents connected now and their orders are `crate::registry`). Agents of the embedded
//! mode connect like any other (the binary composes them).

pub mod admission;
pub mod monitor;
pub mod pacing;
pub mod results;
pub mod service;
