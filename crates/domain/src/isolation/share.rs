//! Splitting a destination's free slots: between its subscriptions (R2), and
//! between its oldest and its newest pending deliveries (R4).
//!
//! # Fair share between subscriptions (R2)
//! The host cap (20) is a politeness limit: it is one server. But one
//! subscription must not monopolise it (C2: 40 000 subscriptions multiplexed
//! on one host). So the host's slots are shared max-min fairly among the
//! subscriptions that **have due work** — not all registered ones, or a host
//! with 40 000 registered subscriptions and one busy one would give the busy
//! one 1/40 000 of a slot. Slots already in flight count against their
//! subscription's share; a subscription already above its share gets nothing
//! new (attempts in flight are not pre-empted), and what it does not get, and
//! what idle subscriptions do not use, spills to the others.
//!
//! # The backlog floor (R4)
//! Reserving a share for *new* work starves the backlog under sustained
//! overload (C4). R4 inverts it: at least 20 % of a destination's concurrency
//! goes to its **oldest** pending deliveries, the rest to the newest, and a
//! reservation nobody uses spills to the other side. The floor is a share of
//! the *concurrency*, counted together with what is already in flight: with
//! only the free slots to go on, a destination at its cap that frees one slot
//! at a time would give the backlog either every slot (`ceil(20 % of 1)`) or
//! none (`floor`), never 20 %.

/// One subscription's load on a host, for [`fair_share`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionLoad<K> {
    /// The caller's key for the subscription (e.g. a `SubscriptionId`).
    pub key: K,
    /// Its attempts in flight to this host.
    pub in_flight: u32,
    /// Whether it has deliveries due now.
    pub has_due_work: bool,
}

/// How many new attempts each subscription may start, given the host's
/// `available` slots (from [`Admit::slots`](super::Admit::slots)).
///
/// The result is aligned with `subs`. It sums to `available` whenever any
/// subscription has due work (nothing is left idle while someone could use
/// it) and to 0 otherwise. Each subscription's total (in flight + new) is at
/// most its max-min fair share of `available + Σ in_flight` of the
/// subscriptions with due work, rounded up. Remainder slots go to the
/// subscriptions with the fewest in flight, ties in input order, so callers
/// should rotate the order between passes.
pub fn fair_share<K>(available: u32, subs: &[SubscriptionLoad<K>]) -> Vec<u32> {
    let mut share = vec![0u32; subs.len()];
    // Water-filling: the competitors share `pool` = their in-flight + the
    // free slots. Anyone above the level drops out (keeping what it has),
    // which raises the level for the rest. Someone is always at or below
    // the level (the mean in-flight is at most pool / n), so this ends with
    // a non-empty set, all at or below `level`.
    let mut competing: Vec<usize> = (0..subs.len()).filter(|&i| subs[i].has_due_work).collect();
    if competing.is_empty() || available == 0 {
        return share;
    }
    let mut pool: u64 = u64::from(available)
        + competing
            .iter()
            .map(|&i| u64::from(subs[i].in_flight))
            .sum::<u64>();
    let mut level = pool / competing.len() as u64;
    loop {
        let (over, under): (Vec<usize>, Vec<usize>) = competing
            .iter()
            .partition(|&&i| u64::from(subs[i].in_flight) > level);
        if over.is_empty() {
            break;
        }
        pool -= over
            .iter()
            .map(|&i| u64::from(subs[i].in_flight))
            .sum::<u64>();
        competing = under;
        level = pool / competing.len() as u64;
    }
    for &i in &competing {
        share[i] = u32::try_from(level - u64::from(subs[i].in_flight)).unwrap_or(u32::MAX);
    }
    // The remainder (fewer than one each): to those with the fewest in flight.
    let remainder = (pool % competing.len() as u64) as usize;
    competing.sort_by_key(|&i| subs[i].in_flight);
    for &i in competing.iter().take(remainder) {
        share[i] += 1;
    }
    share
}

/// The share of a destination's concurrency reserved for its oldest
/// deliveries when both backlog and new work wait (R4).
pub const BACKLOG_FLOOR: f64 = 0.2;

/// The inputs of [`backlog_split`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BacklogInput {
    /// Slots free to start now.
    pub slots: u32,
    /// The destination's current concurrency limit (the cap, ramped).
    pub concurrency: u32,
    /// Attempts in flight that were claimed oldest-first.
    pub oldest_in_flight: u32,
    /// Whether deliveries older than the backlog threshold are due.
    pub has_backlog: bool,
    /// Whether younger deliveries are due.
    pub has_new: bool,
}

/// How many of the free slots to claim oldest-first and how many
/// newest-first: `(oldest, newest)`.
///
/// With both kinds waiting, the oldest get enough to bring them up to
/// `ceil(20 % × concurrency)` in flight (at least one), the newest the rest.
/// With only one kind, it gets every slot (the reservation spills both ways).
/// With neither, `(0, 0)`. Always `oldest + newest ≤ slots`.
pub fn backlog_split(input: BacklogInput) -> (u32, u32) {
    let BacklogInput {
        slots,
        concurrency,
        oldest_in_flight,
        has_backlog,
        has_new,
    } = input;
    match (has_backlog, has_new) {
        (false, false) => (0, 0),
        (true, false) => (slots, 0),
        (false, true) => (0, slots),
        (true, true) => {
            let floor = (f64::from(concurrency) * BACKLOG_FLOOR).ceil() as u32;
            let oldest = floor.max(1).saturating_sub(oldest_in_flight).min(slots);
            (oldest, slots - oldest)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn load(in_flight: u32, has_due_work: bool) -> SubscriptionLoad<()> {
        SubscriptionLoad {
            key: (),
            in_flight,
            has_due_work,
        }
    }

    #[test]
    fn fair_share_table() {
        // (available, [(in_flight, due)], shares)
        type Case = (u32, &'static [(u32, bool)], &'static [u32]);
        let table: &[Case] = &[
            // One sub alone takes everything.
            (20, &[(0, true)], &[20]),
            // Two busy subs split it.
            (20, &[(0, true), (0, true)], &[10, 10]),
            // A hog already at 15 gets nothing: pool 5 + 15 = 20, level 10;
            // the hog drops out and the other takes all 5.
            (5, &[(15, true), (0, true)], &[0, 5]),
            // Idle subs' shares spill to the busy one.
            (20, &[(0, true), (0, false), (0, false)], &[20, 0, 0]),
            // An idle sub with attempts in flight keeps them but gets no more.
            (10, &[(0, true), (10, false)], &[10, 0]),
            // Remainder goes to the fewest in flight.
            (7, &[(2, true), (0, true), (1, true)], &[1, 4, 2]), // totals 3, 4, 3
            (1, &[(5, true), (5, true), (6, true)], &[1, 0, 0]),
            (3, &[(0, true), (0, true)], &[2, 1]),
            // Nothing free, or nobody with work.
            (0, &[(0, true)], &[0]),
            (20, &[(0, false)], &[0]),
            (20, &[], &[]),
            // Many subs, fewer slots than subs: one each to the first ones.
            (2, &[(0, true), (0, true), (0, true)], &[1, 1, 0]),
        ];
        for &(available, subs, want) in table {
            let subs: Vec<_> = subs.iter().map(|&(f, d)| load(f, d)).collect();
            assert_eq!(
                fair_share(available, &subs),
                want,
                "{available} over {subs:?}"
            );
        }
    }

    #[test]
    fn one_subscription_cannot_take_more_than_its_share_when_others_have_work() {
        // Host cap 20, four busy subscriptions, all idle in flight.
        let subs: Vec<_> = (0..4).map(|_| load(0, true)).collect();
        assert_eq!(fair_share(20, &subs), [5, 5, 5, 5]);
        // When three of them go idle, the fourth may use the whole cap.
        let subs = [
            load(5, true),
            load(0, false),
            load(0, false),
            load(0, false),
        ];
        assert_eq!(fair_share(15, &subs), [15, 0, 0, 0]);
    }

    #[test]
    fn backlog_split_table() {
        let input = |slots, concurrency, oldest_in_flight, has_backlog, has_new| BacklogInput {
            slots,
            concurrency,
            oldest_in_flight,
            has_backlog,
            has_new,
        };
        // (input, (oldest, newest))
        let table = [
            (input(20, 20, 0, true, true), (4, 16)),  // 20 % floor
            (input(20, 20, 0, true, false), (20, 0)), // unused new share spills to backlog
            (input(20, 20, 0, false, true), (0, 20)), // unused reservation spills to new
            (input(20, 20, 0, false, false), (0, 0)),
            (input(1, 20, 3, true, true), (1, 0)), // steady state at cap: backlog below floor
            (input(1, 20, 4, true, true), (0, 1)), // at its floor: new work
            (input(2, 20, 0, true, true), (2, 0)), // fewer slots than the floor
            (input(2, 2, 0, true, true), (1, 1)),  // ramped to 2: floor of one
            (input(1, 1, 0, true, true), (1, 0)),  // concurrency 1: the floor wins
            (input(0, 20, 0, true, true), (0, 0)),
        ];
        for (i, want) in table {
            assert_eq!(backlog_split(i), want, "{i:?}");
        }
    }

    #[test]
    fn the_backlog_drains_at_its_floor_under_sustained_overload() {
        // Simulate a destination at its cap of 20 with a flood of new work
        // and a backlog: each step one attempt of each class in flight
        // finishes in proportion, and the freed slot is re-split.
        let (mut old, mut new) = (0u32, 0u32);
        let (s_old, s_new) = backlog_split(BacklogInput {
            slots: 20,
            concurrency: 20,
            oldest_in_flight: old,
            has_backlog: true,
            has_new: true,
        });
        old += s_old;
        new += s_new;
        for step in 0..1000 {
            // Alternate which class frees a slot.
            if step % 5 == 0 && old > 0 {
                old -= 1;
            } else {
                new -= 1;
            }
            let (o, n) = backlog_split(BacklogInput {
                slots: 20 - old - new,
                concurrency: 20,
                oldest_in_flight: old,
                has_backlog: true,
                has_new: true,
            });
            old += o;
            new += n;
            assert!(old >= 4, "the backlog keeps its 20 % at step {step}");
            assert_eq!(old + new, 20);
        }
    }

    proptest! {
        #[test]
        fn fair_shares_sum_to_at_most_the_available_slots(
            available in 0u32..200,
            subs in proptest::collection::vec((0u32..50, any::<bool>()), 0..30),
        ) {
            let subs: Vec<_> = subs.into_iter().map(|(f, d)| load(f, d)).collect();
            let shares = fair_share(available, &subs);
            let total: u64 = shares.iter().map(|&s| u64::from(s)).sum();
            prop_assert!(total <= u64::from(available));
            let busy: Vec<_> = subs.iter().filter(|s| s.has_due_work).collect();
            if !busy.is_empty() {
                prop_assert_eq!(total, u64::from(available), "nothing left idle");
            }
            // No one ends above the fair level of the whole pool (rounded up)
            // unless it was already there.
            if !busy.is_empty() {
                let pool: u64 = u64::from(available) + busy.iter().map(|s| u64::from(s.in_flight)).sum::<u64>();
                let fair = pool.div_ceil(busy.len() as u64);
                for (s, &n) in subs.iter().zip(&shares) {
                    if !s.has_due_work { prop_assert_eq!(n, 0); }
                    if n > 0 { prop_assert!(u64::from(s.in_flight + n) <= fair.max(u64::from(s.in_flight))); }
                }
            }
        }

        #[test]
        fn the_split_never_exceeds_the_slots(
            slots in 0u32..100, concurrency in 0u32..100, oldest in 0u32..100, b in any::<bool>(), n in any::<bool>(),
        ) {
            let (o, w) = backlog_split(BacklogInput { slots, concurrency, oldest_in_flight: oldest, has_backlog: b, has_new: n });
            prop_assert!(o + w <= slots);
            if b || n { prop_assert_eq!(o + w, slots); }
            if b && n && slots > 0 && oldest < (f64::from(concurrency) * BACKLOG_FLOOR).ceil() as u32 {
                prop_assert!(o > 0, "backlog below its floor gets a slot");
            }
        }
    }
}
