//! Where every Slurm controller, slurmd and login of the platform listens: one range of
//! TCP ports the operator chooses (`serve --slurm-ports`), by default 20000-29999, below
//! the kernel's ephemeral ports (32768 and up on Linux) so an outgoing connection never
//! holds one first, and so a site's firewall can open exactly it between its GPU hosts
//! and to the logins (docs/guides/slurm.md, "Ports").

use std::fmt;
use std::str::FromStr;

/// The lowest port a range may start at: below it are the privileged ports.
const LOWEST: u16 = 1024;
/// The fewest ports a range may hold: a cluster takes two (controller, login) and one
/// per node, so fewer would leave room for hardly any cluster.
const FEWEST: u32 = 16;

/// An inclusive range of TCP ports, `low-high`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    low: u16,
    high: u16,
}

impl PortRange {
    pub const DEFAULT: PortRange = PortRange {
        low: 20000,
        high: 29999,
    };

    pub fn low(&self) -> u16 {
        self.low
    }

    pub fn high(&self) -> u16 {
        self.high
    }

    pub fn contains(&self, port: u16) -> bool {
        (self.low..=self.high).contains(&port)
    }

    /// The part of this range inside `ephemeral` (the kernel's range for outgoing
    /// connections, `net.ipv4.ip_local_port_range`), if any: ports there may be held
    /// by any outgoing connection when a daemon starts.
    pub fn overlap(&self, ephemeral: PortRange) -> Option<PortRange> {
        let (low, high) = (self.low.max(ephemeral.low), self.high.min(ephemeral.high));
        (low <= high).then_some(PortRange { low, high })
    }

    /// This host's ephemeral port range, if it can be read.
    pub fn ephemeral() -> Option<PortRange> {
        let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
        let mut words = text.split_whitespace().map(|w| w.parse::<u16>().ok());
        let (low, high) = (words.next()??, words.next()??);
        (low <= high).then_some(PortRange { low, high })
    }
}

impl Default for PortRange {
    fn default() -> Self {
        PortRange::DEFAULT
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.low, self.high)
    }
}

impl FromStr for PortRange {
    type Err = String;

    /// `LOW-HIGH`, both included, e.g. `20000-29999`.
    fn from_str(s: &str) -> Result<Self, String> {
        let (low, high) = s
            .trim()
            .split_once('-')
            .ok_or_else(|| format!("'{s}' is not a range: write LOW-HIGH, e.g. 20000-29999"))?;
        let port = |word: &str, which: &str| {
            word.trim()
                .parse::<u16>()
                .map_err(|_| format!("'{s}': the {which} end '{word}' is not a port (1-65535)"))
        };
        let (low, high) = (port(low, "low")?, port(high, "high")?);
        if low < LOWEST {
            return Err(format!(
                "'{s}': ports below {LOWEST} are privileged; start the range at {LOWEST} or above"
            ));
        }
        if low > high {
            return Err(format!("'{s}': the low end is above the high end"));
        }
        let size = u32::from(high) - u32::from(low) + 1;
        if size < FEWEST {
            return Err(format!(
                "'{s}' holds {size} ports; a cluster takes two and one per node: give at least {FEWEST}"
            ));
        }
        Ok(PortRange { low, high })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_is_low_dash_high_and_bad_ones_say_why() {
        let r: PortRange = "30000-30999".parse().unwrap();
        assert_eq!((r.low(), r.high()), (30000, 30999));
        assert_eq!(r.to_string(), "30000-30999");
        assert!(r.contains(30000) && r.contains(30999) && !r.contains(31000));
        assert_eq!(
            " 20000 - 29999 ".parse::<PortRange>(),
            Ok(PortRange::DEFAULT)
        );
        for (text, says) in [
            ("20000", "not a range"),
            ("20000-70000", "high end '70000' is not a port"),
            ("x-29999", "low end 'x' is not a port"),
            ("80-29999", "privileged"),
            ("29999-20000", "low end is above the high end"),
            ("20000-20009", "holds 10 ports"),
        ] {
            let err = text.parse::<PortRange>().unwrap_err();
            assert!(err.contains(says), "{text}: {err}");
        }
    }

    #[test]
    fn the_overlap_with_the_ephemeral_ports_is_what_both_hold() {
        let eph = PortRange {
            low: 32768,
            high: 60999,
        };
        assert_eq!(PortRange::DEFAULT.overlap(eph), None);
        let r: PortRange = "30000-40000".parse().unwrap();
        assert_eq!(r.overlap(eph).unwrap().to_string(), "32768-40000");
    }
}
