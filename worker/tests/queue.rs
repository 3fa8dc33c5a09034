//! The queue contract, end to end through the library's `run`, against a
//! real `redis-server` started by each test.

use std::sync::Arc;
use std::time::Duration;

use redis::AsyncCommands;
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use workerpool_tests::{TestRedis, eventually};

mod common;
use common::{
    Recorder, config, counter, dead_letters, len, processing_total, push, server_time_ms, start,
};
use workerpool_queue::keys::QueueKeys;
use workerpool_queue::ops;
use workerpool_worker::{Job, Outcome};

const WAIT: Duration = Duration::from_secs(10);

#[tokio::test]
async fn every_job_completes_exactly_once_in_fifo_order_with_one_slot() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("emails");
    let jobs: Vec<String> = (0..30)
        .map(|n| json!({"task": "send", "data": {"n": n}}).to_string())
        .collect();
    push(&mut c, q.name(), &jobs).await;
    let handler = Recorder::new(|_| Outcome::Done);
    let worker = start(config(&redis, &["emails"], "fifo"), handler.clone());
    eventually(WAIT, "30 jobs processed", || {
        let mut c = c.clone();
        let key = q.stats_processed();
        async move { (counter(&mut c, key).await == 30).then_some(()) }
    })
    .await;
    worker.stop().await;
    let order: Vec<u64> = handler
        .seen()
        .iter()
        .map(|j| j.data()["n"].as_u64().expect("n"))
        .collect();
    assert_eq!(order, (0..30).collect::<Vec<_>>());
    assert!(
        handler
            .seen()
            .iter()
            .all(|j| j.attempt() == 1 && j.id().len() == 32)
    );
    assert_eq!(len(&mut c, q.name()).await, 0);
    assert_eq!(processing_total(&mut c, &q).await, 0);
    let workers: Vec<String> = c.zrange(q.workers(), 0, -1).await.expect("zrange");
    assert!(
        workers.is_empty(),
        "a cleanly stopped worker leaves the registry: {workers:?}"
    );
}

#[tokio::test]
async fn failing_jobs_back_off_and_end_in_dead_with_their_last_error() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("flaky");
    push(
        &mut c,
        q.name(),
        &[json!({"id": "j1", "task": "boom"}).to_string()],
    )
    .await;
    let handler = Recorder::new(|job| Outcome::retry(format!("failure #{}", job.attempt())));
    let mut cfg = config(&redis, &["flaky"], "retries");
    cfg.max_attempts = 3;
    cfg.backoff_base = Duration::from_millis(300);
    cfg.backoff_max = Duration::from_millis(300);
    let worker = start(cfg, handler.clone());

    // After the first failure the job waits in the retry set, due within
    // the backoff ceiling, carrying its error and attempt.
    let (waiting, due): (String, f64) = eventually(WAIT, "job in the retry set", || {
        let mut c = c.clone();
        let key = q.retry();
        async move {
            let v: Vec<(String, f64)> = c.zrange_withscores(key, 0, -1).await.expect("zrange");
            v.into_iter().next()
        }
    })
    .await;
    let now_ms = server_time_ms(&mut c).await as f64;
    assert!(
        due <= now_ms + 300.0,
        "due {due} beyond the backoff ceiling (now {now_ms})"
    );
    let waiting: Value = serde_json::from_str(&waiting).expect("json");
    assert_eq!(
        (waiting["id"].clone(), waiting["attempt"].clone()),
        (json!("j1"), json!(1))
    );
    assert_eq!(waiting["error"], json!("failure #1"));

    let dead = eventually(WAIT, "a dead letter", || {
        let mut c = c.clone();
        let q = q.clone();
        async move { dead_letters(&mut c, &q).await.pop() }
    })
    .await;
    let metrics = worker.metrics.render();
    worker.stop().await;
    assert!(
        metrics.contains(r#"workerpool_jobs_total{outcome="retried",queue="flaky"} 2"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"workerpool_jobs_total{outcome="dead",queue="flaky"} 1"#),
        "{metrics}"
    );
    assert_eq!(dead["reason"], json!("exhausted"));
    assert_eq!(dead["attempts"], json!(3));
    assert_eq!(dead["error"], json!("failure #3"));
    assert_eq!(dead["job"]["id"], json!("j1"));
    let attempts: Vec<u32> = handler.seen().iter().map(Job::attempt).collect();
    assert_eq!(attempts, [1, 2, 3]);
    assert_eq!(counter(&mut c, q.stats_failed()).await, 3);
    assert_eq!(counter(&mut c, q.stats_dead()).await, 1);
}

#[tokio::test]
async fn malformed_payloads_are_dead_lettered_with_a_reason_and_the_worker_keeps_going() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("mixed");
    let payloads = [
        "not json".to_string(),
        "[1,2,3]".to_string(),
        json!({"attempt": "x"}).to_string(),
        json!({"task": "fine"}).to_string(),
    ];
    push(&mut c, q.name(), &payloads).await;
    let handler = Recorder::new(|_| Outcome::Done);
    let worker = start(config(&redis, &["mixed"], "malformed"), handler.clone());
    eventually(WAIT, "the valid job done", || {
        let mut c = c.clone();
        let key = q.stats_processed();
        async move { (counter(&mut c, key).await == 1).then_some(()) }
    })
    .await;
    let metrics = worker.metrics.render();
    worker.stop().await;
    let mut dead = dead_letters(&mut c, &q).await;
    dead.reverse(); // newest first in the list
    let summary: Vec<(Value, Value)> = dead
        .iter()
        .map(|d| (d["reason"].clone(), d["job"].clone()))
        .collect();
    assert_eq!(
        summary,
        [
            (json!("malformed"), json!("not json")),
            (json!("malformed"), json!("[1,2,3]")),
            (json!("malformed"), json!({"attempt": "x"})),
        ]
    );
    assert!(
        dead[2]["error"]
            .as_str()
            .expect("error")
            .contains("`attempt`")
    );
    assert_eq!(handler.seen().len(), 1);
    assert!(
        metrics.contains(r#"workerpool_dead_letters_total{queue="mixed",reason="malformed"} 3"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_handler_that_says_retry_false_sends_the_job_straight_to_dead() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("perm");
    push(&mut c, q.name(), &[json!({"task": "charge"}).to_string()]).await;
    let handler = Recorder::new(|_| Outcome::permanent("card declined"));
    let worker = start(config(&redis, &["perm"], "permanent"), handler.clone());
    let dead = eventually(WAIT, "a dead letter", || {
        let mut c = c.clone();
        let q = q.clone();
        async move { dead_letters(&mut c, &q).await.pop() }
    })
    .await;
    worker.stop().await;
    assert_eq!(
        (dead["reason"].clone(), dead["attempts"].clone()),
        (json!("permanent"), json!(1))
    );
    assert_eq!(dead["error"], json!("card declined"));
    assert_eq!(handler.seen().len(), 1);
    let retries: usize = c.zcard(q.retry()).await.expect("zcard");
    assert_eq!(retries, 0);
}

#[tokio::test]
async fn a_delayed_job_waits_in_the_scheduled_set_until_run_at() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("later");
    let run_at = server_time_ms(&mut c).await + 1500;
    push(
        &mut c,
        q.name(),
        &[json!({"task": "remind", "run_at": run_at}).to_string()],
    )
    .await;
    let handler = Recorder::new(|_| Outcome::Done);
    let worker = start(config(&redis, &["later"], "delayed"), handler.clone());
    let score: f64 = eventually(WAIT, "the job parked in the scheduled set", || {
        let mut c = c.clone();
        let key = q.scheduled();
        async move {
            let v: Vec<(String, f64)> = c.zrange_withscores(key, 0, -1).await.expect("zrange");
            v.into_iter().next().map(|(_, s)| s)
        }
    })
    .await;
    assert_eq!(score as u64, run_at);
    assert!(handler.seen().is_empty(), "not run before run_at");
    eventually(WAIT, "the delayed job done", || {
        let mut c = c.clone();
        let key = q.stats_processed();
        async move { (counter(&mut c, key).await == 1).then_some(()) }
    })
    .await;
    assert!(server_time_ms(&mut c).await >= run_at);
    worker.stop().await;
    assert_eq!(
        handler.seen()[0].attempt(),
        1,
        "waiting for run_at is not an attempt"
    );
}

#[tokio::test]
async fn queues_are_served_in_strict_priority_order_and_an_idle_worker_waits_on_all_of_them() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let jobs = |tag: &str| -> Vec<String> {
        (0..5)
            .map(|n| json!({"task": tag, "data": {"n": n}}).to_string())
            .collect()
    };
    push(&mut c, "low", &jobs("low")).await;
    push(&mut c, "high", &jobs("high")).await;
    let handler = Recorder::new(|_| Outcome::Done);
    let worker = start(
        config(&redis, &["high", "low"], "priority"),
        handler.clone(),
    );
    eventually(WAIT, "ten jobs", || {
        let h = handler.clone();
        async move { (h.seen().len() == 10).then_some(()) }
    })
    .await;
    let tasks: Vec<String> = handler
        .seen()
        .iter()
        .map(|j| j.task().unwrap_or_default().to_string())
        .collect();
    assert_eq!(tasks, [vec!["high"; 5], vec!["low"; 5]].concat());

    // Both queues are empty now and the worker blocks on both at once: a
    // job on the second queue is taken long before one blocking wait
    // (2 s) would have ended.
    tokio::time::sleep(Duration::from_millis(300)).await;
    push(&mut c, "low", &[json!({"task": "late"}).to_string()]).await;
    eventually(
        Duration::from_millis(1500),
        "the late low-priority job",
        || {
            let h = handler.clone();
            async move { (h.seen().len() == 11).then_some(()) }
        },
    )
    .await;
    worker.stop().await;
}

#[tokio::test]
async fn a_worker_never_takes_more_jobs_than_it_has_free_slots() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("slots");
    let jobs: Vec<String> = (0..10)
        .map(|n| json!({"data": {"n": n}}).to_string())
        .collect();
    push(&mut c, q.name(), &jobs).await;
    let gate = Arc::new(Semaphore::new(0));
    let handler = Recorder::gated(gate.clone());
    let mut cfg = config(&redis, &["slots"], "slots");
    cfg.concurrency = 3;
    let worker = start(cfg, handler.clone());
    eventually(WAIT, "three jobs running", || {
        let h = handler.clone();
        async move { (h.seen().len() == 3).then_some(()) }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(handler.seen().len(), 3);
    assert_eq!(processing_total(&mut c, &q).await, 3);
    assert_eq!(len(&mut c, q.name()).await, 7);
    gate.add_permits(10);
    eventually(WAIT, "all ten done", || {
        let mut c = c.clone();
        let key = q.stats_processed();
        async move { (counter(&mut c, key).await == 10).then_some(()) }
    })
    .await;
    worker.stop().await;
}

#[tokio::test]
async fn a_restarted_worker_returns_the_jobs_of_an_earlier_incarnation_whose_heartbeat_is_stale() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("restart");
    // An earlier process of pod "pod-a" took two jobs and died 5 s ago
    // with a 2 s window: stale, so the new one returns them at start.
    let earlier = "pod-a~0badc0de";
    let held = [
        json!({"id": "x", "attempt": 1}).to_string(),
        json!({"id": "y", "attempt": 1}).to_string(),
    ];
    for j in &held {
        let _: i64 = c.lpush(q.processing(earlier), j).await.expect("lpush");
    }
    let now = server_time_ms(&mut c).await;
    let _: i64 = c
        .zadd(q.workers(), earlier, now - 5_000)
        .await
        .expect("zadd");
    let _: i64 = c
        .hset(q.worker(earlier), "dead_after_ms", 2_000)
        .await
        .expect("hset");
    let handler = Recorder::new(|_| Outcome::Done);
    let mut cfg = config(&redis, &["restart"], "pod-a");
    cfg.dead_after = Duration::from_secs(60);
    let worker = start(cfg, handler.clone());
    eventually(Duration::from_secs(3), "both leftovers done", || {
        let h = handler.clone();
        async move { (h.seen().len() == 2).then_some(()) }
    })
    .await;
    worker.stop().await;
    let mut ids: Vec<(String, u32)> = handler
        .seen()
        .iter()
        .map(|j| (j.id().to_string(), j.attempt()))
        .collect();
    ids.sort();
    assert_eq!(
        ids,
        [("x".to_string(), 2), ("y".to_string(), 2)],
        "the lost run counted as an attempt"
    );
    assert_eq!(counter(&mut c, q.stats_recovered()).await, 2);
    assert_eq!(len(&mut c, &q.processing(earlier)).await, 0);
}

#[tokio::test]
async fn a_second_live_worker_with_the_same_id_leaves_the_first_ones_jobs_alone() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("twins");
    // A live process of "pod-a" holds a job: it beat just now and keeps
    // beating every 500 ms, within the 60 s window it declared, though
    // longer than the newcomer's own --dead-after.
    let live = "pod-a~00c0ffee";
    let _: i64 = c
        .lpush(
            q.processing(live),
            json!({"id": "x", "attempt": 1}).to_string(),
        )
        .await
        .expect("lpush");
    let _: i64 = c
        .hset(q.worker(live), "dead_after_ms", 60_000)
        .await
        .expect("hset");
    let beating = {
        let mut c = c.clone();
        let key = q.workers();
        tokio::spawn(async move {
            loop {
                let now = server_time_ms(&mut c).await;
                let _: i64 = c.zadd(&key, live, now).await.expect("zadd");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    push(&mut c, q.name(), &[json!({"id": "new"}).to_string()]).await;
    let handler = Recorder::new(|_| Outcome::Done);
    let mut cfg = config(&redis, &["twins"], "pod-a");
    // Its own window is short, and the reaper runs every beat.
    cfg.heartbeat_interval = Duration::from_millis(100);
    cfg.dead_after = Duration::from_millis(300);
    let worker = start(cfg, handler.clone());
    eventually(WAIT, "the waiting job done", || {
        let h = handler.clone();
        async move { (h.seen().len() == 1).then_some(()) }
    })
    .await;
    // Several heartbeats and reaper rounds later, the twin's job is its own.
    tokio::time::sleep(Duration::from_secs(2)).await;
    worker.stop().await;
    beating.abort();
    assert_eq!(
        handler.seen()[0].id(),
        "new",
        "only the waiting job ran here"
    );
    assert_eq!(handler.seen().len(), 1);
    assert_eq!(len(&mut c, &q.processing(live)).await, 1);
    assert_eq!(counter(&mut c, q.stats_recovered()).await, 0);
}

/// The instance file is outside input: only an instance of this worker's
/// own id that it names is taken for exited. One of another id, or
/// content that names no instance, hands over nothing, and live instances
/// it does not name keep the shared-id rule.
#[tokio::test]
async fn an_instance_file_naming_another_worker_id_or_nothing_hands_over_no_live_jobs() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("misnamed");
    let (other, twin) = ("pod-b~00c0ffee", "pod-a~0000beef");
    for live in [other, twin] {
        let _: i64 = c
            .lpush(
                q.processing(live),
                json!({"id": live, "attempt": 1}).to_string(),
            )
            .await
            .expect("lpush");
        let _: i64 = c
            .hset(q.worker(live), "dead_after_ms", 60_000)
            .await
            .expect("hset");
    }
    let beating = {
        let mut c = c.clone();
        let key = q.workers();
        tokio::spawn(async move {
            loop {
                let now = server_time_ms(&mut c).await;
                for live in [other, twin] {
                    let _: i64 = c.zadd(&key, live, now).await.expect("zadd");
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("instance");
    for (n, content) in [&b"pod-b~00c0ffee\n"[..], b"\xff\xfenot an instance"]
        .into_iter()
        .enumerate()
    {
        std::fs::write(&file, content).expect("write");
        let id = format!("new-{n}");
        push(&mut c, q.name(), &[json!({"id": id}).to_string()]).await;
        let handler = Recorder::new(|_| Outcome::Done);
        let mut cfg = config(&redis, &["misnamed"], "pod-a");
        cfg.instance_file = Some(file.clone());
        let worker = start(cfg, handler.clone());
        eventually(WAIT, "the waiting job done", || {
            let h = handler.clone();
            async move { (h.seen().len() == 1).then_some(()) }
        })
        .await;
        // The worker names itself in the file it holds, for its next run.
        let named = std::fs::read_to_string(&file).expect("read");
        assert!(named.starts_with("pod-a~"), "{named:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
        worker.stop().await;
        assert_eq!(handler.seen()[0].id(), id, "only the waiting job ran here");
        assert_eq!(handler.seen().len(), 1);
    }
    beating.abort();
    for live in [other, twin] {
        assert_eq!(len(&mut c, &q.processing(live)).await, 1, "{live}");
    }
    assert_eq!(counter(&mut c, q.stats_recovered()).await, 0);
}

#[tokio::test]
async fn a_silent_worker_is_reaped_by_another_and_its_jobs_run_again() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("reap");
    let lost = "pod-gone~00000001";
    let _: i64 = c
        .lpush(
            q.processing(lost),
            json!({"id": "z", "attempt": 1}).to_string(),
        )
        .await
        .expect("lpush");
    let now = server_time_ms(&mut c).await;
    let _: i64 = c.zadd(q.workers(), lost, now).await.expect("zadd");
    let handler = Recorder::new(|_| Outcome::Done);
    let worker = start(config(&redis, &["reap"], "survivor"), handler.clone());
    eventually(WAIT, "the lost job done", || {
        let h = handler.clone();
        async move { (h.seen().len() == 1).then_some(()) }
    })
    .await;
    let recovered = worker.metrics.render();
    worker.stop().await;
    assert_eq!(handler.seen()[0].id(), "z");
    assert!(
        recovered.contains(r#"workerpool_recovered_jobs_total{queue="reap"} 1"#),
        "{recovered}"
    );
    let workers: Vec<String> = c.zrange(q.workers(), 0, -1).await.expect("zrange");
    assert!(!workers.iter().any(|w| w == lost));
}

#[tokio::test]
async fn an_ack_for_a_job_a_reaper_already_returned_is_counted_and_not_completed_twice() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("stale");
    push(&mut c, q.name(), &[json!({"id": "s1"}).to_string()]).await;
    let gate = Arc::new(Semaphore::new(0));
    let handler = Recorder::gated(gate.clone());
    let worker = start(config(&redis, &["stale"], "stale"), handler.clone());
    eventually(WAIT, "the job running", || {
        let h = handler.clone();
        async move { (!h.seen().is_empty()).then_some(()) }
    })
    .await;
    // Another worker takes this one for lost while its job still runs.
    let instances: Vec<String> = c.zrange(q.workers(), 0, -1).await.expect("zrange");
    let mut conn = redis.conn().await;
    let moved = ops::reap(&mut conn, &q, &instances[0], None)
        .await
        .expect("reap");
    assert_eq!(moved, Some(1));
    gate.add_permits(1);
    eventually(WAIT, "the stale ack counted", || {
        let m = worker.metrics.clone();
        async move {
            m.render()
                .contains(r#"workerpool_stale_acks_total{queue="stale"} 1"#)
                .then_some(())
        }
    })
    .await;
    // The returned job runs again (at-least-once) and is then counted once.
    gate.add_permits(1);
    eventually(WAIT, "the rerun done", || {
        let mut c = c.clone();
        let key = q.stats_processed();
        async move { (counter(&mut c, key).await == 1).then_some(()) }
    })
    .await;
    worker.stop().await;
    assert_eq!(counter(&mut c, q.stats_processed()).await, 1);
    let attempts: Vec<u32> = handler.seen().iter().map(Job::attempt).collect();
    assert_eq!(attempts, [1, 2]);
}

#[tokio::test]
async fn completing_a_job_takes_the_next_from_the_highest_priority_queue_in_the_same_round_trip() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let (high, low) = (QueueKeys::new("high"), QueueKeys::new("low"));
    let queues = [high.clone(), low.clone()];
    let _: () = c
        .lpush(high.processing("w~1"), "done-job")
        .await
        .expect("lpush");
    let _: () = c.lpush(low.name(), "low-1").await.expect("lpush");
    let _: () = c.lpush(high.name(), "high-1").await.expect("lpush");
    let done = ops::Settlement::Done;
    let finished = |payload: &'static str| ops::Finished {
        queue: 0,
        payload: payload.as_bytes(),
        settlement: &done,
        release: None,
        kept: None,
    };
    // Payloads that are no JSON objects are taken untouched.
    let fetched = |queue: usize, payload: &str| ops::Fetched::untouched(queue, payload.into());

    let first = ops::settle(&mut c, &queues, "w~1", &[finished("done-job")], 1, 5, None)
        .await
        .map(|(kept, taken)| (kept, taken.jobs))
        .expect("script");
    assert_eq!(first, (vec![true], vec![fetched(0, "high-1")]));
    assert_eq!(counter(&mut c, high.stats_processed()).await, 1);
    let held: Vec<String> = c
        .lrange(high.processing("w~1"), 0, -1)
        .await
        .expect("lrange");
    assert_eq!(
        held,
        ["high-1"],
        "the completed job is gone, the next one is held"
    );

    let second = ops::settle(&mut c, &queues, "w~1", &[finished("high-1")], 1, 5, None)
        .await
        .map(|(kept, taken)| (kept, taken.jobs))
        .expect("script");
    assert_eq!(second, (vec![true], vec![fetched(1, "low-1")]));
    // A job a reaper already returned is not counted again; nothing left to take.
    let third = ops::settle(&mut c, &queues, "w~1", &[finished("not-held")], 1, 5, None)
        .await
        .map(|(kept, taken)| (kept, taken.jobs))
        .expect("script");
    assert_eq!(third, (vec![false], vec![]));
    assert_eq!(counter(&mut c, high.stats_processed()).await, 2);
}

/// `calls` of `cmdstat_<command>` in `INFO commandstats`.
async fn calls(c: &mut redis::aio::MultiplexedConnection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(c)
        .await
        .expect("info");
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn jobs_that_finish_together_are_settled_together() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("batch");
    let jobs: Vec<String> = (0..400)
        .map(|n| json!({"data": {"n": n}}).to_string())
        .collect();
    push(&mut c, q.name(), &jobs).await;
    let before = calls(&mut c, "evalsha").await + calls(&mut c, "eval").await;
    let mut cfg = config(&redis, &["batch"], "batch");
    cfg.concurrency = 20;
    let handler = Recorder::new(|_| Outcome::Done);
    let worker = start(cfg, handler.clone());
    eventually(WAIT, "all done", || {
        let mut c = c.clone();
        let key = q.stats_processed();
        async move { (counter(&mut c, key).await == 400).then_some(()) }
    })
    .await;
    let scripts = calls(&mut c, "evalsha").await + calls(&mut c, "eval").await - before;
    worker.stop().await;
    assert_eq!(handler.seen().len(), 400, "each job ran once");
    // One script per job settled alone, and an intake script per batch
    // taken, would be well over 400; settled in batches it is far fewer.
    assert!(scripts < 200, "{scripts} script calls for 400 jobs");
}

#[tokio::test]
async fn jobs_in_flight_are_counted_per_queue() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    push(&mut c, "slow", &[json!({"task": "wait"}).to_string()]).await;
    // The job runs until the test lets it finish.
    let gate = Arc::new(Semaphore::new(0));
    let handler = {
        let gate = gate.clone();
        workerpool_worker::handler_fn(move |_job: Job| {
            let gate = gate.clone();
            async move {
                let _ = gate.acquire().await;
                Outcome::Done
            }
        })
    };
    let mut cfg = config(&redis, &["slow", "fast"], "gauge");
    cfg.concurrency = 4;
    let worker = start(cfg, Arc::new(handler));
    let running = r#"workerpool_jobs_in_flight{queue="slow"} 1"#;
    let metrics = eventually(WAIT, "the slow job running", || {
        let metrics = worker.metrics.render();
        async move { metrics.contains(running).then_some(metrics) }
    })
    .await;
    assert!(
        metrics.contains(r#"workerpool_jobs_in_flight{queue="fast"} 0"#),
        "{metrics}"
    );
    gate.add_permits(1);
    eventually(WAIT, "the slow job done", || {
        let mut c = c.clone();
        async move {
            (counter(&mut c, QueueKeys::new("slow").stats_processed()).await == 1).then_some(())
        }
    })
    .await;
    let metrics = worker.metrics.render();
    worker.stop().await;
    assert!(
        metrics.contains(r#"workerpool_jobs_in_flight{queue="slow"} 0"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_job_the_handler_could_not_start_counts_no_failure_and_keeps_its_attempt() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("unstarted");
    push(
        &mut c,
        q.name(),
        &[json!({"id": "j1", "task": "t"}).to_string()],
    )
    .await;
    // The handler's first two tries cannot start the job.
    static TRIES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let handler = Recorder::new(|_| {
        if TRIES.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < 2 {
            Outcome::NotRun {
                error: "the handler process cannot start".into(),
                delay: Duration::from_millis(100),
            }
        } else {
            Outcome::Done
        }
    });
    let worker = start(config(&redis, &["unstarted"], "unstarted"), handler.clone());
    eventually(WAIT, "the job done on its third try", || {
        let mut c = c.clone();
        let key = q.stats_processed();
        async move { (counter(&mut c, key).await == 1).then_some(()) }
    })
    .await;
    let metrics = worker.metrics.render();
    worker.stop().await;
    assert_eq!(
        counter(&mut c, q.stats_failed()).await,
        0,
        "no attempt failed: the handler never started one"
    );
    let attempts: Vec<u32> = handler.seen().iter().map(|j| j.attempt()).collect();
    assert_eq!(attempts, [1, 1, 1], "the attempt is not spent");
    for (outcome, n) in [("requeued", 2), ("retried", 0), ("done", 1)] {
        let line = format!(r#"workerpool_jobs_total{{outcome="{outcome}",queue="unstarted"}} {n}"#);
        assert!(
            metrics.lines().any(|l| l == line),
            "no {line} in\n{metrics}"
        );
    }
}
