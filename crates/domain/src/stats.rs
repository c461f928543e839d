//! Latency percentiles for the daily rollup (`GET /subscriptions/{id}/stats`).
//!
//! The store keeps each day's attempt durations as `(milliseconds, count)`
//! pairs, one per distinct value: exact, mergeable across what retention
//! folded away and what is still stored, and small (a day has at most a few
//! thousand distinct millisecond values, since attempts time out).

/// The `q`-quantile (`0 < q <= 1`) of durations given as ascending
/// `(milliseconds, count)` pairs: the smallest value with at least `q` of
/// all durations at or below it (nearest rank). `None` when empty.
pub fn percentile(pairs: &[(u64, u64)], q: f64) -> Option<u64> {
    let total: u64 = pairs.iter().map(|&(_, n)| n).sum();
    if total == 0 {
        return None;
    }
    let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
    let mut seen = 0u64;
    for &(ms, n) in pairs {
        seen += n;
        if seen >= rank {
            return Some(ms);
        }
    }
    pairs.last().map(|&(ms, _)| ms)
}

/// Adds `more` into `into`, keeping it ascending with one pair per value.
pub fn merge(into: &mut Vec<(u64, u64)>, more: &[(u64, u64)]) {
    into.extend_from_slice(more);
    into.sort_unstable_by_key(|&(ms, _)| ms);
    into.dedup_by(|b, a| {
        if a.0 == b.0 {
            a.1 += b.1;
            true
        } else {
            false
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        // 1..=100 ms, one each.
        let pairs: Vec<(u64, u64)> = (1..=100).map(|ms| (ms, 1)).collect();
        assert_eq!(percentile(&pairs, 0.5), Some(50));
        assert_eq!(percentile(&pairs, 0.9), Some(90));
        assert_eq!(percentile(&pairs, 0.99), Some(99));
        assert_eq!(percentile(&pairs, 1.0), Some(100));
    }

    #[test]
    fn counts_weigh_values() {
        let pairs = [(10, 98), (2000, 2)];
        assert_eq!(percentile(&pairs, 0.5), Some(10));
        assert_eq!(percentile(&pairs, 0.98), Some(10));
        assert_eq!(percentile(&pairs, 0.99), Some(2000));
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn merging_adds_counts_of_equal_values_and_keeps_order() {
        let mut a = vec![(5, 1), (10, 2)];
        merge(&mut a, &[(7, 1), (10, 3), (1, 4)]);
        assert_eq!(a, vec![(1, 4), (5, 1), (7, 1), (10, 5)]);
    }
}
