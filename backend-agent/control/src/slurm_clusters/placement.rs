//! Which of a Slurm cluster's nodes run its controllers and login: a pure choice, from the
//! cluster's nodes and where they ran before.
//!
//! - The **head** runs the primary controller and the login. It stays where it is while
//!   its node is in the cluster (a new node, whatever its name, moves nothing; an
//!   unreachable head is covered by Slurm's own failover to the backup, which takes
//!   control of a primary that neither answers nor writes its heartbeat, until it is
//!   replaced). When it leaves the cluster (quarantined, replaced, scaled down) the
//!   backup's node becomes the head: it shares the state and may have taken control.
//!   Without either, the first node by name.
//! - The **backup** runs the standby controller: only when the controllers can share a
//!   state directory (the platform's shared storage), the cluster has a second node, and
//!   that node's host is another host (a controller tells whether it is the primary or
//!   the backup by its host's name). It stays where it is too; else the first node by name
//!   besides the head.

/// A node of the cluster as the choice sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate<'a> {
    /// The node's id.
    pub id: &'a str,
    /// The node's name (Slurm's NodeName).
    pub name: &'a str,
    /// The name of its host, as its agent declared it (what slurmctld finds there).
    pub host: &'a str,
}

/// Indexes into the candidates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub head: usize,
    pub backup: Option<usize>,
}

/// The placement over `nodes` (any order; ties between names go to the first listed),
/// given the head and backup recorded before (node ids, '' for none); None without nodes.
pub fn place(
    nodes: &[Candidate],
    head_before: &str,
    backup_before: &str,
    backup_allowed: bool,
) -> Option<Placement> {
    let at = |id: &str| nodes.iter().position(|n| !id.is_empty() && n.id == id);
    let first_by_name = |skip: &dyn Fn(&Candidate) -> bool| {
        nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| !skip(n))
            .min_by(|a, b| a.1.name.cmp(b.1.name))
            .map(|(i, _)| i)
    };
    let head = at(head_before)
        .or_else(|| at(backup_before))
        .or_else(|| first_by_name(&|_| false))?;
    let head_host = nodes[head].host;
    let fits = |n: &Candidate| n.id != nodes[head].id && n.host != head_host;
    let backup = match backup_allowed {
        false => None,
        true => at(backup_before)
            .filter(|b| fits(&nodes[*b]))
            .or_else(|| first_by_name(&|n| !fits(n))),
    };
    Some(Placement { head, backup })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes<'a>(names: &[&'a str]) -> Vec<Candidate<'a>> {
        names
            .iter()
            .map(|n| Candidate {
                id: n,
                name: n,
                host: n,
            })
            .collect()
    }

    fn names(ns: &[Candidate], p: Option<Placement>) -> (String, Option<String>) {
        let p = p.expect("a placement");
        (
            ns[p.head].name.to_string(),
            p.backup.map(|b| ns[b].name.to_string()),
        )
    }

    #[test]
    fn the_first_node_by_name_is_the_head_and_the_next_the_backup() {
        let ns = nodes(&["g3", "g1", "g2"]);
        assert_eq!(
            names(&ns, place(&ns, "", "", true)),
            ("g1".into(), Some("g2".into()))
        );
        assert_eq!(names(&ns, place(&ns, "", "", false)), ("g1".into(), None));
        assert_eq!(place(&[], "", "", true), None);
        let one = nodes(&["g1"]);
        assert_eq!(names(&one, place(&one, "", "", true)), ("g1".into(), None));
    }

    #[test]
    fn the_head_and_backup_stay_while_their_nodes_are_in_the_cluster() {
        // A node joins whose name sorts first: nothing moves.
        let ns = nodes(&["g0", "g2", "g3"]);
        assert_eq!(
            names(&ns, place(&ns, "g3", "g2", true)),
            ("g3".into(), Some("g2".into()))
        );
    }

    #[test]
    fn a_head_that_leaves_hands_over_to_the_backup_and_a_new_backup_is_chosen() {
        // g1 (the head) left; g2, its backup, becomes the head; g4 (the replacement)
        // and g3 remain: g3 comes first by name.
        let ns = nodes(&["g2", "g3", "g4"]);
        assert_eq!(
            names(&ns, place(&ns, "g1", "g2", true)),
            ("g2".into(), Some("g3".into()))
        );
        // Neither is left: the first by name.
        assert_eq!(
            names(&ns, place(&ns, "g1", "g9", true)),
            ("g2".into(), Some("g3".into()))
        );
    }

    #[test]
    fn no_backup_shares_the_heads_host() {
        let ns = vec![
            Candidate {
                id: "a",
                name: "a",
                host: "one",
            },
            Candidate {
                id: "b",
                name: "b",
                host: "one",
            },
            Candidate {
                id: "c",
                name: "c",
                host: "two",
            },
        ];
        assert_eq!(
            names(&ns, place(&ns, "a", "b", true)),
            ("a".into(), Some("c".into()))
        );
        assert_eq!(
            names(&ns[..2], place(&ns[..2], "", "", true)),
            ("a".into(), None)
        );
    }
}
