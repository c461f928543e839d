-- The design's two-write model (§9.1): an unfinished delivery is only its
-- queue row (made as wide as a delivery needs, `queue_c`), the claim
-- updates it, and the record deletes it and inserts the finished wide row
-- and the attempt. The wide table's triggers are off: nothing unfinished
-- is ever in it.
\timing on
ALTER TABLE deliveries DISABLE TRIGGER USER;
DROP TABLE IF EXISTS queue_c;
CREATE TABLE queue_c (delivery_id uuid NOT NULL, event_id uuid NOT NULL, sub_id uuid NOT NULL, event_type text NOT NULL,
 destination_host text NOT NULL, state text NOT NULL, attempt int NOT NULL DEFAULT 0, next_attempt_at timestamptz NOT NULL DEFAULT now(),
 lease_expires timestamptz, lease_token bigint NOT NULL DEFAULT 0, worker_id text, last_status int, last_error text,
 created_at timestamptz NOT NULL DEFAULT now(), window_start timestamptz NOT NULL DEFAULT now(), updated_at timestamptz NOT NULL DEFAULT now(),
 retain_from timestamptz NOT NULL, PRIMARY KEY (sub_id, delivery_id));
CREATE INDEX queue_c_due ON queue_c (sub_id, next_attempt_at, delivery_id) WHERE state = 'pending';
CREATE INDEX queue_c_lease ON queue_c (lease_expires) WHERE state = 'inflight';
TRUNCATE deliveries, delivery_queue, attempts;
CHECKPOINT;
\echo phase ingest
DO $$ BEGIN FOR b IN 0..399 LOOP
 INSERT INTO queue_c (delivery_id, event_id, sub_id, event_type, destination_host, state, retain_from)
 SELECT ('00000000-0000-7000-8000-' || lpad(to_hex(b*500+i),12,'0'))::uuid,
        ('00000000-0000-7000-9000-' || lpad(to_hex(b*5+i/100),12,'0'))::uuid,
        ('00000000-0000-7000-a000-' || lpad(to_hex(i%100),12,'0'))::uuid,
        'order.created', '127.0.0.' || (i%100), 'pending', '2026-12-07 12:00+00'
 FROM generate_series(0,499) i;
COMMIT;
END LOOP; END $$;
ANALYZE queue_c;
\echo phase claim
DO $$ BEGIN FOR s IN 0..99 LOOP FOR k IN 1..4 LOOP
 WITH due AS (SELECT d.sub_id, d.delivery_id FROM queue_c d
   WHERE d.sub_id = ('00000000-0000-7000-a000-' || lpad(to_hex(s),12,'0'))::uuid AND d.state='pending' AND d.next_attempt_at <= now()
   ORDER BY d.sub_id, d.next_attempt_at, d.delivery_id LIMIT 500 FOR UPDATE OF d SKIP LOCKED)
 UPDATE queue_c u SET state='inflight', lease_token=u.lease_token+1, lease_expires=now()+interval '30 s', worker_id='w1', updated_at=now()
 FROM due WHERE u.sub_id=due.sub_id AND u.delivery_id=due.delivery_id;
COMMIT;
END LOOP; END LOOP; END $$;
ANALYZE queue_c;
\echo phase record
DO $$ BEGIN FOR b IN 0..399 LOOP
 WITH v AS MATERIALIZED (SELECT ('00000000-0000-7000-8000-' || lpad(to_hex(b*500+i),12,'0'))::uuid AS id, 1::bigint AS token,
     ('00000000-0000-7000-a000-' || lpad(to_hex(i%100),12,'0'))::uuid AS sub FROM generate_series(0,499) i),
 gone AS (DELETE FROM queue_c q USING v WHERE q.sub_id=v.sub AND q.delivery_id=v.id AND q.state='inflight' AND q.lease_token=v.token RETURNING q.*),
 ins AS (INSERT INTO deliveries (delivery_id, event_id, sub_id, event_type, destination_host, state, attempt, next_attempt_at,
     lease_token, last_status, created_at, window_start, updated_at, retain_from)
   SELECT delivery_id, event_id, sub_id, event_type, destination_host, 'delivered', attempt+1, next_attempt_at, lease_token, 200,
     created_at, window_start, now(), retain_from FROM gone)
 INSERT INTO attempts (delivery_id, number, started_at, duration_ms, status, outcome, retain_from)
 SELECT g.delivery_id, 1, now(), 3, 200, 'delivered', g.retain_from FROM gone g;
COMMIT;
END LOOP; END $$;
SELECT 'recorded ' || (SELECT count(*) FROM attempts) || ' unfinished ' || (SELECT count(*) FROM queue_c) AS counts;
ALTER TABLE deliveries ENABLE TRIGGER USER;
