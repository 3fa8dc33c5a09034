//! Unique jobs against a real redis-server: one job per key at a time,
//! under concurrent enqueues, and the key free again once the job is done,
//! dead-lettered, or its hold time is over.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio::sync::Semaphore;
use workerpool_tests::{TestRedis, eventually};

mod common;
use common::{Recorder, config, counter, start};
use workerpool_queue::admin;
use workerpool_queue::keys::QueueKeys;
use workerpool_worker::Outcome;

fn job(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(fields) => fields,
        other => panic!("a job is an object: {other}"),
    }
}

/// Enqueues one job; `true` when it went in.
async fn enqueue(redis: &TestRedis, q: &QueueKeys, value: Value) -> bool {
    let mut c = redis.conn().await;
    let done = admin::enqueue(&mut c, q, vec![job(value)], None)
        .await
        .expect("enqueue");
    done[0].accepted
}

/// Waits until the queue has completed `n` jobs.
async fn processed(redis: &TestRedis, q: &QueueKeys, n: u64) {
    eventually(Duration::from_secs(5), "the job to complete", || async {
        (counter(&mut redis.conn().await, q.stats_processed()).await == n).then_some(())
    })
    .await;
}

#[tokio::test]
async fn of_many_concurrent_enqueues_with_one_key_exactly_one_goes_in() {
    let redis = Arc::new(TestRedis::start());
    let q = QueueKeys::new("reports");
    let mut tasks = Vec::new();
    for i in 0..32 {
        let (redis, q) = (redis.clone(), q.clone());
        tasks.push(tokio::spawn(async move {
            // Each on its own connection, so the scripts interleave.
            enqueue(
                &redis,
                &q,
                json!({"task": "report", "n": i, "unique_key": "daily"}),
            )
            .await
        }));
    }
    let mut accepted = 0;
    for t in tasks {
        accepted += usize::from(t.await.expect("task"));
    }
    assert_eq!(accepted, 1);
    let mut c = redis.conn().await;
    assert_eq!(common::len(&mut c, q.waiting()).await, 1);
    // Another key is not held back by this one.
    assert!(enqueue(&redis, &q, json!({"unique_key": "weekly"})).await);
}

#[tokio::test]
async fn the_key_is_held_while_the_job_runs_and_retries_and_freed_when_it_is_done_or_dead() {
    let redis = TestRedis::start();
    let q = QueueKeys::new("unique");

    // Held while it runs; free once it is done.
    let gate = Arc::new(Semaphore::new(0));
    let recorder = Recorder::gated(gate.clone());
    let worker = start(config(&redis, &["unique"], "w-done"), recorder.clone());
    assert!(enqueue(&redis, &q, json!({"unique_key": "k"})).await);
    eventually(Duration::from_secs(5), "the job to start", || async {
        (recorder.seen().len() == 1).then_some(())
    })
    .await;
    assert!(
        !enqueue(&redis, &q, json!({"unique_key": "k"})).await,
        "a running job holds its key"
    );
    gate.add_permits(1);
    let mut c = redis.conn().await;
    processed(&redis, &q, 1).await;
    assert!(
        enqueue(&redis, &q, json!({"unique_key": "k"})).await,
        "done: the key is free"
    );
    gate.add_permits(1);
    processed(&redis, &q, 2).await;
    worker.stop().await;

    // Held through a retry; free once it is dead-lettered.
    let failing = Recorder::new(|_| Outcome::retry("not yet"));
    let mut cfg = config(&redis, &["unique"], "w-dead");
    cfg.max_attempts = 2;
    cfg.backoff_base = Duration::from_millis(300);
    cfg.backoff_max = Duration::from_millis(300);
    let worker = start(cfg, failing.clone());
    assert!(enqueue(&redis, &q, json!({"id": "r1", "unique_key": "r"})).await);
    eventually(Duration::from_secs(5), "the first attempt", || async {
        (failing.seen().len() == 1).then_some(())
    })
    .await;
    assert!(
        !enqueue(&redis, &q, json!({"unique_key": "r"})).await,
        "a retrying job holds its key"
    );
    eventually(Duration::from_secs(10), "the dead letter", || async {
        (counter(&mut redis.conn().await, q.stats_dead()).await == 1).then_some(())
    })
    .await;
    assert!(
        enqueue(&redis, &q, json!({"id": "r2", "unique_key": "r"})).await,
        "dead: the key is free"
    );
    worker.stop().await;
    let held: Vec<(String, String)> = redis::AsyncCommands::hgetall(&mut c, q.unique())
        .await
        .expect("hgetall");
    assert_eq!(held, [("r".to_string(), "r2".to_string())]);
}

#[tokio::test]
async fn a_hold_ends_after_unique_for_even_when_the_job_never_ends() {
    let redis = TestRedis::start();
    let q = QueueKeys::new("lost");
    assert!(enqueue(&redis, &q, json!({"unique_key": "k", "unique_for": 1})).await);
    assert!(!enqueue(&redis, &q, json!({"unique_key": "k"})).await);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(enqueue(&redis, &q, json!({"unique_key": "k"})).await);
}

#[tokio::test]
async fn a_malformed_unique_key_or_hold_is_refused_and_nothing_is_pushed() {
    let redis = TestRedis::start();
    let q = QueueKeys::new("bad");
    let mut c = redis.conn().await;
    for bad in [
        json!({"unique_key": 7}),
        json!({"unique_key": ""}),
        json!({"unique_key": "k", "unique_for": 0}),
        json!({"unique_key": "k", "unique_for": "1h"}),
        json!({"unique_for": 60}),
    ] {
        let err = admin::enqueue(
            &mut c,
            &q,
            vec![job(json!({"n": 1})), job(bad.clone())],
            None,
        )
        .await
        .expect_err("refused");
        assert!(err.to_string().contains("job 2: \"unique_"), "{bad}: {err}");
    }
    assert_eq!(common::len(&mut c, q.waiting()).await, 0);
}
