-- Claims of one subscription's deliveries (`ClaimRequest::subscription`):
-- the dispatcher splits a host's cap among the subscriptions with due work
-- there, so on a host with many subscriptions each claim wants one
-- subscription's due rows, oldest or newest first. `deliveries_due` would
-- walk the whole host's pending slice to find them; this index, like it,
-- holds pending work only, and gives one subscription's rows in due order
-- from either end.
CREATE INDEX deliveries_due_sub ON deliveries (sub_id, next_attempt_at)
    WHERE state = 'pending';
