//! Any bytes at all on a queue: payloads that are not UTF-8 JSON objects are
//! dead-lettered with their reason and kept, every valid job between them
//! runs exactly once, and the worker never stops. Against a real
//! `redis-server`, through the library's `run`.

use std::collections::BTreeMap;
use std::time::Duration;

use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use serde_json::json;
use workerpool_queue::job::{DeadLetter, DeadReason};
use workerpool_queue::keys::QueueKeys;
use workerpool_queue::snapshot;
use workerpool_tests::{TestRedis, eventually};
use workerpool_worker::Outcome;

mod common;
use common::{Recorder, config, counter, len, processing_total, start};

const WAIT: Duration = Duration::from_secs(20);

/// Payloads that must each end in the dead list as `malformed`.
fn bad_payloads() -> Vec<Vec<u8>> {
    let mut deep_object = String::new();
    for _ in 0..300 {
        deep_object.push_str(r#"{"a":"#);
    }
    deep_object.push('1');
    deep_object.push_str(&"}".repeat(300));
    vec![
        b"".to_vec(),
        b"   ".to_vec(),
        b"\xff\xfe\x00garbage".to_vec(),
        b"{\"task\":\"caf\xe9\"}".to_vec(),
        b"\xc0\xaf".to_vec(),
        b"{\"task\":\"x\"}\xe2\x82".to_vec(),
        b"\0\0\0\0".to_vec(),
        b"{\"task\":\"a\0b\"}".to_vec(),
        "[".repeat(100_000).into_bytes(),
        deep_object.into_bytes(),
        br#"{"task":"big","data":1e400}"#.to_vec(),
        br#"{"attempt":18446744073709551616}"#.to_vec(),
        br#"{"task":"\ud800"}"#.to_vec(),
        "\u{feff}{\"task\":\"bom\"}".as_bytes().to_vec(),
        br#"{"task":"#.to_vec(),
        b"42".to_vec(),
        b"null".to_vec(),
        vec![b'x'; 2 << 20],
        (0..=255u8).cycle().take(70_000).collect(),
    ]
}

/// Valid jobs, each marked with its number `n`; a few of them odd but legal.
fn valid_job(n: u64) -> Vec<u8> {
    match n % 10 {
        // Beyond i64 and u64: legal JSON, read as a float.
        3 => format!(r#"{{"data":{{"n":{n},"big":18446744073709551616}}}}"#).into_bytes(),
        // Duplicate keys: legal JSON; the last one wins, as in most parsers.
        5 => format!(r#"{{"task":"first","task":"dup","data":{{"n":{n}}}}}"#).into_bytes(),
        // NUL escaped, as JSON strings must carry it, and non-ASCII text.
        7 => format!(r#"{{"task":"nul\u0000ünï","data":{{"n":{n}}}}}"#).into_bytes(),
        // Large (1 MiB of data).
        9 => json!({"data": {"n": n, "blob": "y".repeat(1 << 20)}})
            .to_string()
            .into_bytes(),
        _ => json!({"task": "t", "data": {"n": n}})
            .to_string()
            .into_bytes(),
    }
}

async fn lpush(c: &mut MultiplexedConnection, queue: &str, payload: &[u8]) {
    let _: i64 = c.lpush(queue, payload).await.expect("lpush");
}

async fn dead_letters(c: &mut MultiplexedConnection, q: &QueueKeys) -> Vec<DeadLetter> {
    let raw: Vec<Vec<u8>> = c.lrange(q.dead(), 0, -1).await.expect("lrange");
    raw.iter()
        .map(|r| serde_json::from_slice(r).expect("dead letters are UTF-8 JSON"))
        .collect()
}

async fn bad_bytes_between_valid_jobs(concurrency: usize) {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("bytes");
    let bad = bad_payloads();
    let valid = 200u64;
    // Interleaved: a bad payload after every tenth valid job.
    let mut bad_iter = bad.iter();
    for n in 0..valid {
        lpush(&mut c, q.name(), &valid_job(n)).await;
        if n % 10 == 4
            && let Some(b) = bad_iter.next()
        {
            lpush(&mut c, q.name(), b).await;
        }
    }
    for b in bad_iter {
        lpush(&mut c, q.name(), b).await;
    }
    let handler = Recorder::new(|_| Outcome::Done);
    let mut settings = config(&redis, &["bytes"], &format!("bytes-{concurrency}"));
    settings.concurrency = concurrency;
    let worker = start(settings, handler.clone());
    eventually(WAIT, "every valid job done", || {
        let mut c = c.clone();
        let key = q.stats_processed();
        async move { (counter(&mut c, key).await == valid).then_some(()) }
    })
    .await;

    // Still working: a job pushed now runs too, through the idle wait.
    tokio::time::sleep(Duration::from_millis(300)).await;
    lpush(&mut c, q.name(), b"\xde\xad\xbe\xef").await;
    lpush(&mut c, q.name(), &valid_job(valid)).await;
    eventually(WAIT, "the late job done", || {
        let mut c = c.clone();
        let key = q.stats_processed();
        async move { (counter(&mut c, key).await == valid + 1).then_some(()) }
    })
    .await;
    let metrics = worker.metrics.render();
    assert!(!worker.handle.is_finished(), "the worker keeps running");
    worker.stop().await;

    let mut runs: BTreeMap<u64, usize> = BTreeMap::new();
    for job in handler.seen() {
        let n = job.data()["n"].as_u64().expect("every run is a valid job");
        *runs.entry(n).or_default() += 1;
    }
    assert_eq!(runs.len() as u64, valid + 1, "every valid job ran");
    assert!(
        runs.values().all(|&r| r == 1),
        "no valid job ran twice: {runs:?}"
    );
    let dup = handler
        .seen()
        .into_iter()
        .find(|j| j.data()["n"] == json!(5))
        .expect("job 5");
    assert_eq!(dup.task(), Some("dup"));

    let mut expected_bad = bad.clone();
    expected_bad.push(b"\xde\xad\xbe\xef".to_vec());
    let dead = dead_letters(&mut c, &q).await;
    assert_eq!(dead.len(), expected_bad.len(), "every bad payload is dead");
    for letter in &dead {
        assert_eq!(letter.reason, DeadReason::Malformed, "{}", letter.error);
        assert!(!letter.error.is_empty());
        assert_eq!(letter.attempts, 0);
    }
    // Nothing is lost: each bad payload is in the dead list, byte for byte
    // (or, for a JSON object with a field of the wrong type, as that object).
    let mut kept: Vec<Vec<u8>> = dead.iter().filter_map(DeadLetter::raw_payload).collect();
    let objects = dead.iter().filter(|d| d.job.is_object()).count();
    assert_eq!(objects, 1, "only the object with a bad `attempt`");
    kept.sort();
    let mut unparsed: Vec<Vec<u8>> = expected_bad
        .into_iter()
        .filter(|b| !b.starts_with(br#"{"attempt""#))
        .collect();
    unparsed.sort();
    assert!(
        kept == unparsed,
        "the dead list keeps every payload exactly"
    );
    let not_utf8 = dead
        .iter()
        .find(|d| d.raw_payload().as_deref() == Some(b"\xff\xfe\x00garbage".as_slice()))
        .expect("the non-UTF-8 payload");
    assert!(
        not_utf8
            .error
            .contains(r#"not UTF-8 (invalid byte 0xff at offset 0)"#),
        "{}",
        not_utf8.error
    );
    assert!(
        not_utf8.error.contains(r#"\xff\xfe\u{0}garbage"#),
        "{}",
        not_utf8.error
    );

    assert_eq!(len(&mut c, q.name()).await, 0);
    assert_eq!(processing_total(&mut c, &q).await, 0);
    let dead_metric = format!(
        r#"workerpool_dead_letters_total{{queue="bytes",reason="malformed"}} {}"#,
        dead.len()
    );
    assert!(metrics.contains(&dead_metric), "{metrics}");
    assert!(
        !metrics.contains("workerpool_redis_errors_total{"),
        "no Redis error on the way: {metrics}"
    );
}

#[tokio::test]
async fn any_bytes_between_valid_jobs_are_dead_lettered_and_valid_jobs_run_once_with_one_slot() {
    bad_bytes_between_valid_jobs(1).await;
}

#[tokio::test]
async fn any_bytes_between_valid_jobs_are_dead_lettered_and_valid_jobs_run_once_with_batches() {
    bad_bytes_between_valid_jobs(16).await;
}

#[tokio::test]
async fn the_queue_can_be_read_and_its_workers_listed_with_bytes_that_are_not_utf8_in_it() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("raw");
    lpush(&mut c, q.name(), b"\xff head").await;
    let _: i64 = c
        .lpush(q.processing("w~1"), b"\xfe held".as_slice())
        .await
        .expect("lpush");
    let _: i64 = c.zadd(q.workers(), "w~1", 1).await.expect("zadd");
    let read = snapshot::read(&mut c, std::slice::from_ref(&q))
        .await
        .expect("a snapshot despite the bytes");
    assert_eq!(read.queues[0].waiting, 1);
    assert_eq!(read.queues[0].oldest_enqueued_at_ms, None);
    let workers = workerpool_queue::admin::workers(&mut c, &q, 2)
        .await
        .expect("workers despite the bytes");
    assert_eq!(workers[0].jobs, ["?"]);
    let in_list: Vec<Vec<u8>> = c.lrange(q.processing("w~1"), 0, -1).await.expect("lrange");
    assert_eq!(in_list, [b"\xfe held".to_vec()]);
}
