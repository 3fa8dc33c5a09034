//! A Redis that answers but refuses: an ACL without a command the worker
//! needs, or a full memory under `noeviction`. The worker backs off as it
//! does for an unreachable Redis, and `/readyz` names the cause.

use std::time::Duration;

use workerpool_tests::{TestRedis, eventually, free_port};
use workerpool_worker::Outcome;

mod common;
use common::{Recorder, config, start};
use workerpool_tests::http_get;

async fn info_stat(redis: &TestRedis, name: &str) -> u64 {
    let mut c = redis.conn().await;
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(&mut c)
        .await
        .expect("info");
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_blocking_wait_backs_off_instead_of_spinning_and_readyz_names_the_acl() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("limited")
        .arg("on")
        .arg(">pw")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .arg("-blmove")
        .query_async(&mut c)
        .await
        .expect("acl setuser");
    let port = free_port();
    let mut cfg = config(&redis, &["acl"], "limited");
    cfg.redis_url = format!("redis://limited:pw@127.0.0.1:{}/0", redis.port());
    cfg.listen = Some(([127, 0, 0, 1], port).into());
    let before = info_stat(&redis, "total_connections_received").await;
    let running = start(cfg, Recorder::new(|_| Outcome::Done));
    let body = eventually(
        Duration::from_secs(10),
        "readyz names the refusal",
        || async move {
            http_get(port, "/readyz")
                .and_then(|(status, body)| (status == 503 && body.contains("ACL")).then_some(body))
        },
    )
    .await;
    assert!(body.contains("wait"), "{body}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let opened = info_stat(&redis, "total_connections_received").await - before;
    let errors = running
        .metrics
        .render()
        .lines()
        .find_map(|l| {
            l.strip_prefix(r#"workerpool_redis_errors_total{operation="wait"} "#)
                .map(str::to_string)
        })
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    running.stop().await;
    // Backing off from 100 ms doubling to 5 s: a handful of tries in 3 s,
    // not thousands.
    assert!((1..=12).contains(&errors), "{errors} refused waits");
    assert!(opened <= 20, "{opened} connections opened");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_redis_under_noeviction_keeps_the_worker_unready_saying_it_is_out_of_memory() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("1")
        .query_async(&mut c)
        .await
        .expect("maxmemory");
    let port = free_port();
    let mut cfg = config(&redis, &["full"], "full");
    cfg.listen = Some(([127, 0, 0, 1], port).into());
    let running = start(cfg, Recorder::new(|_| Outcome::Done));
    let body = eventually(
        Duration::from_secs(10),
        "readyz names the memory",
        || async move {
            http_get(port, "/readyz").and_then(|(status, body)| {
                (status == 503 && body.contains("out of memory")).then_some(body)
            })
        },
    )
    .await;
    assert!(body.contains("maxmemory"), "{body}");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("0")
        .query_async(&mut c)
        .await
        .expect("maxmemory");
    eventually(
        Duration::from_secs(15),
        "ready once memory is free",
        || async move {
            http_get(port, "/readyz").and_then(|(status, _)| (status == 200).then_some(()))
        },
    )
    .await;
    running.stop().await;
}
