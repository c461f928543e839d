-- The delivery queue: what claims and reclaims search, in a narrow table of
-- its own, so that nothing a claim or a record changes is indexed on the
-- wide `deliveries` row (design §9.1: "the claim query ... churns the index
-- badly").
--
-- Before, `state` was in the predicates of three partial indexes of
-- `deliveries` (`deliveries_due_sub`, `deliveries_unfinished`,
-- `deliveries_lease`), so no state change could be a HOT update: every
-- claim and every record wrote a new entry into each of the row's indexes
-- (primary key, `(event_id, sub_id)`, `deliveries_sub`, and the partial ones
-- whose predicate the new version met), and vacuum cleaned up after each.
-- Now those three indexes live on `delivery_queue`, whose row holds only
-- what they need. A delivery has a queue row exactly while it is `pending`
-- or `inflight`, with the same state, due time, lease expiry, day and host
-- as its `deliveries` row. The wide row keeps every column, so everything
-- that reads a delivery reads it as before; only the searches for due,
-- unfinished and expired work go through the queue.
--
-- The queue is kept by statement-level triggers on `deliveries` (below), in
-- the transaction of whatever wrote the delivery, so no writer can forget
-- it, and what holds on `deliveries` (the outbox's one transaction, a claim's
-- lease token) holds for it too. Lock order: a claim picks and locks the
-- queue row (`FOR UPDATE SKIP LOCKED`), then updates the delivery, whose
-- trigger updates the queue row it holds. The other writers of a pending
-- delivery (deleting its subscription, retention's carry-forward) lock its
-- queue row first too; a delivery that is not pending is written row first,
-- queue row after, and no claim takes its queue row.
--
-- Day partitions of `deliveries` are created with fillfactor 50: room on
-- each page for the new versions the claim and the record write, so they
-- stay on the page as HOT updates (no index entry at all).
CREATE TABLE delivery_queue (
    sub_id           uuid NOT NULL,
    delivery_id      uuid NOT NULL,
    -- The delivery's day partition, so a claim reads its row in one day's
    -- index (see store.rs, "Lookups by id").
    retain_from      timestamptz NOT NULL,
    destination_host text NOT NULL,
    state            text NOT NULL CHECK (state IN ('pending', 'inflight')),
    next_attempt_at  timestamptz NOT NULL,
    lease_expires    timestamptz,
    -- Also the ordered-subscription head check and the unfinished counts:
    -- a subscription's unfinished deliveries, oldest (UUIDv7) first.
    PRIMARY KEY (sub_id, delivery_id)
);
-- Per-subscription claims and `due_destinations`. Whole claim order
-- (due time, then id), so a claim's pick reads its rows in order and stops
-- at its limit, whatever the planner thinks of the table's size.
CREATE INDEX delivery_queue_due ON delivery_queue (sub_id, next_attempt_at, delivery_id)
    WHERE state = 'pending';
-- `reclaim_expired`: only rows in flight carry a lease.
CREATE INDEX delivery_queue_lease ON delivery_queue (lease_expires) WHERE state = 'inflight';

INSERT INTO delivery_queue (sub_id, delivery_id, retain_from, destination_host, state,
    next_attempt_at, lease_expires)
SELECT sub_id, delivery_id, retain_from, destination_host, state, next_attempt_at, lease_expires
FROM deliveries WHERE state IN ('pending', 'inflight');

DROP INDEX deliveries_due_sub, deliveries_unfinished, deliveries_lease;

-- The triggers. Each runs once per statement over the rows it wrote (a
-- transition table), as one set-based statement per kind of change. Their
-- joins find queue rows by key, one probe per row written: a plan made while
-- the queue looked small (a new schema, before its first ANALYZE) would
-- otherwise read the whole queue for every statement, and PL/pgSQL keeps
-- that plan for the connection's life.
CREATE FUNCTION hookd_queue_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO delivery_queue (sub_id, delivery_id, retain_from, destination_host, state,
        next_attempt_at, lease_expires)
    SELECT n.sub_id, n.delivery_id, n.retain_from, n.destination_host, n.state,
           n.next_attempt_at, n.lease_expires
    FROM hookd_new_deliveries n WHERE n.state IN ('pending', 'inflight');
    RETURN NULL;
END
$$;

-- An update (a move between day partitions included: PostgreSQL reports it
-- as an UPDATE) either finishes the delivery, which takes its queue row
-- away, or leaves it unfinished, which writes its queue row when anything
-- the queue holds changed (a replay puts a finished delivery back).
CREATE FUNCTION hookd_queue_updated() RETURNS trigger
LANGUAGE plpgsql SET enable_hashjoin = off SET enable_mergejoin = off AS $$
BEGIN
    DELETE FROM delivery_queue q USING hookd_new_deliveries n
    WHERE q.sub_id = n.sub_id AND q.delivery_id = n.delivery_id
      AND n.state NOT IN ('pending', 'inflight');
    INSERT INTO delivery_queue AS q (sub_id, delivery_id, retain_from, destination_host, state,
        next_attempt_at, lease_expires)
    SELECT n.sub_id, n.delivery_id, n.retain_from, n.destination_host, n.state,
           n.next_attempt_at, n.lease_expires
    FROM hookd_new_deliveries n WHERE n.state IN ('pending', 'inflight')
    ON CONFLICT (sub_id, delivery_id) DO UPDATE SET
        retain_from = EXCLUDED.retain_from, destination_host = EXCLUDED.destination_host,
        state = EXCLUDED.state, next_attempt_at = EXCLUDED.next_attempt_at,
        lease_expires = EXCLUDED.lease_expires
    WHERE (q.retain_from, q.destination_host, q.state, q.next_attempt_at, q.lease_expires)
          IS DISTINCT FROM (EXCLUDED.retain_from, EXCLUDED.destination_host, EXCLUDED.state,
                            EXCLUDED.next_attempt_at, EXCLUDED.lease_expires);
    RETURN NULL;
END
$$;

-- hookd never deletes delivery rows (retention drops whole days, and only
-- days without unfinished deliveries); this keeps the queue right if
-- anything else does.
CREATE FUNCTION hookd_queue_deleted() RETURNS trigger
LANGUAGE plpgsql SET enable_hashjoin = off SET enable_mergejoin = off AS $$
BEGIN
    DELETE FROM delivery_queue q USING hookd_old_deliveries o
    WHERE q.sub_id = o.sub_id AND q.delivery_id = o.delivery_id;
    RETURN NULL;
END
$$;

CREATE TRIGGER deliveries_queue_insert AFTER INSERT ON deliveries
    REFERENCING NEW TABLE AS hookd_new_deliveries
    FOR EACH STATEMENT EXECUTE FUNCTION hookd_queue_inserted();
CREATE TRIGGER deliveries_queue_update AFTER UPDATE ON deliveries
    REFERENCING NEW TABLE AS hookd_new_deliveries
    FOR EACH STATEMENT EXECUTE FUNCTION hookd_queue_updated();
CREATE TRIGGER deliveries_queue_delete AFTER DELETE ON deliveries
    REFERENCING OLD TABLE AS hookd_old_deliveries
    FOR EACH STATEMENT EXECUTE FUNCTION hookd_queue_deleted();

-- Day partitions from now on leave half of each deliveries page free for
-- HOT updates; existing ones do so on pages written from now on.
CREATE OR REPLACE FUNCTION hookd_day_partition(day date) RETURNS boolean
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
        EXECUTE format('CREATE TABLE %I PARTITION OF deliveries FOR VALUES FROM (%L) TO (%L) '
                       'WITH (fillfactor = 50)',
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

DO $$
DECLARE
    part regclass;
BEGIN
    FOR part IN SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = 'deliveries'::regclass LOOP
        EXECUTE format('ALTER TABLE %s SET (fillfactor = 50)', part);
    END LOOP;
END
$$;
