//! The worker's payload size limit against a real redis-server: a job at
//! the limit runs; one over it is dead-lettered as `too_large`, whole,
//! without reaching the handler, whether the worker was busy (the batch
//! fetch) or waiting on an empty queue (the blocking wait).

use std::time::Duration;

use redis::AsyncCommands;
use serde_json::Value;
use workerpool_queue::keys::QueueKeys;
use workerpool_tests::{TestRedis, eventually};
use workerpool_worker::handler::Outcome;

mod common;
use common::{Recorder, config, counter, start};

const LIMIT: u64 = 100_000;
const WAIT: Duration = Duration::from_secs(20);

/// A JSON job of exactly `len` bytes.
fn job_of(len: usize, id: &str) -> Vec<u8> {
    let head = format!(r#"{{"id":"{id}","task":"t","data":""#);
    let tail = r#""}"#;
    format!("{head}{}{tail}", "x".repeat(len - head.len() - tail.len())).into_bytes()
}

#[tokio::test]
async fn a_job_over_the_limit_is_dead_lettered_whole_and_one_at_the_limit_runs() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("sized");
    let mut cfg = config(&redis, &["sized"], "payload-w");
    cfg.max_payload_bytes = LIMIT;
    let recorder = Recorder::new(|_| Outcome::Done);
    let running = start(cfg, recorder.clone());
    // Let the worker reach its blocking wait on the empty queue.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let over = job_of(LIMIT as usize + 1, "over");
    let at = job_of(LIMIT as usize, "at");
    let _: () = c.lpush(q.waiting(), &over).await.expect("lpush");
    let _: () = c.lpush(q.waiting(), &at).await.expect("lpush");
    eventually(WAIT, "the job at the limit done", || {
        let mut c = c.clone();
        let key = q.stats_processed();
        async move { (counter(&mut c, key).await == 1).then_some(()) }
    })
    .await;
    // More, while it is busy or not: taken by the batch fetch and settle.
    for i in 0..3 {
        let big = job_of(LIMIT as usize * 3, &format!("big{i}"));
        let _: () = c.lpush(q.waiting(), &big).await.expect("lpush");
    }
    eventually(WAIT, "every oversized job dead-lettered", || {
        let mut c = c.clone();
        let key = q.dead();
        async move { (c.llen::<_, u64>(key).await.ok()? == 4).then_some(()) }
    })
    .await;
    running.stop().await;

    let seen: Vec<String> = recorder.seen().iter().map(|j| j.id().to_string()).collect();
    assert_eq!(
        seen,
        ["at"],
        "only the job at the limit reached the handler"
    );
    let entries: Vec<Vec<u8>> = c.lrange(q.dead(), 0, -1).await.expect("lrange");
    let mut ids = Vec::new();
    for entry in &entries {
        let letter: Value = serde_json::from_slice(entry).expect("JSON");
        assert_eq!(letter["reason"], "too_large");
        assert_eq!(
            letter["worker"]
                .as_str()
                .map(|w| w.starts_with("payload-w~")),
            Some(true)
        );
        let size = letter["size"].as_u64().expect("size") as usize;
        let error = letter["error"].as_str().expect("error");
        assert!(
            error.contains(&format!("payload of {size} bytes"))
                && error.contains(&format!("limit of {LIMIT} bytes"))
                && error.contains(r#"it starts: "{\"id\":\"#),
            "{error}"
        );
        let kept = &entry[entry.len() - 1 - size..entry.len() - 1];
        let id = letter["job"]["id"].as_str().expect("id").to_string();
        let pushed = if id == "over" {
            over.clone()
        } else {
            job_of(LIMIT as usize * 3, &id)
        };
        assert_eq!(kept, &pushed[..], "{id} kept byte for byte");
        ids.push(id);
    }
    ids.sort();
    assert_eq!(ids, ["big0", "big1", "big2", "over"]);
    assert_eq!(counter(&mut c, q.stats_dead()).await, 4);
    assert_eq!(counter(&mut c, q.stats_processed()).await, 1);
}

#[tokio::test]
async fn without_client_reply_a_worker_polls_and_still_dead_letters_a_job_over_the_limit() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("noreply")
        .arg("on")
        .arg(">pw")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .arg("-client|reply")
        .query_async(&mut c)
        .await
        .expect("acl setuser");
    let q = QueueKeys::new("polled");
    let mut cfg = config(&redis, &["polled"], "polled-w");
    cfg.redis_url = format!("redis://noreply:pw@127.0.0.1:{}/0", redis.port());
    cfg.max_payload_bytes = LIMIT;
    let recorder = Recorder::new(|_| Outcome::Done);
    let running = start(cfg, recorder.clone());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _: () = c
        .lpush(q.waiting(), job_of(LIMIT as usize + 1, "over"))
        .await
        .expect("lpush");
    let _: () = c
        .lpush(q.waiting(), job_of(100, "small"))
        .await
        .expect("lpush");
    eventually(WAIT, "both jobs settled", || {
        let mut c = c.clone();
        let (done, dead) = (q.stats_processed(), q.stats_dead());
        async move {
            (counter(&mut c, done).await == 1 && counter(&mut c, dead).await == 1).then_some(())
        }
    })
    .await;
    let errors = running
        .metrics
        .render()
        .lines()
        .filter(|l| l.starts_with("workerpool_redis_errors_total"))
        .map(str::to_string)
        .collect::<Vec<_>>();
    running.stop().await;
    assert!(
        errors.is_empty(),
        "a refused CLIENT REPLY is no failure: {errors:?}"
    );
    let seen: Vec<String> = recorder.seen().iter().map(|j| j.id().to_string()).collect();
    assert_eq!(seen, ["small"]);
}
