//! Words of a check result that both ends read.

/// The `value` of a bandwidth pair whose sender could not connect to its peer at all
/// (nothing was measured): the control plane tells such a pair from a slow one.
pub const BANDWIDTH_NO_DATA: &str = "no data";
