//! One broken invariant: which concern found it and, in words, what (object ids, the
//! instant, the numbers).

use std::fmt;

/// The invariant a [`Violation`] breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Concern {
    /// A model's pool or on-demand nodes held beyond what the fleet has.
    Capacity,
    /// A tenant's GPUs held beyond its quota.
    Quota,
    /// A node's cluster, or a reservation's clusters, not what they may be.
    Membership,
    /// A tenant's event or audit sequence with a hole, a repeat or out of order.
    Sequence,
    /// An acknowledged answer the store does not hold.
    Answer,
    /// Usage records that do not count what the nodes' holdings say.
    Usage,
}

impl Concern {
    pub fn name(self) -> &'static str {
        match self {
            Concern::Capacity => "capacity",
            Concern::Quota => "quota",
            Concern::Membership => "membership",
            Concern::Sequence => "sequence",
            Concern::Answer => "answer",
            Concern::Usage => "usage",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub concern: Concern,
    pub message: String,
}

impl Violation {
    pub fn new(concern: Concern, message: impl Into<String>) -> Violation {
        Violation {
            concern,
            message: message.into(),
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.concern.name(), self.message)
    }
}
