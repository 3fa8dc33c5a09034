//! A kept job starts as it is taken (take.lua): the taking script writes
//! its outcome `running`, or finds it cancelled, in the same step that
//! moves it into the processing list, and judges which jobs keep an
//! outcome exactly as the worker does, on payloads of every shape.

use std::collections::HashMap;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use workerpool_queue::job;
use workerpool_queue::keys::QueueKeys;
use workerpool_queue::ops::{self, Fetched, Finished, Limits, Settlement, Start};
use workerpool_queue::outcome::{self, State};
use workerpool_tests::TestRedis;

const WORKER: &str = "w~1";

fn limits(keep: Option<Duration>) -> Limits {
    Limits {
        max_attempts: 5,
        max_payload_bytes: 0,
        keep_outcomes: keep,
    }
}

async fn fetch(
    c: &mut MultiplexedConnection,
    q: &QueueKeys,
    n: usize,
    keep: Option<Duration>,
) -> Vec<Fetched> {
    ops::fetch(c, std::slice::from_ref(q), WORKER, n, limits(keep), None)
        .await
        .expect("fetch")
        .jobs
}

async fn fields(c: &mut MultiplexedConnection, key: &str) -> HashMap<String, String> {
    c.hgetall(key).await.expect("hgetall")
}

fn id_of(f: &Fetched) -> String {
    job::id_in(&f.payload).expect("an id")
}

#[tokio::test]
async fn a_kept_job_is_running_as_it_is_taken_and_one_asked_to_stop_is_not_to_run() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("{start}:a");
    for payload in [
        r#"{"id":"asks","task":"t","keep":60}"#,
        r#"{"id":"plain","task":"t"}"#,
    ] {
        let _: i64 = c.lpush(q.waiting(), payload).await.expect("lpush");
    }
    let taken = fetch(&mut c, &q, 2, None).await;
    let by_id: HashMap<String, Start> = taken.iter().map(|f| (id_of(f), f.start)).collect();
    assert_eq!(by_id["asks"], Start::Running);
    assert_eq!(by_id["plain"], Start::Unnoted);
    let asks = fields(&mut c, &q.outcome("asks")).await;
    assert_eq!(asks["state"], "running");
    assert_eq!(asks["attempt"], "1");
    assert_eq!(asks["worker"], WORKER);
    assert_eq!(asks["keep"], "60000");
    let plain: bool = c.exists(q.outcome("plain")).await.expect("exists");
    assert!(!plain, "a job that keeps nothing writes nothing");

    // The worker's default keeps a job that does not say; the settle's
    // taking writes it as the fetch's does.
    let _: i64 = c
        .lpush(q.waiting(), r#"{"id":"default","task":"t"}"#)
        .await
        .expect("lpush");
    let held_plain = taken
        .iter()
        .find(|f| id_of(f) == "plain")
        .expect("plain")
        .payload
        .clone();
    let finished = [Finished {
        queue: 0,
        payload: &held_plain,
        settlement: &Settlement::Done,
        release: None,
        kept: None,
    }];
    let (settled, more) = ops::settle(
        &mut c,
        std::slice::from_ref(&q),
        WORKER,
        &finished,
        1,
        limits(Some(Duration::from_secs(30))),
        None,
    )
    .await
    .expect("settle");
    assert_eq!(settled, vec![true]);
    assert_eq!(more.jobs.len(), 1);
    assert_eq!(more.jobs[0].start, Start::Running);
    assert_eq!(fields(&mut c, &q.outcome("default")).await["keep"], "30000");

    // Asked to stop while running, then given back: taken again, it is
    // marked not to run, and its outcome is left as it was.
    assert_eq!(
        outcome::cancel(&mut c, &q, "asks").await.expect("cancel"),
        outcome::Cancel::Requested {
            state: State::Running
        }
    );
    let held_asks = taken
        .iter()
        .find(|f| id_of(f) == "asks")
        .expect("asks")
        .payload
        .clone();
    let back = [ops::Back {
        held: &held_asks,
        push: &held_asks,
        kept: Some("asks"),
    }];
    let returned = ops::give_back(&mut c, &q, WORKER, &back, ops::NOT_STARTED)
        .await
        .expect("give back");
    assert_eq!(returned, 1);
    let waiting = outcome::read(&mut c, &q, "asks")
        .await
        .expect("read")
        .expect("kept");
    assert_eq!(waiting.state, State::Waiting);
    assert!(
        waiting
            .error
            .as_deref()
            .unwrap_or("")
            .ends_with("before it started them"),
        "{waiting:?}"
    );
    let again = fetch(&mut c, &q, 1, None).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].start, Start::Cancelled);
    assert_eq!(
        outcome::read(&mut c, &q, "asks")
            .await
            .expect("read")
            .map(|o| o.state),
        Some(State::Waiting)
    );
}

/// A random JSON payload, its fields in random order: ids of every kind,
/// `keep` of every kind, and text that looks like them where it is not.
fn payload(rng: &mut StdRng, n: usize) -> String {
    let mut fields: Vec<String> = vec![r#""task":"t""#.into()];
    match rng.random_range(0..7) {
        0 => {}
        1 => fields.push(format!(r#""id":"{:032x}""#, rng.random::<u128>())),
        2 => fields.push(format!(r#""id":"job-{n}""#)),
        3 => fields.push(format!(r#""id":"q\"uo\\te-{n}""#)),
        4 => fields.push(format!(r#""id":"\u00e9t\u00e9-{n}""#)),
        5 => fields.push(format!(r#""id":{n}"#)),
        _ => fields.push(format!(r#""id":"é-{n}""#)),
    }
    match rng.random_range(0..10) {
        0..=2 => {}
        3 => fields.push(format!(r#""keep":{}"#, rng.random_range(1..100_000))),
        4 => fields.push(format!(r#""keep":{}"#, rng.random_range(0.001..100.0f64))),
        5 => fields.push(r#""keep":0"#.into()),
        6 => fields.push(r#""keep":-5"#.into()),
        7 => fields.push(r#""keep":"30""#.into()),
        8 => fields.push(r#""keep":1e12"#.into()),
        _ => fields.push(r#""keep":null"#.into()),
    }
    match rng.random_range(0..5) {
        0 => fields.push(r#""data":{"keep":7,"id":"inner"}"#.into()),
        1 => fields.push(r#""data":"\"keep\":5,\"id\":\"fake\"""#.into()),
        2 => fields.push(format!(r#""data":"{}""#, "x".repeat(5000))),
        3 => fields.push(r#""run_at":1"#.into()),
        _ => {}
    }
    // Shuffled, with a producer's id and enqueued_at last now and then.
    for i in (1..fields.len()).rev() {
        fields.swap(i, rng.random_range(0..=i));
    }
    // As workerpool's producers write it: the job's own fields, `keep`
    // last among them, then the id and enqueued_at.
    if rng.random_bool(0.5)
        && let Some(at) = fields.iter().position(|f| f.starts_with(r#""keep""#))
    {
        let keep = fields.remove(at);
        fields.push(keep);
    }
    if rng.random_bool(0.4) && !fields.iter().any(|f| f.starts_with(r#""id""#)) {
        fields.push(format!(r#""id":"{:032x}""#, rng.random::<u128>()));
        fields.push(format!(
            r#""enqueued_at":{}"#,
            1_700_000_000_000u64 + n as u64
        ));
    }
    format!("{{{}}}", fields.join(","))
}

#[tokio::test]
async fn the_taking_judges_what_is_kept_as_the_worker_does_on_random_payloads() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("{start}:r");
    let mut rng = StdRng::seed_from_u64(44);
    let (mut noted, mut left) = (0, 0);
    for n in 0..600 {
        let pushed = payload(&mut rng, n);
        let default = rng
            .random_bool(0.5)
            .then(|| Duration::from_millis(rng.random_range(1..10_000_000)));
        let _: i64 = c.lpush(q.waiting(), &pushed).await.expect("lpush");
        let taken = fetch(&mut c, &q, 1, default).await;
        assert_eq!(taken.len(), 1, "{pushed}");
        let Fetched {
            payload,
            stamp,
            start,
            ..
        } = taken.into_iter().next().expect("one");
        // What the worker makes of it: a job it runs as stamped, its keep.
        let held = payload.clone();
        let judged = job::take_stamped(payload, stamp).ok().and_then(|(job, _)| {
            let keep = match job.keep() {
                Ok(own) => own.or(default),
                // The worker warns and notes the start itself.
                Err(_) => return None,
            }?;
            Some((job.id().to_string(), job.attempt(), keep))
        });
        let small = held.len() <= 4096 || !String::from_utf8_lossy(&held).contains("\"keep\"");
        match (start, &judged) {
            (Start::Running, Some((id, attempt, keep))) => {
                let hash = fields(&mut c, &q.outcome(id)).await;
                let ms = (*keep).min(ops::MAX_KEEP).as_millis().max(1).to_string();
                assert_eq!(
                    hash.get("state").map(String::as_str),
                    Some("running"),
                    "{pushed}"
                );
                assert_eq!(hash["keep"], ms, "{pushed}");
                assert_eq!(hash["attempt"], attempt.to_string(), "{pushed}");
                noted += 1;
            }
            (Start::Running | Start::Cancelled, None) => {
                panic!("the taking noted a job the worker keeps nothing of: {pushed}")
            }
            (Start::Unnoted, Some(_)) => {
                // Left to the worker: only a job too large to read here.
                assert!(!small, "the taking left a kept job to the worker: {pushed}");
                left += 1;
            }
            (Start::Unnoted, None) => {
                let ids: Vec<String> = c
                    .keys(format!("{}:job:*", q.waiting()))
                    .await
                    .expect("keys");
                assert!(ids.is_empty(), "{pushed}: {ids:?}");
            }
            (Start::Cancelled, Some(_)) => panic!("nothing was cancelled: {pushed}"),
        }
        let _: i64 = c.del(q.processing(WORKER)).await.expect("del");
        let keys: Vec<String> = c
            .keys(format!("{}:job:*", q.waiting()))
            .await
            .expect("keys");
        if !keys.is_empty() {
            let _: i64 = c.del(keys).await.expect("del");
        }
    }
    // The cases the rule is about all came up.
    assert!(noted > 50 && left > 0, "noted {noted}, left {left}");
}
