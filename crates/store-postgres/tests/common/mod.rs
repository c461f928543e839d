//! Helpers shared by this crate's PostgreSQL test binaries.

use hookd_domain::DeliveryId;
use hookd_store::conformance::new_event;
use hookd_store::{NewDelivery, Store, Subscription};
use hookd_store_postgres::PgStore;

/// Accepts one event fanned out to each of `subs`; its deliveries' ids.
pub async fn ingest(store: &PgStore, subs: &[&Subscription]) -> Vec<DeliveryId> {
    let deliveries: Vec<NewDelivery> = subs
        .iter()
        .map(|s| NewDelivery {
            id: DeliveryId::new(),
            sub_id: s.id,
            destination_host: s.url.host().to_owned(),
        })
        .collect();
    let ids = deliveries.iter().map(|d| d.id).collect();
    store
        .accept_event(new_event("order.created", None), deliveries)
        .await
        .unwrap();
    ids
}
