//! A Redis that may evict keys under memory pressure, as a worker sees it:
//! a loud warning and gauges by default, a refusal with
//! `--require-noeviction`, and evictions noticed as they happen.

use std::time::Duration;

use workerpool_tests::{TestRedis, eventually};
use workerpool_worker::Outcome;

mod common;
use common::{Recorder, config, start};

async fn set_policy(redis: &TestRedis, policy: &str) {
    let mut c = redis.conn().await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg(policy)
        .query_async(&mut c)
        .await
        .expect("config set");
}

#[tokio::test]
async fn require_noeviction_refuses_an_evicting_redis_and_says_which_policy() {
    let redis = TestRedis::start();
    set_policy(&redis, "allkeys-lru").await;
    let mut cfg = config(&redis, &["evicting"], "strict");
    cfg.require_noeviction = true;
    let running = start(cfg, Recorder::new(|_| Outcome::Done));
    let ended = tokio::time::timeout(Duration::from_secs(10), running.handle)
        .await
        .expect("the worker stops by itself")
        .expect("worker task");
    let error = ended.expect_err("refused").to_string();
    assert!(error.contains("--require-noeviction"), "{error}");
    assert!(error.contains("allkeys-lru"), "{error}");
    assert!(error.contains("noeviction"), "{error}");

    // The same flag against a Redis that does not evict: it runs.
    set_policy(&redis, "noeviction").await;
    let mut cfg = config(&redis, &["evicting"], "strict");
    cfg.require_noeviction = true;
    let running = start(cfg, Recorder::new(|_| Outcome::Done));
    eventually(Duration::from_secs(5), "the noeviction gauge", || {
        let m = running.metrics.clone();
        async move {
            m.render()
                .contains(
                    r#"workerpool_redis_maxmemory_policy{policy="noeviction",queue="evicting"} 1"#,
                )
                .then_some(())
        }
    })
    .await;
    running.stop().await;
}

#[tokio::test]
async fn an_evicting_redis_shows_in_the_gauges_and_a_policy_change_and_evictions_are_seen() {
    let redis = TestRedis::start();
    set_policy(&redis, "volatile-lru").await;
    let running = start(
        config(&redis, &["cache"], "lenient"),
        Recorder::new(|_| Outcome::Done),
    );
    let gauge = |policy: &str| {
        format!(r#"workerpool_redis_maxmemory_policy{{policy="{policy}",queue="cache"}} 1"#)
    };
    let volatile = gauge("volatile-lru");
    eventually(Duration::from_secs(5), "the volatile gauge", || {
        let m = running.metrics.clone();
        let want = volatile.clone();
        async move { m.render().contains(&want).then_some(()) }
    })
    .await;
    // Someone switches the policy and fills the memory: the next look
    // (every 12 heartbeats here) shows the new policy alone and the evictions.
    set_policy(&redis, "allkeys-lru").await;
    let mut c = redis.conn().await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("2mb")
        .query_async(&mut c)
        .await
        .expect("maxmemory");
    let filler = "x".repeat(10_000);
    for i in 0..600 {
        let _: Result<(), _> = redis::cmd("SET")
            .arg(format!("other:{i}"))
            .arg(&filler)
            .query_async(&mut c)
            .await;
    }
    let allkeys = gauge("allkeys-lru");
    let rendered = eventually(
        Duration::from_secs(10),
        "the new policy and evictions",
        || {
            let m = running.metrics.clone();
            let want = allkeys.clone();
            async move {
                let text = m.render();
                let evicted = text
                    .lines()
                    .find_map(|l| {
                        l.strip_prefix(r#"workerpool_redis_evicted_keys{queue="cache"} "#)
                    })
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0);
                (text.contains(&want) && evicted > 0).then_some(text)
            }
        },
    )
    .await;
    assert!(
        !rendered.contains(&volatile),
        "the old policy's series is gone: {rendered}"
    );
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("0")
        .query_async(&mut c)
        .await
        .expect("maxmemory");
    running.stop().await;
}
