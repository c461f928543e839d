//! A destination's concurrency cap divided among the worker nodes that share
//! one database (issue 8: scale out on PostgreSQL).
//!
//! Admission state is per process, so with `N` worker nodes each enforcing
//! the whole cap a host could see `N × cap` attempts at once. Each node
//! therefore admits only its share, `⌈cap / N⌉` (at least 1), where `N` is
//! the number of live worker nodes the store's heartbeats report. The shares
//! add up to at most `cap + N − 1` (the rounding up, which keeps a cap
//! smaller than the node count from starving anyone), and to exactly `cap`
//! when `N` divides it.
//!
//! The count is only as fresh as the last heartbeat: when a node joins, the
//! others keep their larger share until their next heartbeat sees it, so for
//! at most one heartbeat period a host may see up to `cap + ⌈cap / N⌉`. When
//! a node dies, the others keep their smaller share until it drops out of
//! the live window: under-subscription, the safe side.

/// One node's share of a host's concurrency `cap` when `live_nodes` worker
/// nodes share it: `⌈cap / live_nodes⌉`, at least 1. Zero live nodes (no
/// heartbeat yet, or the store unreachable at start) counts as one: this
/// node alone.
pub fn node_share(cap: u32, live_nodes: u32) -> u32 {
    cap.div_ceil(live_nodes.max(1)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_node_keeps_the_whole_cap() {
        assert_eq!(node_share(20, 1), 20);
        assert_eq!(node_share(1, 1), 1);
    }

    #[test]
    fn the_cap_is_divided_rounding_up() {
        assert_eq!(node_share(20, 2), 10);
        assert_eq!(node_share(20, 3), 7);
        assert_eq!(node_share(20, 4), 5);
        assert_eq!(node_share(21, 4), 6);
    }

    #[test]
    fn every_node_keeps_at_least_one_slot() {
        assert_eq!(node_share(3, 5), 1);
        assert_eq!(node_share(1, 100), 1);
        assert_eq!(node_share(0, 3), 1, "a zero cap still admits one");
    }

    #[test]
    fn no_live_node_counts_as_this_one_alone() {
        assert_eq!(node_share(20, 0), 20);
    }

    #[test]
    fn the_shares_hold_the_cap_up_to_rounding() {
        for cap in 1..=64u32 {
            for nodes in 1..=16u32 {
                let total = node_share(cap, nodes) * nodes;
                assert!(total >= cap, "cap {cap}, {nodes} nodes: {total} < cap");
                assert!(
                    total < cap + nodes,
                    "cap {cap}, {nodes} nodes: {total} over cap + rounding"
                );
                if cap % nodes == 0 {
                    assert_eq!(total, cap, "cap {cap}, {nodes} nodes divide exactly");
                }
            }
        }
    }
}
