//! The `workerpool-worker` binary as a process: supervision of exec
//! children, kill -9, the drain on SIGTERM, SIGINT, SIGHUP and SIGQUIT,
//! the state line on SIGUSR1, Redis restarts, the HTTP endpoints, a stderr
//! nobody reads.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use serde_json::{Value, json};
use workerpool_queue::keys::QueueKeys;
use workerpool_tests::{TestRedis, eventually, free_port};

mod common;
use common::{counter, processing_total, push};
use workerpool_tests::http_get;

const WAIT: Duration = Duration::from_secs(20);
const FAST: [&str; 4] = ["--heartbeat-interval", "200ms", "--dead-after", "1s"];

struct Worker {
    child: Child,
    port: u16,
}

impl Worker {
    fn start(redis: &TestRedis, args: &[&str], env: &[(&str, &Path)]) -> Self {
        Self::spawn(redis, args, env, "warn", Stdio::inherit())
    }

    /// A worker logging at `info` to `log`.
    fn start_logging(redis: &TestRedis, args: &[&str], log: &Path) -> Self {
        let file = std::fs::File::create(log).expect("log file");
        Self::spawn(redis, args, &[], "info", Stdio::from(file))
    }

    /// A worker logging at `info` to a pipe nobody reads: its read end is
    /// closed before the worker writes its first line.
    fn start_with_stderr_closed(redis: &TestRedis, args: &[&str]) -> Self {
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(reader);
        Self::spawn(redis, args, &[], "info", Stdio::from(writer))
    }

    fn spawn(
        redis: &TestRedis,
        args: &[&str],
        env: &[(&str, &Path)],
        level: &str,
        stderr: Stdio,
    ) -> Self {
        let port = free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_workerpool-worker"))
            .arg("--redis-url")
            .arg(redis.url())
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v.as_os_str())))
            .env("RUST_LOG", level)
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn workerpool-worker");
        Self { child, port }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn signal(&self, name: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid().to_string())
            .status()
            .expect("kill");
        assert!(ok.success());
    }

    fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.port, path)
    }

    async fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let child = &mut self.child;
        eventually(timeout, "the worker to exit", || {
            let status = child.try_wait().expect("try_wait");
            async move { status }
        })
        .await
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A bare HTTP/1.0 GET: status code and body.
async fn wait_processed(c: &MultiplexedConnection, q: &QueueKeys, n: u64) {
    eventually(WAIT, &format!("{n} jobs processed"), || {
        let mut c = c.clone();
        let key = q.stats_processed();
        async move { (counter(&mut c, key).await >= n).then_some(()) }
    })
    .await;
}

/// Process ids whose parent is `pid`, but its handler keeper (the worker
/// binary started again to kill handler groups should the worker die).
fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // The fields after the parenthesised command: state, ppid, …
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1));
        let keeper = std::fs::read(entry.path().join("cmdline")).is_ok_and(|c| {
            c.split(|&b| b == 0)
                .any(|arg| arg == workerpool_worker::handlers::keeper::ARG.as_bytes())
        });
        if ppid == Some(pid.to_string().as_str())
            && !keeper
            && !stat
                .rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
        {
            out.push(child);
        }
    }
    out
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn a_child_that_dies_on_one_job_is_replaced_and_that_job_alone_ends_dead() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("supervised");
    let dir = tempfile::tempdir().expect("tempdir");
    let (pids, done) = (dir.path().join("pids"), dir.path().join("done"));
    let handler = r#"echo $$ >> "$PIDS"
while read -r line; do
  case "$line" in
    *'"n":3'*) exit 1 ;;
    *) echo "$line" >> "$DONE"; echo '{"ok":true}' ;;
  esac
done"#;
    push(
        &mut c,
        q.name(),
        (1..=5).map(|n| json!({"task": "t", "data": {"n": n}})),
    )
    .await;
    let mut args = vec![
        "--queue",
        "supervised",
        "--concurrency",
        "2",
        "--max-attempts",
        "2",
    ];
    args.extend(["--backoff-base", "50ms", "--backoff-max", "100ms"]);
    args.extend(FAST);
    args.extend(["--", "sh", "-c", handler]);
    let mut worker = Worker::start(&redis, &args, &[("PIDS", &pids), ("DONE", &done)]);

    wait_processed(&c, &q, 4).await;
    let dead: Vec<String> = eventually(WAIT, "job 3 dead", || {
        let mut c = c.clone();
        let key = q.dead();
        async move {
            let v: Vec<String> = c.lrange(key, 0, -1).await.expect("lrange");
            (!v.is_empty()).then_some(v)
        }
    })
    .await;
    assert_eq!(dead.len(), 1);
    let letter: Value = serde_json::from_str(&dead[0]).expect("json");
    assert_eq!(letter["job"]["data"]["n"], json!(3));
    assert_eq!(
        (letter["reason"].clone(), letter["attempts"].clone()),
        (json!("exhausted"), json!(2))
    );
    assert!(
        letter["error"].as_str().expect("error").contains("exited"),
        "{letter}"
    );

    let done_ns: BTreeSet<u64> = lines(&done)
        .iter()
        .map(|l| {
            serde_json::from_str::<Value>(l).expect("json")["data"]["n"]
                .as_u64()
                .expect("n")
        })
        .collect();
    assert_eq!(done_ns, BTreeSet::from([1, 2, 4, 5]));
    assert_eq!(counter(&mut c, q.stats_processed()).await, 4);
    assert_eq!(
        lines(&pids).len(),
        4,
        "two children at start, one replacement per death"
    );
    let live = eventually(WAIT, "the pool back at full size", || {
        let kids = children_of(worker.pid());
        async move { (kids.len() == 2).then_some(kids) }
    })
    .await;
    assert_eq!(live.len(), 2, "the pool keeps its size");

    worker.signal("TERM");
    assert!(worker.wait_exit(WAIT).await.success());
}

#[tokio::test]
async fn jobs_of_a_worker_killed_with_sigkill_are_recovered_by_another_and_none_is_lost() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("kill9");
    push(
        &mut c,
        q.name(),
        (0..24).map(|n| json!({"data": {"ms": 300, "n": n}})),
    )
    .await;
    let mut args = vec![
        "--queue",
        "kill9",
        "--handler",
        "sleep",
        "--concurrency",
        "4",
    ];
    args.extend(FAST);
    let mut victim_args = args.clone();
    victim_args.extend(["--worker-id", "victim"]);
    let mut victim = Worker::start(&redis, &victim_args, &[]);
    eventually(WAIT, "the victim holding four jobs", || {
        let mut c = c.clone();
        let q = q.clone();
        async move { (processing_total(&mut c, &q).await == 4).then_some(()) }
    })
    .await;
    victim.signal("KILL");
    victim.wait_exit(WAIT).await;
    let held = processing_total(&mut c, &q).await;
    assert!(held > 0, "the killed worker left jobs behind");

    let mut rescuer_args = args.clone();
    rescuer_args.extend(["--worker-id", "rescuer"]);
    let mut rescuer = Worker::start(&redis, &rescuer_args, &[]);
    wait_processed(&c, &q, 24).await;
    rescuer.signal("TERM");
    assert!(rescuer.wait_exit(WAIT).await.success());

    assert_eq!(
        counter(&mut c, q.stats_processed()).await,
        24,
        "every job done once"
    );
    assert_eq!(counter(&mut c, q.stats_recovered()).await, held as u64);
    let waiting: usize = c.llen(q.name()).await.expect("llen");
    let dead: usize = c.llen(q.dead()).await.expect("llen");
    assert_eq!(
        (waiting, dead, processing_total(&mut c, &q).await),
        (0, 0, 0)
    );
}

/// Worker settings of the instance-file tests: four slots, sleeping jobs,
/// and a --dead-after of a minute, so jobs back within seconds were not
/// returned by waiting for a heartbeat to go stale.
fn restart_args<'a>(queue: &'a str, file: &'a str) -> Vec<&'a str> {
    vec![
        "--queue",
        queue,
        "--handler",
        "sleep",
        "--concurrency",
        "4",
        "--heartbeat-interval",
        "1s",
        "--dead-after",
        "60s",
        "--worker-id",
        "pod-a",
        "--instance-file",
        file,
    ]
}

/// The instances registered on a queue, with their last beats.
async fn registered(c: &mut MultiplexedConnection, q: &QueueKeys) -> Vec<(String, u64)> {
    workerpool_queue::ops::workers(c, q).await.expect("workers")
}

/// Waits until the jobs of `q` held by every worker number `n`.
async fn holding(c: &MultiplexedConnection, q: &QueueKeys, n: usize) {
    eventually(WAIT, &format!("{n} jobs held"), || {
        let mut c = c.clone();
        let q = q.clone();
        async move { (processing_total(&mut c, &q).await == n).then_some(()) }
    })
    .await;
}

#[tokio::test]
async fn a_restarted_worker_takes_back_its_killed_predecessors_jobs_at_once_through_its_instance_file()
 {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("restart");
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("instance");
    let file_arg = file.to_str().expect("a UTF-8 path");
    push(
        &mut c,
        q.name(),
        (0..12).map(|n| json!({"data": {"ms": 1000, "n": n}})),
    )
    .await;
    let args = restart_args("restart", file_arg);
    let mut first = Worker::start(&redis, &args, &[]);
    holding(&c, &q, 4).await;
    let named = std::fs::read_to_string(&file).expect("the first process named itself");
    first.signal("KILL");
    first.wait_exit(WAIT).await;
    let killed = Instant::now();
    // Its heartbeat is fresh, within the minute it declared: without the
    // file the next process would leave its four jobs for that minute.
    let before = registered(&mut c, &q).await;
    assert_eq!(
        before
            .iter()
            .map(|(name, _)| name.as_str())
            .collect::<Vec<_>>(),
        [named.trim()]
    );
    assert_eq!(processing_total(&mut c, &q).await, 4);

    let log = dir.path().join("second.log");
    let mut second = Worker::start_logging(&redis, &args, &log);
    wait_processed(&c, &q, 12).await;
    let took = killed.elapsed();
    assert!(
        took < Duration::from_secs(20),
        "all 12 jobs done {took:?} after the kill, well within the 60 s --dead-after"
    );
    assert_eq!(counter(&mut c, q.stats_recovered()).await, 4);
    // The predecessor is gone from the registry; the file names the one
    // registered now, for the next restart.
    let now = registered(&mut c, &q).await;
    let named_now = std::fs::read_to_string(&file).expect("named");
    assert_eq!(
        now.iter()
            .map(|(name, _)| name.as_str())
            .collect::<Vec<_>>(),
        [named_now.trim()]
    );
    assert_ne!(named_now, named);
    second.signal("TERM");
    assert!(second.wait_exit(WAIT).await.success());
    let said = lines(&log).join("\n");
    assert!(
        said.contains("returned the jobs of this container's previous run at once"),
        "{said}"
    );
    assert!(!said.contains("another live worker"), "{said}");
    assert_eq!(counter(&mut c, q.stats_processed()).await, 12);
    assert_eq!(processing_total(&mut c, &q).await, 0);
    eprintln!("12 jobs, 4 of them held by the killed process: all done {took:.1?} after the kill");
}

#[tokio::test]
async fn a_second_live_process_given_the_same_id_and_instance_file_leaves_the_first_ones_jobs_alone()
 {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("twins");
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("instance");
    let file_arg = file.to_str().expect("a UTF-8 path");
    push(
        &mut c,
        q.name(),
        (0..4).map(|n| json!({"data": {"ms": 4000, "n": n}})),
    )
    .await;
    let args = restart_args("twins", file_arg);
    let mut first = Worker::start(&redis, &args, &[]);
    holding(&c, &q, 4).await;
    let named = std::fs::read_to_string(&file).expect("the first process named itself");

    // The same id and the same file, by hand, while the first runs: the
    // file's lock is held, so it proves nothing about the first process.
    let log = dir.path().join("second.log");
    let mut second = Worker::start_logging(&redis, &args, &log);
    eventually(WAIT, "the second process registered", || {
        let mut c = c.clone();
        let q = q.clone();
        async move { (registered(&mut c, &q).await.len() == 2).then_some(()) }
    })
    .await;
    let first_instance = named.trim();
    assert_eq!(
        c.llen::<_, usize>(q.processing(first_instance))
            .await
            .expect("llen"),
        4,
        "the first process's jobs are its own"
    );
    second.signal("TERM");
    assert!(second.wait_exit(WAIT).await.success());
    let said = lines(&log).join("\n");
    assert!(
        said.contains("another live process holds this file"),
        "{said}"
    );
    assert!(
        said.contains("another live worker uses --worker-id"),
        "{said}"
    );
    assert_eq!(
        std::fs::read_to_string(&file).expect("named"),
        named,
        "the second process did not write the file it does not hold"
    );
    wait_processed(&c, &q, 4).await;
    first.signal("TERM");
    assert!(first.wait_exit(WAIT).await.success());
    assert_eq!(counter(&mut c, q.stats_recovered()).await, 0);
    assert_eq!(counter(&mut c, q.stats_processed()).await, 4);
}

#[tokio::test]
async fn sigterm_lets_jobs_that_fit_finish_and_returns_the_rest_to_the_head_of_the_queue() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("drain");
    let jobs = [("a", 300), ("b", 300), ("c", 30_000), ("d", 10), ("e", 10)];
    push(
        &mut c,
        q.name(),
        jobs.iter()
            .map(|(id, ms)| json!({"id": id, "data": {"ms": ms}})),
    )
    .await;
    let mut args = vec![
        "--queue",
        "drain",
        "--handler",
        "sleep",
        "--concurrency",
        "3",
        "--shutdown-timeout",
        "1500ms",
    ];
    args.extend(FAST);
    let mut worker = Worker::start(&redis, &args, &[]);
    eventually(WAIT, "three jobs running", || {
        let mut c = c.clone();
        let q = q.clone();
        async move { (processing_total(&mut c, &q).await == 3).then_some(()) }
    })
    .await;
    assert_eq!(worker.get("/readyz"), Some((200, "ok\n".into())));

    let signalled = Instant::now();
    worker.signal("TERM");
    let readiness = eventually(WAIT, "readyz to report draining", || {
        let r = worker.get("/readyz");
        async move { r.filter(|(status, _)| *status == 503) }
    })
    .await;
    assert_eq!(readiness.1, "draining\n");
    let status = worker.wait_exit(WAIT).await;
    let took = signalled.elapsed();
    assert!(status.success(), "{status:?}");
    assert!(
        took < Duration::from_millis(1500 + 1500),
        "exit before the deadline plus margin, took {took:?}"
    );

    assert_eq!(
        counter(&mut c, q.stats_processed()).await,
        2,
        "a and b fit in the timeout"
    );
    let queue: Vec<String> = c.lrange(q.name(), 0, -1).await.expect("lrange");
    let ids: Vec<Value> = queue
        .iter()
        .map(|j| serde_json::from_str::<Value>(j).expect("json")["id"].clone())
        .collect();
    assert_eq!(
        ids,
        [json!("e"), json!("d"), json!("c")],
        "c is back at the head, before d and e"
    );
    let c_job: Value = serde_json::from_str(&queue[2]).expect("json");
    assert!(
        c_job.get("attempt").is_none(),
        "an interrupted attempt is not counted: {c_job}"
    );
    assert_eq!(processing_total(&mut c, &q).await, 0);
}

#[tokio::test]
async fn a_second_signal_skips_the_wait() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("impatient");
    push(
        &mut c,
        q.name(),
        [json!({"id": "long", "data": {"ms": 60_000}})],
    )
    .await;
    let mut args = vec![
        "--queue",
        "impatient",
        "--handler",
        "sleep",
        "--shutdown-timeout",
        "60s",
    ];
    args.extend(FAST);
    let mut worker = Worker::start(&redis, &args, &[]);
    eventually(WAIT, "the job running", || {
        let mut c = c.clone();
        let q = q.clone();
        async move { (processing_total(&mut c, &q).await == 1).then_some(()) }
    })
    .await;
    worker.signal("TERM");
    tokio::time::sleep(Duration::from_millis(200)).await;
    worker.signal("INT");
    let status = worker.wait_exit(Duration::from_secs(10)).await;
    assert!(status.success());
    let queue: Vec<String> = c.lrange(q.name(), 0, -1).await.expect("lrange");
    assert_eq!(queue.len(), 1);
}

#[tokio::test]
async fn a_redis_restart_mid_run_is_survived_and_every_job_is_accounted_for() {
    let mut redis = TestRedis::start_persistent();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("restart");
    let dir = tempfile::tempdir().expect("tempdir");
    let done = dir.path().join("done");
    let handler =
        r#"while read -r line; do sleep 0.01; echo "$line" >> "$DONE"; echo '{"ok":true}'; done"#;
    const N: u64 = 300;
    push(&mut c, q.name(), (0..N).map(|n| json!({"data": {"n": n}}))).await;
    let mut args = vec!["--queue", "restart", "--concurrency", "4"];
    args.extend(FAST);
    args.extend(["--", "sh", "-c", handler]);
    let mut worker = Worker::start(&redis, &args, &[("DONE", &done)]);
    wait_processed(&c, &q, 40).await;

    redis.stop();
    let unready = eventually(WAIT, "readyz to report redis unreachable", || {
        let r = worker.get("/readyz");
        async move { r.filter(|(status, _)| *status == 503) }
    })
    .await;
    assert!(
        unready.1.starts_with("redis unreachable ("),
        "readyz says what failed and how: {}",
        unready.1
    );
    assert_eq!(
        worker.get("/healthz").map(|r| r.0),
        Some(200),
        "liveness does not depend on redis"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    redis.resume();

    let mut c = redis.conn().await;
    eventually(WAIT, "every job done", || {
        let done = lines(&done);
        async move {
            let ns: BTreeSet<u64> = done
                .iter()
                .map(|l| {
                    serde_json::from_str::<Value>(l).expect("json")["data"]["n"]
                        .as_u64()
                        .expect("n")
                })
                .collect();
            (ns.len() as u64 == N).then_some(())
        }
    })
    .await;
    eventually(WAIT, "ready again", || {
        let r = worker.get("/readyz");
        async move { r.filter(|(status, _)| *status == 200) }
    })
    .await;
    let metrics = worker.get("/metrics").expect("metrics").1;
    assert!(
        metrics.contains("workerpool_redis_errors_total"),
        "{metrics}"
    );
    worker.signal("TERM");
    assert!(worker.wait_exit(WAIT).await.success());
    let waiting: usize = c.llen(q.name()).await.expect("llen");
    let retrying: usize = c.zcard(q.retry()).await.expect("zcard");
    let dead: usize = c.llen(q.dead()).await.expect("llen");
    assert_eq!(
        (waiting, retrying, dead, processing_total(&mut c, &q).await),
        (0, 0, 0, 0)
    );
}

#[tokio::test]
async fn bad_settings_stop_the_worker_at_start_with_one_line_naming_the_flag() {
    for (args, needle) in [
        (vec!["--handler", "noop"], "--queue"),
        (vec!["--queue", "q"], "--handler"),
        (
            vec!["--queue", "q", "--", "/nonexistent/handler"],
            "/nonexistent/handler",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_workerpool-worker"))
            .args([
                "--redis-url",
                "redis://127.0.0.1:1",
                "--listen",
                "127.0.0.1:0",
            ])
            .args(&args)
            .output()
            .expect("run");
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stderr.lines().last().unwrap_or_default();
        assert!(
            last.starts_with("error: ") && last.contains(needle),
            "{args:?}: {stderr}"
        );
    }
}

/// Whether process `pid` exists (and is not a zombie).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_children_die_with_a_sigkilled_worker_and_never_see_its_settings() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let pids = dir.path().join("pids");
    let env_dump = dir.path().join("env");
    // Each child records its pid and environment, then takes a job and
    // hangs on it; it also starts a grandchild in its process group.
    let script = format!(
        "echo $$ >> {pids}; env > {env}; sleep 300 & echo $! >> {pids}; while IFS= read -r job; do sleep 300; done",
        pids = pids.display(),
        env = env_dump.display()
    );
    let url = format!("redis://:s3cret-word@127.0.0.1:{}/0", redis.port());
    let port = free_port();
    let mut worker = Command::new(env!("CARGO_BIN_EXE_workerpool-worker"))
        .env("WORKERPOOL_REDIS_URL", &url)
        .env("WORKERPOOL_QUEUE", "orphans")
        .env("HANDLER_SETTING", "kept")
        .env("WORKERPOOL_WORKER_ID", "pod-7")
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--",
            "sh",
            "-c",
            &script,
        ])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn workerpool-worker");
    // Whatever happens below, nothing this test started outlives it.
    let _cleanup = KillOnDrop(worker.id(), pids.clone());
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("s3cret-word")
        .query_async(&mut c)
        .await
        .expect("requirepass");
    let mut c = redis::Client::open(url.as_str())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect with the password");
    push(&mut c, "orphans", &[json!({"task": "t"}).to_string()]).await;
    let q = QueueKeys::new("orphans");
    eventually(WAIT, "the job running", || {
        let mut c = c.clone();
        let q = q.clone();
        async move { (processing_total(&mut c, &q).await == 1).then_some(()) }
    })
    .await;
    let started: Vec<u32> =
        eventually(WAIT, "child and grandchild pids", || {
            let pids = lines(&pids);
            async move {
                (pids.len() >= 2).then(|| pids.iter().filter_map(|p| p.parse().ok()).collect())
            }
        })
        .await;
    let env = std::fs::read_to_string(&env_dump).expect("env dump");
    assert!(env.contains("HANDLER_SETTING=kept"), "{env}");
    // The worker's id stays, for the handler's logs, and the worker tells
    // the child its share of the slots; no other setting.
    assert!(env.contains("WORKERPOOL_WORKER_ID=pod-7"), "{env}");
    assert!(env.contains("WORKERPOOL_JOBS_PER_CHILD=1"), "{env}");
    assert_eq!(env.matches("WORKERPOOL_").count(), 2, "{env}");
    assert!(!env.contains("s3cret"), "{env}");

    worker.kill().expect("kill -9 the worker");
    let _ = worker.wait();
    let (child, grandchild) = (started[0], started[1]);
    eventually(
        Duration::from_secs(5),
        "the child and its grandchild gone with their worker",
        || async move { (!alive(child) && !alive(grandchild)).then_some(()) },
    )
    .await;
}

/// Kills a process and those listed in a file of pids when dropped, so
/// that a failing test leaves nothing behind.
struct KillOnDrop(u32, std::path::PathBuf);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let mut pids = lines(&self.1);
        pids.push(self.0.to_string());
        for pid in pids {
            let _ = Command::new("kill").arg("-9").arg(pid).status();
        }
    }
}

#[tokio::test]
async fn a_handler_error_with_line_breaks_and_escapes_stays_on_its_own_log_line() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("forged");
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("worker.log");
    // Every attempt fails with an error that tries to start a log line of
    // its own, set the window title and reorder text.
    let handler = r#"while read -r line; do
  printf '%s\n' '{"ok":false,"error":"boom\r\nFAKE level=INFO all good \u001b]0;pwned\u0007 \u202etxt.exe"}'
done"#;
    push(&mut c, q.name(), [json!({"id": "j1", "task": "t"})]).await;
    let mut args = vec!["--queue", "forged", "--max-attempts", "2"];
    args.extend(["--backoff-base", "50ms", "--backoff-max", "100ms"]);
    args.extend(FAST);
    args.extend(["--", "sh", "-c", handler]);
    let mut worker = Worker::start_logging(&redis, &args, &log);

    let dead: Vec<String> = eventually(WAIT, "the job dead", || {
        let mut c = c.clone();
        let key = q.dead();
        async move {
            let v: Vec<String> = c.lrange(key, 0, -1).await.expect("lrange");
            (!v.is_empty()).then_some(v)
        }
    })
    .await;
    worker.signal("TERM");
    assert!(worker.wait_exit(WAIT).await.success());

    // The dead letter keeps the real text.
    let letter: Value = serde_json::from_str(&dead[0]).expect("json");
    assert_eq!(
        letter["error"],
        json!("boom\r\nFAKE level=INFO all good \u{1b}]0;pwned\u{7} \u{202e}txt.exe")
    );
    // The log shows it escaped, on the line of the event it belongs to.
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(!text.contains('\r'), "{text:?}");
    for line in text.lines() {
        assert!(!line.starts_with("FAKE"), "a forged line: {text}");
        assert!(
            !line
                .chars()
                .any(|c| c.is_control() || matches!(c, '\u{202a}'..='\u{202e}')),
            "a raw control or bidi character: {line:?}"
        );
    }
    let escaped = r"boom\r\nFAKE level=INFO all good \u{1b}]0;pwned\u{7} \u{202e}txt.exe";
    for event in ["attempt failed", "job dead-lettered"] {
        assert!(
            text.lines()
                .any(|l| l.contains(event) && l.contains(escaped)),
            "{event} with the error escaped: {text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_cannot_start_spends_no_attempts_reports_unready_and_recovers() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("broken");
    let dir = tempfile::tempdir().expect("tempdir");
    let fixed = dir.path().join("fixed");
    // Until the file exists the handler dies at start, saying why, as a
    // script that is missing or fails to import does.
    let handler = r#"if [ ! -f "$FIXED" ]; then echo "python3: can't open file '/app/handler.py'" >&2; exit 2; fi
while read -r line; do echo '{"ok":true}'; done"#;
    const N: u64 = 20;
    push(
        &mut c,
        q.name(),
        (0..N).map(|n| json!({"id": format!("j{n}")})),
    )
    .await;
    let mut args = vec!["--queue", "broken", "--max-attempts", "3"];
    args.extend(["--backoff-base", "20ms", "--backoff-max", "50ms"]);
    args.extend(FAST);
    args.extend(["--", "sh", "-c", handler]);
    let worker = Worker::start(&redis, &args, &[("FIXED", &fixed)]);
    let body = eventually(WAIT, "readyz names the handler's problem", || {
        let r = worker.get("/readyz");
        async move {
            r.and_then(|(status, body)| {
                (status == 503 && body.starts_with("handler:")).then_some(body)
            })
        }
    })
    .await;
    assert!(body.contains("can't open file '/app/handler.py'"), "{body}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Nothing died for it: every job waits, in the queue or parked with
    // the reason, none past its first attempt.
    assert_eq!(counter(&mut c, q.stats_dead()).await, 0);
    let parked: Vec<String> = c.zrange(q.retry(), 0, -1).await.expect("zrange");
    for p in &parked {
        let job: Value = serde_json::from_str(p).expect("json");
        assert!(
            job["attempt"].as_u64().unwrap_or(0) <= 1,
            "at most the attempts spent before the pool counted as broken: {p}"
        );
    }
    assert!(
        parked.iter().any(|p| p.contains("can't open file")),
        "the parked jobs carry the handler's words: {parked:?}"
    );

    std::fs::write(&fixed, "").expect("fix the handler");
    // The next child starts after the restart backoff, and the parked jobs
    // come back after theirs.
    eventually(Duration::from_secs(60), "every job done", || {
        let mut c = c.clone();
        let key = q.stats_processed();
        async move { (counter(&mut c, key).await == N).then_some(()) }
    })
    .await;
    eventually(WAIT, "ready again", || {
        let r = worker.get("/readyz");
        async move { r.and_then(|(status, _)| (status == 200).then_some(())) }
    })
    .await;
    assert_eq!(counter(&mut c, q.stats_dead()).await, 0);
}

#[tokio::test]
async fn with_its_stderr_a_closed_pipe_the_worker_still_settles_every_job_and_drains_on_sigterm() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("unread");
    const N: usize = 5;
    push(
        &mut c,
        q.name(),
        (0..N).map(|n| json!({"id": format!("j{n}"), "task": "t"})),
    )
    .await;
    // Every attempt fails: each is logged ("attempt failed", "job
    // dead-lettered"), and each log line meets a broken pipe.
    let handler = r#"while read -r line; do echo '{"ok":false,"error":"x"}'; done"#;
    let mut args = vec!["--queue", "unread", "--concurrency", "2"];
    args.extend(["--max-attempts", "2", "--backoff-base", "50ms"]);
    args.extend(["--backoff-max", "100ms"]);
    args.extend(FAST);
    args.extend(["--handler", "exec", "--", "sh", "-c", handler]);
    let mut worker = Worker::start_with_stderr_closed(&redis, &args);

    eventually(WAIT, "every job dead-lettered", || {
        let mut c = c.clone();
        let key = q.dead();
        async move { (common::len(&mut c, &key).await == N).then_some(()) }
    })
    .await;
    assert_eq!(processing_total(&mut c, &q).await, 0, "no job stranded");
    assert_eq!(common::len(&mut c, q.name()).await, 0);

    let signalled = Instant::now();
    worker.signal("TERM");
    let status = worker.wait_exit(Duration::from_secs(5)).await;
    assert!(status.success(), "{status:?}");
    assert!(signalled.elapsed() < Duration::from_secs(5));
}

/// A worker running one job of `ms` milliseconds under the sleep handler,
/// and the queue.
async fn one_sleeping_job(
    redis: &TestRedis,
    queue: &str,
    ms: u64,
    extra: &[&str],
    log: Option<&Path>,
) -> (Worker, MultiplexedConnection, QueueKeys) {
    let mut c = redis.conn().await;
    let q = QueueKeys::new(queue);
    push(
        &mut c,
        q.name(),
        [json!({"id": "slow", "data": {"ms": ms}})],
    )
    .await;
    let mut args = vec!["--queue", queue, "--handler", "sleep"];
    args.extend(extra);
    args.extend(FAST);
    let worker = match log {
        Some(log) => Worker::start_logging(redis, &args, log),
        None => Worker::start(redis, &args, &[]),
    };
    // Running, not only taken: the signal must not come between the two.
    running(&worker, queue, 1).await;
    (worker, c, q)
}

/// Waits until `n` jobs of `queue` run in `worker` (its metrics say so).
async fn running(worker: &Worker, queue: &str, n: usize) {
    let gauge = format!("workerpool_jobs_in_flight{{queue=\"{queue}\"}} {n}");
    eventually(WAIT, &format!("{n} jobs running"), || {
        let running = worker
            .get("/metrics")
            .is_some_and(|(_, body)| body.lines().any(|l| l == gauge));
        async move { running.then_some(()) }
    })
    .await;
}

/// `signal` drains like SIGTERM: the running job finishes, then exit 0.
async fn drains_on(signal: &str) {
    let redis = TestRedis::start();
    let (mut worker, mut c, q) = one_sleeping_job(&redis, "hup", 2_000, &[], None).await;
    worker.signal(signal);
    let unready = eventually(WAIT, "readyz to report draining", || {
        let r = worker.get("/readyz");
        async move { r.filter(|(status, _)| *status == 503) }
    })
    .await;
    assert_eq!(unready.1, "draining\n");
    let status = worker.wait_exit(WAIT).await;
    assert!(status.success(), "SIG{signal}: {status:?}");
    assert_eq!(
        counter(&mut c, q.stats_processed()).await,
        1,
        "SIG{signal}: the running job finished"
    );
    assert_eq!(processing_total(&mut c, &q).await, 0);
    assert_eq!(common::len(&mut c, q.name()).await, 0);
}

#[tokio::test]
async fn sighup_drains_like_sigterm() {
    drains_on("HUP").await;
}

#[tokio::test]
async fn sigquit_drains_like_sigterm() {
    drains_on("QUIT").await;
}

#[tokio::test]
async fn a_second_signal_of_any_draining_kind_skips_the_wait() {
    let redis = TestRedis::start();
    let extra = ["--shutdown-timeout", "60s"];
    let (mut worker, mut c, q) = one_sleeping_job(&redis, "twice", 60_000, &extra, None).await;
    worker.signal("HUP");
    tokio::time::sleep(Duration::from_millis(200)).await;
    worker.signal("QUIT");
    let status = worker.wait_exit(Duration::from_secs(10)).await;
    assert!(status.success(), "{status:?}");
    assert_eq!(common::len(&mut c, q.name()).await, 1, "the job is back");
    assert_eq!(processing_total(&mut c, &q).await, 0);
}

#[tokio::test]
async fn sigusr1_logs_the_jobs_in_flight_and_the_worker_keeps_running() {
    let redis = TestRedis::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("worker.log");
    let (mut worker, mut c, q) = one_sleeping_job(&redis, "usr1", 3_000, &[], Some(&log)).await;
    worker.signal("USR1");
    let line = eventually(WAIT, "the state line", || {
        let found = lines(&log).into_iter().find(|l| l.contains("worker state"));
        async move { found }
    })
    .await;
    for part in ["draining=false", "in_flight=1", "jobs=usr1: 1 (slow "] {
        assert!(line.contains(part), "{part} in {line}");
    }
    assert!(
        worker.child.try_wait().expect("try_wait").is_none(),
        "still running"
    );
    assert_eq!(worker.get("/readyz"), Some((200, "ok\n".into())));

    worker.signal("TERM");
    let status = worker.wait_exit(WAIT).await;
    assert!(status.success(), "{status:?}");
    assert_eq!(counter(&mut c, q.stats_processed()).await, 1);
    assert_eq!(processing_total(&mut c, &q).await, 0);
}

/// A child holding all of a worker's slots: SIGTERM lets every job it holds
/// finish, then the worker exits 0 with nothing left in processing.
#[tokio::test]
async fn sigterm_drains_every_job_a_child_holding_many_has_in_hand() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("drain-many");
    let jobs: Vec<Value> = (0..8).map(|i| json!({"id": format!("d{i}")})).collect();
    push(&mut c, q.name(), jobs).await;
    // Answers each job 1.5 s after it arrived, with its id, from a thread.
    let child = r#"
import json, sys, threading, time
lock = threading.Lock()
def run(jid):
    time.sleep(1.5)
    with lock:
        sys.stdout.write(json.dumps({"id": jid, "ok": True}) + "\n"); sys.stdout.flush()
for line in sys.stdin:
    threading.Thread(target=run, args=(json.loads(line)["id"],)).start()
"#;
    let mut args = vec!["--queue", q.name(), "--concurrency", "8", "--children", "1"];
    args.extend(FAST);
    args.extend(["--shutdown-timeout", "10s", "--", "python3", "-c", child]);
    let mut worker = Worker::start(&redis, &args, &[]);
    running(&worker, q.name(), 8).await;
    worker.signal("TERM");
    let status = worker.wait_exit(WAIT).await;
    assert!(status.success(), "{status:?}");
    assert_eq!(counter(&mut c, q.stats_processed()).await, 8);
    assert_eq!(processing_total(&mut c, &q).await, 0);
    assert_eq!(common::len(&mut c, q.name()).await, 0);
}
