//! What hookd tells the platform and the customer about a subscription,
//! unasked: the health monitor and its system events.
//!
//! Four conditions are **signals** ([`SignalKind`]): the subscription was
//! disabled by hookd (410 Gone, or every attempt failed for the configured
//! period), its deliveries are dead-lettering (R3), most recent failures
//! share one 4xx status (R6), or ingest is shedding its events (R4). When a
//! signal is raised, a system event `hookd.subscription.<kind>` goes through
//! hookd's own pipeline — accepted in the same store transaction that
//! raises the signal — so the platform subscribes to it like any other
//! event. The store's compare-and-set makes the announcement exactly once,
//! however many nodes see the condition.
//!
//! The monitor runs every few seconds on every node:
//! - **shedding**: samples every subscription's backlog and judges it with
//!   [`BacklogTrend`]; the raised shedding signals (from the store, so every
//!   node agrees) are what ingest refuses;
//! - **disabling**: subscriptions whose failing streak is older than the
//!   configured period are disabled (their deliveries are kept, unsent, and
//!   flow again when re-enabled);
//! - **dead-lettering and configuration errors**: re-judged for the
//!   subscriptions the dispatcher touched since the last round and those
//!   with such a signal raised, from the same counts `/health` shows.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, RwLock};
use std::time::Duration;

use hookd_domain::shedding::{BacklogTrend, SheddingConfig};
use hookd_domain::{DeliveryId, EventId, SubscriptionId};
use hookd_store::{NewDelivery, NewEvent, Notice, SignalKind, StoreError, Subscription};
use tokio_util::sync::CancellationToken;

use crate::AppState;
use crate::error::chain;
use crate::health::{WINDOW, configuration_error};

/// How the monitor judges.
#[derive(Debug, Clone, PartialEq)]
pub struct MonitorConfig {
    /// How often it looks.
    pub every: Duration,
    /// When a backlog sheds.
    pub shedding: SheddingConfig,
    /// How long every attempt must have failed before hookd disables the
    /// subscription (5 days by default).
    pub disable_after: chrono::Duration,
}

impl Default for MonitorConfig {
    fn default() -> Self {
        Self {
            every: Duration::from_secs(5),
            shedding: SheddingConfig::default(),
            disable_after: chrono::Duration::days(5),
        }
    }
}

/// The detail of the dead-lettering signal.
const DEAD_LETTERING: &str =
    "deliveries ran out of retries and are dead; replay them once the endpoint is fixed";

/// The monitor's memory on this node.
#[derive(Debug, Default)]
pub(crate) struct Signals {
    /// Subscriptions ingest refuses now (the raised shedding signals).
    shedding: RwLock<HashSet<SubscriptionId>>,
    /// Subscriptions with attempts since the last round.
    touched: Mutex<HashSet<SubscriptionId>>,
    /// Backlog history, per subscription with a backlog.
    trends: Mutex<HashMap<SubscriptionId, BacklogTrend>>,
}

impl Signals {
    /// Those of `subs` that are shedding now.
    pub(crate) fn shedding_among(
        &self,
        subs: impl Iterator<Item = SubscriptionId>,
    ) -> Vec<SubscriptionId> {
        let shedding = self.shedding.read().unwrap_or_else(|p| p.into_inner());
        if shedding.is_empty() {
            return Vec::new();
        }
        subs.filter(|s| shedding.contains(s)).collect()
    }
}

impl AppState {
    /// Notes that one of `sub_id`'s attempts finished, so the next monitor
    /// round re-judges it. Cheap; called by the dispatcher per attempt.
    pub fn touch(&self, sub_id: &SubscriptionId) {
        self.inner
            .signals
            .touched
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(*sub_id);
    }

    /// Raises `kind` for `sub` with `detail` and announces it with a system
    /// event, in one store transaction. Returns whether it was raised now
    /// (`false`: it was already raised with this detail).
    pub async fn announce(
        &self,
        sub: &Subscription,
        kind: SignalKind,
        detail: &str,
    ) -> Result<bool, StoreError> {
        let event_type = kind.event_type();
        let built = self
            .inner
            .fanout
            .current(self.store())
            .await
            .map_err(|e| StoreError::Backend(Box::new(e)))?;
        let deliveries: Vec<NewDelivery> = built
            .index
            .matches_system(&event_type, sub.customer_id.as_ref())
            .into_iter()
            // Telling a subscription about itself helps no one: if it could
            // hear, it would not be in trouble.
            .filter(|t| t.sub_id != sub.id)
            .map(|t| NewDelivery {
                id: DeliveryId::new(),
                sub_id: t.sub_id,
                destination_host: t.destination_host.to_string(),
            })
            .collect();
        let fanout = deliveries.len();
        let payload = serde_json::json!({
            "subscription_id": sub.id,
            "customer_id": sub.customer_id,
            "url": sub.url.as_str(),
            "signal": kind,
            "detail": detail,
        });
        let notice = Notice {
            event: NewEvent {
                id: EventId::new(),
                event_type,
                payload: payload.to_string(),
                idempotency_key: None,
                customer_id: sub.customer_id.clone(),
            },
            deliveries,
        };
        let raised = self
            .store()
            .raise_signal(&sub.id, kind, detail, Some(notice))
            .await?;
        if raised {
            metrics::counter!("hookd_signals_raised_total", "kind" => kind.as_str()).increment(1);
            tracing::warn!(sub_id = %sub.id, signal = kind.as_str(), detail, deliveries = fanout, "subscription signal raised");
            if fanout > 0 {
                self.wake().notify_one();
            }
        }
        Ok(raised)
    }

    /// Runs the monitor every `config.every` until `shutdown`.
    pub async fn run_monitor(&self, config: MonitorConfig, shutdown: CancellationToken) {
        while !shutdown.is_cancelled() {
            if let Err(e) = self.monitor_round(&config).await {
                tracing::warn!(error = %chain(&e), "the subscription monitor's round failed");
            }
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = tokio::time::sleep(config.every) => {}
            }
        }
    }

    /// One monitor round (for tests, which drive rounds themselves).
    pub async fn monitor_round(&self, config: &MonitorConfig) -> Result<(), StoreError> {
        let now = chrono::Utc::now();
        // One read of every raised signal serves the whole round.
        let raised = self.store().raised_signals(None).await?;
        let of_kind = |kind| -> HashSet<SubscriptionId> {
            raised
                .iter()
                .filter(|s| s.kind == kind)
                .map(|s| s.sub_id)
                .collect()
        };
        self.judge_backlogs(config, now, of_kind(SignalKind::Shedding))
            .await?;
        self.disable_failing(config, now).await?;
        let mut outcomes = of_kind(SignalKind::DeadLettering);
        outcomes.extend(of_kind(SignalKind::ConfigurationError));
        self.judge_outcomes(now, outcomes).await?;
        self.gauge_due_work().await?;
        Ok(())
    }

    /// `hookd_deliveries_due` and `hookd_backlog_oldest_seconds`, refreshed
    /// every round rather than at each scrape: the count grows with the
    /// pending backlog, so its cost is bounded by the monitor's period, not
    /// by how often `/metrics` is scraped.
    async fn gauge_due_work(&self) -> Result<(), StoreError> {
        let due = self.store().due_work().await?;
        metrics::gauge!("hookd_deliveries_due").set(due.due as f64);
        metrics::gauge!("hookd_backlog_oldest_seconds").set(due.oldest_overdue.as_secs_f64());
        Ok(())
    }

    /// Judges every backlog; `raised` are the subscriptions shedding as the
    /// round began. Leaves ingest's set as this round decided it (another
    /// node's verdict reaches it next round).
    async fn judge_backlogs(
        &self,
        config: &MonitorConfig,
        now: chrono::DateTime<chrono::Utc>,
        raised: HashSet<SubscriptionId>,
    ) -> Result<(), StoreError> {
        let store = self.store();
        let backlogs: HashMap<SubscriptionId, u64> = store
            .backlogs()
            .await?
            .into_iter()
            .map(|b| (b.sub_id, b.unfinished))
            .collect();
        metrics::gauge!("hookd_deliveries_unfinished").set(backlogs.values().sum::<u64>() as f64);
        let cfg = &config.shedding;
        let mut verdicts = Vec::new();
        {
            let mut trends = self
                .inner
                .signals
                .trends
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            // A subscription without a backlog needs no history, unless it
            // is shedding and about to be judged "shrunk".
            trends.retain(|id, _| backlogs.contains_key(id) || raised.contains(id));
            for id in backlogs.keys().chain(raised.iter()) {
                let unfinished = backlogs.get(id).copied().unwrap_or(0);
                let trend = trends.entry(*id).or_default();
                let shed = trend.observe(cfg, now, unfinished);
                let judged = unfinished < cfg.threshold || trend.has_window(cfg, now);
                verdicts.push((*id, shed, judged, unfinished));
            }
        }
        verdicts.sort_by_key(|v| v.0);
        verdicts.dedup_by_key(|v| v.0);
        let mut now_shedding = raised.clone();
        for (id, shed, judged, unfinished) in verdicts {
            if shed && !raised.contains(&id) {
                let Ok(sub) = self.store().get_subscription(&id).await else {
                    continue;
                };
                let detail = format!(
                    "its backlog is at or over {} unfinished deliveries and has not shrunk in {} s; new events for it are refused with 429 until it does",
                    cfg.threshold,
                    cfg.window.num_seconds()
                );
                // Raised now, or by another node a moment ago: either way
                // it is raised.
                self.announce(&sub, SignalKind::Shedding, &detail).await?;
                now_shedding.insert(id);
            } else if !shed && judged && raised.contains(&id) {
                store.lower_signal(&id, SignalKind::Shedding).await?;
                now_shedding.remove(&id);
                tracing::info!(sub_id = %id, unfinished, "shedding stopped: the backlog shrank");
            }
        }
        *self
            .inner
            .signals
            .shedding
            .write()
            .unwrap_or_else(|p| p.into_inner()) = now_shedding;
        Ok(())
    }

    async fn disable_failing(
        &self,
        config: &MonitorConfig,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<(), StoreError> {
        let failing = self
            .store()
            .failing_subscriptions(now - config.disable_after)
            .await?;
        for id in failing {
            let Ok(sub) = self.store().get_subscription(&id).await else {
                continue;
            };
            let detail = format!(
                "every attempt failed for {}; its deliveries are kept and flow again when it is re-enabled",
                humanize(config.disable_after)
            );
            self.announce(&sub, SignalKind::Disabled, &detail).await?;
        }
        Ok(())
    }

    /// Re-judges dead-lettering and configuration errors for the
    /// subscriptions touched since the last round and those with either
    /// signal raised (`raised`), which may need lowering.
    async fn judge_outcomes(
        &self,
        now: chrono::DateTime<chrono::Utc>,
        raised: HashSet<SubscriptionId>,
    ) -> Result<(), StoreError> {
        let store = self.store();
        let mut candidates: HashSet<SubscriptionId> = std::mem::take(
            &mut *self
                .inner
                .signals
                .touched
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        candidates.extend(raised);
        for id in candidates {
            let sub = match store.get_subscription(&id).await {
                Ok(sub) => sub,
                Err(StoreError::NotFound) => continue,
                Err(e) => return Err(e),
            };
            let health = match store.subscription_health(&id, now - WINDOW).await {
                Ok(h) => h,
                Err(StoreError::NotFound) => continue,
                Err(e) => return Err(e),
            };
            let raised = |kind| health.signals.iter().find(|s| s.kind == kind);
            // Raised with this very detail already: nothing to write.
            let known = |kind, detail: &str| raised(kind).is_some_and(|s| s.detail == detail);
            if health.dead_count > 0 {
                if !known(SignalKind::DeadLettering, DEAD_LETTERING) {
                    self.announce(&sub, SignalKind::DeadLettering, DEAD_LETTERING)
                        .await?;
                }
            } else if raised(SignalKind::DeadLettering).is_some() {
                store.lower_signal(&id, SignalKind::DeadLettering).await?;
            }
            match configuration_error(&health) {
                Some(e) => {
                    let detail = e.status.to_string();
                    if !known(SignalKind::ConfigurationError, &detail) {
                        self.announce(&sub, SignalKind::ConfigurationError, &detail)
                            .await?;
                    }
                }
                None if raised(SignalKind::ConfigurationError).is_some() => {
                    store
                        .lower_signal(&id, SignalKind::ConfigurationError)
                        .await?;
                }
                None => {}
            }
        }
        Ok(())
    }
}

/// `5 days`, `2 h`, `90 s`.
fn humanize(d: chrono::Duration) -> String {
    let s = d.num_seconds();
    if s % 86_400 == 0 && s >= 86_400 {
        format!("{} days", s / 86_400)
    } else if s % 3600 == 0 && s >= 3600 {
        format!("{} h", s / 3600)
    } else {
        format!("{s} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods_read_as_people_write_them() {
        assert_eq!(humanize(chrono::Duration::days(5)), "5 days");
        assert_eq!(humanize(chrono::Duration::hours(2)), "2 h");
        assert_eq!(humanize(chrono::Duration::seconds(90)), "90 s");
    }
}
