//! The slice geometry shared by every MIG-capable GPU, as bit masks over memory slices.

/// Compute slices per GPU: the compute slices of all instances sum to at most this.
pub const COMPUTE_SLICES: u8 = 7;
/// Memory slices per GPU: placements are runs `[start, start+size)` inside 0..8.
pub const MEMORY_SLICES: u8 = 8;

/// Bit mask of the memory slices `[start, start+size)`.
pub(crate) fn slice_mask(start: u8, size: u8) -> u16 {
    (((1u32 << size) - 1) << start) as u16
}

/// Whether `[start, start+size)` lies inside the GPU's memory slices.
pub(crate) fn in_bounds(start: u8, size: u8) -> bool {
    size >= 1 && start as u16 + size as u16 <= MEMORY_SLICES as u16
}

/// Human form of a slice run: "slice 3" or "slices 4-7".
pub(crate) fn describe_run(start: u8, size: u8) -> String {
    if size == 1 {
        format!("slice {start}")
    } else {
        format!("slices {}-{}", start, start + size - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_cover_the_run() {
        assert_eq!(slice_mask(0, 1), 0b1);
        assert_eq!(slice_mask(4, 4), 0b1111_0000);
        assert_eq!(slice_mask(0, 8), 0xff);
        assert_eq!(slice_mask(6, 2), 0b1100_0000);
    }

    #[test]
    fn bounds() {
        assert!(in_bounds(6, 2));
        assert!(!in_bounds(7, 2));
        assert!(!in_bounds(0, 0));
    }

    #[test]
    fn describes_runs() {
        assert_eq!(describe_run(3, 1), "slice 3");
        assert_eq!(describe_run(4, 4), "slices 4-7");
    }
}
