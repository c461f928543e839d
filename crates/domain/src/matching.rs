//! Fan-out matching: which subscriptions an event goes to. Built once from
//! the subscriptions and rebuilt when one changes (design §9.4), so matching
//! an event is a few hash look-ups, never a scan.

use std::collections::HashMap;
use std::sync::Arc;

use crate::event_type::{EventType, EventTypePattern};
use crate::{CustomerId, SubscriptionId};

/// What fan-out needs to know of a subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FanoutTarget {
    /// The subscription.
    pub sub_id: SubscriptionId,
    /// Its customer, if any.
    pub customer_id: Option<CustomerId>,
    /// Its destination host, denormalised onto each delivery row.
    pub destination_host: Arc<str>,
}

/// The index from event type to subscriptions.
#[derive(Debug, Default, Clone)]
pub struct SubscriptionIndex {
    exact: HashMap<String, Vec<Arc<FanoutTarget>>>,
    /// Keyed by the prefix with its trailing dot (`invoice.`).
    prefix: HashMap<String, Vec<Arc<FanoutTarget>>>,
    all: Vec<Arc<FanoutTarget>>,
    len: usize,
}

impl SubscriptionIndex {
    /// Builds the index from `(target, patterns)` pairs.
    pub fn build<'a>(
        subs: impl IntoIterator<Item = (FanoutTarget, &'a [EventTypePattern])>,
    ) -> Self {
        let mut idx = Self::default();
        for (target, patterns) in subs {
            let target = Arc::new(target);
            idx.len += 1;
            // A subscription listing overlapping patterns (`*` and `a.b`)
            // still gets one delivery: `matches` dedupes by id.
            for p in patterns {
                match p {
                    EventTypePattern::All => idx.all.push(target.clone()),
                    EventTypePattern::Prefix(pre) => idx
                        .prefix
                        .entry(pre.clone())
                        .or_default()
                        .push(target.clone()),
                    EventTypePattern::Exact(t) => idx
                        .exact
                        .entry(t.as_str().to_owned())
                        .or_default()
                        .push(target.clone()),
                }
            }
        }
        idx
    }

    /// How many subscriptions are indexed.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no subscription is indexed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The subscriptions an event of type `event_type` goes to: those whose
    /// patterns match it and, when the event names a customer, only that
    /// customer's. Each subscription appears once, in a stable order.
    pub fn matches(
        &self,
        event_type: &EventType,
        customer: Option<&CustomerId>,
    ) -> Vec<Arc<FanoutTarget>> {
        self.select(event_type, true, |t| {
            customer.is_none_or(|c| t.customer_id.as_ref() == Some(c))
        })
    }

    /// The subscriptions one of hookd's own events about a subscription of
    /// `customer` goes to. hookd's events are opt-in: only patterns that
    /// name them (`hookd.subscription.*`, `hookd.*`, an exact type) match —
    /// `*` means "every platform event" and does not. They go to platform
    /// subscriptions (no customer) and to that customer's, never to another
    /// customer's: they describe one customer's endpoint.
    pub fn matches_system(
        &self,
        event_type: &EventType,
        customer: Option<&CustomerId>,
    ) -> Vec<Arc<FanoutTarget>> {
        self.select(event_type, false, |t| {
            t.customer_id.is_none() || t.customer_id.as_ref() == customer
        })
    }

    fn select(
        &self,
        event_type: &EventType,
        include_all: bool,
        keep: impl Fn(&FanoutTarget) -> bool,
    ) -> Vec<Arc<FanoutTarget>> {
        let name = event_type.as_str();
        let mut out: Vec<Arc<FanoutTarget>> = Vec::new();
        let mut push = |list: &Vec<Arc<FanoutTarget>>| {
            for t in list {
                if keep(t) {
                    out.push(t.clone());
                }
            }
        };
        if let Some(list) = self.exact.get(name) {
            push(list);
        }
        if !self.prefix.is_empty() {
            for (i, b) in name.bytes().enumerate() {
                if b == b'.'
                    && let Some(list) = self.prefix.get(&name[..=i])
                {
                    push(list);
                }
            }
        }
        if include_all {
            push(&self.all);
        }
        out.sort_by_key(|t| t.sub_id);
        out.dedup_by(|a, b| a.sub_id == b.sub_id);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(customer: Option<&str>) -> FanoutTarget {
        FanoutTarget {
            sub_id: SubscriptionId::new(),
            customer_id: customer.map(|c| CustomerId::parse(c).unwrap()),
            destination_host: Arc::from("example.com"),
        }
    }

    fn pats(ps: &[&str]) -> Vec<EventTypePattern> {
        ps.iter()
            .map(|p| EventTypePattern::parse(p).unwrap())
            .collect()
    }

    fn ids(v: Vec<Arc<FanoutTarget>>) -> Vec<SubscriptionId> {
        v.into_iter().map(|t| t.sub_id).collect()
    }

    #[test]
    fn exact_prefix_and_all_patterns_match_once_each() {
        let (a, b, c, d) = (target(None), target(None), target(None), target(None));
        let (pa, pb, pc, pd) = (
            pats(&["invoice.paid"]),
            pats(&["invoice.*"]),
            pats(&["*", "invoice.paid"]),
            pats(&["user.*"]),
        );
        let idx = SubscriptionIndex::build([
            (a.clone(), pa.as_slice()),
            (b.clone(), pb.as_slice()),
            (c.clone(), pc.as_slice()),
            (d.clone(), pd.as_slice()),
        ]);
        let got = ids(idx.matches(&EventType::parse("invoice.paid").unwrap(), None));
        let mut want = vec![a.sub_id, b.sub_id, c.sub_id];
        want.sort();
        assert_eq!(got, want);
        let got = ids(idx.matches(&EventType::parse("invoice.refund.partial").unwrap(), None));
        let mut want = vec![b.sub_id, c.sub_id];
        want.sort();
        assert_eq!(got, want);
        assert_eq!(
            ids(idx.matches(&EventType::parse("order").unwrap(), None)),
            vec![c.sub_id]
        );
    }

    #[test]
    fn system_events_are_opt_in_and_stay_with_their_customer() {
        let platform = target(None);
        let mine = target(Some("acme"));
        let theirs = target(Some("globex"));
        let everything = target(None);
        let (pp, pm, pt, pe) = (
            pats(&["hookd.subscription.*"]),
            pats(&["hookd.*"]),
            pats(&["hookd.subscription.disabled"]),
            pats(&["*"]),
        );
        let idx = SubscriptionIndex::build([
            (platform.clone(), pp.as_slice()),
            (mine.clone(), pm.as_slice()),
            (theirs.clone(), pt.as_slice()),
            (everything.clone(), pe.as_slice()),
        ]);
        let ty = EventType::parse("hookd.subscription.disabled").unwrap();
        let acme = CustomerId::parse("acme").unwrap();
        let mut want = vec![platform.sub_id, mine.sub_id];
        want.sort();
        assert_eq!(ids(idx.matches_system(&ty, Some(&acme))), want);
        // A subscription of no customer: platform subscriptions only.
        assert_eq!(ids(idx.matches_system(&ty, None)), vec![platform.sub_id]);
        // Ordinary matching still lets `*` see everything.
        assert_eq!(idx.matches(&ty, None).len(), 4);
    }

    #[test]
    fn a_customer_event_reaches_only_that_customers_subscriptions() {
        let (mine, theirs, global) = (target(Some("acme")), target(Some("globex")), target(None));
        let all = pats(&["*"]);
        let idx = SubscriptionIndex::build([
            (mine.clone(), all.as_slice()),
            (theirs.clone(), all.as_slice()),
            (global.clone(), all.as_slice()),
        ]);
        let acme = CustomerId::parse("acme").unwrap();
        let t = EventType::parse("a.b").unwrap();
        assert_eq!(ids(idx.matches(&t, Some(&acme))), vec![mine.sub_id]);
        assert_eq!(idx.matches(&t, None).len(), 3);
    }
}
