-- An ingest batch in one round trip. The group committer's batch was a
-- transaction of four round trips (BEGIN, the events' INSERT, the
-- deliveries' INSERT, COMMIT). Sampling pg_stat_activity during `steady`
-- found its connection mostly idle in transaction between them: waiting
-- for hookd to be scheduled, not for the server. Called as one
-- self-committing statement, the batch is all or nothing as before.
--
-- Unless `expected_generation` is NULL, first checks that the subscription
-- generation is still the one the batch's deliveries were matched against,
-- and raises SQLSTATE HKD01 (nothing written) when it moved: the check
-- ingest made with a separate read before, now in the same round trip.
--
-- Inserts the events (first of each idempotency key only: the caller
-- dedupes within the batch), in key order so batches sharing keys lock
-- them in one order; then the deliveries of the events it inserted (every
-- one of them in the usual case, no key taken). Returns the inserted ids.
CREATE FUNCTION hookd_accept_batch(
    expected_generation bigint,
    ev_id uuid[], ev_type text[], ev_payload text[], ev_key text[], ev_customer text[],
    d_id uuid[], d_event uuid[], d_sub uuid[], d_type text[], d_host text[])
RETURNS SETOF uuid
LANGUAGE plpgsql AS $$
DECLARE
    fresh uuid[];
BEGIN
    IF expected_generation IS NOT NULL AND expected_generation IS DISTINCT FROM
        (SELECT value FROM meta WHERE name = 'subscription_generation') THEN
        RAISE EXCEPTION 'the subscription generation moved' USING ERRCODE = 'HKD01';
    END IF;
    WITH ins AS (
        INSERT INTO events (event_id, type, payload, idempotency_key, customer_id)
        SELECT u.event_id, u.type, u.payload, u.idempotency_key, u.customer_id
        FROM unnest(ev_id, ev_type, ev_payload, ev_key, ev_customer)
          AS u(event_id, type, payload, idempotency_key, customer_id)
        ORDER BY u.idempotency_key
        ON CONFLICT (idempotency_key) DO NOTHING
        RETURNING events.event_id)
    SELECT coalesce(array_agg(ins.event_id), '{}') INTO fresh FROM ins;
    IF cardinality(fresh) = cardinality(ev_id) THEN
        INSERT INTO deliveries (delivery_id, event_id, sub_id, event_type, destination_host,
            state, attempt, next_attempt_at, created_at, window_start, updated_at, retain_from)
        SELECT u.delivery_id, u.event_id, u.sub_id, u.event_type, u.host, 'pending', 0,
               now(), now(), now(), now(), now()
        FROM unnest(d_id, d_event, d_sub, d_type, d_host)
          AS u(delivery_id, event_id, sub_id, event_type, host);
    ELSIF cardinality(fresh) > 0 THEN
        INSERT INTO deliveries (delivery_id, event_id, sub_id, event_type, destination_host,
            state, attempt, next_attempt_at, created_at, window_start, updated_at, retain_from)
        SELECT u.delivery_id, u.event_id, u.sub_id, u.event_type, u.host, 'pending', 0,
               now(), now(), now(), now(), now()
        FROM unnest(d_id, d_event, d_sub, d_type, d_host)
          AS u(delivery_id, event_id, sub_id, event_type, host)
        WHERE u.event_id IN (SELECT unnest(fresh));
    END IF;
    RETURN QUERY SELECT unnest(fresh);
END
$$;
