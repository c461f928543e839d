-- Ingest that claims (`Store::accept_events_claiming`, design §9.1): a
-- delivery the ingesting node's dispatcher will send at once is written
-- already claimed — `inflight`, leased to that worker, lease token 1 —
-- instead of `pending` and then rewritten by a claim. That saves the
-- claim's row version (its index entries, its WAL) and its round trip.
--
-- `hookd_accept_batch` gains three arguments: which deliveries to claim
-- (`d_claimed`, parallel to `d_id`; NULL claims none), for whom, and for how
-- long. Otherwise it is 0013's function.
DROP FUNCTION hookd_accept_batch(bigint, uuid[], text[], text[], text[], text[],
    uuid[], uuid[], uuid[], text[], text[]);

CREATE FUNCTION hookd_accept_batch(
    expected_generation bigint,
    ev_id uuid[], ev_type text[], ev_payload text[], ev_key text[], ev_customer text[],
    d_id uuid[], d_event uuid[], d_sub uuid[], d_type text[], d_host text[],
    d_claimed boolean[], claim_worker text, claim_lease interval)
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
    IF cardinality(fresh) > 0 THEN
        INSERT INTO deliveries (delivery_id, event_id, sub_id, event_type, destination_host,
            state, attempt, next_attempt_at, lease_expires, lease_token, worker_id,
            created_at, window_start, updated_at, retain_from)
        SELECT u.delivery_id, u.event_id, u.sub_id, u.event_type, u.host,
               CASE WHEN u.claimed THEN 'inflight' ELSE 'pending' END, 0, now(),
               CASE WHEN u.claimed THEN now() + claim_lease END,
               CASE WHEN u.claimed THEN 1 ELSE 0 END,
               CASE WHEN u.claimed THEN claim_worker END,
               now(), now(), now(), now()
        FROM unnest(d_id, d_event, d_sub, d_type, d_host,
                    coalesce(d_claimed, array_fill(false, ARRAY[cardinality(d_id)])))
          AS u(delivery_id, event_id, sub_id, event_type, host, claimed)
        WHERE cardinality(fresh) = cardinality(ev_id) OR u.event_id = ANY(fresh);
    END IF;
    RETURN QUERY SELECT unnest(fresh);
END
$$;
