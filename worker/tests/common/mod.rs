//! Redis inspection helpers shared by the worker's integration tests.
// Each test binary uses a different subset.
#![allow(dead_code)]

use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use serde_json::Value;
use workerpool_worker::keys::QueueKeys;

/// Pushes jobs as producers do (`LPUSH`), in order.
pub async fn push<J: ToString>(
    c: &mut MultiplexedConnection,
    queue: &str,
    jobs: impl IntoIterator<Item = J>,
) {
    for j in jobs {
        let _: i64 = c.lpush(queue, j.to_string()).await.expect("lpush");
    }
}

/// A counter's value, 0 when unset.
pub async fn counter(c: &mut MultiplexedConnection, key: String) -> u64 {
    let v: Option<u64> = c.get(key).await.expect("get");
    v.unwrap_or(0)
}

/// A list's length.
pub async fn len(c: &mut MultiplexedConnection, key: &str) -> usize {
    c.llen(key).await.expect("llen")
}

/// Jobs held in every processing list of the queue, registered worker or not.
pub async fn processing_total(c: &mut MultiplexedConnection, q: &QueueKeys) -> usize {
    let keys: Vec<String> = c.keys(q.processing("*")).await.expect("keys");
    let mut n = 0;
    for k in keys {
        n += len(c, &k).await;
    }
    n
}

/// The dead list's envelopes, newest first.
pub async fn dead_letters(c: &mut MultiplexedConnection, q: &QueueKeys) -> Vec<Value> {
    let raw: Vec<String> = c.lrange(q.dead(), 0, -1).await.expect("lrange");
    raw.iter()
        .map(|r| serde_json::from_str(r).expect("dead letters are JSON"))
        .collect()
}

/// The Redis server's clock, unix milliseconds.
pub async fn server_time_ms(c: &mut MultiplexedConnection) -> u64 {
    workerpool_worker::admin::server_time_ms(c)
        .await
        .expect("time")
}
