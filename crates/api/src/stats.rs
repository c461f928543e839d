//! `GET /subscriptions/{id}/stats?days=N`: the per-subscription daily rollup
//! (design §9.3: "keep a rolled-up counter forever, since that is what
//! customers actually query"). Delivery records expire (7 days by default);
//! these counts do not, because retention folds what it removes into them.

use axum::Json;
use axum::extract::State;
use hookd_domain::SubscriptionId;
use hookd_domain::stats::percentile;
use hookd_store::DailyStats;
use serde::Serialize;

use crate::AppState;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{IdPath, QueryParams, from_str};
use crate::subscriptions::visible;

use crate::limits::{DEFAULT_STATS_DAYS as DEFAULT_DAYS, MAX_STATS_DAYS as MAX_DAYS};

/// One day.
#[derive(Debug, Serialize, PartialEq, utoipa::ToSchema)]
struct DayView {
    /// The UTC day, `2026-11-30`.
    day: chrono::NaiveDate,
    attempts: u64,
    delivered: u64,
    failed: u64,
    dead: u64,
    /// Attempt durations; `null` on a day without attempts.
    latency_ms: Option<Latency>,
}

#[derive(Debug, Serialize, PartialEq, utoipa::ToSchema)]
struct Latency {
    p50: u64,
    p90: u64,
    p99: u64,
    max: u64,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct StatsView {
    #[schema(value_type = String)]
    sub_id: SubscriptionId,
    /// Oldest day first; every day of the range, zeros where nothing ran.
    data: Vec<DayView>,
}

/// Every day from `first` to `last`, with the rollup's numbers where it has
/// them.
fn days(first: chrono::NaiveDate, last: chrono::NaiveDate, rows: Vec<DailyStats>) -> Vec<DayView> {
    let mut rows = rows.into_iter().peekable();
    first
        .iter_days()
        .take_while(|d| *d <= last)
        .map(|day| {
            while rows.peek().is_some_and(|r| r.day < day) {
                rows.next();
            }
            match rows.next_if(|r| r.day == day) {
                Some(r) => DayView {
                    day,
                    attempts: r.attempts,
                    delivered: r.delivered,
                    failed: r.failed,
                    dead: r.dead,
                    latency_ms: percentile(&r.latency_ms, 0.5).map(|p50| Latency {
                        p50,
                        p90: percentile(&r.latency_ms, 0.9).unwrap_or(p50),
                        p99: percentile(&r.latency_ms, 0.99).unwrap_or(p50),
                        max: r.latency_ms.last().map_or(p50, |&(ms, _)| ms),
                    }),
                },
                None => DayView {
                    day,
                    attempts: 0,
                    delivered: 0,
                    failed: 0,
                    dead: 0,
                    latency_ms: None,
                },
            }
        })
        .collect()
}

/// `GET /subscriptions/{id}/stats`.
#[utoipa::path(
    get,
    path = "/subscriptions/{id}/stats",
    operation_id = "get_subscription_stats",
    tag = "subscriptions",
    params(
        ("id" = String, Path, description = "The subscription's id (`sub_…`)."),
        ("days" = Option<u32>, Query, description = "How many days up to today (UTC), 1 to 3660; 7 when absent."),
    ),
    responses(
        (status = 200, description = "The daily rollup, oldest day first.", body = StatsView),
        (status = 400, description = "Malformed request: bad JSON, a wrong type, a missing or unknown field or query parameter.", body = crate::error::Body),
        crate::error::CommonErrors,
        (status = 404, description = "No such subscription, or not the caller's (also a malformed id).", body = crate::error::Body),
    ),
    security(("bearer" = [])),
)]
pub(crate) async fn get(
    State(state): State<AppState>,
    caller: Caller,
    IdPath(sub_id): IdPath<SubscriptionId>,
    mut q: QueryParams,
) -> Result<Json<impl Serialize>, ApiError> {
    let n = q
        .take_parsed("days", from_str::<u32>)?
        .unwrap_or(DEFAULT_DAYS);
    if !(1..=MAX_DAYS).contains(&n) {
        return Err(ApiError::BadRequest(format!(
            "days: must be 1 to {MAX_DAYS}"
        )));
    }
    q.finish()?;
    visible(&state, &caller, &sub_id).await?;
    let today = chrono::Utc::now().date_naive();
    let first = today - chrono::Days::new(u64::from(n - 1));
    let rows = state.store().daily_stats(&sub_id, first).await?;
    Ok(Json(StatsView {
        sub_id,
        data: days(first, today, rows),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(d: u32) -> chrono::NaiveDate {
        chrono::NaiveDate::from_ymd_opt(2026, 11, d).unwrap()
    }

    #[test]
    fn every_day_of_the_range_is_shown_with_zeros_where_nothing_ran() {
        let rows = vec![
            DailyStats {
                day: day(27),
                attempts: 3,
                delivered: 2,
                failed: 0,
                dead: 1,
                latency_ms: vec![(10, 2), (900, 1)],
            },
            DailyStats {
                day: day(29),
                attempts: 1,
                delivered: 1,
                failed: 0,
                dead: 0,
                latency_ms: vec![(5, 1)],
            },
        ];
        let v = days(day(27), day(30), rows);
        assert_eq!(v.len(), 4);
        assert_eq!(v[0].attempts, 3);
        assert_eq!(
            v[0].latency_ms,
            Some(Latency {
                p50: 10,
                p90: 900,
                p99: 900,
                max: 900
            })
        );
        assert_eq!(v[1].attempts, 0);
        assert_eq!(v[1].latency_ms, None);
        assert_eq!(v[2].delivered, 1);
        assert_eq!(v[3].day, day(30));
    }
}
