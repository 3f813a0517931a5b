//! The kinds of work order, as both ends label them in their metrics.

pub const MIG_LAYOUT: &str = "mig_layout";
pub const DRIVER: &str = "driver";
