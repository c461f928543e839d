-- Bulk replay jobs, signals, failing streaks, and the daily rollup that
-- retention folds removed attempts into.

-- The outcome an attempt caused, for the daily rollup: 'delivered',
-- 'retry', 'failed' or 'dead'; NULL when its lease was lost (it moved
-- nothing), and for attempts recorded before this column existed.
ALTER TABLE attempts ADD COLUMN outcome TEXT
    CHECK (outcome IN ('delivered', 'retry', 'failed', 'dead'));

-- When the subscription's failing streak began (an attempt's started_at,
-- caller's clock, ms): the first attempt that did not deliver since the
-- last one that did. NULL when its last attempt delivered, or none failed.
ALTER TABLE subscriptions ADD COLUMN failing_since INTEGER;

CREATE TABLE replay_jobs (
    job_id      BLOB    NOT NULL PRIMARY KEY,
    sub_id      BLOB    NOT NULL REFERENCES subscriptions (sub_id),
    since       INTEGER NOT NULL,
    until       INTEGER NOT NULL,
    -- JSON array of exact event types; [] means all.
    event_types TEXT    NOT NULL,
    -- JSON array of delivery state names.
    states      TEXT    NOT NULL,
    state       TEXT    NOT NULL CHECK (state IN ('running', 'completed', 'cancelled')),
    total       INTEGER NOT NULL,
    done        INTEGER NOT NULL DEFAULT 0,
    failed      INTEGER NOT NULL DEFAULT 0,
    skipped     INTEGER NOT NULL DEFAULT 0,
    requeued    INTEGER NOT NULL DEFAULT 0,
    created_at  INTEGER NOT NULL,
    finished_at INTEGER
) STRICT;

-- What the job runner polls: running jobs, oldest first.
CREATE INDEX replay_jobs_running ON replay_jobs (created_at, job_id)
    WHERE state = 'running';

-- A job's items, fixed at creation. No foreign key to deliveries:
-- retention may remove a delivery, and its item is then skipped. Items are
-- removed when their job ends (the counts live on the job row).
CREATE TABLE replay_job_items (
    job_id      BLOB NOT NULL REFERENCES replay_jobs (job_id),
    delivery_id BLOB NOT NULL,
    -- queued: not re-queued yet (or waiting for its delivery to finish);
    -- requeued: made pending by the job, not settled yet.
    state       TEXT NOT NULL CHECK (state IN ('queued', 'requeued')),
    PRIMARY KEY (job_id, delivery_id)
) STRICT, WITHOUT ROWID;

CREATE INDEX replay_job_items_state ON replay_job_items (job_id, state, delivery_id);

-- Raised signals; lowering one deletes its row.
CREATE TABLE subscription_signals (
    sub_id    BLOB    NOT NULL REFERENCES subscriptions (sub_id),
    kind      TEXT    NOT NULL
        CHECK (kind IN ('disabled', 'dead_lettering', 'configuration_error', 'shedding')),
    detail    TEXT    NOT NULL,
    raised_at INTEGER NOT NULL,
    PRIMARY KEY (sub_id, kind)
) STRICT;

-- Attempts removed by retention, folded per subscription and UTC day
-- (`YYYY-MM-DD`). Kept forever; no foreign key, so it outlives anything.
CREATE TABLE daily_stats (
    sub_id    BLOB    NOT NULL,
    day       TEXT    NOT NULL,
    attempts  INTEGER NOT NULL,
    delivered INTEGER NOT NULL,
    failed    INTEGER NOT NULL,
    dead      INTEGER NOT NULL,
    -- JSON array of [milliseconds, count] pairs, ascending by milliseconds.
    latency   TEXT    NOT NULL,
    PRIMARY KEY (sub_id, day)
) STRICT;

-- Retention walks expired rows oldest first.
CREATE INDEX deliveries_created ON deliveries (created_at);
CREATE INDEX events_created ON events (created_at);
