//! Redis Cluster, against real `redis-server --cluster-enabled yes` nodes
//! joined by `redis-cli --cluster create`. Every URL here names a primary
//! that does not own the queue's slot, so each command is redirected.

use std::io::Write;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use redis::cluster_async::ClusterConnection;
use serde_json::Value;
use workerpool_queue::keys::{QueueKeys, slot};
use workerpool_tests::{TestRedisCluster, eventually, free_port};

mod common;
use common::{stderr, stop};
use workerpool_tests::http_get;

const WAIT: Duration = Duration::from_secs(60);

fn cli(url: &str, args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(workerpool_tests::bin_dir().join("workerpool"))
        .args(args)
        .env("WORKERPOOL_REDIS_URL", url)
        .env_remove("WORKERPOOL_QUEUE")
        .env_remove("WORKERPOOL_REDIS_MODE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run workerpool");
    if let Some(mut input) = child.stdin.take() {
        input
            .write_all(stdin.unwrap_or("").as_bytes())
            .expect("write stdin");
    }
    child.wait_with_output().expect("workerpool output")
}

fn worker(url: &str, queues: &[&str], handler: &str, port: u16, extra: &[&str]) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_workerpool-worker"));
    cmd.args(["--redis-url", url, "--handler", handler]);
    for q in queues {
        cmd.args(["--queue", q]);
    }
    cmd.args(["--listen", &format!("127.0.0.1:{port}")])
        .args(extra)
        .env("RUST_LOG", "warn")
        .env_remove("WORKERPOOL_REDIS_MODE")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn workerpool-worker")
}

async fn counter(c: &mut ClusterConnection, key: String) -> u64 {
    let v: Option<u64> = c.get(key).await.expect("get counter");
    v.unwrap_or(0)
}

async fn held(c: &mut ClusterConnection, q: &QueueKeys) -> usize {
    // The processing lists of every registered instance (one slot).
    let names: Vec<String> = c.zrange(q.workers(), 0, -1).await.expect("workers");
    let mut n = 0;
    for name in names {
        let len: usize = c.llen(q.processing(&name)).await.expect("llen");
        n += len;
    }
    n
}

fn jobs(from: u32, to: u32, ms: u32) -> String {
    (from..to)
        .map(|n| format!("{{\"data\":{{\"n\":{n},\"ms\":{ms}}}}}\n"))
        .collect()
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_and_the_cli_on_a_cluster_through_a_node_that_does_not_own_the_queue() {
    let cluster = TestRedisCluster::start(3, 0);
    let q = QueueKeys::new("{mail}");
    let url = cluster.url(cluster.primary_not_owning(slot(q.name())));
    let mut c = cluster.conn().await;

    let ids = ok(&cli(
        &url,
        &["enqueue", "--queue", q.name()],
        Some(&jobs(0, 200, 200)),
    ));
    assert_eq!(ids.lines().count(), 200);

    // A slow worker takes jobs, then is killed without a chance to give
    // them back.
    let first = worker(
        &url,
        &[q.name()],
        "sleep",
        free_port(),
        &["--concurrency", "4"],
    );
    let mut c2 = c.clone();
    eventually(WAIT, "the first worker holds jobs", || {
        let mut c = c2.clone();
        let q = q.clone();
        async move { (held(&mut c, &q).await > 0).then_some(()) }
    })
    .await;
    let mut first = first;
    let _ = first.kill();
    let _ = first.wait();
    let stranded = held(&mut c2, &q).await;
    assert!(stranded > 0);

    // A second worker returns them through the reaper and drains the rest.
    let port = free_port();
    let second = worker(
        &url,
        &[q.name()],
        "noop",
        port,
        &[
            "--concurrency",
            "8",
            "--heartbeat-interval",
            "500ms",
            "--dead-after",
            "2s",
        ],
    );
    eventually(WAIT, "every job done", || {
        let mut c = c.clone();
        let key = q.stats_processed();
        async move { (counter(&mut c, key).await >= 200).then_some(()) }
    })
    .await;
    assert_eq!(http_get(port, "/readyz").map(|r| r.0), Some(200));
    let recovered = counter(&mut c, q.stats_recovered()).await;
    assert!(recovered >= stranded as u64, "{recovered} < {stranded}");
    let waiting: usize = c.llen(q.waiting()).await.expect("llen");
    assert_eq!(waiting, 0);

    let stats = ok(&cli(
        &url,
        &["stats", "--queue", q.name(), "--json", "--no-rate"],
        None,
    ));
    let stats: Value = serde_json::from_str(&stats).expect("json");
    assert!(stats["processed_total"].as_u64() >= Some(200), "{stats}");
    assert_eq!(stats["backlog"], Value::from(0), "{stats}");

    // A kept job's outcome, written by the settle script on the queue's
    // node and waited for through another node.
    ok(&cli(
        &url,
        &["enqueue", "--queue", q.name(), r#"{"id":"kept","keep":60}"#],
        None,
    ));
    let waited = ok(&cli(
        &url,
        &[
            "job",
            "wait",
            "--queue",
            q.name(),
            "kept",
            "--timeout",
            "10s",
        ],
        None,
    ));
    assert!(waited.contains("state: done\n"), "{waited}");
    let log = stop(second);
    assert!(!log.contains("ERROR"), "{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn queue_names_that_cannot_share_a_slot_are_refused_with_how_to_name_them() {
    let cluster = TestRedisCluster::start(3, 0);
    let url = cluster.url(0);

    // No hash tag: the worker exits at once, saying how to name the queue.
    let mut w = worker(&url, &["mail"], "noop", free_port(), &[]);
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Ok(Some(status)) = w.try_wait() {
            break status;
        }
        assert!(Instant::now() < deadline, "the worker did not exit");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success());
    let err = stderr(&mut w);
    assert!(
        err.contains("queue mail has no hash tag") && err.contains("for example {mail}"),
        "{err}"
    );

    // Two tags in two slots: refused the same way.
    let mut w = worker(
        &url,
        &["{mail}:high", "{sms}:low"],
        "noop",
        free_port(),
        &[],
    );
    let status = w.wait().expect("exit");
    assert!(!status.success());
    let err = stderr(&mut w);
    assert!(
        err.contains("different slots") && err.contains("{mail}:high, {mail}:low"),
        "{err}"
    );

    // Told it is a cluster, it refuses before connecting at all.
    let out = Command::new(env!("CARGO_BIN_EXE_workerpool-worker"))
        .args([
            "--redis-url",
            "redis://127.0.0.1:1",
            "--redis-mode",
            "cluster",
        ])
        .args(["--queue", "mail", "--handler", "noop"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("has no hash tag"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The CLI too.
    let out = cli(&url, &["stats", "--queue", "mail"], None);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("has no hash tag"), "{err}");

    // Several queues with one tag are served in priority order.
    let ok_port = free_port();
    let high = QueueKeys::new("{mail}:high");
    let low = QueueKeys::new("{mail}:low");
    ok(&cli(
        &url,
        &["enqueue", "--queue", low.name()],
        Some(&jobs(0, 20, 0)),
    ));
    ok(&cli(
        &url,
        &["enqueue", "--queue", high.name()],
        Some(&jobs(0, 20, 0)),
    ));
    let w = worker(&url, &[high.name(), low.name()], "noop", ok_port, &[]);
    let c = cluster.conn().await;
    eventually(WAIT, "both queues drained", || {
        let mut c = c.clone();
        let (h, l) = (high.stats_processed(), low.stats_processed());
        async move { (counter(&mut c, h).await + counter(&mut c, l).await == 40).then_some(()) }
    })
    .await;
    let log = stop(w);
    assert!(!log.contains("ERROR"), "{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn moving_the_queues_slot_and_failing_its_primary_over_mid_run_lose_no_job() {
    let cluster = TestRedisCluster::start(3, 1);
    let q = QueueKeys::new("{jobs}");
    let s = slot(q.name());
    let url = cluster.url(cluster.primary_not_owning(s));
    let mut c = cluster.conn().await;
    const N: u64 = 3000;
    ok(&cli(
        &url,
        &["enqueue", "--queue", q.name()],
        Some(&jobs(0, N as u32, 20)),
    ));
    let port = free_port();
    let w = worker(&url, &[q.name()], "sleep", port, &["--concurrency", "20"]);
    let watcher = c.clone();
    let progress = |at: u64| {
        let c = watcher.clone();
        let key = q.stats_processed();
        async move {
            eventually(WAIT, "jobs done", || {
                let mut c = c.clone();
                let key = key.clone();
                async move { (counter(&mut c, key).await >= at).then_some(()) }
            })
            .await
        }
    };

    progress(N / 5).await;
    let to = cluster.primary_not_owning(s);
    let moved = tokio::task::block_in_place(|| cluster.move_slot(s, to));
    assert!(moved > 0, "the queue's keys moved");
    assert_eq!(cluster.owner(s), to);
    let done = counter(&mut c, q.stats_processed()).await;
    assert!(done < N, "the slot moved mid-run ({done} done)");

    progress(N / 2).await;
    let promoted = tokio::task::block_in_place(|| cluster.fail_over(s));
    assert_eq!(cluster.owner(s), promoted);
    let done = counter(&mut c, q.stats_processed()).await;
    assert!(done < N, "the failover happened mid-run ({done} done)");

    progress(N).await;
    // Settled exactly once each: nothing lost, nothing run twice, nothing
    // left in a list.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(counter(&mut c, q.stats_processed()).await, N);
    assert_eq!(counter(&mut c, q.stats_dead()).await, 0);
    let waiting: usize = c.llen(q.waiting()).await.expect("llen");
    assert_eq!(waiting, 0);
    assert_eq!(held(&mut c, &q).await, 0);
    assert_eq!(http_get(port, "/readyz").map(|r| r.0), Some(200));
    let log = stop(w);
    assert!(!log.contains("ERROR"), "{log}");
}

/// `calls` of `cmdstat_<command>` on node `n`.
fn calls(cluster: &TestRedisCluster, n: usize, command: &str) -> u64 {
    let info: String = cluster.on_node(n, redis::cmd("INFO").arg("commandstats"));
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .and_then(|calls| calls.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_of_a_pools_queues_is_one_transaction_on_the_node_that_owns_them() {
    let cluster = TestRedisCluster::start(3, 0);
    let queues = [QueueKeys::new("{mail}:high"), QueueKeys::new("{mail}:low")];
    let owner = cluster.owner(slot(queues[0].name()));
    let url = cluster.url(cluster.primary_not_owning(slot(queues[0].name())));
    let endpoint =
        workerpool_queue::connection::Endpoint::new(url, Default::default()).expect("endpoint");
    let mut conn = endpoint
        .connect(Duration::from_secs(2), Duration::from_secs(2))
        .await
        .expect("connect");
    assert!(conn.is_cluster(), "the mode was asked of the server");
    let mut c = cluster.conn().await;
    let _: () = c.lpush(queues[1].name(), "{}").await.expect("lpush");
    workerpool_queue::snapshot::read(&mut conn, &queues)
        .await
        .expect("snapshot");
    let before: Vec<(u64, u64)> = (0..cluster.len())
        .map(|n| (calls(&cluster, n, "exec"), calls(&cluster, n, "evalsha")))
        .collect();
    for _ in 0..5 {
        let snap = workerpool_queue::snapshot::read(&mut conn, &queues)
            .await
            .expect("snapshot");
        assert_eq!(snap.queues[1].waiting, 1);
    }
    // Each read's figures are one MULTI/EXEC on the owner of the queues'
    // slot, and no script runs anywhere.
    for (n, (exec, evalsha)) in before.into_iter().enumerate() {
        let execs = calls(&cluster, n, "exec") - exec;
        assert_eq!(execs, if n == owner { 5 } else { 0 }, "node {n}");
        assert_eq!(calls(&cluster, n, "evalsha") - evalsha, 0, "node {n}");
    }
}
