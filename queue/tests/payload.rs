//! The payload size limit and bounded reads of dead letters, against a
//! real redis-server: a payload over the limit is dead-lettered whole by
//! the taking scripts as `too_large` (never sent to the worker), one at
//! the limit is taken, and readers of the dead list get a long entry's
//! start, size and digest, by which it is still removed or retried
//! exactly.

use std::time::Duration;

use redis::AsyncCommands;
use serde_json::{Value, json};
use workerpool_queue::admin::{
    DEAD_PREVIEW_BYTES, DEAD_WHOLE_BYTES, dead_letters, dead_page, purge_dead, retry_dead,
};
use workerpool_queue::job::{DeadLetter, DeadReason, Encoding};
use workerpool_queue::keys::QueueKeys;
use workerpool_queue::ops::{self, Limits};
use workerpool_tests::TestRedis;

const LIMIT: u64 = 64 * 1024;

fn limits() -> Limits {
    Limits {
        max_attempts: 5,
        max_payload_bytes: LIMIT,
        keep_outcomes: None,
    }
}

/// A JSON job of exactly `len` bytes, its id and enqueue time last, as the
/// contract's producers write them.
fn job_of(len: usize, id: &str) -> Vec<u8> {
    let head = r#"{"task":"big","data":""#;
    let tail = format!(r#"","id":"{id}","enqueued_at":1767225600000}}"#);
    let fill = len - head.len() - tail.len();
    format!("{head}{}{tail}", "x".repeat(fill)).into_bytes()
}

/// The payload a too_large entry keeps: its last `size` bytes before the
/// closing brace.
fn kept_payload(entry: &[u8]) -> Vec<u8> {
    let letter: Value = serde_json::from_slice(entry).expect("a JSON payload keeps it JSON");
    let size = letter["size"].as_u64().expect("size") as usize;
    entry[entry.len() - 1 - size..entry.len() - 1].to_vec()
}

#[tokio::test]
async fn a_payload_over_the_limit_is_dead_lettered_whole_and_one_at_the_limit_runs() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("sized");
    let over = job_of(LIMIT as usize + 1, "over");
    let at = job_of(LIMIT as usize, "at");
    // Oldest first: the one over the limit is taken first.
    let _: () = c.lpush(q.waiting(), &over).await.expect("lpush");
    let _: () = c.lpush(q.waiting(), &at).await.expect("lpush");

    let taken = ops::fetch(&mut c, std::slice::from_ref(&q), "w~1", 2, limits(), None)
        .await
        .expect("fetch");
    assert_eq!(taken.jobs.len(), 1, "only the job at the limit is taken");
    assert!(
        taken.jobs[0].payload.ends_with(&at[1..]),
        "the job at the limit, stamped"
    );
    assert_eq!(taken.too_large.len(), 1);
    let error = &taken.too_large[0].error;
    assert!(
        error.contains(&format!("payload of {} bytes", LIMIT + 1))
            && error.contains(&format!("limit of {LIMIT} bytes"))
            && error.contains(r#"it starts: "{\"task\":\"big\",\"data\":\"xxx"#),
        "{error}"
    );
    // Never held by the worker: only the job at the limit is in its list.
    let held: Vec<Vec<u8>> = c.lrange(q.processing("w~1"), 0, -1).await.expect("lrange");
    assert_eq!(held.len(), 1);
    assert_eq!(c.llen::<_, u64>(q.waiting()).await.expect("llen"), 0);
    let dead_total: u64 = c.get(q.stats_dead()).await.expect("get");
    assert_eq!(dead_total, 1);

    let entries: Vec<Vec<u8>> = c.lrange(q.dead(), 0, -1).await.expect("lrange");
    assert_eq!(entries.len(), 1);
    let letter: DeadLetter = serde_json::from_slice(&entries[0]).expect("an envelope");
    assert_eq!(letter.reason, DeadReason::TooLarge);
    assert_eq!(letter.size, Some(LIMIT + 1));
    assert_eq!(letter.encoding, Some(Encoding::Raw));
    assert_eq!(letter.worker, "w~1");
    assert_eq!(&letter.error, error);
    assert_eq!(letter.job["id"], json!("over"));
    assert_eq!(kept_payload(&entries[0]), over, "kept byte for byte");
}

#[tokio::test]
async fn bytes_that_are_not_json_nor_utf8_are_kept_exactly_and_named_escaped() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("binary");
    let mut payload = b"\xff\x00\"\\\n".to_vec();
    payload.extend(std::iter::repeat_n(b'\xfe', LIMIT as usize));
    let _: () = c.lpush(q.waiting(), &payload).await.expect("lpush");
    let taken = ops::fetch(&mut c, std::slice::from_ref(&q), "w~1", 1, limits(), None)
        .await
        .expect("fetch");
    assert!(taken.jobs.is_empty());
    let error = &taken.too_large[0].error;
    assert!(
        error.contains(r#"it starts: "\xff\x00\"\\\x0a\xfe"#),
        "{error}"
    );
    let entry: Vec<u8> = c.lindex(q.dead(), 0).await.expect("lindex");
    let size = payload.len();
    assert_eq!(
        &entry[entry.len() - 1 - size..entry.len() - 1],
        &payload[..]
    );
    // Not JSON, so neither is the entry; readers still get its head.
    let page = dead_page(&mut c, &q, 0, 10).await.expect("page");
    let letter = page[0].letter.as_ref().expect("the head decodes");
    assert_eq!(letter.reason, DeadReason::TooLarge);
    assert_eq!(letter.size, Some(size as u64));
}

#[tokio::test]
async fn settling_takes_no_payload_over_the_limit_either() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("settled");
    let _: () = c
        .lpush(q.waiting(), job_of(LIMIT as usize + 10, "big"))
        .await
        .expect("lpush");
    let (_, taken) = ops::settle(
        &mut c,
        std::slice::from_ref(&q),
        "w~1",
        &[],
        1,
        limits(),
        None,
    )
    .await
    .expect("settle");
    assert!(taken.jobs.is_empty());
    assert_eq!(taken.too_large.len(), 1);
    assert_eq!(c.llen::<_, u64>(q.dead()).await.expect("llen"), 1);
}

#[tokio::test]
async fn the_blocking_wait_takes_through_the_script_and_never_returns_a_large_payload() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("waited");
    let mut blocker = redis.conn().await;
    // Nothing comes: the wait times out and takes nothing.
    let taken = ops::wait_then_fetch(
        &mut blocker,
        &q,
        "w~1",
        Duration::from_millis(200),
        limits(),
    )
    .await
    .expect("wait");
    assert!(taken.jobs.is_empty() && taken.too_large.is_empty());
    // A job over the limit arrives while waiting: dead-lettered by the script.
    let pushed = tokio::spawn({
        let mut c = c.clone();
        let big = job_of(LIMIT as usize * 4, "big");
        async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let _: () = c.lpush("waited", big).await.expect("lpush");
        }
    });
    let taken = ops::wait_then_fetch(&mut blocker, &q, "w~1", Duration::from_secs(5), limits())
        .await
        .expect("wait");
    pushed.await.expect("pushed");
    assert!(taken.jobs.is_empty());
    assert_eq!(taken.too_large.len(), 1, "{taken:?}");
    assert_eq!(c.llen::<_, u64>(q.dead()).await.expect("llen"), 1);
    // A job under it is taken stamped, into the processing list.
    let _: () = c
        .lpush(q.waiting(), r#"{"task":"small"}"#)
        .await
        .expect("lpush");
    let taken = ops::wait_then_fetch(&mut blocker, &q, "w~1", Duration::from_secs(5), limits())
        .await
        .expect("wait");
    assert_eq!(taken.jobs.len(), 1);
    assert!(
        String::from_utf8_lossy(&taken.jobs[0].payload).starts_with(r#"{"attempt":1,"#),
        "stamped"
    );
    assert_eq!(
        c.llen::<_, u64>(q.processing("w~1")).await.expect("llen"),
        1
    );
    assert_eq!(c.llen::<_, u64>(q.waiting()).await.expect("llen"), 0);
    // The connection is still in step: a plain command gets its own reply.
    let pong: String = redis::cmd("PING")
        .query_async(&mut blocker)
        .await
        .expect("ping");
    assert_eq!(pong, "PONG");
}

#[tokio::test]
async fn readers_get_a_long_dead_letters_start_and_size_and_still_remove_or_retry_it_exactly() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("reading");
    let big = job_of(3 * 1024 * 1024, "big-1");
    let other = job_of(3 * 1024 * 1024, "big-2");
    for job in [&big, &other] {
        let _: () = c.lpush(q.waiting(), job).await.expect("lpush");
        ops::fetch(&mut c, std::slice::from_ref(&q), "w~1", 1, limits(), None)
            .await
            .expect("fetch");
    }
    // A small letter on top, read whole as before.
    let small = DeadLetter {
        reason: DeadReason::Exhausted,
        error: "boom".into(),
        attempts: 5,
        died_at: 1,
        worker: "w~1".into(),
        job: json!({"id": "small", "task": "t", "attempt": 5}),
        encoding: None,
        size: None,
    }
    .to_json();
    let _: () = c.lpush(q.dead(), &small).await.expect("lpush");

    let newest = dead_letters(&mut c, &q, None, Some(1)).await.expect("read");
    assert_eq!(newest.len(), 1);
    assert_eq!(newest[0].raw, small.as_bytes(), "a short entry comes whole");
    assert!(newest[0].cut.is_none());

    let page = dead_page(&mut c, &q, 1, 1).await.expect("page");
    let entry = &page[0];
    let stored: u64 = redis::cmd("EVAL")
        .arg("return #redis.call('LINDEX', KEYS[1], 1)")
        .arg(1)
        .arg(q.dead())
        .query_async(&mut c)
        .await
        .expect("length");
    assert_eq!(entry.size, stored, "the entry's size as stored");
    assert_eq!(
        entry.raw.len(),
        DEAD_PREVIEW_BYTES,
        "only its start is read"
    );
    assert!(entry.cut.is_some());
    let letter = entry.letter.as_ref().expect("decoded from its start");
    assert_eq!(letter.reason, DeadReason::TooLarge);
    assert_eq!(letter.size, Some(big.len() as u64));
    assert_eq!(
        entry.job_id(),
        Some("big-2"),
        "the id, from the entry's end"
    );
    assert_eq!(letter.job["task"], json!("big"), "the task, from its start");
    assert!(
        entry
            .job_start()
            .is_some_and(|s| s.starts_with(br#"{"task":"big""#))
    );

    // Purged by its id: found by digest, not read whole.
    assert_eq!(purge_dead(&mut c, &q, Some("big-2")).await, Ok(1));
    assert_eq!(c.llen::<_, u64>(q.dead()).await.expect("llen"), 2);
    // Retried: the too_large job goes back exactly as it was pushed; the
    // small one gets its fresh start.
    let done = retry_dead(&mut c, &q, None).await.expect("retry");
    assert_eq!(done.retried, 2, "{done:?}");
    assert_eq!(c.llen::<_, u64>(q.dead()).await.expect("llen"), 0);
    let waiting: Vec<Vec<u8>> = c.lrange(q.waiting(), 0, -1).await.expect("lrange");
    assert_eq!(
        waiting.last(),
        Some(&big),
        "the big job, byte for byte, and first to run: it died first"
    );
    assert!(
        waiting
            .iter()
            .any(|w| w.starts_with(br#"{"id":"small","task":"t","enqueued_at":"#)),
        "the small one, fresh"
    );
}

#[tokio::test]
async fn a_long_letter_of_another_reason_is_read_whole_again_only_to_retry_it() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("longletter");
    let data = "y".repeat(DEAD_WHOLE_BYTES * 2);
    let letter = DeadLetter {
        reason: DeadReason::Exhausted,
        error: "boom".into(),
        attempts: 5,
        died_at: 1,
        worker: "w~1".into(),
        job: json!({"attempt": 5, "id": "long", "task": "t", "data": data}),
        encoding: None,
        size: None,
    }
    .to_json();
    let _: () = c.lpush(q.dead(), &letter).await.expect("lpush");
    let read = dead_letters(&mut c, &q, Some("long"), None)
        .await
        .expect("read");
    assert_eq!(read.len(), 1, "found by its id from the entry's start");
    assert!(read[0].cut.is_some());
    assert_eq!(read[0].size, letter.len() as u64);
    let done = retry_dead(&mut c, &q, Some("long")).await.expect("retry");
    assert_eq!(done.retried, 1);
    let back: Vec<u8> = c.lindex(q.waiting(), 0).await.expect("lindex");
    let back: Value = serde_json::from_slice(&back).expect("json");
    assert_eq!(back["data"], json!(data));
    assert!(back.get("attempt").is_none());
}

#[tokio::test]
async fn a_snapshot_reads_the_age_of_a_large_job_at_the_head_without_its_bytes() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("headed");
    let _: () = c
        .lpush(q.waiting(), job_of(3 * 1024 * 1024, "big"))
        .await
        .expect("lpush");
    let read = workerpool_queue::snapshot::read(&mut c, std::slice::from_ref(&q))
        .await
        .expect("snapshot");
    assert_eq!(
        read.queues[0].oldest_enqueued_at_ms,
        Some(1_767_225_600_000)
    );
    assert_eq!(read.queues[0].waiting, 1);
}

#[tokio::test]
async fn a_counter_another_program_wrote_stops_the_take_before_any_job_moves() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("counted");
    let over = job_of(LIMIT as usize + 1, "over");
    let small = job_of(100, "small");
    // The one over the limit first, then one that would go to processing:
    // an INCR refused after the take would leave the small one in no key.
    let _: () = c.lpush(q.waiting(), &over).await.expect("lpush");
    let _: () = c.lpush(q.waiting(), &small).await.expect("lpush");
    let _: () = c.set(q.stats_dead(), "not a number").await.expect("set");
    let error = ops::fetch(&mut c, std::slice::from_ref(&q), "w~1", 2, limits(), None)
        .await
        .expect_err("the counter is refused");
    assert!(
        error.to_string().contains(&q.stats_dead()),
        "the error names the key: {error}"
    );
    let waiting: Vec<Vec<u8>> = c.lrange(q.waiting(), 0, -1).await.expect("lrange");
    assert_eq!(waiting, [small, over], "nothing moved");
    let dead: u64 = c.llen(q.dead()).await.expect("llen");
    assert_eq!(dead, 0);
}
