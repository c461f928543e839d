//! Whether a hot-shard split of one destination host may run now (R5:
//! "never split during a failure").
//!
//! A split moves a host's work between shards; doing it while the host is
//! failing would mix a recovery with a migration. So it is refused while
//! either sign of a failure shows:
//!
//! - the host's circuit is not closed (open or half-open) on any live node,
//!   as the nodes' heartbeats last reported it (circuit state lives in each
//!   node's memory, R1; the caller passes only the nodes it judges live);
//! - or its recent attempts failed at least [`SPLIT_MAX_FAILURE_PERCENT`] %
//!   of the time, judged only from [`SPLIT_MIN_ATTEMPTS`] attempts up (a
//!   handful of attempts says nothing about a rate).
//!
//! The rule is pure: the caller gathers the heartbeats and counts the
//! attempts, and shows the sentence to the operator.

/// Fewer recent attempts than this are too few to judge the failure rate
/// by: the rate alone then never refuses.
pub const SPLIT_MIN_ATTEMPTS: u64 = 20;

/// A failure rate at or above this percentage refuses a split.
pub const SPLIT_MAX_FAILURE_PERCENT: u64 = 20;

/// A host's recent attempts, for [`split_refusal`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct RecentAttempts {
    /// Attempts made.
    pub total: u64,
    /// Of those, the attempts that got no 2xx (at most `total`).
    pub failed: u64,
}

/// Why a split of `host` must not run now, as one sentence naming the host,
/// the reason and (for circuits) the node(s); `None` if it may run.
///
/// `live_open_circuits` holds, for each live node, its id and the hosts whose
/// circuit is not closed on it (its last heartbeat's
/// `open_circuits`). A circuit not closed on any node refuses; otherwise
/// `recent` refuses if it has at least [`SPLIT_MIN_ATTEMPTS`] attempts of
/// which at least [`SPLIT_MAX_FAILURE_PERCENT`] % failed. Host names are
/// compared ignoring ASCII case.
pub fn split_refusal(
    host: &str,
    live_open_circuits: &[(String, Vec<String>)],
    recent: RecentAttempts,
) -> Option<String> {
    let mut nodes: Vec<&str> = Vec::new();
    for (node, hosts) in live_open_circuits {
        if hosts.iter().any(|h| h.eq_ignore_ascii_case(host)) && !nodes.contains(&node.as_str()) {
            nodes.push(node);
        }
    }
    if !nodes.is_empty() {
        let which = if nodes.len() == 1 { "node" } else { "nodes" };
        return Some(format!(
            "refusing to split {host}: its circuit is open or half-open on {which} {} \
             (never split during a failure)",
            nodes.join(", ")
        ));
    }
    let RecentAttempts { total, failed } = recent;
    // In u128: no product overflows.
    let failing =
        u128::from(failed) * 100 >= u128::from(SPLIT_MAX_FAILURE_PERCENT) * u128::from(total);
    if total >= SPLIT_MIN_ATTEMPTS && failing {
        let percent = u128::from(failed) * 100 / u128::from(total);
        return Some(format!(
            "refusing to split {host}: {percent} % of its recent attempts failed \
             ({failed} of {total}; {SPLIT_MAX_FAILURE_PERCENT} % or more is a failure) \
             (never split during a failure)"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, hosts: &[&str]) -> (String, Vec<String>) {
        (
            id.to_owned(),
            hosts.iter().map(|h| (*h).to_owned()).collect(),
        )
    }

    fn attempts(total: u64, failed: u64) -> RecentAttempts {
        RecentAttempts { total, failed }
    }

    const QUIET: RecentAttempts = RecentAttempts {
        total: 100,
        failed: 0,
    };

    #[test]
    fn split_allowed_when_every_circuit_is_closed_and_attempts_succeed() {
        assert_eq!(split_refusal("a.example", &[], QUIET), None);
        assert_eq!(
            split_refusal("a.example", &[node("w1", &[]), node("w2", &[])], QUIET),
            None
        );
        assert_eq!(
            split_refusal("a.example", &[], RecentAttempts::default()),
            None,
            "no attempts at all"
        );
    }

    #[test]
    fn split_refused_while_the_hosts_circuit_is_not_closed_on_a_live_node() {
        let live = [
            node("w1", &["b.example"]),
            node("w2", &["a.example", "c.example"]),
        ];
        let why = split_refusal("a.example", &live, QUIET).expect("refused");
        assert!(why.contains("a.example"), "{why}");
        assert!(why.contains("circuit"), "{why}");
        assert!(why.contains("node w2"), "names the node: {why}");
        assert!(!why.contains("w1"), "only the nodes that see it: {why}");
    }

    #[test]
    fn split_refusal_names_every_node_that_sees_the_circuit() {
        let live = [
            node("w1", &["a.example"]),
            node("w2", &[]),
            node("w3", &["a.example"]),
        ];
        let why = split_refusal("a.example", &live, QUIET).expect("refused");
        assert!(why.contains("nodes w1, w3"), "{why}");
    }

    #[test]
    fn split_refused_by_a_circuit_whatever_the_attempts() {
        let live = [node("w1", &["a.example"])];
        assert!(split_refusal("a.example", &live, RecentAttempts::default()).is_some());
        assert!(split_refusal("a.example", &live, attempts(19, 19)).is_some());
    }

    #[test]
    fn split_host_names_compare_ignoring_case() {
        let live = [node("w1", &["A.Example"])];
        assert!(split_refusal("a.example", &live, QUIET).is_some());
    }

    #[test]
    fn split_not_refused_by_another_hosts_open_circuit() {
        let live = [
            node("w1", &["b.example"]),
            node("w2", &["a.example.org", "example"]),
        ];
        assert_eq!(split_refusal("a.example", &live, QUIET), None);
    }

    #[test]
    fn split_refused_at_a_failure_rate_of_20_percent_and_states_it() {
        let why = split_refusal("a.example", &[], attempts(20, 4)).expect("refused");
        assert!(why.contains("a.example"), "{why}");
        assert!(why.contains("20 %"), "states the rate: {why}");
        assert!(why.contains("4 of 20"), "{why}");
        let why = split_refusal("a.example", &[], attempts(40, 30)).expect("refused");
        assert!(why.contains("75 %"), "{why}");
        assert!(why.contains("30 of 40"), "{why}");
    }

    #[test]
    fn split_allowed_below_20_attempts_even_if_all_failed() {
        assert_eq!(split_refusal("a.example", &[], attempts(19, 19)), None);
        assert_eq!(split_refusal("a.example", &[], attempts(1, 1)), None);
    }

    #[test]
    fn split_allowed_just_below_the_failure_rate() {
        assert_eq!(split_refusal("a.example", &[], attempts(20, 3)), None);
        assert_eq!(split_refusal("a.example", &[], attempts(101, 20)), None);
        assert!(split_refusal("a.example", &[], attempts(100, 20)).is_some());
    }

    #[test]
    fn split_rate_does_not_overflow() {
        assert!(split_refusal("a.example", &[], attempts(u64::MAX, u64::MAX)).is_some());
        assert_eq!(
            split_refusal("a.example", &[], attempts(u64::MAX, u64::MAX / 10)),
            None
        );
    }
}
