-- One cycle of the three-write design: 5 events × 100 subscriptions
-- inserted pending, 500 claimed (5 per destination host through the due
-- index, FOR UPDATE SKIP LOCKED, as hookd claims), 500 completed with
-- their attempt rows; each statement its own transaction, as in hookd.
WITH ev AS (
    INSERT INTO ceiling.events (event_id, type, payload, idempotency_key)
    SELECT gen_random_uuid(), 'order.created', '{"seq":1}', gen_random_uuid()::text
    FROM generate_series(1, 5)
    RETURNING event_id
)
INSERT INTO ceiling.deliveries (delivery_id, event_id, sub_id, destination_host, state)
SELECT gen_random_uuid(), ev.event_id, s.sub_id, s.host, 'pending'
FROM ev CROSS JOIN ceiling.subs s;
WITH c AS (
    UPDATE ceiling.deliveries d
    SET state = 'inflight', attempt = d.attempt + 1, worker_id = 'w1',
        lease_expires = now() + interval '90 s'
    FROM (SELECT q.delivery_id FROM ceiling.subs s
          CROSS JOIN LATERAL (
              SELECT delivery_id FROM ceiling.deliveries
              WHERE state = 'pending' AND destination_host = s.host
              ORDER BY next_attempt_at
              LIMIT 5 FOR UPDATE SKIP LOCKED) q) p
    WHERE d.delivery_id = p.delivery_id
    RETURNING d.delivery_id
)
SELECT coalesce(array_agg(delivery_id), '{}')::text AS ids FROM c \gset
WITH u AS (
    UPDATE ceiling.deliveries
    SET state = 'delivered', last_status = 200, lease_expires = NULL, worker_id = NULL
    WHERE delivery_id = ANY (:ids::uuid[])
    RETURNING delivery_id, attempt
)
INSERT INTO ceiling.attempts (delivery_id, attempt, status)
SELECT delivery_id, attempt, 200 FROM u;
