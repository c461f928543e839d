-- Ordered subscriptions: a claim takes a delivery of an ordered subscription
-- only if no earlier delivery of that subscription is still pending and none
-- is in flight. This index holds only unfinished deliveries, so that check is
-- one short probe however long the subscription's delivered history grows.
-- The claim's subquery repeats this WHERE word for word, which is what lets
-- SQLite's planner use a partial index.
CREATE INDEX deliveries_unfinished ON deliveries (sub_id, delivery_id)
    WHERE state IN ('pending', 'inflight');
