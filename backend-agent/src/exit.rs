//! The process's exit codes, for the supervisor that restarts it: 0 after a clean stop, 1
//! for any failure worth a restart, and [`REFUSED`] when the control plane refused the node
//! agent (a wrong join token, a revoked or foreign certificate, an inventory that
//! contradicts the node's): a restart would be refused again, so the node unit names it in
//! `RestartPreventExitStatus=` instead of looping.

/// `gpufleet-agent node`: the control plane refused this node (EX_CONFIG of sysexits.h:
/// what needs changing is the agent's configuration or credentials).
pub const REFUSED: u8 = 78;

/// The exit code of `gpufleet-agent node` that ended with `error`.
pub fn of_node(error: &anyhow::Error) -> u8 {
    if error
        .chain()
        .any(|cause| cause.is::<gpufleet_node::session::Refused>())
    {
        REFUSED
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufleet_node::session::Refused;

    #[test]
    fn a_refused_node_exits_78_and_any_other_failure_1() {
        let refused = || {
            anyhow::Error::new(Refused {
                node: "gpu-a".into(),
                why: "join token: wrong".into(),
            })
        };
        assert_eq!(of_node(&refused()), REFUSED);
        assert_eq!(of_node(&refused().context("node agent")), REFUSED);
        assert_eq!(of_node(&anyhow::anyhow!("--name: not a DNS label")), 1);
        // Words alone are no refusal.
        assert_eq!(
            of_node(&anyhow::anyhow!(
                "the control plane refused node x: said by something else"
            )),
            1
        );
    }
}
