//! What an XID means for the node: NVIDIA's XID catalog (Ampere and newer) condensed to
//! the fleet's classes, after `/work/shared/reference/driver-xid.md` section 3 (catalog
//! buckets, DCGM's always-fail set, the EKS node-replacement list).

/// How serious an XID is for the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    /// An application's own error (or nothing): the GPU is fine.
    App,
    /// Watch it: a trend or a condition worth a look, the GPU keeps working.
    Warn,
    /// The GPU needs a reset, a reboot or service before more work.
    Fatal,
}

/// The catalog's name and the action for one XID.
pub struct Meaning {
    pub class: Class,
    pub name: &'static str,
    pub action: &'static str,
}

/// The meaning of XID `code`; unknown codes are Warn (looked at, not trusted).
pub fn meaning(code: u64) -> Meaning {
    let (class, name, action) = match code {
        8 => (
            Class::App,
            "FIFO_ERROR_IDLE_TIMEOUT",
            "restart the application",
        ),
        13 => (
            Class::App,
            "GR_EXCEPTION",
            "an application fault; investigate if it repeats on this GPU",
        ),
        31 => (
            Class::App,
            "FIFO_ERROR_MMU_ERR_FLT",
            "an application page fault; investigate if it repeats on this GPU",
        ),
        32 => (
            Class::Warn,
            "PBDMA_ERROR",
            "often PCIe signal quality: watch the PCIe link",
        ),
        43 => (
            Class::App,
            "RESETCHANNEL_VERIF_ERROR",
            "none: the GPU stays healthy",
        ),
        45 => (
            Class::App,
            "PREEMPTIVE_REMOVAL",
            "none unless alone (then restart the fabric manager)",
        ),
        46 => (Class::Fatal, "GPU_TIMEOUT_ERROR", "drain and reset the GPU"),
        48 => (
            Class::Fatal,
            "GPU_ECC_DBE",
            "double-bit ECC error: drain and reset the GPU; service it if it recurs",
        ),
        54 => (
            Class::Fatal,
            "SILENT_RUNNING_PWR_REDUCED_CLOCKING",
            "auxiliary power is not connected: check the mechanicals",
        ),
        62 => (Class::Fatal, "PMU_HALT_ERROR", "drain and reset the GPU"),
        63 => (
            Class::Warn,
            "INFOROM_DRAM_RETIREMENT_EVENT",
            "a row remap or page retirement: reset the GPU to apply it",
        ),
        64 => (
            Class::Fatal,
            "INFOROM_DRAM_RETIREMENT_FAILURE",
            "the remap failed: drain and reset; a candidate for service",
        ),
        68 | 69 => (Class::App, "engine error", "restart the application"),
        74 => (
            Class::Fatal,
            "NVLINK_ERROR",
            "drain and reset the GPU or reboot the node; check its NVLink peer",
        ),
        79 => (
            Class::Fatal,
            "GPU_HAS_FALLEN_OFF_THE_BUS",
            "drain and reboot (power-cycle) the node; service the GPU if it repeats",
        ),
        92 => (
            Class::Warn,
            "EXCESSIVE_SBE_INTERRUPTS",
            "watch the single-bit ECC trend",
        ),
        94 => (
            Class::Warn,
            "CONTAINED_ERROR",
            "restart the application; reset the GPU when convenient",
        ),
        95 => (Class::Fatal, "UNCONTAINED_ERROR", "drain and reset the GPU"),
        109 => (
            Class::Fatal,
            "CTXSW_TIMEOUT_ERROR",
            "drain and reset the GPU",
        ),
        110 => (
            Class::Fatal,
            "SEC_FAULT_ERROR",
            "cold-reset the GPU; service it if it persists",
        ),
        119 => (
            Class::Fatal,
            "GSP_RPC_TIMEOUT",
            "reset the GPU; power-cycle if it persists",
        ),
        120 => (Class::Fatal, "GSP_ERROR", "reset the GPU"),
        121 | 137 => (
            Class::Warn,
            "NVLink notice",
            "log it; reset at the next maintenance window",
        ),
        136 => (Class::Fatal, "ALI_TRAINING_FAIL", "reset the GPU"),
        140 => (
            Class::Fatal,
            "UNRECOVERABLE_ECC_ERROR_ESCAPE",
            "reset the GPU; contact the vendor if it persists",
        ),
        143 => (Class::Fatal, "GPU_INIT_ERROR", "reset the GPU"),
        144..=150 => (
            Class::Fatal,
            "NVLINK5 error",
            "decode the subcode; most need a GPU reset",
        ),
        151 => (Class::Fatal, "KEY_ROTATION_ERROR", "restart the VM"),
        155 => (Class::Fatal, "NVLINK_SW_DEFINED_ERROR", "reset the GPU"),
        156 => (Class::Fatal, "RESOURCE_RETIREMENT_EVENT", "reset the GPU"),
        157 => (
            Class::Warn,
            "RESOURCE_RETIREMENT_FAILURE",
            "no repair resources left: review for service",
        ),
        158 => (Class::Fatal, "GPU_FATAL_TIMEOUT", "reset the GPU"),
        _ => (
            Class::Warn,
            "not in the catalog",
            "look it up in NVIDIA's XID catalog",
        ),
    };
    Meaning {
        class,
        name,
        action,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fatal_xids_are_the_ones_that_need_a_reset_or_service() {
        for code in [46, 48, 64, 74, 79, 95, 119, 140] {
            assert_eq!(meaning(code).class, Class::Fatal, "XID {code}");
        }
        for code in [13, 31, 43, 45] {
            assert_eq!(meaning(code).class, Class::App, "XID {code}");
        }
        assert_eq!(meaning(63).class, Class::Warn);
        assert_eq!(meaning(9999).class, Class::Warn);
        assert_eq!(meaning(79).name, "GPU_HAS_FALLEN_OFF_THE_BUS");
    }
}
