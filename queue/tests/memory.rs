//! The eviction policy as `INFO` reports it, read from a real server, and
//! the keys of the layout that carry a TTL: exactly those the warning for
//! a `volatile-*` policy names.

use std::collections::BTreeSet;
use std::time::Duration;

use workerpool_queue::connection::{Endpoint, Tls};
use workerpool_queue::keys::QueueKeys;
use workerpool_queue::memory::{self, Risk, VOLATILE_KEYS};
use workerpool_queue::rate::RateLimit;
use workerpool_queue::{admin, ops};
use workerpool_tests::TestRedis;

#[tokio::test]
async fn the_policy_is_read_from_info_and_a_change_is_seen() {
    let redis = TestRedis::start();
    let endpoint = Endpoint::new(redis.url(), Tls::default()).expect("url");
    let mut c = endpoint
        .connect(Duration::from_secs(3), Duration::from_secs(3))
        .await
        .expect("connect");
    let q = QueueKeys::new("mail");
    let m = memory::read(&mut c, &q).await.expect("info");
    assert_eq!(
        (m.policy.as_deref(), m.risk()),
        (Some("noeviction"), Risk::None)
    );
    let mut raw = redis.conn().await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("allkeys-lfu")
        .query_async(&mut raw)
        .await
        .expect("config set");
    let m = memory::read(&mut c, &q).await.expect("info");
    assert_eq!(m.risk(), Risk::AllKeys);
    assert!(m.warning().is_some_and(|w| w.contains("allkeys-lfu")));
}

#[tokio::test]
async fn the_keys_with_a_ttl_are_exactly_those_the_volatile_warning_names() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("{mail}:high");
    let instance = "pod-1~00000001";
    // Everything a queue goes through: a heartbeat, unique and delayed
    // jobs, a rate-limited fetch, a retry, a dead letter, a completion.
    ops::heartbeat(
        &mut c,
        &q,
        instance,
        Duration::from_secs(60),
        &[("dead_after_ms", "30000".into())],
    )
    .await
    .expect("heartbeat");
    let jobs = (0..6)
        .map(
            |i| match serde_json::json!({"task": "t", "unique_key": format!("k{i}")}) {
                serde_json::Value::Object(o) => o,
                _ => unreachable!("an object"),
            },
        )
        .collect();
    admin::enqueue(&mut c, &q, jobs, None)
        .await
        .expect("enqueue");
    let later = vec![serde_json::Map::new()];
    admin::enqueue(&mut c, &q, later, Some(Duration::from_secs(600)))
        .await
        .expect("delayed");
    let rate: RateLimit = "100/s".parse().expect("rate");
    let taken = ops::fetch(
        &mut c,
        std::slice::from_ref(&q),
        instance,
        3,
        5,
        Some(&rate),
    )
    .await
    .expect("fetch");
    assert_eq!(taken.jobs.len(), 3);
    let settlements = [
        ops::Settlement::Done,
        ops::Settlement::Retry {
            next: "{\"attempt\":2}".into(),
            delay: Duration::from_secs(60),
        },
        ops::Settlement::Dead {
            envelope: "{\"reason\":\"x\"}".into(),
        },
    ];
    let finished: Vec<ops::Finished<'_>> = taken
        .jobs
        .iter()
        .zip(&settlements)
        .map(|(job, settlement)| ops::Finished {
            queue: 0,
            payload: &job.payload,
            settlement,
            release: None,
            kept: None,
        })
        .collect();
    ops::settle(
        &mut c,
        std::slice::from_ref(&q),
        instance,
        &finished,
        1,
        5,
        Some(&rate),
    )
    .await
    .expect("settle");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut c)
        .await
        .expect("keys");
    let mut with_ttl = BTreeSet::new();
    let mut without = BTreeSet::new();
    for key in keys {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut c)
            .await
            .expect("pttl");
        let shown = key
            .replacen(q.name(), "<q>", 1)
            .replace(instance, "<instance>");
        if ttl >= 0 {
            with_ttl.insert(shown);
        } else {
            without.insert(shown);
        }
    }
    let named: BTreeSet<String> = VOLATILE_KEYS.iter().map(|(k, _)| k.to_string()).collect();
    assert_eq!(with_ttl, named, "keys without a TTL: {without:?}");
    // The jobs' own keys are among those without.
    for key in [
        "<q>",
        "<q>:processing:<instance>",
        "<q>:retry",
        "<q>:dead",
        "<q>:scheduled",
    ] {
        assert!(without.contains(key), "{key}: {without:?}");
    }
}
