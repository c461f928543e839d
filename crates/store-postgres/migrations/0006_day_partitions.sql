-- Deliveries and attempts in day partitions (design §9.3: "partition
-- deliveries by day and drop partitions rather than DELETE"), the attempt's
-- outcome and the subscription's failing streak, bulk replay jobs, signals,
-- and the daily rollup that outlives the partitions.
--
-- The partition key is `retain_from`: the time retention counts from. It is
-- the delivery's creation, or the moment an unfinished delivery of an expired
-- day was carried forward into today's partition. An attempt copies its
-- delivery's `retain_from` when it is written (and is carried forward with
-- it), so a delivery and its attempts are always in the same day, and a day
-- is dropped as one pair of partitions: `deliveries_pYYYYMMDD` and
-- `attempts_pYYYYMMDD`, each covering [YYYY-MM-DD 00:00 UTC, next day).
--
-- There is no DEFAULT partition: `hookd_ensure_partitions()` creates today's
-- and the next three days' partitions ahead of time (at migrate, and at the
-- end of every retention pass, inside the transaction that drops a day), so an
-- insert always finds its day. A DEFAULT partition would make every new day
-- partition scan it (and fail if it held rows of that day), and its rows
-- could never be dropped whole. If upkeep stops for more than three days,
-- inserts fail loudly rather than piling up somewhere retention cannot reach.

-- 1. The old tables move aside; their index names are freed for the new ones.
ALTER TABLE attempts DROP CONSTRAINT attempts_delivery_id_fkey;
ALTER TABLE attempts RENAME TO attempts_0005;
ALTER TABLE deliveries RENAME TO deliveries_0005;
ALTER INDEX deliveries_pkey RENAME TO deliveries_0005_pkey;
ALTER INDEX deliveries_event_id_sub_id_key RENAME TO deliveries_0005_event_id_sub_id_key;
ALTER INDEX attempts_pkey RENAME TO attempts_0005_pkey;
DROP INDEX deliveries_due, deliveries_lease, deliveries_sub, deliveries_unfinished,
    deliveries_due_sub, attempts_delivery;

-- 2. The partitioned tables.
CREATE TABLE deliveries (
    delivery_id      uuid NOT NULL,
    -- Foreign keys *from* a partitioned table work (each partition carries
    -- them) and cost nothing when a partition is dropped.
    event_id         uuid NOT NULL REFERENCES events (event_id),
    sub_id           uuid NOT NULL REFERENCES subscriptions (sub_id),
    event_type       text NOT NULL,
    -- The shard key for claims and per-destination admission.
    destination_host text NOT NULL,
    state            text NOT NULL DEFAULT 'pending'
                     CHECK (state IN ('pending', 'inflight', 'delivered', 'failed', 'dead')),
    attempt          integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    lease_expires    timestamptz,
    -- Bumped by every claim; completion, renewal and release are conditional
    -- on it, so a worker whose lease was lost cannot overwrite a newer claim.
    lease_token      bigint NOT NULL DEFAULT 0,
    worker_id        text,
    last_status      integer,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    window_start     timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    -- The partition key: creation, or when an unfinished delivery was carried
    -- forward out of an expired day.
    retain_from      timestamptz NOT NULL DEFAULT now(),
    -- A unique constraint on a partitioned table must include the partition
    -- key. Ids are unique by construction (UUIDv7 chosen by the caller).
    PRIMARY KEY (delivery_id, retain_from),
    -- Still unique per (event, subscription): ingest writes all of an event's
    -- deliveries in one transaction, with one now(), so they share one
    -- retain_from and a duplicate within the fan-out collides here; a repeated
    -- event is stopped earlier by the events' idempotency key.
    UNIQUE (event_id, sub_id, retain_from)
) PARTITION BY RANGE (retain_from);

-- Sized by pending work only: delivered history does not slow claims down.
CREATE INDEX deliveries_due ON deliveries (destination_host, next_attempt_at) WHERE state = 'pending';
-- For reclaim_expired: only rows in flight carry a lease.
CREATE INDEX deliveries_lease ON deliveries (lease_expires) WHERE state = 'inflight';
-- For the delivery log of one subscription, newest first.
CREATE INDEX deliveries_sub ON deliveries (sub_id, delivery_id);
-- The ordered-subscription head check, the backlog and health counts: only
-- unfinished deliveries.
CREATE INDEX deliveries_unfinished ON deliveries (sub_id, delivery_id)
    WHERE state IN ('pending', 'inflight');
-- Per-subscription claims on a shared host.
CREATE INDEX deliveries_due_sub ON deliveries (sub_id, next_attempt_at)
    WHERE state = 'pending';

-- PostgreSQL 15 allows no identity column on a partitioned table; a plain
-- sequence does the same job.
CREATE SEQUENCE attempt_ids AS bigint;

CREATE TABLE attempts (
    attempt_id       bigint NOT NULL DEFAULT nextval('attempt_ids'),
    -- No foreign key to deliveries: a key referencing a partitioned table
    -- makes every partition drop check (or cascade to) the other table, and
    -- DETACH/DROP of a referenced partition is refused while rows point into
    -- it. Instead the store keeps the pair together: an attempt is written
    -- with its delivery's retain_from, both move together when carried
    -- forward, and both partitions of a day are dropped in one transaction.
    delivery_id      uuid NOT NULL,
    number           integer NOT NULL,
    started_at       timestamptz NOT NULL,
    duration_ms      bigint NOT NULL,
    status           integer,
    error_class      text,
    -- At most 1 KB (MAX_SNIPPET_BYTES), truncated by the caller.
    response_snippet text,
    -- The outcome this attempt caused ('delivered', 'retry', 'failed',
    -- 'dead'; the same names as on SQLite); NULL when its lease was lost and
    -- it moved nothing. The daily rollup counts it.
    outcome          text CHECK (outcome IN ('delivered', 'retry', 'failed', 'dead')),
    -- Its delivery's partition key, copied at insert.
    retain_from      timestamptz NOT NULL,
    PRIMARY KEY (attempt_id, retain_from)
) PARTITION BY RANGE (retain_from);
ALTER SEQUENCE attempt_ids OWNED BY attempts.attempt_id;
CREATE INDEX attempts_delivery ON attempts (delivery_id, attempt_id);

-- 3. Day partitions. `hookd_day_partition(day)` creates the pair for one UTC
-- day if missing; `hookd_ensure_partitions()` does so for today (UTC) through
-- today + 3. Creating a partition locks its parent exclusively, so the common
-- case (all there) checks first and takes no lock; creators serialise on an
-- advisory lock (per schema) and check again.
CREATE FUNCTION hookd_day_partition(day date) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    suffix text := to_char(day, 'YYYYMMDD');
    lo timestamptz := day::timestamp AT TIME ZONE 'UTC';
    hi timestamptz := (day + 1)::timestamp AT TIME ZONE 'UTC';
    created boolean := false;
BEGIN
    IF to_regclass(format('%I', 'deliveries_p' || suffix)) IS NOT NULL
       AND to_regclass(format('%I', 'attempts_p' || suffix)) IS NOT NULL THEN
        RETURN false;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('hookd_day_partition ' || current_schema()));
    IF to_regclass(format('%I', 'deliveries_p' || suffix)) IS NULL THEN
        EXECUTE format('CREATE TABLE %I PARTITION OF deliveries FOR VALUES FROM (%L) TO (%L)',
                       'deliveries_p' || suffix, lo, hi);
        created := true;
    END IF;
    IF to_regclass(format('%I', 'attempts_p' || suffix)) IS NULL THEN
        EXECUTE format('CREATE TABLE %I PARTITION OF attempts FOR VALUES FROM (%L) TO (%L)',
                       'attempts_p' || suffix, lo, hi);
        created := true;
    END IF;
    RETURN created;
END
$$;

CREATE FUNCTION hookd_ensure_partitions() RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    today date := (now() AT TIME ZONE 'UTC')::date;
    n integer := 0;
BEGIN
    FOR i IN 0..3 LOOP
        IF hookd_day_partition(today + i) THEN
            n := n + 1;
        END IF;
    END LOOP;
    RETURN n;
END
$$;

-- 4. Existing rows move in: a partition for each day that has deliveries,
-- plus today .. today + 3. An existing delivery's retain_from is its
-- created_at; an unfinished one in an expired day is carried forward by the
-- first retention pass like any other.
DO $$
DECLARE
    d date;
BEGIN
    FOR d IN SELECT DISTINCT (created_at AT TIME ZONE 'UTC')::date FROM deliveries_0005 LOOP
        PERFORM hookd_day_partition(d);
    END LOOP;
    PERFORM hookd_ensure_partitions();
END
$$;

INSERT INTO deliveries (delivery_id, event_id, sub_id, event_type, destination_host, state, attempt,
    next_attempt_at, lease_expires, lease_token, worker_id, last_status, last_error, created_at,
    window_start, updated_at, retain_from)
SELECT delivery_id, event_id, sub_id, event_type, destination_host, state, attempt,
    next_attempt_at, lease_expires, lease_token, worker_id, last_status, last_error, created_at,
    window_start, updated_at, created_at
FROM deliveries_0005;

-- Old attempts did not record their outcome; the best reconstruction: a 2xx
-- delivered, the last attempt of a failed or dead delivery caused that, any
-- other was a retry.
INSERT INTO attempts (attempt_id, delivery_id, number, started_at, duration_ms, status, error_class,
    response_snippet, outcome, retain_from)
SELECT a.attempt_id, a.delivery_id, a.number, a.started_at, a.duration_ms, a.status, a.error_class,
    a.response_snippet,
    CASE WHEN a.status BETWEEN 200 AND 299 THEN 'delivered'
         WHEN a.number = d.attempt AND d.state IN ('failed', 'dead') THEN d.state
         ELSE 'retry' END,
    d.created_at
FROM attempts_0005 a JOIN deliveries_0005 d ON d.delivery_id = a.delivery_id;

SELECT setval('attempt_ids', COALESCE((SELECT max(attempt_id) FROM attempts), 0) + 1, false);

DROP TABLE attempts_0005;
DROP TABLE deliveries_0005;

-- 5. The failing streak: when the subscription's current run of failed
-- attempts began (`started_at` of its first attempt), NULL when its last
-- attempt delivered. Written only when it changes.
ALTER TABLE subscriptions ADD COLUMN failing_since timestamptz;
CREATE INDEX subscriptions_failing ON subscriptions (failing_since) WHERE failing_since IS NOT NULL;

-- 6. Bulk replay jobs. Items are fixed at creation; `state` of an item:
-- 'queued' (not re-queued yet), 'requeued' (waiting for its delivery to
-- finish), then one of 'done', 'failed', 'skipped'. The job row keeps the
-- counts, moved in the same transaction as the items.
CREATE TABLE replay_jobs (
    job_id      uuid PRIMARY KEY,
    sub_id      uuid NOT NULL REFERENCES subscriptions (sub_id),
    since       timestamptz NOT NULL,
    until       timestamptz NOT NULL,
    event_types text[] NOT NULL,
    states      text[] NOT NULL,
    state       text NOT NULL CHECK (state IN ('running', 'completed', 'cancelled')),
    total       bigint NOT NULL DEFAULT 0,
    done        bigint NOT NULL DEFAULT 0,
    failed      bigint NOT NULL DEFAULT 0,
    skipped     bigint NOT NULL DEFAULT 0,
    requeued    bigint NOT NULL DEFAULT 0,
    created_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
CREATE INDEX replay_jobs_running ON replay_jobs (created_at, job_id) WHERE state = 'running';

CREATE TABLE replay_job_items (
    job_id      uuid NOT NULL REFERENCES replay_jobs (job_id) ON DELETE CASCADE,
    -- No foreign key: the delivery may be dropped by retention (the item is
    -- then skipped).
    delivery_id uuid NOT NULL,
    state       text NOT NULL DEFAULT 'queued'
                CHECK (state IN ('queued', 'requeued', 'done', 'failed', 'skipped')),
    PRIMARY KEY (job_id, delivery_id)
);
CREATE INDEX replay_job_items_open ON replay_job_items (job_id, state, delivery_id)
    WHERE state IN ('queued', 'requeued');

-- 7. Signals: at most one raised signal per (subscription, kind).
CREATE TABLE subscription_signals (
    sub_id    uuid NOT NULL REFERENCES subscriptions (sub_id),
    kind      text NOT NULL CHECK (kind IN ('disabled', 'dead_lettering', 'configuration_error', 'shedding')),
    detail    text NOT NULL,
    raised_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sub_id, kind)
);

-- 8. The daily rollup of attempts removed by retention, kept forever (no
-- foreign key: it outlives everything it counts). `latency` is a JSON array
-- of [milliseconds, count] pairs, ascending, one per distinct duration.
CREATE TABLE daily_stats (
    sub_id    uuid NOT NULL,
    day       date NOT NULL,
    attempts  bigint NOT NULL,
    delivered bigint NOT NULL,
    failed    bigint NOT NULL,
    dead      bigint NOT NULL,
    latency   jsonb NOT NULL,
    PRIMARY KEY (sub_id, day)
);

-- Merges two latency arrays, adding the counts of equal durations.
CREATE FUNCTION hookd_merge_latency(a jsonb, b jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT COALESCE(jsonb_agg(jsonb_build_array(ms, n) ORDER BY ms), '[]'::jsonb)
    FROM (
        SELECT (p->>0)::bigint AS ms, sum((p->>1)::bigint) AS n
        FROM (SELECT jsonb_array_elements(COALESCE(a, '[]'::jsonb)) AS p
              UNION ALL
              SELECT jsonb_array_elements(COALESCE(b, '[]'::jsonb))) AS pairs
        GROUP BY 1
    ) AS merged
$$;

-- Retention deletes events by age (once no delivery refers to them).
CREATE INDEX events_created ON events (created_at);
