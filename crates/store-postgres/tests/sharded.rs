//! What is particular to a sharded deployment (issue 8), beyond the shared
//! suite (`sharded_conformance.rs`): where deliveries land, what a shard
//! that fails during ingest costs (nothing: the sweeper finishes it), the
//! hot-host split (R5), and the shard map's rules. A control database and
//! two shards: three fresh schemas in `HOOKD_TEST_DATABASE_URL`.

use std::collections::HashSet;
use std::time::Duration;

use hookd_domain::placement::{PlacementKey, shard_of};
use hookd_domain::{DeliveryId, SubscriptionId};
use hookd_store::conformance::{new_event, new_sub};
use hookd_store::{
    ClaimOrder, ClaimRequest, DeliveryQuery, NewDelivery, Store, StoreError, Subscription,
};
use hookd_store_postgres::sharded::ShardedStore;
use hookd_store_postgres::testing::{TestDatabase, fresh_schema};
use hookd_store_postgres::{PgOptions, PgStore};

struct Deployment {
    store: ShardedStore,
    /// Its options: one keyring for every handle on it.
    options: PgOptions,
    control: TestDatabase,
    shards: [TestDatabase; 2],
}

async fn deployment(options: PgOptions) -> Option<Deployment> {
    let control = fresh_schema().await?;
    let shards = [fresh_schema().await?, fresh_schema().await?];
    let urls: Vec<String> = shards.iter().map(|s| s.url.clone()).collect();
    let store = ShardedStore::open(&control.url, &urls, options.clone())
        .await
        .expect("open the shards")
        .with_sweep_after(Duration::ZERO);
    Some(Deployment {
        store,
        options,
        control,
        shards,
    })
}

/// The delivery ids one database holds (read as a plain, unsharded store).
async fn held(url: &str) -> HashSet<DeliveryId> {
    let db = PgStore::connect(url, PgOptions::default()).await.unwrap();
    let all = db
        .list_deliveries(&DeliveryQuery {
            limit: 10_000,
            ..DeliveryQuery::default()
        })
        .await
        .unwrap();
    db.close().await;
    all.into_iter().map(|d| d.delivery.id).collect()
}

fn to(sub: &Subscription) -> NewDelivery {
    NewDelivery {
        id: DeliveryId::new(),
        sub_id: sub.id,
        destination_host: sub.url.host().to_owned(),
    }
}

/// An event's deliveries, read through the deployment (every shard).
async fn of_event(
    store: &ShardedStore,
    event: hookd_domain::EventId,
) -> Vec<hookd_store::DeliveryDetail> {
    store
        .list_deliveries(&DeliveryQuery {
            event_id: Some(event),
            limit: 100,
            ..DeliveryQuery::default()
        })
        .await
        .unwrap()
}

async fn subscribe(store: &ShardedStore, hosts: &[String]) -> Vec<Subscription> {
    let mut subs = Vec::new();
    for host in hosts {
        subs.push(
            store
                .create_subscription(new_sub(host, None))
                .await
                .unwrap(),
        );
    }
    subs
}

async fn outbox_rows(control: &TestDatabase) -> i64 {
    let pool = sqlx::PgPool::connect(&control.url).await.unwrap();
    let n = sqlx::query_scalar("SELECT count(*) FROM shard_outbox")
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;
    n
}

#[tokio::test]
async fn deliveries_land_on_the_shard_of_their_host_and_nowhere_else() {
    let Some(d) = deployment(PgOptions::default()).await else {
        return;
    };
    let hosts: Vec<String> = (0..12).map(|i| format!("place-{i}.example")).collect();
    let subs = subscribe(&d.store, &hosts).await;
    let deliveries: Vec<NewDelivery> = subs.iter().map(to).collect();
    let accepted = d
        .store
        .accept_event(new_event("order.created", None), deliveries.clone())
        .await
        .unwrap();
    assert!(!accepted.duplicate);

    let on = [held(&d.shards[0].url).await, held(&d.shards[1].url).await];
    for delivery in &deliveries {
        let home = shard_of(PlacementKey::Host(&delivery.destination_host), 2);
        assert!(
            on[home].contains(&delivery.id),
            "{} on shard {home}",
            delivery.destination_host
        );
        assert!(!on[1 - home].contains(&delivery.id), "and only there");
    }
    assert!(
        on.iter().all(|s| !s.is_empty()),
        "12 hosts use both shards: {on:?}"
    );
    assert!(
        held(&d.control.url).await.is_empty(),
        "the control database holds none"
    );
    assert_eq!(
        outbox_rows(&d.control).await,
        0,
        "the outbox row went with the parts"
    );

    // Read back through the deployment: one list, every delivery; each by id.
    let listed = of_event(&d.store, accepted.event_id).await;
    assert_eq!(listed.len(), 12);
    assert!(
        listed
            .windows(2)
            .all(|w| w[0].delivery.id.as_uuid() > w[1].delivery.id.as_uuid()),
        "newest first"
    );
    for delivery in &deliveries {
        d.store.get_delivery(&delivery.id).await.unwrap();
    }
    assert_eq!(
        d.store.get_event(&accepted.event_id).await.unwrap().id,
        accepted.event_id
    );
}

#[tokio::test]
async fn a_shard_that_fails_during_ingest_loses_nothing_and_the_sweeper_finishes_its_part() {
    let options = PgOptions {
        call_timeout: Duration::from_millis(1500),
        statement_timeout: Duration::from_millis(1000),
        acquire_timeout: Duration::from_millis(1000),
        ..PgOptions::default()
    };
    let Some(d) = deployment(options).await else {
        return;
    };
    // One host on each shard.
    let mut hosts = Vec::new();
    for shard in 0..2 {
        let host = (0..)
            .map(|i| format!("sweep-{i}.example"))
            .find(|h| shard_of(PlacementKey::Host(h), 2) == shard)
            .unwrap();
        hosts.push(host);
    }
    let subs = subscribe(&d.store, &hosts).await;

    // Shard 1 stops answering writes: its table is locked by someone else.
    let locker = sqlx::PgPool::connect(&d.shards[1].url).await.unwrap();
    let mut lock = locker.begin().await.unwrap();
    sqlx::query("LOCK TABLE shard_parts IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();

    let deliveries: Vec<NewDelivery> = subs.iter().map(to).collect();
    let accepted = d
        .store
        .accept_event(new_event("order.created", None), deliveries.clone())
        .await
        .expect("accepted: the control database committed it, with its outbox row");
    assert!(
        held(&d.shards[0].url).await.contains(&deliveries[0].id),
        "shard 0 took its part"
    );
    assert_eq!(outbox_rows(&d.control).await, 1, "kept for the sweeper");
    // The sweeper cannot finish while the shard is down, and says nothing
    // is lost by trying.
    d.store.materialize_fanout().await.unwrap();
    assert_eq!(outbox_rows(&d.control).await, 1);

    lock.rollback().await.unwrap();
    locker.close().await;
    // The sweep runs at most every SWEEP_EVERY (2 s), so poll.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while outbox_rows(&d.control).await > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the sweeper never finished"
        );
        d.store.materialize_fanout().await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let on = [held(&d.shards[0].url).await, held(&d.shards[1].url).await];
    assert_eq!(on[0], HashSet::from([deliveries[0].id]), "shard 0: once");
    assert_eq!(
        on[1],
        HashSet::from([deliveries[1].id]),
        "shard 1: its part, once"
    );
    let listed = of_event(&d.store, accepted.event_id).await;
    assert_eq!(listed.len(), 2);
}

#[tokio::test]
async fn writing_a_part_again_writes_nothing_twice() {
    let Some(d) = deployment(PgOptions::default()).await else {
        return;
    };
    let subs = subscribe(
        &d.store,
        &["again-1.example".into(), "again-2.example".into()],
    )
    .await;
    let deliveries: Vec<NewDelivery> = subs.iter().map(to).collect();
    let event = new_event("order.created", None);
    d.store
        .accept_event(event.clone(), deliveries.clone())
        .await
        .unwrap();
    // A sweeper that finds the row (as after a crash before its removal):
    // the control database's outbox row again, then a sweep.
    let pool = sqlx::PgPool::connect(&d.control.url).await.unwrap();
    sqlx::query("INSERT INTO shard_outbox (event_id, deliveries) VALUES ($1, $2)")
        .bind(event.id.as_uuid())
        .bind(hookd_store::fanout::encode_batch(&deliveries))
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    d.store.materialize_fanout().await.unwrap();
    assert_eq!(outbox_rows(&d.control).await, 0);
    let all: usize = held(&d.shards[0].url).await.len() + held(&d.shards[1].url).await.len();
    assert_eq!(all, 2, "each delivery once");
}

#[tokio::test]
async fn a_split_host_places_new_deliveries_by_subscription_and_claims_still_see_one_host() {
    let Some(d) = deployment(PgOptions::default()).await else {
        return;
    };
    let host = "hot.example".to_owned();
    let subs = subscribe(&d.store, &vec![host.clone(); 16]).await;
    let home = shard_of(PlacementKey::Host(&host), 2);
    let before: Vec<NewDelivery> = subs.iter().map(to).collect();
    d.store
        .accept_event(new_event("order.created", None), before.clone())
        .await
        .unwrap();
    assert_eq!(
        held(&d.shards[home].url).await.len(),
        16,
        "one shard holds the host"
    );

    let (map, changed) = d.store.split_host(&host).await.unwrap();
    assert!(changed);
    assert_eq!(map.version, 2);
    assert_eq!(map.split_hosts, vec![host.clone()]);
    assert!(!d.store.split_host(&host).await.unwrap().1, "split once");
    // Every node applies the stored map within seconds; this one, at its
    // next check.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while d.store.map().version < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the map never applied"
        );
        d.store.due_destinations(10).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let after: Vec<NewDelivery> = subs.iter().map(to).collect();
    d.store
        .accept_event(new_event("order.created", None), after.clone())
        .await
        .unwrap();
    let on = [held(&d.shards[0].url).await, held(&d.shards[1].url).await];
    for delivery in &after {
        let s = shard_of(
            PlacementKey::HostAndSubscription(&host, &delivery.sub_id),
            2,
        );
        assert!(on[s].contains(&delivery.id));
    }
    assert!(
        after.iter().any(|d| !on[home].contains(&d.id)),
        "16 subscriptions spread over both shards"
    );
    assert!(
        before.iter().all(|d| on[home].contains(&d.id)),
        "old deliveries stay"
    );

    // Admission still sees one host, with all 16 subscriptions.
    let due = d.store.due_destinations(10).await.unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].host, host);
    let listed: HashSet<SubscriptionId> = due[0].subscriptions.iter().map(|s| s.sub_id).collect();
    assert_eq!(listed.len(), 16);
    // And claims reach both shards' deliveries, each once.
    let reqs: Vec<ClaimRequest> = subs
        .iter()
        .map(|s| ClaimRequest {
            worker_id: "w".into(),
            destination: host.clone(),
            subscription: Some(s.id),
            order: ClaimOrder::OldestFirst,
            limit: 10,
            lease: Duration::from_secs(30),
        })
        .collect();
    let mut claimed = HashSet::new();
    for _ in 0..4 {
        d.store.due_destinations(10).await.unwrap();
        for list in d.store.claim_many(&reqs).await.unwrap() {
            for c in list {
                assert!(claimed.insert(c.delivery.id), "claimed twice");
            }
        }
    }
    assert_eq!(claimed.len(), 32);
}

#[tokio::test]
async fn the_shard_map_only_grows_at_the_end() {
    let Some(d) = deployment(PgOptions::default()).await else {
        return;
    };
    let urls: Vec<String> = d.shards.iter().map(|s| s.url.clone()).collect();
    // The same list, or none: the stored map.
    let same = ShardedStore::open(&d.control.url, &urls, d.options.clone())
        .await
        .unwrap();
    assert_eq!(same.map().version, 1);
    let none = ShardedStore::open(&d.control.url, &[], d.options.clone())
        .await
        .unwrap();
    assert_eq!(none.map().shards, urls);
    // Reordered or shrunk: refused, naming both lists.
    for wrong in [
        vec![urls[1].clone(), urls[0].clone()],
        vec![urls[0].clone()],
    ] {
        match ShardedStore::open(&d.control.url, &wrong, d.options.clone()).await {
            Err(StoreError::Conflict(msg)) => assert!(msg.contains("added at the end"), "{msg}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
    // Grown at the end (here by the control database itself): version 2,
    // and subscriptions are mirrored onto the new shard.
    let sub = d
        .store
        .create_subscription(new_sub("grow.example", None))
        .await
        .unwrap();
    let mut grown = urls.clone();
    grown.push(d.control.url.clone());
    let bigger = ShardedStore::open(&d.control.url, &grown, d.options.clone())
        .await
        .unwrap();
    assert_eq!(bigger.map().version, 2);
    assert_eq!(bigger.map().shards.len(), 3);
    assert_eq!(bigger.get_subscription(&sub.id).await.unwrap().id, sub.id);
}
