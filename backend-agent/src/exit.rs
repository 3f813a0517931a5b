//! The process's exit codes, for the supervisor that restarts it: 0 after a clean stop, 1
//! for any failure worth a restart, and [`REFUSED`] when the control plane refused the node
//! agent (a wrong join token, a revoked or foreign certificate, an inventory that
//! contradicts the node's): a restart would be refused again, so the node unit names it in
//! `RestartPreventExitStatus=` instead of looping.

/// `gpufleet-agent node`: the control plane refused this node (EX_CONFIG of sysexits.h:
/// what needs changing is the agent's configuration or credentials).
pub const REFUSED: u8 = 78;

/// How the node agent's own words begin when the control plane refused it
/// (`gpufleet-node`'s session ends with this error, and only then).
const REFUSED_PREFIX: &str = "the control plane refused node ";

/// The exit code of `gpufleet-agent node` that ended with `error`.
pub fn of_node(error: &anyhow::Error) -> u8 {
    if error
        .chain()
        .any(|cause| cause.to_string().starts_with(REFUSED_PREFIX))
    {
        REFUSED
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_node_exits_78_and_any_other_failure_1() {
        let refused = anyhow::anyhow!("the control plane refused node gpu-a: join token: wrong");
        assert_eq!(of_node(&refused), REFUSED);
        assert_eq!(of_node(&refused.context("node agent")), REFUSED);
        assert_eq!(of_node(&anyhow::anyhow!("--name: not a DNS label")), 1);
        assert_eq!(
            of_node(&anyhow::anyhow!(
                "cannot lock: the control plane refused node x"
            )),
            1
        );
    }
}
