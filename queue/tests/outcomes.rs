//! Kept outcomes against a real Redis: written by the settle script with
//! the settlement itself, never by a settlement whose job is gone, read
//! back by id, expiring once final, and waited for by several waiters at
//! once.

use std::collections::HashMap;
use std::time::Duration;

use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use workerpool_queue::keys::QueueKeys;
use workerpool_queue::ops::{self, Finished, Kept, Settlement};
use workerpool_queue::outcome::{self, State, Waited};
use workerpool_tests::TestRedis;

const WORKER: &str = "w~1";

/// Pushes `jobs` (each `{"id": …}`) and takes them into the processing
/// list; returns the payloads as held, by id.
async fn taken(c: &mut MultiplexedConnection, q: &QueueKeys, ids: &[&str]) -> Vec<String> {
    for id in ids {
        let _: i64 = c
            .lpush(q.waiting(), format!(r#"{{"id":"{id}","task":"t"}}"#))
            .await
            .expect("lpush");
    }
    let taken = ops::fetch(c, std::slice::from_ref(q), WORKER, ids.len(), 5, None)
        .await
        .expect("fetch");
    assert_eq!(taken.jobs.len(), ids.len());
    taken
        .jobs
        .into_iter()
        .map(|j| String::from_utf8(j.payload).expect("utf-8"))
        .collect()
}

fn kept<'a>(id: &'a str, value: &'a str, note: &'a str) -> Kept<'a> {
    Kept {
        id,
        keep: Duration::from_secs(60),
        attempt: 1,
        worker: WORKER,
        value,
        note,
    }
}

async fn settle(
    c: &mut MultiplexedConnection,
    queues: &[QueueKeys],
    finished: &[Finished<'_>],
) -> Vec<bool> {
    let (kept, _) = ops::settle(c, queues, WORKER, finished, 0, 5, None)
        .await
        .expect("settle");
    kept
}

async fn fields(c: &mut MultiplexedConnection, key: &str) -> HashMap<String, String> {
    c.hgetall(key).await.expect("hgetall")
}

#[tokio::test]
async fn each_settlement_writes_its_kept_outcome_and_the_rest_write_none() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("{out}:a");
    let held = taken(&mut c, &q, &["done", "retried", "dead", "plain"]).await;
    let done = Settlement::Done;
    let retry = Settlement::Retry {
        next: r#"{"attempt":1,"id":"retried","task":"t","error":"boom"}"#.into(),
        delay: Duration::from_secs(30),
    };
    let dead = Settlement::Dead {
        envelope: r#"{"reason":"permanent"}"#.into(),
    };
    let by_id = |id: &str| {
        held.iter()
            .find(|p| p.contains(id))
            .expect("held")
            .as_bytes()
    };
    let finished = [
        Finished {
            queue: 0,
            payload: by_id("\"done\""),
            settlement: &done,
            release: None,
            kept: Some(kept("done", r#"{"path":"/out/1.mp4","n":1.10}"#, "")),
        },
        Finished {
            queue: 0,
            payload: by_id("\"retried\""),
            settlement: &retry,
            release: None,
            kept: Some(kept("retried", "boom", "")),
        },
        Finished {
            queue: 0,
            payload: by_id("\"dead\""),
            settlement: &dead,
            release: None,
            kept: Some(kept("dead", "no such file", "")),
        },
        Finished {
            queue: 0,
            payload: by_id("\"plain\""),
            settlement: &done,
            release: None,
            kept: None,
        },
    ];
    assert_eq!(
        settle(&mut c, std::slice::from_ref(&q), &finished).await,
        [true; 4]
    );

    let d = outcome::read(&mut c, &q, "done")
        .await
        .expect("read")
        .expect("kept");
    assert_eq!(d.state, State::Done);
    assert_eq!(d.attempt, Some(1));
    assert_eq!(d.worker.as_deref(), Some(WORKER));
    // The result as the handler wrote it: the raw text is kept.
    let raw = fields(&mut c, &q.outcome("done")).await;
    assert_eq!(raw["result"], r#"{"path":"/out/1.mp4","n":1.10}"#);
    assert_eq!(
        d.result,
        Some(serde_json::json!({"path": "/out/1.mp4", "n": 1.1}))
    );
    let ttl: i64 = c.pttl(q.outcome("done")).await.expect("pttl");
    assert!((50_000..=60_000).contains(&ttl), "{ttl}");
    let end: usize = redis::cmd("XLEN")
        .arg(q.outcome_end("done"))
        .query_async(&mut c)
        .await
        .expect("xlen");
    assert_eq!(end, 1);
    let ttl: i64 = c.pttl(q.outcome_end("done")).await.expect("pttl");
    assert!((50_000..=60_000).contains(&ttl), "{ttl}");

    let r = outcome::read(&mut c, &q, "retried")
        .await
        .expect("read")
        .expect("kept");
    assert_eq!(r.state, State::Retrying);
    assert_eq!(r.error.as_deref(), Some("boom"));
    let updated = r.updated_at_ms.expect("updated_at");
    let next = r.next_at_ms.expect("next_at");
    assert!(
        (29_000..=31_000).contains(&(next - updated)),
        "{next} - {updated}"
    );
    let ttl: i64 = c.pttl(q.outcome("retried")).await.expect("pttl");
    assert_eq!(ttl, -1, "an outcome that is not final does not expire");
    let waiting: i64 = c.exists(q.outcome_end("retried")).await.expect("exists");
    assert_eq!(waiting, 0, "no end for waiters yet");

    let x = outcome::read(&mut c, &q, "dead")
        .await
        .expect("read")
        .expect("kept");
    assert_eq!(x.state, State::Dead);
    assert_eq!(x.error.as_deref(), Some("no such file"));
    assert!(x.result.is_none());

    assert_eq!(
        outcome::read(&mut c, &q, "plain").await.expect("read"),
        None
    );
    let stray: Vec<String> = c.keys("{out}:a:job:*").await.expect("keys");
    assert_eq!(
        stray.len(),
        5,
        "three outcomes, and the end lists of the two final ones: {stray:?}"
    );
}

#[tokio::test]
async fn a_settlement_whose_job_is_gone_keeps_no_outcome_and_the_last_run_wins() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("{out}:b");
    let held = taken(&mut c, &q, &["twice"]).await;
    // A reaper returned the job meanwhile: the first run's settlement finds
    // its payload gone.
    let _: i64 = c
        .lrem(q.processing(WORKER), 1, &held[0])
        .await
        .expect("lrem");
    let done = Settlement::Done;
    let stale = [Finished {
        queue: 0,
        payload: held[0].as_bytes(),
        settlement: &done,
        release: None,
        kept: Some(kept("twice", "\"first run\"", "")),
    }];
    assert_eq!(
        settle(&mut c, std::slice::from_ref(&q), &stale).await,
        [false]
    );
    assert_eq!(
        outcome::read(&mut c, &q, "twice").await.expect("read"),
        None
    );
    // The second run's is the one kept.
    let again = taken(&mut c, &q, &["twice"]).await;
    let second = [Finished {
        queue: 0,
        payload: again[0].as_bytes(),
        settlement: &done,
        release: None,
        kept: Some(kept("twice", "\"second run\"", "")),
    }];
    assert_eq!(
        settle(&mut c, std::slice::from_ref(&q), &second).await,
        [true]
    );
    let o = outcome::read(&mut c, &q, "twice")
        .await
        .expect("read")
        .expect("kept");
    assert_eq!(o.result, Some(serde_json::json!("second run")));
}

#[tokio::test]
async fn kept_outcomes_of_several_queues_settle_beside_the_taking_of_new_jobs() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let queues = [QueueKeys::new("{out}:high"), QueueKeys::new("{out}:low")];
    let high = taken(&mut c, &queues[0], &["h1"]).await;
    let low = taken(&mut c, &queues[1], &["l1"]).await;
    for (q, id) in [(&queues[0], "h2"), (&queues[1], "l2")] {
        let _: i64 = c
            .lpush(q.waiting(), format!(r#"{{"id":"{id}"}}"#))
            .await
            .expect("lpush");
    }
    let done = Settlement::Done;
    let finished = [
        Finished {
            queue: 0,
            payload: high[0].as_bytes(),
            settlement: &done,
            release: None,
            kept: Some(kept("h1", "1", "")),
        },
        Finished {
            queue: 1,
            payload: low[0].as_bytes(),
            settlement: &done,
            release: None,
            kept: Some(kept("l1", "", "the result was not kept: too large")),
        },
    ];
    let (settled, taken) = ops::settle(&mut c, &queues, WORKER, &finished, 2, 5, None)
        .await
        .expect("settle");
    assert_eq!(settled, [true, true]);
    // The outcome keys after the queues' are not taken for queues.
    assert_eq!(
        taken.jobs.iter().map(|j| j.queue).collect::<Vec<_>>(),
        [0, 1]
    );
    let h = outcome::read(&mut c, &queues[0], "h1")
        .await
        .expect("read")
        .expect("kept");
    assert_eq!(h.result, Some(serde_json::json!(1)));
    let l = outcome::read(&mut c, &queues[1], "l1")
        .await
        .expect("read")
        .expect("kept");
    assert_eq!(l.state, State::Done);
    assert_eq!(l.result, None);
    assert_eq!(
        l.result_error.as_deref(),
        Some("the result was not kept: too large")
    );
    assert_eq!(
        outcome::read(&mut c, &queues[0], "l1").await.expect("read"),
        None
    );
}

#[tokio::test]
async fn every_waiter_wakes_when_the_job_ends_and_a_wait_for_nothing_times_out() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("{out}:c");
    let held = taken(&mut c, &q, &["awaited"]).await;
    outcome::running(&mut c, &q, "awaited", 1, WORKER, 1)
        .await
        .expect("running");
    let running = outcome::read(&mut c, &q, "awaited")
        .await
        .expect("read")
        .expect("kept");
    assert_eq!(running.state, State::Running);
    // Three waiters, each on a connection of its own (a wait blocks it).
    let mut waiters = Vec::new();
    for _ in 0..3 {
        let mut own = redis.conn().await;
        let q = q.clone();
        waiters.push(tokio::spawn(async move {
            outcome::wait(&mut own, &q, "awaited", Duration::from_secs(20)).await
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(waiters.iter().all(|w| !w.is_finished()), "they block");
    let done = Settlement::Done;
    let finished = [Finished {
        queue: 0,
        payload: held[0].as_bytes(),
        settlement: &done,
        release: None,
        kept: Some(kept("awaited", r#""ok""#, "")),
    }];
    assert_eq!(
        settle(&mut c, std::slice::from_ref(&q), &finished).await,
        [true]
    );
    for waiter in waiters {
        let waited = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken at once")
            .expect("task")
            .expect("wait");
        match waited {
            Waited::Final(o) => assert_eq!(o.result, Some(serde_json::json!("ok"))),
            other => panic!("{other:?}"),
        }
    }
    // A final outcome answers at once; an unknown job times out.
    let mut own = redis.conn().await;
    let again = outcome::wait(&mut own, &q, "awaited", Duration::from_secs(5))
        .await
        .expect("wait");
    assert!(matches!(again, Waited::Final(_)));
    let started = std::time::Instant::now();
    let none = outcome::wait(&mut own, &q, "unknown", Duration::from_millis(300))
        .await
        .expect("wait");
    assert_eq!(none, Waited::TimedOut(None));
    assert!(started.elapsed() >= Duration::from_millis(300));
}
