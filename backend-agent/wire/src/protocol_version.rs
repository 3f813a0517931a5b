//! The node agent protocol's version and the skew both ends accept. Each end says its
//! release and protocol when the session opens (`RegisterNode`, `Registered`); an end
//! from before versions were sent says neither and speaks protocol 1. Each end accepts a
//! peer at most [`SKEW`] protocol versions from its own, so that a rolling upgrade may
//! run the previous release on either side; the newer end speaks the older's protocol.
//! Both ends apply the same rule, so the control plane refuses first, before it records
//! anything of the agent.

/// This build's release: the workspace version, as `scripts/release.sh` names it.
pub const RELEASE: &str = env!("CARGO_PKG_VERSION");

/// The protocol this build speaks. Raise it with any change the other end must know of
/// (a new message or meaning), and say what the newer end does for the older one in
/// `proto/gpufleet/v1/node_agent.proto`.
/// 1: the releases before versions were sent. 2: versions sent; node-local team volumes
/// (`VolumeMount.local_size_gib`, `owner_uid`).
pub const PROTOCOL: u32 = 2;

/// The first protocol whose agents make node-local team volumes: an older agent ignores
/// the fields and would refuse the volume as not under shared storage.
pub const NODE_LOCAL_VOLUMES: u32 = 2;

/// The protocol of an end that sends no version: the release before versions were sent.
pub const UNVERSIONED: u32 = 1;

/// How many protocol versions from its own an end accepts, either way.
pub const SKEW: u32 = 1;

/// `OrderResult.error_kind` of an order an agent refused unrun because its
/// `WorkOrder.epoch` is older than the newest epoch of the control plane's lease the agent
/// has seen. Not a protocol version change: an agent that ignores the epoch runs the
/// order, and a control plane that sends none (0) is obeyed.
pub const STALE_EPOCH: &str = "stale_epoch";

/// One end's versions, as it said them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    /// The release it named; empty when it named none.
    pub release: String,
    pub protocol: u32,
}

impl Version {
    /// This build.
    pub fn ours() -> Version {
        Version {
            release: RELEASE.to_string(),
            protocol: PROTOCOL,
        }
    }

    /// A peer's versions from what it sent (`protocol` absent: an unversioned release).
    pub fn peer(release: &str, protocol: Option<u32>) -> Version {
        Version {
            release: release.chars().take(128).collect(),
            protocol: protocol.unwrap_or(UNVERSIONED),
        }
    }

    /// Whether this build works with the peer: its protocol within [`SKEW`] of ours.
    pub fn supported(&self) -> bool {
        self.protocol.abs_diff(PROTOCOL) <= SKEW
    }

    /// What the peer should do when it is not supported: the older end upgrades.
    pub fn remedy(&self, peer_kind: &str, our_kind: &str) -> String {
        if self.protocol > PROTOCOL {
            format!("upgrade the {our_kind} to a release within {SKEW} protocol version of the {peer_kind}'s")
        } else {
            format!("upgrade the {peer_kind} to a release within {SKEW} protocol version of the {our_kind}'s")
        }
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.release.is_empty() {
            write!(f, "an unnamed release speaking protocol {}", self.protocol)
        } else {
            write!(
                f,
                "release {} speaking protocol {}",
                self.release, self.protocol
            )
        }
    }
}

/// The range of protocols this build accepts, for messages: "1 to 3".
pub fn accepted() -> String {
    format!(
        "{} to {}",
        PROTOCOL.saturating_sub(SKEW),
        PROTOCOL.saturating_add(SKEW)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unversioned_peer_is_the_previous_protocol_and_is_accepted() {
        let old = Version::peer("", None);
        assert_eq!(old.protocol, UNVERSIONED);
        assert!(old.supported());
        assert_eq!(old.to_string(), "an unnamed release speaking protocol 1");
    }

    #[test]
    fn peers_within_one_protocol_version_are_accepted_and_others_refused() {
        for (protocol, ok) in [(0, false), (1, true), (2, true), (3, true), (4, false)] {
            assert_eq!(
                Version::peer("x", Some(protocol)).supported(),
                ok,
                "protocol {protocol}"
            );
        }
        assert_eq!(accepted(), "1 to 3");
    }

    #[test]
    fn the_older_end_is_the_one_to_upgrade() {
        let newer = Version::peer("9.0.0", Some(PROTOCOL + 2));
        assert!(newer
            .remedy("agent", "control plane")
            .starts_with("upgrade the control plane"));
        let older = Version::peer("0.0.1", Some(0));
        assert!(older
            .remedy("agent", "control plane")
            .starts_with("upgrade the agent"));
    }
}
