//! Redis Sentinel, against real processes: a primary, a replica and
//! sentinels (`redis-server <conf> --sentinel`). The URL names only the
//! sentinels; the primary is found through them, and again after a
//! failover.

use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use redis::AsyncCommands;
use serde_json::{Value, json};
use workerpool_queue::connection::{Connection, Endpoint, Tls};
use workerpool_queue::keys::QueueKeys;
use workerpool_tests::sentinel::{Auth, TestRedisSentinel};
use workerpool_tests::{eventually, free_port};

mod common;
use common::stop;
use workerpool_tests::http_get;

const WAIT: Duration = Duration::from_secs(30);

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

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn connect(url: &str) -> redis::RedisResult<Connection> {
    Endpoint::new(url, Tls::default())
        .expect("a valid sentinel url")
        .connect(Duration::from_secs(2), Duration::from_secs(2))
        .await
}

fn sentinel_of(c: &Connection) -> &workerpool_queue::connection::SentinelConnection {
    match c {
        Connection::Sentinel(s) => s,
        other => panic!("a sentinel url gives a sentinel connection, not {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_cli_and_queue_operations_reach_the_primary_through_the_sentinels() {
    let setup = TestRedisSentinel::start(1);
    // A sentinel that is down comes first: the next one is asked.
    let down = free_port();
    let url = setup.url().replacen(
        "redis+sentinel://",
        &format!("redis+sentinel://127.0.0.1:{down},"),
        1,
    );
    let q = QueueKeys::new("mail");

    let jobs: String = (0..20)
        .map(|n| format!("{{\"task\":\"t\",\"data\":{{\"n\":{n}}}}}\n"))
        .collect();
    let ids = ok(&cli(&url, &["enqueue", "--queue", q.name()], Some(&jobs)));
    assert_eq!(ids.lines().count(), 20);
    let mut primary = setup.primary().await;
    let waiting: usize = primary.llen(q.waiting()).await.expect("llen");
    assert_eq!(waiting, 20, "the jobs are on the primary");

    let stats = ok(&cli(
        &url,
        &["stats", "--queue", q.name(), "--json", "--no-rate"],
        None,
    ));
    let stats: Value = serde_json::from_str(&stats).expect("stats json");
    assert_eq!(stats["backlog"], json!(20), "{stats}");

    let mut c = connect(&url).await.expect("connect through the sentinels");
    assert!(!c.is_cluster());
    assert_eq!(sentinel_of(&c).discoveries(), 1);
    assert!(
        workerpool_queue::admin::exists(&mut c, &q)
            .await
            .expect("exists")
    );
    let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut c).await.expect("role");
    assert_eq!(role[0], redis::Value::BulkString(b"master".to_vec()));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_url_the_sentinels_cannot_serve_is_refused_with_what_each_sentinel_said() {
    let setup = TestRedisSentinel::start_with(
        1,
        Auth {
            password: Some("node-secret".into()),
            sentinel_password: Some("sentinel-secret".into()),
        },
    );
    let sentinel = setup.sentinel_ports()[0];

    // Both passwords right: the queue is reached.
    let url = setup.url();
    assert!(url.contains("sentinel_password=sentinel-secret"), "{url}");
    ok(&cli(&url, &["enqueue", "--queue", "q", "{}"], None));

    // The primary's name wrong.
    let wrong_name = url.replace("/mymaster/", "/othermaster/");
    let out = cli(&wrong_name, &["stats", "--queue", "q"], None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(&format!(
            "sentinel 127.0.0.1:{sentinel} monitors no primary named \"othermaster\""
        )),
        "{err}"
    );

    // The sentinels' password missing, then the primary's wrong: each
    // message says which part refused, and neither password is shown.
    let no_sentinel_password = url.replace("?sentinel_password=sentinel-secret", "");
    let out = cli(&no_sentinel_password, &["stats", "--queue", "q"], None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(&format!("sentinel 127.0.0.1:{sentinel}: ")),
        "{err}"
    );
    assert!(
        err.contains("NOAUTH") || err.contains("credentials"),
        "{err}"
    );
    let wrong_node_password = url.replace(":node-secret@", ":wrong@");
    let out = cli(&wrong_node_password, &["stats", "--queue", "q"], None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("(named by sentinel"), "{err}");
    assert!(err.contains("credentials"), "{err}");
    assert!(
        !err.contains("node-secret") && !err.contains("sentinel-secret") && !err.contains("wrong@"),
        "{err}"
    );

    // A URL that does not parse is refused before any connection.
    let out = cli(
        "redis+sentinel://127.0.0.1:1/",
        &["stats", "--queue", "q"],
        None,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("names no primary"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_connection_finds_the_new_primary_after_the_old_one_is_killed() {
    let mut setup = TestRedisSentinel::start(3);
    let mut c = connect(&setup.url()).await.expect("connect");
    let old = setup.primary_port();
    let _: i64 = c.lpush("q", "before").await.expect("lpush");
    let replicated: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(2000)
        .query_async(&mut c)
        .await
        .expect("wait");
    assert_eq!(replicated, 1);

    let new = setup.kill_primary();
    assert_ne!(new, old);
    // The first command after the failover may fail (its socket broke);
    // the next ones go to the new primary.
    let items: Vec<String> = eventually(WAIT, "a read on the new primary", || {
        let mut c = c.clone();
        async move { c.lrange("q", 0, -1).await.ok() }
    })
    .await;
    assert_eq!(items, ["before"], "the replicated write survived");
    let _: i64 = c
        .lpush("q", "after")
        .await
        .expect("lpush on the new primary");
    assert!(sentinel_of(&c).discoveries() >= 2);
    let on_new: Vec<String> = setup.on_node(new, redis::cmd("LRANGE").arg("q").arg(0).arg(-1));
    assert_eq!(on_new, ["after", "before"]);
}

/// A worker process running an exec handler that appends each job to the
/// file `$DONE`.
fn worker(url: &str, queue: &str, done: &std::path::Path, port: u16) -> Child {
    let handler = r#"while IFS= read -r line; do
  printf '%s\n' "$line" >> "$DONE"
  echo '{"ok":true}'
done"#;
    Command::new(env!("CARGO_BIN_EXE_workerpool-worker"))
        .args(["--redis-url", url, "--queue", queue, "--concurrency", "4"])
        .args(["--heartbeat-interval", "200ms", "--dead-after", "1s"])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--", "sh", "-c", handler])
        .env("DONE", done)
        .env("RUST_LOG", "warn")
        .env_remove("WORKERPOOL_REDIS_MODE")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn workerpool-worker")
}

/// The `data.n` of every job the handler ran.
fn ran(done: &std::path::Path) -> BTreeSet<u64> {
    std::fs::read_to_string(done)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|j| j["data"]["n"].as_u64())
        .collect()
}

/// Pushes job `n` until the push is acknowledged by the primary and by its
/// replica (`WAIT 1`): only then can no failover lose it.
async fn enqueue_replicated(c: &mut Connection, queue: &str, n: u64) {
    let job = json!({"task": "t", "data": {"n": n}}).to_string();
    loop {
        let pushed: redis::RedisResult<i64> = c.lpush(queue, &job).await;
        if pushed.is_ok() {
            let replicas: redis::RedisResult<i64> =
                redis::cmd("WAIT").arg(1).arg(1000).query_async(c).await;
            if matches!(replicas, Ok(r) if r >= 1) {
                return;
            }
        }
        // Unacknowledged: pushed again (at-least-once; the job may run twice).
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_keeps_running_jobs_across_a_failover_and_none_acknowledged_is_lost() {
    let setup = TestRedisSentinel::start(1);
    let url = setup.url();
    let done = setup.dir().join("done.jsonl");
    let q = QueueKeys::new("failover");
    let port = free_port();
    let child = worker(&url, q.name(), &done, port);

    let mut producer = connect(&url).await.expect("producer connects");
    for n in 0..100 {
        enqueue_replicated(&mut producer, q.name(), n).await;
    }
    eventually(WAIT, "the worker runs jobs", || {
        let started = !ran(&done).is_empty();
        async move { started.then_some(()) }
    })
    .await;

    // The failover while jobs are still being pushed and run: the producer
    // keeps pushing during it.
    let fail_over = tokio::task::spawn_blocking(move || {
        let new = setup.fail_over();
        (setup, new)
    });
    let mut n = 100;
    while !fail_over.is_finished() {
        enqueue_replicated(&mut producer, q.name(), n).await;
        n += 1;
    }
    let (setup, new) = fail_over.await.expect("failover");
    for m in n..n + 100 {
        enqueue_replicated(&mut producer, q.name(), m).await;
    }
    let total = n + 100;
    assert_eq!(setup.primary_port(), new);
    assert!(sentinel_of(&producer).discoveries() >= 2);

    let expected: BTreeSet<u64> = (0..total).collect();
    eventually(WAIT, "every acknowledged job runs", || {
        let missing = expected.difference(&ran(&done)).next().is_some();
        async move { (!missing).then_some(()) }
    })
    .await;
    assert_eq!(
        http_get(port, "/readyz").map(|(status, _)| status),
        Some(200),
        "the worker is ready on the new primary"
    );
    let c = setup.primary().await;
    eventually(WAIT, "nothing left waiting on the new primary", || {
        let mut c = c.clone();
        let key = q.waiting().to_string();
        async move {
            let left: usize = c.llen(key).await.ok()?;
            (left == 0).then_some(())
        }
    })
    .await;
    let log = stop(child);
    assert!(!log.contains("panicked"), "{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_primary_demoted_under_an_open_connection_answers_readonly_and_the_next_command_finds_the_new_one()
 {
    let setup = TestRedisSentinel::start(1);
    let url = setup.url();
    let endpoint = Endpoint::new(url.as_str(), Tls::default()).expect("url");
    let mut c = connect(&url).await.expect("connect");
    let old = setup.primary_port();
    let _: i64 = c.lpush("q", "one").await.expect("lpush");
    let new = setup
        .node_ports()
        .into_iter()
        .find(|p| *p != old)
        .expect("the replica");
    // Swapped by hand, without the sentinel, which would close every
    // client connection: the open socket stays on the old primary.
    let _: () = setup.on_node(new, redis::cmd("REPLICAOF").arg("NO").arg("ONE"));
    let _: () = setup.on_node(old, redis::cmd("REPLICAOF").arg("127.0.0.1").arg(new));
    let sentinel = setup.sentinel_ports()[0];
    let _: () = setup.on_sentinel(
        sentinel,
        redis::cmd("SENTINEL").arg("REMOVE").arg("mymaster"),
    );
    let _: () = setup.on_sentinel(
        sentinel,
        redis::cmd("SENTINEL")
            .arg("MONITOR")
            .arg("mymaster")
            .arg("127.0.0.1")
            .arg(new)
            .arg(1),
    );

    let refused = c
        .lpush::<_, _, i64>("q", "two")
        .await
        .expect_err("the old primary is a replica now");
    assert_eq!(refused.code(), Some("READONLY"), "{refused}");
    let shown = endpoint.describe(&refused);
    assert!(shown.contains("the sentinels are asked again"), "{shown}");
    let _: i64 = c.lpush("q", "two").await.expect("lpush on the new primary");
    assert_eq!(sentinel_of(&c).discoveries(), 2);
    let on_new: Vec<String> = setup.on_node(new, redis::cmd("LRANGE").arg("q").arg(0).arg(-1));
    assert_eq!(on_new, ["two", "one"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_connection_leaves_the_old_primary_when_a_sentinel_announces_the_switch() {
    let setup = TestRedisSentinel::start(1);
    let mut c = connect(&setup.url()).await.expect("connect");
    let sentinel = setup.sentinel_ports()[0];
    // The connection's listener is subscribed to +switch-master.
    eventually(WAIT, "a subscriber on the sentinel", || {
        let clients: String = setup.on_sentinel(sentinel, redis::cmd("CLIENT").arg("LIST"));
        async move { clients.contains(" sub=1 ").then_some(()) }
    })
    .await;
    let port = |c: &mut Connection| {
        let mut c = c.clone();
        async move {
            let answer: Vec<String> = redis::cmd("CONFIG")
                .arg("GET")
                .arg("port")
                .query_async(&mut c)
                .await
                .ok()?;
            answer.get(1)?.parse::<u16>().ok()
        }
    };
    let old = setup.primary_port();
    assert_eq!(port(&mut c).await, Some(old));

    let new = setup.fail_over();
    // Sentinel reconfigures the old primary (closing its connections) only
    // after it next looks at it, seconds later; until then it still takes
    // writes that its demotion throws away. The announcement moves the
    // connection at once.
    eventually(
        Duration::from_secs(3),
        "commands on the new primary",
        || {
            let asked = port(&mut c);
            async move { (asked.await == Some(new)).then_some(()) }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn after_a_failover_under_a_busy_worker_its_processing_list_holds_only_what_it_runs() {
    let setup = TestRedisSentinel::start(1);
    let url = setup.url();
    let dir = setup.dir();
    let (started, done, go) = (dir.join("started"), dir.join("done.jsonl"), dir.join("go"));
    let q = QueueKeys::new("busy");
    // Each job is held until the file $GO exists.
    let handler = r#"while IFS= read -r line; do
  printf '%s\n' "$line" >> "$STARTED"
  while [ ! -e "$GO" ]; do sleep 0.01; done
  printf '%s\n' "$line" >> "$DONE"
  echo '{"ok":true}'
done"#;
    let port = free_port();
    let mut child = KillOnDrop(Some(
        Command::new(env!("CARGO_BIN_EXE_workerpool-worker"))
            .args([
                "--redis-url",
                &url,
                "--queue",
                q.name(),
                "--concurrency",
                "8",
            ])
            .args(["--heartbeat-interval", "200ms", "--dead-after", "1s"])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--", "sh", "-c", handler])
            .env("STARTED", &started)
            .env("DONE", &done)
            .env("GO", &go)
            .env("RUST_LOG", "warn")
            .env_remove("WORKERPOOL_REDIS_MODE")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn workerpool-worker"),
    ));

    let mut producer = connect(&url).await.expect("producer connects");
    for n in 0..8 {
        enqueue_replicated(&mut producer, q.name(), n).await;
    }
    eventually(WAIT, "eight jobs running", || {
        let running = std::fs::read_to_string(&started)
            .unwrap_or_default()
            .lines()
            .count();
        async move { (running == 8).then_some(()) }
    })
    .await;
    // The eight entries of the processing list reach the replica.
    let replicated: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(2000)
        .query_async(&mut producer)
        .await
        .expect("wait");
    assert_eq!(replicated, 1);

    let old = setup.primary_port();
    let replica = setup
        .node_ports()
        .into_iter()
        .find(|p| *p != old)
        .expect("the replica");
    let replica = redis::Client::open(setup.node_url(replica)).expect("replica url");
    let fail_over = tokio::task::spawn_blocking(move || {
        let new = setup.fail_over();
        (setup, new)
    });
    // The jobs end as soon as the replica is promoted: their settlements
    // reach the old primary before the sentinel announces the switch, and
    // are lost with it, while the new primary still lists the eight.
    eventually(WAIT, "the replica promoted", || {
        let role = replica
            .get_connection_with_timeout(Duration::from_secs(1))
            .and_then(|mut c| redis::cmd("ROLE").query::<Vec<redis::Value>>(&mut c))
            .ok();
        async move {
            (role?.first()? == &redis::Value::BulkString(b"master".to_vec())).then_some(())
        }
    })
    .await;
    std::fs::write(&go, "").expect("release the jobs");
    let (setup, _) = fail_over.await.expect("failover");
    let expected: BTreeSet<u64> = (0..8).collect();
    eventually(WAIT, "the eight jobs done", || {
        let all = ran(&done).is_superset(&expected);
        async move { all.then_some(()) }
    })
    .await;

    // At-least-once: an entry the worker no longer runs goes back to the
    // queue and runs again; then nothing is held and nothing shows in flight.
    let mut c = connect(&url).await.expect("connect");
    let q2 = q.clone();
    eventually(WAIT, "an empty processing list, nothing in flight", || {
        let (mut c, q) = (c.clone(), q2.clone());
        async move {
            let counts = workerpool_queue::snapshot::counts(&mut c, &q).await.ok()?;
            let workers: Vec<String> = c.zrange(q.workers(), 0, -1).await.ok()?;
            let mut held = 0;
            for w in &workers {
                held += c.llen::<_, usize>(q.processing(w)).await.ok()?;
            }
            (counts.waiting == 0 && counts.in_flight == 0 && held == 0 && workers.len() == 1)
                .then_some(())
        }
    })
    .await;
    let snapshot = workerpool_queue::snapshot::counts(&mut c, &q)
        .await
        .expect("snapshot");
    assert_eq!(
        (snapshot.in_flight, snapshot.held()),
        (0, 0),
        "{snapshot:?}"
    );
    let log = stop(child.0.take().expect("the worker"));
    assert!(!log.contains("panicked"), "{log}");
    assert!(log.contains("Redis has a new primary"), "{log}");
    drop(setup);
}

/// A worker process killed when the test ends, should it fail first.
struct KillOnDrop(Option<Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
