-- hookd's PostgreSQL statements as they are (migrations 0015-0016), at
-- their smallest: 200,000 deliveries of 100 subscriptions, inserted,
-- claimed and recorded in statements of 500 rows, on the real schema (the
-- reference trigger off, as the same in every model). The wide row is
-- inserted (its trigger inserts the queue row), the claim updates the wide
-- row (its trigger updates the queue row), and the record updates the wide
-- row (its trigger deletes the queue row) and inserts the attempt.
\ir ingest-wide.sql
\echo phase claim
DO $$ BEGIN FOR s IN 0..99 LOOP FOR k IN 1..4 LOOP
 WITH due AS (SELECT d.delivery_id, d.retain_from FROM delivery_queue d
   WHERE d.sub_id = ('00000000-0000-7000-a000-' || lpad(to_hex(s),12,'0'))::uuid AND d.state='pending' AND d.next_attempt_at <= now()
   ORDER BY d.sub_id, d.next_attempt_at, d.delivery_id LIMIT 500 FOR UPDATE OF d SKIP LOCKED)
 UPDATE deliveries u SET state='inflight', lease_token=u.lease_token+1, lease_expires=now()+interval '30 s', worker_id='w1', updated_at=now()
 FROM due WHERE u.delivery_id=due.delivery_id AND u.retain_from=due.retain_from AND u.state='pending';
COMMIT;
END LOOP; END LOOP; END $$;
ANALYZE deliveries;
\echo phase record
DO $$ BEGIN FOR b IN 0..399 LOOP
 WITH v AS MATERIALIZED (SELECT ('00000000-0000-7000-8000-' || lpad(to_hex(b*500+i),12,'0'))::uuid AS id, 1::bigint AS token,
     timestamptz '2026-12-07 12:00+00' AS rf FROM generate_series(0,499) i),
 m AS (UPDATE deliveries d SET attempt=d.attempt+1, state='delivered', last_status=200, last_error=NULL,
     lease_expires=NULL, worker_id=NULL, updated_at=now() FROM v
     WHERE d.delivery_id=v.id AND d.retain_from=v.rf AND d.state='inflight' AND d.lease_token=v.token RETURNING d.delivery_id, d.retain_from)
 INSERT INTO attempts (delivery_id, number, started_at, duration_ms, status, outcome, retain_from)
 SELECT m.delivery_id, 1, now(), 3, 200, 'delivered', m.retain_from FROM m;
COMMIT;
END LOOP; END $$;
SELECT 'recorded ' || (SELECT count(*) FROM attempts) || ' unfinished ' || (SELECT count(*) FROM delivery_queue) AS counts;
