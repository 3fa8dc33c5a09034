//! Dead-letter operations on a list longer than the pages they read it in.

use redis::AsyncCommands;
use serde_json::{Value, json};
use workerpool_queue::admin::{Resurrected, dead_letters, purge_dead, retry_dead};
use workerpool_queue::job::{DeadLetter, DeadReason};
use workerpool_queue::keys::QueueKeys;
use workerpool_tests::TestRedis;

/// A dead letter of job `id`, as a worker stores it.
fn letter(id: &str) -> String {
    DeadLetter {
        reason: DeadReason::Exhausted,
        error: "boom".into(),
        attempts: 3,
        died_at: 1,
        worker: "w~1".into(),
        job: json!({"id": id, "task": "t", "attempt": 3, "error": "boom"}),
        encoding: None,
        size: None,
    }
    .to_json()
}

#[tokio::test]
async fn retry_and_purge_go_through_a_long_dead_list_a_page_at_a_time() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("long");
    // 2,500 entries, oldest pushed first; every seventh is not a letter.
    let entries: Vec<Vec<u8>> = (0..2500)
        .map(|i| match i % 7 {
            3 => format!("oops {i}").into_bytes(),
            _ => letter(&format!("j{i}")).into_bytes(),
        })
        .collect();
    let malformed = entries.iter().filter(|e| e.starts_with(b"oops")).count() as u64;
    for chunk in entries.chunks(500) {
        let _: () = c.lpush(q.dead(), chunk).await.expect("lpush");
    }

    let one = dead_letters(&mut c, &q, Some("j1500"), None)
        .await
        .expect("list");
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].raw, entries[1500]);
    let all = dead_letters(&mut c, &q, None, None).await.expect("list");
    assert_eq!(all.len(), 2500);
    let newest = dead_letters(&mut c, &q, None, Some(1200))
        .await
        .expect("list");
    assert_eq!(newest.len(), 1200);
    assert_eq!(newest[1199].raw, entries[2500 - 1200]);

    let done = retry_dead(&mut c, &q, Some("j2")).await.expect("retry one");
    assert_eq!(
        done,
        Resurrected {
            retried: 1,
            skipped_malformed: 0
        }
    );
    let done = retry_dead(&mut c, &q, None).await.expect("retry all");
    assert_eq!(
        done,
        Resurrected {
            retried: 2500 - malformed - 1,
            skipped_malformed: malformed,
        }
    );
    // Oldest first: the queue runs them in the order they died, the one
    // retried alone before the rest.
    let waiting: Vec<String> = c.lrange(q.waiting(), 0, -1).await.expect("lrange");
    let ids: Vec<u64> = waiting
        .iter()
        .rev()
        .map(|p| {
            let job: Value = serde_json::from_str(p).expect("a job");
            assert_eq!(
                (job.get("attempt"), job.get("error")),
                (None, None),
                "{job}"
            );
            job["id"]
                .as_str()
                .and_then(|id| id[1..].parse().ok())
                .expect("an id")
        })
        .collect();
    assert_eq!(ids[0], 2);
    assert!(ids[1..].windows(2).all(|w| w[0] < w[1]), "in order");
    assert_eq!(ids.len() as u64, 2500 - malformed);
    // What is left is what is not a job, in its order.
    let left: Vec<Vec<u8>> = c.lrange(q.dead(), 0, -1).await.expect("lrange");
    let expected: Vec<Vec<u8>> = entries
        .iter()
        .rev()
        .filter(|e| e.starts_with(b"oops"))
        .cloned()
        .collect();
    assert_eq!(left, expected);

    let _: () = c.lpush(q.dead(), letter("x")).await.expect("lpush");
    assert_eq!(purge_dead(&mut c, &q, Some("x")).await, Ok(1));
    assert_eq!(purge_dead(&mut c, &q, Some("x")).await, Ok(0));
    assert_eq!(purge_dead(&mut c, &q, None).await, Ok(malformed));
    let gone: bool = c.exists(q.dead()).await.expect("exists");
    assert!(!gone);
    assert_eq!(purge_dead(&mut c, &q, None).await, Ok(0));
}
