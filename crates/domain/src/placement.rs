//! Where a delivery lives in a sharded deployment (design §4: "sharded by
//! destination"; R5: a hot host split by (host, subscription)).
//!
//! Rendezvous (highest-random-weight) hashing: each shard scores the key,
//! and the best score wins. A key's shard depends only on the key and the
//! shard count, so every node places alike; adding a shard moves only the
//! keys it now wins (about 1/(M+1) of them), never a key between two old
//! shards. The hash is SHA-256, stable across builds and platforms (a
//! `std` hasher is not).

use sha2::{Digest, Sha256};

use crate::SubscriptionId;

/// What a delivery is placed by: its host, or, for a host that was split
/// (`hookd shards split`), its host and subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlacementKey<'a> {
    /// The usual key: every delivery to one host on one shard.
    Host(&'a str),
    /// A split host: each of its subscriptions placed on its own.
    HostAndSubscription(&'a str, &'a SubscriptionId),
}

impl PlacementKey<'_> {
    fn bytes(&self) -> Vec<u8> {
        match self {
            PlacementKey::Host(host) => host.as_bytes().to_vec(),
            PlacementKey::HostAndSubscription(host, sub) => {
                let mut key = host.as_bytes().to_vec();
                // A byte no host name holds, so (host, sub) never equals
                // another host's key.
                key.push(b'\n');
                key.extend_from_slice(sub.as_uuid().as_bytes());
                key
            }
        }
    }
}

/// The shard (an index below `shards`) that `key` lives on. `shards` must
/// be at least 1; 0 is treated as 1.
pub fn shard_of(key: PlacementKey<'_>, shards: usize) -> usize {
    if shards <= 1 {
        return 0;
    }
    let key = key.bytes();
    (0..shards)
        .max_by_key(|&shard| score(&key, shard))
        .unwrap_or(0)
}

fn score(key: &[u8], shard: usize) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update((shard as u64).to_be_bytes());
    h.update(key);
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("host-{i}.example.com")).collect()
    }

    #[test]
    fn one_shard_takes_everything() {
        assert_eq!(shard_of(PlacementKey::Host("a.example"), 1), 0);
        assert_eq!(shard_of(PlacementKey::Host("a.example"), 0), 0);
    }

    #[test]
    fn placement_is_stable_and_spreads_hosts() {
        // The same answer every time (no per-process seed) ...
        let h = hosts(2000);
        let first: Vec<usize> = h
            .iter()
            .map(|h| shard_of(PlacementKey::Host(h), 4))
            .collect();
        let again: Vec<usize> = h
            .iter()
            .map(|h| shard_of(PlacementKey::Host(h), 4))
            .collect();
        assert_eq!(first, again);
        // ... and every shard gets a fair part (500 expected; far from the
        // tails of a binomial(2000, 1/4), whose sd is ~19).
        for shard in 0..4 {
            let n = first.iter().filter(|&&s| s == shard).count();
            assert!((400..600).contains(&n), "shard {shard} got {n} of 2000");
        }
    }

    #[test]
    fn a_known_host_has_a_fixed_shard() {
        // Pinned: a change of hash would move every host of every
        // deployment, so it must show up as a failing test.
        let got: Vec<usize> = ["a.example", "b.example", "c.example", "d.example"]
            .iter()
            .map(|h| shard_of(PlacementKey::Host(h), 3))
            .collect();
        assert_eq!(got, PINNED);
    }
    const PINNED: [usize; 4] = [0, 1, 2, 2];

    #[test]
    fn adding_a_shard_moves_hosts_only_onto_the_new_shard() {
        let h = hosts(3000);
        let mut moved = 0;
        for host in &h {
            let before = shard_of(PlacementKey::Host(host), 3);
            let after = shard_of(PlacementKey::Host(host), 4);
            if before != after {
                assert_eq!(after, 3, "{host} moved between old shards");
                moved += 1;
            }
        }
        // About a quarter move (750 expected).
        assert!((600..900).contains(&moved), "{moved} of 3000 moved");
    }

    #[test]
    fn a_split_host_spreads_its_subscriptions() {
        let subs: Vec<SubscriptionId> = (0..400).map(|_| SubscriptionId::new()).collect();
        let mut seen = [0usize; 4];
        for sub in &subs {
            let s = shard_of(PlacementKey::HostAndSubscription("hot.example", sub), 4);
            let again = shard_of(PlacementKey::HostAndSubscription("hot.example", sub), 4);
            assert_eq!(s, again);
            seen[s] += 1;
        }
        assert!(seen.iter().all(|&n| n > 50), "{seen:?}");
    }
}
