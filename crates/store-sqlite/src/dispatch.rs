//! Dispatch: finding due work, claiming it under a lease, and recording what
//! happened. Every lease-conditional write checks `state = 'inflight' AND
//! lease_token = ?`: the token is bumped by every claim, so a worker whose
//! lease was lost (expired and re-claimed, or released) matches nothing.

use std::time::Duration;

use hookd_domain::{DeliveryId, SubscriptionId};
use hookd_store::{
    AttemptRecord, ClaimOrder, ClaimRequest, ClaimedDelivery, Delivery, DueDestination,
    DueSubscription, Lease, MAX_SNIPPET_BYTES, NextState, RecordOutcome, Result, StoreError,
    StreakChange,
};
use sqlx::{QueryBuilder, Sqlite, SqliteConnection};
use uuid::Uuid;

use crate::SqliteStore;
use crate::codec::{
    self, after, delivery_columns, duration_ms, event_columns, from_ms, now_ms,
    subscription_columns, to_ms,
};
use crate::error::from_sqlx;
use crate::subscriptions::DELETED;

/// Ids per `IN (…)` list, far below SQLite's limit on bound values; a claim
/// batch fits in one statement.
const IDS_PER_QUERY: usize = 1000;

/// The condition, on a pending due row `d` joined to its subscription `s`,
/// under which `d` may be claimed now as far as ordering goes: its
/// subscription is not ordered, or no delivery of it with a smaller id is
/// still unfinished and none of it is in flight (the trait's ordering rule).
/// One probe of the partial index `deliveries_unfinished`, whose WHERE the
/// subquery repeats so the planner can use it. A macro so it can be
/// `concat!`ed into both queries that must agree on it: claiming, and
/// listing hosts with claimable work.
macro_rules! not_blocked_by_order {
    () => {
        "(s.ordered = 0 OR NOT EXISTS ( \
             SELECT 1 FROM deliveries x WHERE x.sub_id = d.sub_id \
               AND x.state IN ('pending', 'inflight') \
               AND (x.delivery_id < d.delivery_id OR x.state = 'inflight')))"
    };
}

/// Pending due rows `d` of active subscriptions `s` that may be claimed
/// now (`$now`, the parameter holding the store's clock): what both
/// `due_destinations` and `claim_due` select from.
macro_rules! claimable {
    ($now:literal) => {
        concat!(
            "d.state = 'pending' AND d.next_attempt_at <= ",
            $now,
            " AND s.state = 'active' AND ",
            not_blocked_by_order!()
        )
    };
}

/// One row of the due listing: host, subscription, its oldest and newest
/// claimable `next_attempt_at` (ms), its `rate_limit` and `max_concurrency`.
type DueRow = (String, Uuid, i64, i64, Option<i64>, Option<i64>);

pub(crate) async fn due_destinations(
    store: &SqliteStore,
    limit: u32,
) -> Result<Vec<DueDestination>> {
    // One statement: group claimable rows by (host, subscription), pick the
    // `limit` most overdue hosts from those groups, and return every group of
    // those hosts, host by host. The limit is on hosts, so it sits on the
    // `hosts` CTE, never on the rows. Ties on the oldest due time (same
    // millisecond) go to the host, and subscription, whose oldest claimable
    // delivery was created first, so the order is stable. Each group carries
    // its subscription's `rate_limit` and `max_concurrency`: one value each
    // per subscription, so grouping by them too splits nothing.
    let rows: Vec<DueRow> = sqlx::query_as(concat!(
        "WITH subs AS ( \
             SELECT d.destination_host AS host, d.sub_id AS sub_id, \
                    MIN(d.next_attempt_at) AS oldest, MAX(d.next_attempt_at) AS newest, \
                    MIN(d.delivery_id) AS first_id, s.rate_limit AS rate_limit, \
                    s.max_concurrency AS max_concurrency \
             FROM deliveries d JOIN subscriptions s ON s.sub_id = d.sub_id \
             WHERE ",
        claimable!("?1"),
        " GROUP BY d.destination_host, d.sub_id, s.rate_limit, s.max_concurrency \
         ), hosts AS ( \
             SELECT host, MIN(oldest) AS oldest, MIN(first_id) AS first_id FROM subs \
             GROUP BY host ORDER BY MIN(oldest), MIN(first_id) LIMIT ?2 \
         ) \
         SELECT subs.host, subs.sub_id, subs.oldest, subs.newest, subs.rate_limit, \
                subs.max_concurrency \
         FROM subs JOIN hosts ON hosts.host = subs.host \
         ORDER BY hosts.oldest, hosts.first_id, subs.oldest, subs.first_id"
    ))
    .bind(now_ms())
    .bind(i64::from(limit))
    .fetch_all(&store.reader)
    .await
    .map_err(from_sqlx)?;
    let mut due: Vec<DueDestination> = Vec::new();
    for (host, sub_id, oldest, newest, rate_limit, max_concurrency) in rows {
        let sub = DueSubscription {
            sub_id: SubscriptionId::from_uuid(sub_id),
            oldest_due_at: from_ms(oldest, "next_attempt_at")?,
            newest_due_at: from_ms(newest, "next_attempt_at")?,
            rate_limit: codec::rate_limit(rate_limit, "rate_limit")?,
            max_concurrency: codec::max_concurrency(max_concurrency, "max_concurrency")?,
        };
        match due.last_mut() {
            Some(last) if last.host == host => last.subscriptions.push(sub),
            _ => due.push(DueDestination {
                host,
                subscriptions: vec![sub],
            }),
        }
    }
    Ok(due)
}

/// The statement that picks and marks a claim's rows, for one filter and one
/// order. Parameters are numbered, so every variant binds the same list:
/// ?1 lease expiry, ?2 worker, ?3 now, ?4 host, ?5 limit, ?6 subscription
/// (only the variants that filter on it use it).
macro_rules! claim_sql {
    ($filter:literal, $order:literal) => {
        concat!(
            "UPDATE deliveries SET state = 'inflight', lease_token = lease_token + 1, \
             lease_expires = ?1, worker_id = ?2, updated_at = ?3 \
             WHERE delivery_id IN ( \
                 SELECT d.delivery_id FROM deliveries d JOIN subscriptions s ON s.sub_id = d.sub_id \
                 WHERE d.destination_host = ?4 ",
            $filter,
            " AND ",
            claimable!("?3"),
            " ORDER BY ",
            $order,
            " LIMIT ?5) \
             RETURNING delivery_id"
        )
    };
}

pub(crate) async fn claim_due(
    store: &SqliteStore,
    req: &ClaimRequest,
) -> Result<Vec<ClaimedDelivery>> {
    // Four fixed statements rather than one with `?sub IS NULL OR …`, so the
    // planner sees the subscription filter when there is one and can use
    // `deliveries_due_sub` for it.
    let sql = match (req.subscription.is_some(), req.order) {
        (false, ClaimOrder::OldestFirst) => {
            claim_sql!("", "d.next_attempt_at, d.delivery_id")
        }
        (false, ClaimOrder::NewestFirst) => {
            claim_sql!("", "d.next_attempt_at DESC, d.delivery_id DESC")
        }
        (true, ClaimOrder::OldestFirst) => {
            claim_sql!("AND d.sub_id = ?6", "d.next_attempt_at, d.delivery_id")
        }
        (true, ClaimOrder::NewestFirst) => claim_sql!(
            "AND d.sub_id = ?6",
            "d.next_attempt_at DESC, d.delivery_id DESC"
        ),
    };
    // The write transaction is what makes claims exclusive: no other claimer
    // can run between choosing rows and marking them inflight.
    let mut tx = store.write().await?;
    let now = now_ms();
    // The subquery is evaluated before any row is updated, so within one
    // batch an ordered subscription's head makes the rows behind it wait
    // (they see it `pending`): at most one delivery per ordered subscription.
    let mut pick = sqlx::query_scalar(sql)
        .bind(after(now, req.lease))
        .bind(&req.worker_id)
        .bind(now)
        .bind(&req.destination)
        .bind(i64::from(req.limit));
    if let Some(sub) = &req.subscription {
        pick = pick.bind(sub.as_uuid());
    }
    let ids: Vec<Uuid> = pick.fetch_all(&mut *tx).await.map_err(from_sqlx)?;

    // RETURNING cannot join, so load the claimed rows with their event and
    // subscription in one query per batch of ids (one, for any sane limit).
    let mut claimed = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(IDS_PER_QUERY) {
        let mut q = QueryBuilder::<Sqlite>::new(concat!(
            "SELECT ",
            delivery_columns!(),
            ", ",
            event_columns!(),
            ", ",
            subscription_columns!(),
            " FROM deliveries d JOIN events e ON e.event_id = d.event_id \
             JOIN subscriptions s ON s.sub_id = d.sub_id WHERE d.delivery_id IN ("
        ));
        let mut list = q.separated(", ");
        for id in chunk {
            list.push_bind(*id);
        }
        q.push(")");
        for row in q.build().fetch_all(&mut *tx).await.map_err(from_sqlx)? {
            let (delivery, token) = codec::delivery(&row)?;
            claimed.push(ClaimedDelivery {
                lease: Lease {
                    delivery_id: delivery.id,
                    token,
                },
                event: codec::event(&row)?,
                subscription: codec::subscription(&row, &store.keyring)?,
                delivery,
            });
        }
    }
    tx.commit().await.map_err(from_sqlx)?;
    // In the order asked for, as the contract promises.
    claimed.sort_by_key(|c| (c.delivery.next_attempt_at, c.delivery.id));
    if req.order == ClaimOrder::NewestFirst {
        claimed.reverse();
    }
    Ok(claimed)
}

/// At most [`MAX_SNIPPET_BYTES`] of `s`, cut on a character boundary. The
/// caller should already have cut it; the store enforces its own limit.
fn clip(s: &str) -> &str {
    if s.len() <= MAX_SNIPPET_BYTES {
        return s;
    }
    let mut end = MAX_SNIPPET_BYTES;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

pub(crate) async fn record_attempt(
    store: &SqliteStore,
    record: AttemptRecord,
) -> Result<RecordOutcome> {
    let AttemptRecord {
        lease,
        attempt,
        next,
        last_error,
    } = record;
    let mut tx = store.write().await?;
    let now = now_ms();
    let (state, next_attempt_at, outcome) = match next {
        NextState::Delivered => ("delivered", None, "delivered"),
        NextState::Retry { delay } => ("pending", Some(after(now, delay)), "retry"),
        NextState::Failed => ("failed", None, "failed"),
        NextState::Dead => ("dead", None, "dead"),
    };
    let moved = sqlx::query(
        "UPDATE deliveries SET state = ?, attempt = attempt + 1, last_status = ?, last_error = ?, \
         next_attempt_at = COALESCE(?, next_attempt_at), lease_expires = NULL, worker_id = NULL, updated_at = ? \
         WHERE delivery_id = ? AND state = 'inflight' AND lease_token = ?",
    )
    .bind(state)
    .bind(attempt.status.map(i64::from))
    .bind(last_error)
    .bind(next_attempt_at)
    .bind(now)
    .bind(lease.delivery_id.as_uuid())
    .bind(lease.token)
    .execute(&mut *tx)
    .await
    .map_err(from_sqlx)?
    .rows_affected()
        == 1;

    // The attempt happened whether or not we still hold the lease, so its
    // row is written either way; it keeps the outcome it caused, none when
    // the lease was lost (the daily rollup counts by it).
    sqlx::query(
        "INSERT INTO attempts (delivery_id, number, started_at, duration_ms, status, error_class, \
         response_snippet, outcome) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(lease.delivery_id.as_uuid())
    .bind(i64::from(attempt.number))
    .bind(to_ms(attempt.started_at))
    .bind(duration_ms(attempt.duration))
    .bind(attempt.status.map(i64::from))
    .bind(attempt.error_class.map(|c| c.as_str()))
    .bind(attempt.response_snippet.as_deref().map(clip))
    .bind(moved.then_some(outcome))
    .execute(&mut *tx)
    .await
    .map_err(|e| match e {
        // The only foreign key is the delivery: it does not exist.
        sqlx::Error::Database(ref db) if db.is_foreign_key_violation() => StoreError::NotFound,
        e => from_sqlx(e),
    })?;

    // The failing streak follows every attempt, lease or not. Each
    // statement writes the row only when the streak changes, so a run of
    // successes (or of failures) costs no write.
    let streak = if matches!(next, NextState::Delivered) {
        sqlx::query(
            "UPDATE subscriptions SET failing_since = NULL WHERE failing_since IS NOT NULL \
             AND sub_id = (SELECT sub_id FROM deliveries WHERE delivery_id = ?)",
        )
        .bind(lease.delivery_id.as_uuid())
    } else {
        sqlx::query(
            "UPDATE subscriptions SET failing_since = ? WHERE failing_since IS NULL \
             AND sub_id = (SELECT sub_id FROM deliveries WHERE delivery_id = ?)",
        )
        .bind(to_ms(attempt.started_at))
        .bind(lease.delivery_id.as_uuid())
    };
    streak.execute(&mut *tx).await.map_err(from_sqlx)?;
    tx.commit().await.map_err(from_sqlx)?;
    Ok(if moved {
        RecordOutcome::Recorded
    } else {
        RecordOutcome::LeaseLost
    })
}

pub(crate) async fn record_attempts(
    store: &SqliteStore,
    records: Vec<AttemptRecord>,
) -> Result<Vec<RecordOutcome>> {
    if records.is_empty() {
        return Ok(Vec::new());
    }
    // One write transaction for the whole batch, each record exactly as
    // record_attempt writes it, with the same statements (prepared once per
    // connection and reused for every record). The failing streak is folded
    // per subscription in record order and written once per subscription at
    // the end. Any error drops the transaction: nothing is written.
    let mut tx = store.write().await?;
    let now = now_ms();
    let mut outcomes = Vec::with_capacity(records.len());
    let mut streaks: Vec<(Uuid, StreakChange)> = Vec::new();
    for record in records {
        let AttemptRecord {
            lease,
            attempt,
            next,
            last_error,
        } = record;
        let (state, next_attempt_at, outcome) = match next {
            NextState::Delivered => ("delivered", None, "delivered"),
            NextState::Retry { delay } => ("pending", Some(after(now, delay)), "retry"),
            NextState::Failed => ("failed", None, "failed"),
            NextState::Dead => ("dead", None, "dead"),
        };
        let moved: Option<Uuid> = sqlx::query_scalar(
            "UPDATE deliveries SET state = ?, attempt = attempt + 1, last_status = ?, last_error = ?, \
             next_attempt_at = COALESCE(?, next_attempt_at), lease_expires = NULL, worker_id = NULL, updated_at = ? \
             WHERE delivery_id = ? AND state = 'inflight' AND lease_token = ? RETURNING sub_id",
        )
        .bind(state)
        .bind(attempt.status.map(i64::from))
        .bind(last_error)
        .bind(next_attempt_at)
        .bind(now)
        .bind(lease.delivery_id.as_uuid())
        .bind(lease.token)
        .fetch_optional(&mut *tx)
        .await
        .map_err(from_sqlx)?;
        let sub_id = match moved {
            Some(sub_id) => sub_id,
            // The lease was lost: the attempt is still written, and still
            // counts for the streak. A missing delivery fails the batch, as
            // record_attempt fails on it.
            None => sqlx::query_scalar("SELECT sub_id FROM deliveries WHERE delivery_id = ?")
                .bind(lease.delivery_id.as_uuid())
                .fetch_optional(&mut *tx)
                .await
                .map_err(from_sqlx)?
                .ok_or(StoreError::NotFound)?,
        };
        sqlx::query(
            "INSERT INTO attempts (delivery_id, number, started_at, duration_ms, status, error_class, \
             response_snippet, outcome) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(lease.delivery_id.as_uuid())
        .bind(i64::from(attempt.number))
        .bind(to_ms(attempt.started_at))
        .bind(duration_ms(attempt.duration))
        .bind(attempt.status.map(i64::from))
        .bind(attempt.error_class.map(|c| c.as_str()))
        .bind(attempt.response_snippet.as_deref().map(clip))
        .bind(moved.is_some().then_some(outcome))
        .execute(&mut *tx)
        .await
        .map_err(|e| match e {
            sqlx::Error::Database(ref db) if db.is_foreign_key_violation() => StoreError::NotFound,
            e => from_sqlx(e),
        })?;
        let delivered = matches!(next, NextState::Delivered);
        match streaks.iter_mut().find(|(s, _)| *s == sub_id) {
            Some((_, change)) => {
                *change = StreakChange::then(Some(*change), delivered, attempt.started_at);
            }
            None => streaks.push((
                sub_id,
                StreakChange::then(None, delivered, attempt.started_at),
            )),
        }
        outcomes.push(if moved.is_some() {
            RecordOutcome::Recorded
        } else {
            RecordOutcome::LeaseLost
        });
    }
    // Each statement writes the row only when the streak changes.
    for (sub_id, change) in streaks {
        let q = match change {
            StreakChange::End => sqlx::query(
                "UPDATE subscriptions SET failing_since = NULL \
                 WHERE sub_id = ? AND failing_since IS NOT NULL",
            )
            .bind(sub_id),
            StreakChange::StartUnlessBegun(t) => sqlx::query(
                "UPDATE subscriptions SET failing_since = ? \
                 WHERE sub_id = ? AND failing_since IS NULL",
            )
            .bind(to_ms(t))
            .bind(sub_id),
            StreakChange::Restart(t) => sqlx::query(
                "UPDATE subscriptions SET failing_since = ?1 \
                 WHERE sub_id = ?2 AND failing_since IS NOT ?1",
            )
            .bind(to_ms(t))
            .bind(sub_id),
        };
        q.execute(&mut *tx).await.map_err(from_sqlx)?;
    }
    tx.commit().await.map_err(from_sqlx)?;
    Ok(outcomes)
}

pub(crate) async fn renew_lease(
    store: &SqliteStore,
    lease: &Lease,
    lease_for: Duration,
) -> Result<bool> {
    // A lease that has expired but not yet been reclaimed is still renewable:
    // nobody else holds the row, and record_attempt would accept it too.
    // "Lost" means another claim or a release has happened since.
    let mut tx = store.write().await?;
    let now = now_ms();
    let renewed = sqlx::query(
        "UPDATE deliveries SET lease_expires = ?, updated_at = ? \
         WHERE delivery_id = ? AND state = 'inflight' AND lease_token = ?",
    )
    .bind(after(now, lease_for))
    .bind(now)
    .bind(lease.delivery_id.as_uuid())
    .bind(lease.token)
    .execute(&mut *tx)
    .await
    .map_err(from_sqlx)?;
    tx.commit().await.map_err(from_sqlx)?;
    Ok(renewed.rows_affected() == 1)
}

pub(crate) async fn release(store: &SqliteStore, leases: &[Lease]) -> Result<u64> {
    if leases.is_empty() {
        return Ok(0);
    }
    let mut tx = store.write().await?;
    let now = now_ms();
    let mut released = 0;
    // One statement per lease: each needs its own token check, and the
    // prepared statement is cached, so this costs little inside one transaction.
    for lease in leases {
        let done = sqlx::query(
            "UPDATE deliveries SET state = 'pending', lease_expires = NULL, worker_id = NULL, updated_at = ? \
             WHERE delivery_id = ? AND state = 'inflight' AND lease_token = ?",
        )
        .bind(now)
        .bind(lease.delivery_id.as_uuid())
        .bind(lease.token)
        .execute(&mut *tx)
        .await
        .map_err(from_sqlx)?;
        released += done.rows_affected();
    }
    tx.commit().await.map_err(from_sqlx)?;
    Ok(released)
}

pub(crate) async fn reclaim_expired(store: &SqliteStore) -> Result<u64> {
    let mut tx = store.write().await?;
    let now = now_ms();
    // The token stays as it is: the next claim bumps it, which is what
    // fences out the worker whose lease expired.
    let done = sqlx::query(
        "UPDATE deliveries SET state = 'pending', lease_expires = NULL, worker_id = NULL, updated_at = ? \
         WHERE state = 'inflight' AND lease_expires < ?",
    )
    .bind(now)
    .bind(now)
    .execute(&mut *tx)
    .await
    .map_err(from_sqlx)?;
    tx.commit().await.map_err(from_sqlx)?;
    Ok(done.rows_affected())
}

pub(crate) async fn replay_delivery(store: &SqliteStore, id: &DeliveryId) -> Result<Delivery> {
    // A write transaction, so the state read below is still the state when
    // the update lands: no claim or delete can come in between.
    let mut tx = store.write().await?;
    let now = now_ms();
    let (state, sub_state): (String, String) = sqlx::query_as(
        "SELECT d.state, s.state FROM deliveries d JOIN subscriptions s ON s.sub_id = d.sub_id \
         WHERE d.delivery_id = ?",
    )
    .bind(id.as_uuid())
    .fetch_optional(&mut *tx)
    .await
    .map_err(from_sqlx)?
    .ok_or(StoreError::NotFound)?;
    if sub_state == "deleted" {
        // Nothing claims deliveries of a deleted subscription: replaying one
        // would leave it pending forever.
        return Err(StoreError::Conflict(DELETED.to_owned()));
    }
    // Only finished deliveries move; one already queued or in flight is left
    // as it is (and its lease with it).
    if !matches!(state.as_str(), "pending" | "inflight") {
        requeue(&mut tx, id.as_uuid(), now).await?;
    }
    let row = sqlx::query(concat!(
        "SELECT ",
        delivery_columns!(),
        " FROM deliveries d WHERE d.delivery_id = ?"
    ))
    .bind(id.as_uuid())
    .fetch_one(&mut *tx)
    .await
    .map_err(from_sqlx)?;
    let (delivery, _) = codec::delivery(&row)?;
    tx.commit().await.map_err(from_sqlx)?;
    Ok(delivery)
}

/// Queues a finished delivery again, as `replay_delivery` does: pending, due
/// now, with a fresh retry window; attempt count and history kept. The
/// caller has checked that it is finished and its subscription not deleted.
pub(crate) async fn requeue(conn: &mut SqliteConnection, id: &Uuid, now: i64) -> Result<()> {
    sqlx::query(
        "UPDATE deliveries SET state = 'pending', next_attempt_at = ?, window_start = ?, \
         lease_expires = NULL, worker_id = NULL, updated_at = ? WHERE delivery_id = ?",
    )
    .bind(now)
    .bind(now)
    .bind(now)
    .bind(id)
    .execute(conn)
    .await
    .map_err(from_sqlx)?;
    Ok(())
}
