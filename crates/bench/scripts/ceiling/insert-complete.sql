-- One cycle of the two-write design (§9.1's in-memory queue on a lone
-- node: deliveries written inflight at ingest, no claim): 5 events × 100
-- subscriptions inserted leased, then completed with their attempt rows.
WITH ev AS (
    INSERT INTO ceiling.events (event_id, type, payload, idempotency_key)
    SELECT gen_random_uuid(), 'order.created', '{"seq":1}', gen_random_uuid()::text
    FROM generate_series(1, 5)
    RETURNING event_id
), ins AS (
    INSERT INTO ceiling.deliveries
        (delivery_id, event_id, sub_id, destination_host, state, attempt, worker_id, lease_expires)
    SELECT gen_random_uuid(), ev.event_id, s.sub_id, s.host, 'inflight', 1, 'w1',
           now() + interval '90 s'
    FROM ev CROSS JOIN ceiling.subs s
    RETURNING delivery_id
)
SELECT array_agg(delivery_id)::text AS ids FROM ins \gset
WITH u AS (
    UPDATE ceiling.deliveries
    SET state = 'delivered', last_status = 200, lease_expires = NULL, worker_id = NULL
    WHERE delivery_id = ANY (:ids::uuid[])
    RETURNING delivery_id, attempt
)
INSERT INTO ceiling.attempts (delivery_id, attempt, status)
SELECT delivery_id, attempt, 200 FROM u;
