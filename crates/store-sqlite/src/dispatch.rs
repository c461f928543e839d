//! Dispatch: finding due work, claiming it under a lease, and recording what
//! happened. Every lease-conditional write checks `state = 'inflight' AND
//! lease_token = ?`: the token is bumped by every claim, so a worker whose
//! lease was lost (expired and re-claimed, or released) matches nothing.

use std::time::Duration;

use hookd_domain::{DeliveryId, SubscriptionId};
use hookd_store::{
    AttemptRecord, ClaimOrder, ClaimParts, ClaimRequest, ClaimedDelivery, Delivery, DueDestination,
    DueSubscription, Lease, MAX_SNIPPET_BYTES, NextState, RecordOutcome, Result, StoreError,
    StreakChange,
};
use sqlx::sqlite::SqliteRow;
use sqlx::{QueryBuilder, Sqlite, SqliteConnection};
use uuid::Uuid;

use crate::codec::{
    self, after, delivery_columns, duration_ms, event_columns, from_ms, now_ms,
    subscription_columns, to_ms,
};
use crate::error::from_sqlx;
use crate::subscriptions::DELETED;
use crate::{SqliteStore, keep_prepared};

/// Ids per `IN (…)` list, far below SQLite's limit on bound values; a
/// claim's events, or its subscriptions, fit in one statement.
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
/// claimable `next_attempt_at` (ms), its `rate_limit` and `max_concurrency`,
/// and the id of its oldest claimable delivery (the tie-break).
type DueRow = (String, Uuid, i64, i64, Option<i64>, Option<i64>, Uuid);

/// The due listing, one row per active subscription with claimable work,
/// found by index seeks per subscription rather than by grouping every
/// pending row: its cost follows the number of subscriptions, not the
/// backlog (a grouping over 200,000 pending rows took 750 ms a pass; this
/// takes about 1 ms). Unordered subscriptions: the oldest and newest due
/// rows by `deliveries_due_sub`, the host of the oldest. Ordered ones: only
/// their head (the smallest unfinished id, by `deliveries_unfinished`) can
/// be claimable, and only if it is pending and due and nothing of the
/// subscription is in flight — the same rule as `not_blocked_by_order!`.
const DUE_SQL: &str = "\
    WITH subs AS ( \
        SELECT s.sub_id, s.rate_limit, s.max_concurrency, \
            (SELECT d.rowid FROM deliveries d WHERE d.sub_id = s.sub_id AND d.state = 'pending' \
               AND d.next_attempt_at <= ?1 ORDER BY d.next_attempt_at LIMIT 1) AS first_row, \
            (SELECT d.next_attempt_at FROM deliveries d WHERE d.sub_id = s.sub_id AND d.state = 'pending' \
               AND d.next_attempt_at <= ?1 ORDER BY d.next_attempt_at DESC LIMIT 1) AS newest \
        FROM subscriptions s WHERE s.state = 'active' AND s.ordered = 0 \
    ), heads AS ( \
        SELECT s.sub_id, s.rate_limit, s.max_concurrency, \
            (SELECT x.rowid FROM deliveries x WHERE x.sub_id = s.sub_id \
               AND x.state IN ('pending', 'inflight') ORDER BY x.delivery_id LIMIT 1) AS head_row \
        FROM subscriptions s WHERE s.state = 'active' AND s.ordered = 1 \
    ) \
    SELECT d.destination_host, subs.sub_id, d.next_attempt_at, subs.newest, subs.rate_limit, \
           subs.max_concurrency, d.delivery_id \
    FROM subs JOIN deliveries d ON d.rowid = subs.first_row \
    UNION ALL \
    SELECT d.destination_host, heads.sub_id, d.next_attempt_at, d.next_attempt_at, heads.rate_limit, \
           heads.max_concurrency, d.delivery_id \
    FROM heads JOIN deliveries d ON d.rowid = heads.head_row \
    WHERE d.state = 'pending' AND d.next_attempt_at <= ?1 \
      AND NOT EXISTS (SELECT 1 FROM deliveries y WHERE y.sub_id = heads.sub_id \
                        AND y.state IN ('pending', 'inflight') AND y.state = 'inflight')";

pub(crate) async fn due_destinations(
    store: &SqliteStore,
    limit: u32,
) -> Result<Vec<DueDestination>> {
    let mut rows: Vec<DueRow> = sqlx::query_as(DUE_SQL)
        .bind(now_ms())
        .fetch_all(&store.reader)
        .await
        .map_err(from_sqlx)?;
    // Most overdue first; ties (same millisecond) go to the subscription,
    // and host, whose oldest claimable delivery was created first (ids are
    // UUIDv7), so the order is stable.
    rows.sort_by_key(|r| (r.2, r.6));
    let mut listed = Vec::with_capacity(rows.len());
    for (host, sub_id, oldest, newest, rate_limit, max_concurrency, _) in rows {
        let sub = DueSubscription {
            sub_id: SubscriptionId::from_uuid(sub_id),
            oldest_due_at: from_ms(oldest, "next_attempt_at")?,
            newest_due_at: from_ms(newest, "next_attempt_at")?,
            rate_limit: codec::rate_limit(rate_limit, "rate_limit")?,
            max_concurrency: codec::max_concurrency(max_concurrency, "max_concurrency")?,
        };
        listed.push((host, sub));
    }
    Ok(hookd_store::group_due_by_host(listed, limit))
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
            " LIMIT ?5) RETURNING ",
            delivery_columns!("")
        )
    };
}

pub(crate) async fn claim_due(
    store: &SqliteStore,
    req: &ClaimRequest,
) -> Result<Vec<ClaimedDelivery>> {
    let mut claimed = claim_many(store, std::slice::from_ref(req)).await?;
    Ok(claimed.pop().unwrap_or_default())
}

/// Every request's claim in ONE write transaction: one lock, one commit and
/// one load of the claimed rows for a whole dispatcher pass, instead of four
/// round trips per destination. Each request's UPDATE sees the rows earlier
/// requests marked `inflight`, so no delivery is claimed twice.
pub(crate) async fn claim_many(
    store: &SqliteStore,
    reqs: &[ClaimRequest],
) -> Result<Vec<Vec<ClaimedDelivery>>> {
    if reqs.is_empty() {
        return Ok(Vec::new());
    }
    // The write transaction is what makes claims exclusive: no other claimer
    // can run between choosing rows and marking them inflight.
    let mut tx = store.write().await?;
    let now = now_ms();
    // Per statement: the requests it served, and the rows it claimed as its
    // UPDATE returned them (inflight, with the new lease token). Which row
    // is whose is worked out after the commit.
    let mut picked: Vec<(Vec<usize>, Vec<SqliteRow>)> = Vec::new();
    // Requests of one subscription each go together, one statement for up
    // to PICKS_PER_STATEMENT of them, as long as no two share a (host,
    // subscription): their rows cannot overlap, so one statement gives each
    // what it alone would. A request repeating a pair (a backlog floor
    // beside new work) waits for the next round, so it sees what the first
    // took, as one after the other would; one without a subscription goes
    // alone.
    let mut left: Vec<usize> = (0..reqs.len()).collect();
    while !left.is_empty() {
        let mut round: Vec<usize> = Vec::new();
        let mut later: Vec<usize> = Vec::new();
        let mut seen: std::collections::HashSet<(&str, Uuid)> = std::collections::HashSet::new();
        // Hosts with a request put off: what follows on that host waits
        // too, so no request is served before an earlier one that could
        // take the same rows.
        let mut blocked: std::collections::HashSet<&str> = std::collections::HashSet::new();
        for i in left {
            let req = &reqs[i];
            let host = req.destination.as_str();
            if blocked.contains(host) {
                later.push(i);
                continue;
            }
            // One statement marks its rows with one lease and one worker:
            // a request asking for others waits for a round of its own.
            let same_lease = round.first().is_none_or(|&f: &usize| {
                reqs[f].lease == req.lease && reqs[f].worker_id == req.worker_id
            });
            match req.subscription {
                Some(sub)
                    if round.len() < PICKS_PER_STATEMENT
                        && same_lease
                        && seen.insert((host, *sub.as_uuid())) =>
                {
                    round.push(i)
                }
                None if round.is_empty() && later.is_empty() => {
                    picked.push((vec![i], pick(&mut tx, req, now).await?));
                }
                _ => {
                    blocked.insert(host);
                    later.push(i);
                }
            }
        }
        if !round.is_empty() {
            let rows = pick_each(&mut tx, reqs, &round, now).await?;
            picked.push((round, rows));
        }
        left = later;
    }

    // The rows are decoded, and their events and subscriptions read, after
    // the commit: the write lock is not held while the async side works
    // through them. A row that fails to decode fails the call; its delivery
    // stays leased until the lease expires, as after any claim whose worker
    // went away.
    tx.commit().await.map_err(from_sqlx)?;
    // Each row to the request of its statement that names its (host,
    // subscription): a statement's requests each have their own pair.
    let mut claimed: Vec<(usize, Delivery, i64)> = Vec::new();
    for (round, rows) in &picked {
        let slot: std::collections::HashMap<(&str, Uuid), usize> = round
            .iter()
            .filter_map(|&i| {
                let req = &reqs[i];
                req.subscription
                    .map(|sub| ((req.destination.as_str(), *sub.as_uuid()), i))
            })
            .collect();
        for row in rows {
            let (delivery, token) = codec::delivery(row)?;
            let whose = match round[..] {
                [only] => Some(only),
                _ => slot
                    .get(&(
                        delivery.destination_host.as_str(),
                        *delivery.sub_id.as_uuid(),
                    ))
                    .copied(),
            };
            if let Some(i) = whose {
                claimed.push((i, delivery, token));
            }
        }
    }
    // Each event and subscription read once ([`ClaimParts`]), on a reader:
    // the one writer is what every claim, record and ingest waits for. The
    // rows' foreign keys keep both from being removed; a subscription is
    // "as it is now" either way.
    let (event_ids, sub_ids) = ClaimParts::ids(claimed.iter().map(|(_, d, _)| d));
    let mut parts = ClaimParts::default();
    if !claimed.is_empty() {
        let mut conn = store.reader.acquire().await.map_err(from_sqlx)?;
        let select = concat!(
            "SELECT ",
            event_columns!(),
            " FROM events e WHERE e.event_id IN ("
        );
        let ids: Vec<Uuid> = event_ids.iter().map(|id| *id.as_uuid()).collect();
        for row in read_in(&mut conn, select, &ids).await? {
            let e = codec::event(&row)?;
            parts.events.insert(e.id, e);
        }
        let select = concat!(
            "SELECT ",
            subscription_columns!(),
            " FROM subscriptions s WHERE s.sub_id IN ("
        );
        let ids: Vec<Uuid> = sub_ids.iter().map(|id| *id.as_uuid()).collect();
        for row in read_in(&mut conn, select, &ids).await? {
            let s = codec::subscription(&row, &store.keyring)?;
            parts.subscriptions.insert(s.id, s);
        }
    }
    let mut out: Vec<Vec<ClaimedDelivery>> = vec![Vec::new(); reqs.len()];
    for (i, delivery, token) in claimed {
        out[i].push(parts.claimed(delivery, token, None)?);
    }
    for (req, claimed) in reqs.iter().zip(&mut out) {
        // In the order asked for, as the contract promises.
        claimed.sort_by_key(|c| (c.delivery.next_attempt_at, c.delivery.id));
        if req.order == ClaimOrder::NewestFirst {
            claimed.reverse();
        }
    }
    Ok(out)
}

/// The rows of `select` (a query ending in `IN (`) for `ids`, on `conn`,
/// [`IDS_PER_QUERY`] ids per statement.
async fn read_in(
    conn: &mut SqliteConnection,
    select: &'static str,
    ids: &[Uuid],
) -> Result<Vec<sqlx::sqlite::SqliteRow>> {
    let mut rows = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(IDS_PER_QUERY) {
        let mut q = QueryBuilder::<Sqlite>::new(select);
        let mut list = q.separated(", ");
        for id in chunk {
            list.push_bind(*id);
        }
        q.push(")");
        let q = q
            .build()
            .persistent(keep_prepared(chunk.len(), IDS_PER_QUERY));
        rows.extend(q.fetch_all(&mut *conn).await.map_err(from_sqlx)?);
    }
    Ok(rows)
}

/// Most requests picked by one statement of [`claim_many`]: SQLite allows
/// 500 terms in a compound SELECT; each binds three values.
const PICKS_PER_STATEMENT: usize = 100;

/// Picks and marks the rows of several requests, each for its own (host,
/// subscription) pair, in ONE statement (one round trip under the write
/// lock, not one per request); returns every row claimed, as the UPDATE
/// returned it. Each term is the request's own pick, exactly as [`pick`]
/// makes it; all terms read the rows before any is marked, and their rows
/// cannot overlap, since every term has its own pair.
async fn pick_each(
    conn: &mut SqliteConnection,
    reqs: &[ClaimRequest],
    which: &[usize],
    now: i64,
) -> Result<Vec<SqliteRow>> {
    let lease = reqs[which[0]].lease;
    let worker = &reqs[which[0]].worker_id;
    // ?1 lease expiry, ?2 worker, ?3 now; then host, limit, subscription
    // per term.
    let mut sql = String::from(
        "UPDATE deliveries SET state = 'inflight', lease_token = lease_token + 1, \
         lease_expires = ?1, worker_id = ?2, updated_at = ?3 WHERE delivery_id IN (",
    );
    for (t, &i) in which.iter().enumerate() {
        let (host, limit, sub) = (4 + 3 * t, 5 + 3 * t, 6 + 3 * t);
        let order = match reqs[i].order {
            ClaimOrder::OldestFirst => "d.next_attempt_at, d.delivery_id",
            ClaimOrder::NewestFirst => "d.next_attempt_at DESC, d.delivery_id DESC",
        };
        if t > 0 {
            sql.push_str(" UNION ALL ");
        }
        sql.push_str(&format!(
            "SELECT delivery_id FROM (SELECT d.delivery_id FROM deliveries d \
             JOIN subscriptions s ON s.sub_id = d.sub_id \
             WHERE d.destination_host = ?{host} AND d.sub_id = ?{sub} AND {} \
             ORDER BY {order} LIMIT ?{limit})",
            claimable!("?3"),
        ));
    }
    sql.push_str(concat!(") RETURNING ", delivery_columns!("")));
    // Safe to run as built: it holds only this function's fixed fragments
    // and parameter numbers; every value is bound.
    let mut q = sqlx::query(sqlx::AssertSqlSafe(sql))
        .persistent(keep_prepared(which.len(), PICKS_PER_STATEMENT))
        .bind(after(now, lease))
        .bind(worker)
        .bind(now);
    for &i in which {
        let req = &reqs[i];
        q = q
            .bind(&req.destination)
            .bind(i64::from(req.limit))
            .bind(req.subscription.map(|s| *s.as_uuid()));
    }
    q.fetch_all(&mut *conn).await.map_err(from_sqlx)
}

/// Picks and marks one request's rows inside the caller's write
/// transaction; returns them, as the UPDATE left them.
async fn pick(conn: &mut SqliteConnection, req: &ClaimRequest, now: i64) -> Result<Vec<SqliteRow>> {
    // Four fixed statements rather than one with `?sub IS NULL OR …`, so the
    // planner sees the subscription filter when there is one and can use
    // `deliveries_due_sub` for it. A claim by host alone (the trait allows
    // it; only tests make one) has no index of its own since migration
    // 0011 and reads the pending rows: the dispatcher always names the
    // subscription.
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
    // The subquery is evaluated before any row is updated, so within one
    // request an ordered subscription's head makes the rows behind it wait
    // (they see it `pending`): at most one delivery per ordered subscription.
    let mut pick = sqlx::query(sql)
        .bind(after(now, req.lease))
        .bind(&req.worker_id)
        .bind(now)
        .bind(&req.destination)
        .bind(i64::from(req.limit));
    if let Some(sub) = &req.subscription {
        pick = pick.bind(sub.as_uuid());
    }
    pick.fetch_all(&mut *conn).await.map_err(from_sqlx)
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

/// Records per statement of [`record_attempts`]: the attempts INSERT binds
/// 8 values a row, the deliveries UPDATE 7, 8,192 at most, below SQLite's
/// limit (32,766). As many as the dispatcher's recorder batches (1,024), so
/// its batch is one statement of each kind: every statement is a round trip
/// to the writer's thread while the write lock is held.
const RECORDS_PER_STATEMENT: usize = 1024;

pub(crate) async fn record_attempts(
    store: &SqliteStore,
    records: Vec<AttemptRecord>,
) -> Result<Vec<RecordOutcome>> {
    if records.is_empty() {
        return Ok(Vec::new());
    }
    // One write transaction for the whole batch and a handful of
    // set-based statements, whatever its size: every statement is a round
    // trip to the connection's thread taken while holding the write lock,
    // and one per record (three, with the streak) made the lock wait on
    // the async runtime's scheduling more than on SQLite. Each record is
    // written exactly as record_attempt writes it. Any error drops the
    // transaction: nothing is written.
    let mut tx = store.write().await?;
    let now = now_ms();

    // 1. Every delivery whose lease still holds moves, in one UPDATE … FROM
    //    per chunk. Two records of one delivery carry different lease
    //    tokens (two claims), and only the current one can match. Two
    //    records of one lease: only the first takes part, as recording them
    //    one by one would have it (the second finds the lease gone).
    let firsts = AttemptRecord::firsts_of_their_lease(&records);
    let movers: Vec<&AttemptRecord> = records
        .iter()
        .zip(&firsts)
        .filter_map(|(r, &first)| first.then_some(r))
        .collect();
    let mut moved: std::collections::HashMap<(Uuid, i64), Uuid> =
        std::collections::HashMap::with_capacity(records.len());
    for chunk in movers.chunks(RECORDS_PER_STATEMENT) {
        let mut q =
            QueryBuilder::<Sqlite>::new("WITH v (id, token, state, status, error, next_at) AS (");
        q.push_values(chunk, |mut row, r| {
            let (state, next_at) = match r.next {
                NextState::Delivered => ("delivered", None),
                NextState::Retry { delay } => ("pending", Some(after(now, delay))),
                NextState::Failed => ("failed", None),
                NextState::Dead => ("dead", None),
            };
            row.push_bind(*r.lease.delivery_id.as_uuid())
                .push_bind(r.lease.token)
                .push_bind(state)
                .push_bind(r.attempt.status.map(i64::from))
                .push_bind(r.last_error.clone())
                .push_bind(next_at);
        });
        q.push(
            ") UPDATE deliveries SET state = v.state, attempt = attempt + 1, last_status = v.status, \
             last_error = v.error, next_attempt_at = COALESCE(v.next_at, next_attempt_at), \
             lease_expires = NULL, worker_id = NULL, updated_at = ",
        );
        q.push_bind(now);
        q.push(
            " FROM v WHERE deliveries.delivery_id = v.id AND deliveries.state = 'inflight' \
             AND deliveries.lease_token = v.token \
             RETURNING deliveries.delivery_id, deliveries.lease_token, deliveries.sub_id",
        );
        let rows: Vec<(Uuid, i64, Uuid)> = q
            .build_query_as()
            .persistent(keep_prepared(chunk.len(), RECORDS_PER_STATEMENT))
            .fetch_all(&mut *tx)
            .await
            .map_err(from_sqlx)?;
        for (id, token, sub) in rows {
            moved.insert((id, token), sub);
        }
    }

    // 2. The subscription of each record whose lease was lost (rare): the
    //    attempt is still written and still counts for the streak. A
    //    missing delivery fails the batch, as record_attempt fails on it.
    let lost: Vec<Uuid> = records
        .iter()
        .filter(|r| !moved.contains_key(&(*r.lease.delivery_id.as_uuid(), r.lease.token)))
        .map(|r| *r.lease.delivery_id.as_uuid())
        .collect();
    let mut lost_subs: std::collections::HashMap<Uuid, Uuid> = std::collections::HashMap::new();
    for chunk in lost.chunks(IDS_PER_QUERY) {
        let mut q = QueryBuilder::<Sqlite>::new(
            "SELECT delivery_id, sub_id FROM deliveries WHERE delivery_id IN (",
        );
        let mut list = q.separated(", ");
        for id in chunk {
            list.push_bind(*id);
        }
        q.push(")");
        let rows: Vec<(Uuid, Uuid)> = q
            .build_query_as()
            .persistent(keep_prepared(chunk.len(), IDS_PER_QUERY))
            .fetch_all(&mut *tx)
            .await
            .map_err(from_sqlx)?;
        lost_subs.extend(rows);
    }

    // 3. Every attempt row, each with the outcome it caused (none when its
    //    lease was lost), and the streaks folded in record order.
    let mut outcomes = Vec::with_capacity(records.len());
    let mut streaks: Vec<(Uuid, StreakChange)> = Vec::new();
    for (r, first) in records.iter().zip(firsts) {
        let key = (*r.lease.delivery_id.as_uuid(), r.lease.token);
        let (sub_id, outcome) = match moved.get(&key) {
            Some(sub) if first => (*sub, RecordOutcome::Recorded),
            Some(sub) => (*sub, RecordOutcome::LeaseLost),
            None => (
                *lost_subs.get(&key.0).ok_or(StoreError::NotFound)?,
                RecordOutcome::LeaseLost,
            ),
        };
        outcomes.push(outcome);
        let delivered = matches!(r.next, NextState::Delivered);
        match streaks.iter_mut().find(|(s, _)| *s == sub_id) {
            Some((_, change)) => {
                *change = StreakChange::then(Some(*change), delivered, r.attempt.started_at);
            }
            None => streaks.push((
                sub_id,
                StreakChange::then(None, delivered, r.attempt.started_at),
            )),
        }
    }
    for (chunk, chunk_outcomes) in records
        .chunks(RECORDS_PER_STATEMENT)
        .zip(outcomes.chunks(RECORDS_PER_STATEMENT))
    {
        let mut q = QueryBuilder::<Sqlite>::new(
            "INSERT INTO attempts (delivery_id, number, started_at, duration_ms, status, \
             error_class, response_snippet, outcome) ",
        );
        q.push_values(chunk.iter().zip(chunk_outcomes), |mut row, (r, outcome)| {
            let a = &r.attempt;
            let caused = match r.next {
                NextState::Delivered => "delivered",
                NextState::Retry { .. } => "retry",
                NextState::Failed => "failed",
                NextState::Dead => "dead",
            };
            row.push_bind(*r.lease.delivery_id.as_uuid())
                .push_bind(i64::from(a.number))
                .push_bind(to_ms(a.started_at))
                .push_bind(duration_ms(a.duration))
                .push_bind(a.status.map(i64::from))
                .push_bind(a.error_class.map(|c| c.as_str()))
                .push_bind(a.response_snippet.as_deref().map(clip).map(str::to_owned))
                .push_bind((*outcome == RecordOutcome::Recorded).then_some(caused));
        });
        let q = q
            .build()
            .persistent(keep_prepared(chunk.len(), RECORDS_PER_STATEMENT));
        q.execute(&mut *tx).await.map_err(|e| match e {
            // The only foreign key is the delivery: it does not exist.
            sqlx::Error::Database(ref db) if db.is_foreign_key_violation() => StoreError::NotFound,
            e => from_sqlx(e),
        })?;
    }

    // 4. The streaks, one statement; each row is written only when its
    //    streak changes, so a run of successes (or failures) costs nothing.
    if !streaks.is_empty() {
        let mut q = QueryBuilder::<Sqlite>::new("WITH v (sub, kind, t) AS (");
        q.push_values(&streaks, |mut row, (sub, change)| {
            let (kind, t) = match *change {
                StreakChange::StartUnlessBegun(t) => ("start", Some(to_ms(t))),
                StreakChange::End => ("end", None),
                StreakChange::Restart(t) => ("restart", Some(to_ms(t))),
            };
            row.push_bind(*sub).push_bind(kind).push_bind(t);
        });
        q.push(
            ") UPDATE subscriptions SET failing_since = CASE v.kind WHEN 'end' THEN NULL \
                 WHEN 'restart' THEN v.t ELSE COALESCE(subscriptions.failing_since, v.t) END \
             FROM v WHERE subscriptions.sub_id = v.sub AND subscriptions.failing_since IS NOT \
                 (CASE v.kind WHEN 'end' THEN NULL WHEN 'restart' THEN v.t \
                  ELSE COALESCE(subscriptions.failing_since, v.t) END)",
        );
        // No full size here: one row per subscription in the batch.
        let q = q.build().persistent(keep_prepared(streaks.len(), 0));
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
