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
        release: None,
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
    // Waiters on the two that end: their end streams are written.
    for id in ["done", "dead"] {
        let _: i64 = c
            .hset(q.outcome(id), outcome::WAITED_FIELD, 1)
            .await
            .expect("hset");
    }
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
    // Not final: kept a week past its next attempt's due time, so an
    // outcome whose job vanished still goes.
    let ttl: i64 = c.pttl(q.outcome("retried")).await.expect("pttl");
    let week = ops::MAX_KEEP.as_millis() as i64;
    assert!(
        (week + 29_000..=week + 30_000).contains(&ttl),
        "{ttl}: a week and the delay"
    );
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
    assert!(
        outcome::start(&mut c, &q, "awaited", 1, WORKER, Duration::from_secs(60))
            .await
            .expect("start")
    );
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

/// Enqueues `{"id": id, "task": "t", …extra}` through the queue crate.
async fn enqueue(
    c: &mut MultiplexedConnection,
    q: &QueueKeys,
    id: &str,
    extra: serde_json::Value,
    delay: Option<Duration>,
) {
    let mut job = serde_json::json!({"id": id, "task": "t"});
    if let (Some(job), Some(extra)) = (job.as_object_mut(), extra.as_object()) {
        job.extend(extra.clone());
    }
    let job = job.as_object().cloned().expect("an object");
    let done = workerpool_queue::admin::enqueue(c, q, vec![job], delay)
        .await
        .expect("enqueue");
    assert!(done[0].accepted);
}

async fn state(c: &mut MultiplexedConnection, q: &QueueKeys, id: &str) -> Option<State> {
    outcome::read(c, q, id)
        .await
        .expect("read")
        .map(|o| o.state)
}

#[test]
fn the_lua_limit_of_an_outcomes_life_is_the_crates() {
    let lua = include_str!("../src/lua/outcome.lua");
    assert!(
        lua.contains(&format!(
            "local MAX_KEEP_MS = {}\n",
            ops::MAX_KEEP.as_millis()
        )),
        "outcome.lua's MAX_KEEP_MS differs from ops::MAX_KEEP"
    );
    assert!(
        lua.contains(&format!(
            "local MAX_KEEP_TEXT = '{}'\n",
            ops::MAX_KEEP.as_millis()
        )),
        "outcome.lua's MAX_KEEP_TEXT differs from ops::MAX_KEEP"
    );
}

#[tokio::test]
async fn a_producer_that_asks_sees_its_job_waiting_or_scheduled_at_once_and_others_see_nothing() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("{out}:e");
    enqueue(&mut c, &q, "now", serde_json::json!({"keep": 60}), None).await;
    enqueue(
        &mut c,
        &q,
        "later",
        serde_json::json!({"keep": 60}),
        Some(Duration::from_secs(120)),
    )
    .await;
    enqueue(&mut c, &q, "plain", serde_json::json!({}), None).await;
    let now = outcome::read(&mut c, &q, "now")
        .await
        .expect("read")
        .expect("kept");
    assert_eq!(now.state, State::Waiting);
    assert_eq!(now.next_at_ms, None);
    let later = outcome::read(&mut c, &q, "later")
        .await
        .expect("read")
        .expect("kept");
    assert_eq!(later.state, State::Scheduled);
    let due = later.next_at_ms.expect("next_at") - later.updated_at_ms.expect("updated_at");
    assert!((119_000..=121_000).contains(&due), "{due}");
    assert_eq!(state(&mut c, &q, "plain").await, None);
    // Bounded: a week past when it is due, however long it waits.
    let ttl: i64 = c.pttl(q.outcome("now")).await.expect("pttl");
    let week = ops::MAX_KEEP.as_millis() as i64;
    assert!((week - 2_000..=week).contains(&ttl), "{ttl}");
    // The unkept job went in as before; all three are where they should be.
    let waiting: i64 = c.llen(q.waiting()).await.expect("llen");
    let scheduled: i64 = c.zcard(q.scheduled()).await.expect("zcard");
    assert_eq!((waiting, scheduled), (2, 1));
    // A keep that is not a number of seconds is refused whole.
    let bad = serde_json::json!({"id": "bad", "keep": "soon"});
    let refused = workerpool_queue::admin::enqueue(
        &mut c,
        &q,
        vec![bad.as_object().cloned().expect("object")],
        None,
    )
    .await
    .expect_err("refused");
    assert!(refused.to_string().contains("keep"), "{refused}");
}

#[tokio::test]
async fn a_kept_job_back_in_the_queue_is_waiting_again_whether_given_back_or_reaped() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("{out}:f");
    let held = taken(&mut c, &q, &["given", "reaped", "elsewhere"]).await;
    for id in ["given", "reaped", "elsewhere"] {
        let worker = if id == "elsewhere" { "w~2" } else { WORKER };
        assert!(
            outcome::start(&mut c, &q, id, 1, worker, Duration::from_secs(60))
                .await
                .expect("start")
        );
    }
    let given = held.iter().find(|p| p.contains("given")).expect("given");
    let back = [ops::Back {
        held: given.as_bytes(),
        push: given.as_bytes(),
        kept: Some("given"),
    }];
    assert_eq!(
        ops::give_back(&mut c, &q, WORKER, &back, ops::STOPPING)
            .await
            .expect("give back"),
        1
    );
    let g = outcome::read(&mut c, &q, "given")
        .await
        .expect("read")
        .expect("kept");
    assert_eq!(g.state, State::Waiting);
    assert!(
        g.error.as_deref().unwrap_or("").contains("given back"),
        "{g:?}"
    );
    // The reaper moves the other two; only the one shown running on the
    // lost worker changes (the other says it runs elsewhere).
    let moved = ops::reap(&mut c, &q, WORKER, None).await.expect("reap");
    assert_eq!(moved, Some(2));
    let r = outcome::read(&mut c, &q, "reaped")
        .await
        .expect("read")
        .expect("kept");
    assert_eq!(r.state, State::Waiting);
    assert!(
        r.error.as_deref().unwrap_or("").contains("was lost"),
        "{r:?}"
    );
    assert_eq!(state(&mut c, &q, "elsewhere").await, Some(State::Running));
}

#[tokio::test]
async fn a_kept_job_dead_lettered_or_scheduled_at_intake_says_so_and_its_waiters_wake() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("{out}:g");
    let held = taken(&mut c, &q, &["lost", "later"]).await;
    let by_id = |id: &str| held.iter().find(|p| p.contains(id)).expect("held").clone();
    let letter =
        serde_json::json!({"reason": "lost", "error": "lost 5 times", "job": {"id": "lost"}});
    let actions = [
        ops::IntakeAction::Dead {
            held: by_id("lost").into_bytes(),
            envelope: letter.to_string(),
            release: None,
            kept: Some(ops::KeptAt {
                id: "lost".into(),
                keep: Duration::from_secs(60),
            }),
        },
        ops::IntakeAction::Schedule {
            held: by_id("later").into_bytes(),
            payload: by_id("later").into_bytes(),
            run_at: 4_000_000_000_000,
            kept: Some(ops::KeptAt {
                id: "later".into(),
                keep: Duration::from_secs(60),
            }),
        },
    ];
    let done = ops::settle_intake(&mut c, &q, WORKER, &actions)
        .await
        .expect("settle intake");
    assert_eq!(done, vec![true, true]);
    let waited = outcome::wait(&mut c, &q, "lost", Duration::from_secs(2))
        .await
        .expect("wait");
    let Waited::Final(dead) = waited else {
        panic!("not final: {waited:?}")
    };
    assert_eq!(dead.state, State::Dead);
    assert_eq!(dead.error.as_deref(), Some("lost 5 times"));
    let ttl: i64 = c.pttl(q.outcome("lost")).await.expect("pttl");
    assert!((50_000..=60_000).contains(&ttl), "{ttl}");
    let later = outcome::read(&mut c, &q, "later")
        .await
        .expect("read")
        .expect("kept");
    assert_eq!(later.state, State::Scheduled);
    assert_eq!(later.next_at_ms, Some(4_000_000_000_000));
}

#[tokio::test]
async fn cancel_removes_a_waiting_scheduled_or_retrying_job_frees_its_unique_key_and_wakes_waiters()
{
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("{out}:h");
    // Many others around it: the one named is the one removed.
    for i in 0..2500 {
        enqueue(
            &mut c,
            &q,
            &format!("other-{i}"),
            serde_json::json!({}),
            None,
        )
        .await;
    }
    enqueue(
        &mut c,
        &q,
        "w1",
        serde_json::json!({"keep": 60, "unique_key": "report:7"}),
        None,
    )
    .await;
    for i in 2500..3000 {
        enqueue(
            &mut c,
            &q,
            &format!("other-{i}"),
            serde_json::json!({}),
            None,
        )
        .await;
    }
    // A second job of the same unique key is refused while w1 waits.
    let dup = serde_json::json!({"id": "w2", "unique_key": "report:7"});
    let refused = workerpool_queue::admin::enqueue(
        &mut c,
        &q,
        vec![dup.as_object().cloned().expect("object")],
        None,
    )
    .await
    .expect("enqueue");
    assert!(!refused[0].accepted);
    let waiter = {
        let mut own = redis.conn().await;
        let q = q.clone();
        tokio::spawn(
            async move { outcome::wait(&mut own, &q, "w1", Duration::from_secs(20)).await },
        )
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        outcome::cancel(&mut c, &q, "w1").await.expect("cancel"),
        outcome::Cancel::Removed {
            from: State::Waiting
        }
    );
    let depth: i64 = c.llen(q.waiting()).await.expect("llen");
    assert_eq!(depth, 3000, "only the cancelled job left the queue");
    let woke = waiter.await.expect("join").expect("wait");
    let Waited::Final(cancelled) = woke else {
        panic!("the waiter did not wake to the cancel: {woke:?}")
    };
    assert_eq!(cancelled.state, State::Cancelled);
    let accepted = workerpool_queue::admin::enqueue(
        &mut c,
        &q,
        vec![dup.as_object().cloned().expect("object")],
        None,
    )
    .await
    .expect("enqueue");
    assert!(
        accepted[0].accepted,
        "the cancelled job's unique key is free"
    );
    // A scheduled job the producer did not keep: removed all the same, and
    // its outcome says so for a day.
    enqueue(
        &mut c,
        &q,
        "s1",
        serde_json::json!({}),
        Some(Duration::from_secs(600)),
    )
    .await;
    assert_eq!(
        outcome::cancel(&mut c, &q, "s1").await.expect("cancel"),
        outcome::Cancel::Removed {
            from: State::Scheduled
        }
    );
    let scheduled: i64 = c.zcard(q.scheduled()).await.expect("zcard");
    assert_eq!(scheduled, 0);
    assert_eq!(state(&mut c, &q, "s1").await, Some(State::Cancelled));
    let ttl: i64 = c.pttl(q.outcome("s1")).await.expect("pttl");
    let day = outcome::CANCELLED_KEEP.as_millis() as i64;
    assert!((day - 2_000..=day).contains(&ttl), "{ttl}");
    // Again: final, left alone. An id nobody knows: unknown.
    assert_eq!(
        outcome::cancel(&mut c, &q, "s1").await.expect("cancel"),
        outcome::Cancel::Final {
            state: State::Cancelled
        }
    );
    assert_eq!(
        outcome::cancel(&mut c, &q, "nobody").await.expect("cancel"),
        outcome::Cancel::Unknown
    );
    assert_eq!(state(&mut c, &q, "nobody").await, None);
    // A retrying job, in the retry set.
    let _: i64 = c
        .zadd(
            q.retry(),
            r#"{"id":"r1","task":"t","attempt":1}"#,
            4_000_000_000_000u64,
        )
        .await
        .expect("zadd");
    assert_eq!(
        outcome::cancel(&mut c, &q, "r1").await.expect("cancel"),
        outcome::Cancel::Removed {
            from: State::Retrying
        }
    );
    let retries: i64 = c.zcard(q.retry()).await.expect("zcard");
    assert_eq!(retries, 0);
}

#[tokio::test]
async fn a_cancel_of_a_taken_job_stops_it_before_it_starts_and_one_that_fails_is_not_retried() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("{out}:i");
    for id in ["taken", "running"] {
        enqueue(
            &mut c,
            &q,
            id,
            serde_json::json!({"keep": 60, "unique_key": format!("k-{id}")}),
            None,
        )
        .await;
    }
    let taken_jobs = ops::fetch(&mut c, std::slice::from_ref(&q), WORKER, 2, 5, None)
        .await
        .expect("fetch");
    let held: Vec<String> = taken_jobs
        .jobs
        .into_iter()
        .map(|j| String::from_utf8(j.payload).expect("utf-8"))
        .collect();
    let by_id = |id: &str| held.iter().find(|p| p.contains(id)).expect("held").clone();
    assert!(
        outcome::start(&mut c, &q, "running", 1, WORKER, Duration::from_secs(60))
            .await
            .expect("start")
    );
    // Taken (written running as it was taken), not yet started: the
    // cancel finds it in no list and asks.
    assert_eq!(
        outcome::cancel(&mut c, &q, "taken").await.expect("cancel"),
        outcome::Cancel::Requested {
            state: State::Running
        }
    );
    assert_eq!(
        outcome::cancel(&mut c, &q, "running")
            .await
            .expect("cancel"),
        outcome::Cancel::Requested {
            state: State::Running
        }
    );
    let asked = outcome::cancel_requested(&mut c, &q, &["taken", "running", "nobody"])
        .await
        .expect("asked");
    assert_eq!(asked, vec![true, true, false]);
    // The worker's own start (for a job the taking could not judge)
    // refuses it; it settles cancelled.
    assert!(
        !outcome::start(&mut c, &q, "taken", 1, WORKER, Duration::from_secs(60))
            .await
            .expect("start")
    );
    // The running one fails: retried, it would run again; asked to stop,
    // it ends cancelled.
    let retry = Settlement::Retry {
        next: by_id("running"),
        delay: Duration::from_secs(1),
    };
    let held_taken = by_id("taken");
    let held_running = by_id("running");
    // Release tokens (`<length of the id>:<id><unique key>`).
    let token_taken = "5:takenk-taken";
    let token_running = "7:runningk-running";
    let kept_of = |id: &'static str, token: &'static str| Kept {
        release: Some(token),
        ..kept(id, "", "")
    };
    let finished = [
        Finished {
            queue: 0,
            payload: held_taken.as_bytes(),
            settlement: &Settlement::Cancelled,
            release: Some(token_taken),
            kept: Some(kept_of("taken", token_taken)),
        },
        Finished {
            queue: 0,
            payload: held_running.as_bytes(),
            settlement: &retry,
            release: Some(token_running),
            kept: Some(Kept {
                value: "it stopped",
                ..kept_of("running", token_running)
            }),
        },
    ];
    assert_eq!(
        settle(&mut c, std::slice::from_ref(&q), &finished).await,
        vec![true, true]
    );
    for id in ["taken", "running"] {
        assert_eq!(state(&mut c, &q, id).await, Some(State::Cancelled), "{id}");
    }
    let retries: i64 = c.zcard(q.retry()).await.expect("zcard");
    let processing: i64 = c.llen(q.processing(WORKER)).await.expect("llen");
    assert_eq!((retries, processing), (0, 0));
    let holders: i64 = c.hlen(q.unique()).await.expect("hlen");
    assert_eq!(holders, 0, "both unique keys are free");
    let failed: Option<i64> = c.get(q.stats_failed()).await.expect("get");
    assert_eq!(failed, None, "a cancel is not a failure");
}

#[tokio::test]
async fn progress_is_written_only_for_the_attempt_running_on_its_worker_and_tells_of_a_cancel() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("{out}:j");
    let _ = taken(&mut c, &q, &["p"]).await;
    // Not started: nothing is written.
    let early = outcome::progress(&mut c, &q, "p", WORKER, 1, "10")
        .await
        .expect("progress");
    assert!(!early.written);
    assert!(
        outcome::start(&mut c, &q, "p", 2, WORKER, Duration::from_secs(60))
            .await
            .expect("start")
    );
    let stale = outcome::progress(&mut c, &q, "p", WORKER, 1, "10")
        .await
        .expect("progress");
    let other = outcome::progress(&mut c, &q, "p", "w~2", 2, "10")
        .await
        .expect("progress");
    assert!(!stale.written && !other.written);
    let ok = outcome::progress(&mut c, &q, "p", WORKER, 2, r#"{"pct":40,"step":"encode"}"#)
        .await
        .expect("progress");
    assert_eq!(
        ok,
        outcome::Reported {
            written: true,
            cancel_requested: false
        }
    );
    let p = outcome::read(&mut c, &q, "p")
        .await
        .expect("read")
        .expect("kept");
    assert_eq!(
        p.progress,
        Some(serde_json::json!({"pct": 40, "step": "encode"}))
    );
    assert!(p.progress_at_ms.is_some());
    let _ = outcome::cancel(&mut c, &q, "p").await.expect("cancel");
    let asked = outcome::progress(&mut c, &q, "p", WORKER, 2, "50")
        .await
        .expect("progress");
    assert!(asked.written && asked.cancel_requested);
}

#[tokio::test]
async fn a_user_refused_the_end_stream_leaves_a_kept_job_in_its_processing_list() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("{out}:k");
    let held = taken(&mut c, &q, &["acl"]).await;
    // A waiter marked it: the settlement must write its end stream.
    let _: i64 = c
        .hset(q.outcome("acl"), outcome::WAITED_FIELD, 1)
        .await
        .expect("hset");
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("noxadd")
        .arg("on")
        .arg(">pw")
        .arg("~*")
        .arg("+@all")
        .arg("-xadd")
        .query_async(&mut c)
        .await
        .expect("acl setuser");
    let url = format!("redis://noxadd:pw@127.0.0.1:{}/", redis.port());
    let mut limited = redis::Client::open(url)
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let finished = [Finished {
        queue: 0,
        payload: held[0].as_bytes(),
        settlement: &Settlement::Done,
        release: None,
        kept: Some(kept("acl", r#"{"ok":1}"#, "")),
    }];
    let refused = ops::settle(
        &mut limited,
        std::slice::from_ref(&q),
        WORKER,
        &finished,
        0,
        5,
        None,
    )
    .await;
    assert!(refused.is_err(), "{refused:?}");
    let processing: Vec<String> = c.lrange(q.processing(WORKER), 0, -1).await.expect("lrange");
    assert_eq!(processing, held, "the job is still held, not in no list");
    assert_eq!(state(&mut c, &q, "acl").await, None);
}

#[tokio::test]
async fn a_job_nobody_waits_for_ends_without_an_end_stream_and_a_waiter_still_wakes_at_once() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("{out}:l");
    let held = taken(&mut c, &q, &["alone", "awaited"]).await;
    let by_id = |id: &str| held.iter().find(|p| p.contains(id)).expect("held").clone();
    let alone = by_id("alone");
    let done = Settlement::Done;
    let finished = [Finished {
        queue: 0,
        payload: alone.as_bytes(),
        settlement: &done,
        release: None,
        kept: Some(kept("alone", "1", "")),
    }];
    settle(&mut c, std::slice::from_ref(&q), &finished).await;
    assert_eq!(state(&mut c, &q, "alone").await, Some(State::Done));
    let streams: i64 = c.exists(q.outcome_end("alone")).await.expect("exists");
    assert_eq!(streams, 0, "no waiter, no stream");
    // A waiter marks the outcome before it blocks, and wakes as it ends, well
    // before its slice would have.
    let waiter = {
        let mut own = redis.conn().await;
        let q = q.clone();
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let waited = outcome::wait(&mut own, &q, "awaited", Duration::from_secs(20)).await;
            (waited, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let marked: Option<String> = c
        .hget(q.outcome("awaited"), outcome::WAITED_FIELD)
        .await
        .expect("hget");
    assert_eq!(marked.as_deref(), Some("1"));
    let awaited = by_id("awaited");
    let finished = [Finished {
        queue: 0,
        payload: awaited.as_bytes(),
        settlement: &done,
        release: None,
        kept: Some(kept("awaited", "2", "")),
    }];
    settle(&mut c, std::slice::from_ref(&q), &finished).await;
    let (waited, took) = waiter.await.expect("join");
    let Ok(Waited::Final(o)) = waited else {
        panic!("{waited:?}")
    };
    assert_eq!(o.result, Some(serde_json::json!(2)));
    assert!(took < Duration::from_secs(3), "woke after {took:?}");
    // A wait on an id no one kept leaves a mark that goes in a week.
    let nothing = outcome::wait(&mut c, &q, "nobody", Duration::from_millis(200))
        .await
        .expect("wait");
    assert_eq!(nothing, Waited::TimedOut(None));
    let ttl: i64 = c.pttl(q.outcome("nobody")).await.expect("pttl");
    assert!(ttl > 0 && ttl <= ops::MAX_KEEP.as_millis() as i64, "{ttl}");
}
