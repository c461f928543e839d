-- As current.sql, but the claim writes only the queue row (which gains
-- the lease token and worker) and the record fences on it: the claim no
-- longer writes the wide row. Tried in hookd in session 30 and not kept.
ALTER TABLE delivery_queue ADD COLUMN IF NOT EXISTS lease_token bigint NOT NULL DEFAULT 0, ADD COLUMN IF NOT EXISTS worker_id text;
\ir ingest-wide.sql
\echo phase claim
DO $$ BEGIN FOR s IN 0..99 LOOP FOR k IN 1..4 LOOP
 WITH due AS (SELECT d.sub_id, d.delivery_id, d.retain_from FROM delivery_queue d
   WHERE d.sub_id = ('00000000-0000-7000-a000-' || lpad(to_hex(s),12,'0'))::uuid AND d.state='pending' AND d.next_attempt_at <= now()
   ORDER BY d.sub_id, d.next_attempt_at, d.delivery_id LIMIT 500 FOR UPDATE OF d SKIP LOCKED)
 UPDATE delivery_queue u SET state='inflight', lease_token=u.lease_token+1, lease_expires=now()+interval '30 s', worker_id='w1'
 FROM due WHERE u.sub_id=due.sub_id AND u.delivery_id=due.delivery_id;
COMMIT;
END LOOP; END LOOP; END $$;
ANALYZE deliveries; ANALYZE delivery_queue;
\echo phase record
DO $$ BEGIN FOR b IN 0..399 LOOP
 WITH v AS MATERIALIZED (SELECT ('00000000-0000-7000-8000-' || lpad(to_hex(b*500+i),12,'0'))::uuid AS id, 1::bigint AS token,
     timestamptz '2026-12-07 12:00+00' AS rf, ('00000000-0000-7000-a000-' || lpad(to_hex((b*500+i)%100),12,'0'))::uuid AS sub FROM generate_series(0,499) i),
 f AS MATERIALIZED (SELECT v.* FROM v JOIN delivery_queue q ON q.sub_id=v.sub AND q.delivery_id=v.id AND q.state='inflight' AND q.lease_token=v.token),
 m AS (UPDATE deliveries d SET attempt=d.attempt+1, state='delivered', last_status=200, last_error=NULL,
     lease_expires=NULL, worker_id=NULL, lease_token=f.token, updated_at=now() FROM f
     WHERE d.delivery_id=f.id AND d.retain_from=f.rf RETURNING d.delivery_id, d.retain_from)
 INSERT INTO attempts (delivery_id, number, started_at, duration_ms, status, outcome, retain_from)
 SELECT m.delivery_id, 1, now(), 3, 200, 'delivered', m.retain_from FROM m;
COMMIT;
END LOOP; END $$;
SELECT 'recorded ' || (SELECT count(*) FROM attempts) || ' unfinished ' || (SELECT count(*) FROM delivery_queue) AS counts;
