//! Each component run as a Redis ACL user with exactly the rules that
//! `docs/redis-acl.md` gives it: the lines are read from the page's `acl`
//! blocks, so the page and the tests cannot drift apart. Each user must do
//! all its component does; one without a required command gets a refusal
//! that names it; one without an optional command (`CLIENT ID`, `INFO`)
//! keeps working with one warning.

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use serde_json::{Map, Value, json};
use tower::ServiceExt;
use workerpool_queue::admin;
use workerpool_queue::connection::{Connection, Endpoint, Refused, Tls, refused};
use workerpool_queue::keys::QueueKeys;
use workerpool_queue::keys::slot;
use workerpool_queue::schedule::{self, Fired};
use workerpool_tests::{TestRedis, TestRedisCluster, eventually, free_port};

mod common;
use common::counter;
use workerpool_tests::http_get;

const WAIT: Duration = Duration::from_secs(20);
const DOC: &str = include_str!("../../docs/redis-acl.md");
/// The queue every line of the page is written for.
const QUEUE: &str = "jobs";

/// The rules of `user`'s line in the page's `acl` blocks (the words after
/// `ACL SETUSER <user>`).
fn rules(user: &str) -> Vec<String> {
    let mut in_block = false;
    for line in DOC.lines() {
        match line.trim() {
            "```acl" => in_block = true,
            "```" => in_block = false,
            text if in_block => {
                let words: Vec<&str> = text.split_whitespace().collect();
                if words[..2] == ["ACL", "SETUSER"] && words.get(2) == Some(&user) {
                    return words[3..].iter().map(|w| w.to_string()).collect();
                }
            }
            _ => {}
        }
    }
    panic!("docs/redis-acl.md has no acl line for {user}")
}

/// Every user the page's `acl` blocks define.
fn documented_users() -> Vec<String> {
    let mut in_block = false;
    let mut users = Vec::new();
    for line in DOC.lines() {
        match line.trim() {
            "```acl" => in_block = true,
            "```" => in_block = false,
            text if in_block => {
                let words: Vec<&str> = text.split_whitespace().collect();
                assert_eq!(words[..2], ["ACL", "SETUSER"], "{text}");
                users.push(words[2].to_string());
            }
            _ => {}
        }
    }
    users
}

/// Creates `name` with the page's rules for `user`, less `drop` and plus
/// `add`; returns its URL.
async fn user(redis: &TestRedis, user: &str, name: &str, drop: &[&str], add: &[&str]) -> String {
    let mut c = redis.conn().await;
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER").arg(name);
    for rule in rules(user) {
        if !drop.contains(&rule.as_str()) {
            cmd.arg(rule);
        }
    }
    for rule in add {
        cmd.arg(*rule);
    }
    let () = cmd.query_async(&mut c).await.expect("acl setuser");
    format!("redis://{name}:secret@127.0.0.1:{}", redis.port())
}

/// Each `+command` of `user`'s line.
fn commands(user: &str) -> Vec<String> {
    rules(user)
        .into_iter()
        .filter(|r| r.starts_with('+'))
        .collect()
}

async fn connect(url: &str) -> Connection {
    Endpoint::new(url, Tls::default())
        .expect("valid url")
        .connect(Duration::from_secs(3), Duration::from_secs(10))
        .await
        .expect("connect as the ACL user")
}

fn job(task: &str, id: &str) -> String {
    json!({"task": task, "id": id}).to_string()
}

fn object(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        other => panic!("not an object: {other}"),
    }
}

fn dead_letter(id: &str) -> String {
    json!({
        "reason": "exhausted", "error": "boom", "attempts": 2,
        "died_at": 1_700_000_000_000u64, "worker": "w~1",
        "job": {"id": id, "task": "t", "attempt": 2},
    })
    .to_string()
}

/// A queue with a bit of everything: waiting, delayed, retrying and dead
/// jobs, registered workers (one holding a job), an expired unique key,
/// and counters.
async fn populate(c: &mut MultiplexedConnection, q: &QueueKeys) {
    let _: () = c.lpush(q.waiting(), job("t", "w1")).await.expect("lpush");
    let _: () = c
        .zadd(q.scheduled(), job("t", "s1"), 9_999_999_999_999u64)
        .await
        .expect("zadd");
    let _: () = c
        .zadd(q.retry(), job("t", "r1"), 9_999_999_999_999u64)
        .await
        .expect("zadd");
    for id in ["d1", "d2", "d3"] {
        let _: () = c.lpush(q.dead(), dead_letter(id)).await.expect("lpush");
    }
    let now = common::server_time_ms(c).await;
    let _: () = c
        .zadd(q.workers(), "pod-1~00000001", now)
        .await
        .expect("zadd");
    let _: () = c
        .hset_multiple(
            q.worker("pod-1~00000001"),
            &[
                ("pid", "1"),
                ("concurrency", "2"),
                ("dead_after_ms", "30000"),
            ],
        )
        .await
        .expect("hset");
    let _: () = c
        .lpush(q.processing("pod-1~00000001"), job("t", "p1"))
        .await
        .expect("lpush");
    // A worker that has not written its details (yet, or any more).
    let _: () = c
        .zadd(q.workers(), "pod-2~00000002", now)
        .await
        .expect("zadd");
    // A unique key whose hold has expired: the next unique enqueue frees it.
    let _: () = c.zadd(q.unique_expiry(), "old-key", 1).await.expect("zadd");
    let _: () = c.hset(q.unique(), "old-key", "gone").await.expect("hset");
    let _: () = c.set(q.stats_processed(), 7).await.expect("set");
}

// ---------------------------------------------------------------- worker

struct Worker {
    child: Child,
    port: u16,
    log: tempfile::NamedTempFile,
}

impl Worker {
    /// The `workerpool-worker` binary as `url`'s user: retries after 10 ms,
    /// dead-letters at the second failure, fails jobs whose task is `fail`.
    fn start(url: &str, queues: &[&str]) -> Self {
        let port = free_port();
        let log = tempfile::NamedTempFile::new().expect("log file");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_workerpool-worker"));
        cmd.arg("--redis-url").arg(url);
        for q in queues {
            cmd.arg("--queue").arg(q);
        }
        let child = cmd
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--worker-id", "acl-worker", "--concurrency", "2"])
            .args(["--max-attempts", "2", "--backoff-base", "10ms"])
            .args(["--heartbeat-interval", "200ms", "--dead-after", "1s"])
            .args(["--handler", "exec-per-job", "--", "sh", "-c"])
            .arg(r#"if grep -q '"task":"fail"'; then echo boom >&2; exit 1; fi"#)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log.reopen().expect("log file"))
            .spawn()
            .expect("spawn workerpool-worker");
        Self { child, port, log }
    }

    fn readyz(&self) -> Option<(u16, String)> {
        http_get(self.port, "/readyz")
    }

    async fn wait_ready(&self) {
        let port = self.port;
        eventually(WAIT, "the worker to be ready", || async move {
            http_get(port, "/readyz").and_then(|(status, _)| (status == 200).then_some(()))
        })
        .await;
    }

    /// SIGTERM, the exit, and the log.
    async fn stop(mut self) -> (bool, String) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let child = &mut self.child;
        let status = eventually(WAIT, "the worker to exit", || {
            let status = child.try_wait().expect("try_wait");
            async move { status }
        })
        .await;
        let log = std::fs::read_to_string(self.log.path()).expect("read log");
        (status.success(), log)
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn wait_counter(c: &MultiplexedConnection, key: String, n: u64) {
    eventually(WAIT, &format!("{key} to reach {n}"), || {
        let (mut c, key) = (c.clone(), key.clone());
        async move { (counter(&mut c, key).await >= n).then_some(()) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_with_exactly_its_acl_takes_runs_retries_dead_letters_beats_and_reaps() {
    let redis = TestRedis::start();
    let q = QueueKeys::new(QUEUE);
    let mut c = redis.conn().await;
    let url = user(&redis, "workerpool-worker", "worker", &[], &[]).await;
    // A worker lost long ago, still holding a job: the reaper's work.
    let _: () = c
        .zadd(q.workers(), "ghost~00000000", 1)
        .await
        .expect("zadd");
    let _: () = c
        .lpush(q.processing("ghost~00000000"), job("ok", "from-ghost"))
        .await
        .expect("lpush");
    for (task, id) in [("ok", "a"), ("fail", "f"), ("ok", "b")] {
        let _: () = c.lpush(q.waiting(), job(task, id)).await.expect("lpush");
    }
    let worker = Worker::start(&url, &[QUEUE]);
    worker.wait_ready().await;
    wait_counter(&c, q.stats_recovered(), 1).await;
    wait_counter(&c, q.stats_processed(), 3).await;
    wait_counter(&c, q.stats_dead(), 1).await;
    // The queue is empty now: the next job arrives during a blocking wait.
    let _: () = c
        .lpush(q.waiting(), job("ok", "late"))
        .await
        .expect("lpush");
    wait_counter(&c, q.stats_processed(), 4).await;
    // A job over 256 KiB, which the worker stamps itself and the scripts
    // find by its length and digest (named.lua), with the same commands.
    let large = format!(
        r#"{{"task":"ok","id":"large","data":"{}"}}"#,
        "x".repeat(300 * 1024)
    );
    let _: () = c.lpush(q.waiting(), large).await.expect("lpush");
    wait_counter(&c, q.stats_processed(), 5).await;
    // A delayed job is promoted when due.
    let now = common::server_time_ms(&mut c).await;
    let _: () = c
        .zadd(q.scheduled(), job("ok", "delayed"), now + 300)
        .await
        .expect("zadd");
    wait_counter(&c, q.stats_processed(), 6).await;

    assert_eq!(
        counter(&mut c, q.stats_failed()).await,
        2,
        "two attempts of f"
    );
    let dead: Vec<String> = c.lrange(q.dead(), 0, -1).await.expect("dead");
    assert_eq!(dead.len(), 1);
    assert!(dead[0].contains(r#""id":"f""#), "{dead:?}");
    let workers: Vec<(String, f64)> = c
        .zrange_withscores(q.workers(), 0, -1)
        .await
        .expect("workers");
    assert_eq!(workers.len(), 1, "the ghost is reaped: {workers:?}");
    assert!(workers[0].0.starts_with("acl-worker~"), "{workers:?}");
    let beat = workers[0].1 as u64;
    let now = common::server_time_ms(&mut c).await;
    assert!(
        now.saturating_sub(beat) < 1000,
        "a heartbeat {}ms old",
        now - beat
    );
    let (status, body) = worker.readyz().expect("readyz answers");
    assert_eq!((status, body.trim()), (200, "ok"));

    let (clean, log) = worker.stop().await;
    assert!(clean, "the worker exits cleanly:\n{log}");
    for refusal in ["NOPERM", "may not run", "redis command"] {
        assert!(!log.contains(refusal), "{refusal} in the log:\n{log}");
    }
    let held: usize = c.llen(q.waiting()).await.expect("llen");
    assert_eq!(held, 0, "no job left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_client_id_and_info_a_worker_runs_with_one_warning_for_each() {
    let redis = TestRedis::start();
    let q = QueueKeys::new(QUEUE);
    let other = QueueKeys::new("more");
    let mut c = redis.conn().await;
    // Two queues: two blocking connections, each of which would ask for
    // its CLIENT ID.
    let url = user(
        &redis,
        "workerpool-worker-minimal",
        "minimal",
        &[],
        &["~more", "~more:*"],
    )
    .await;
    let worker = Worker::start(&url, &[QUEUE, "more"]);
    worker.wait_ready().await;
    for round in 0..3 {
        // Jobs that arrive during blocking waits, on either queue.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let _: () = c
            .lpush(q.waiting(), job("ok", &format!("j{round}")))
            .await
            .expect("lpush");
        let _: () = c
            .lpush(other.waiting(), job("ok", &format!("m{round}")))
            .await
            .expect("lpush");
    }
    wait_counter(&c, q.stats_processed(), 3).await;
    wait_counter(&c, other.stats_processed(), 3).await;
    let (status, _) = worker.readyz().expect("readyz answers");
    assert_eq!(status, 200);
    let (clean, log) = worker.stop().await;
    assert!(clean, "the worker exits cleanly:\n{log}");
    let client = log
        .matches("may not run CLIENT ID or CLIENT UNBLOCK")
        .count();
    assert_eq!(client, 1, "one warning about CLIENT ID:\n{log}");
    let info = log.matches("may not run INFO").count();
    assert_eq!(info, 1, "one warning about INFO:\n{log}");
    assert!(log.contains("+client|id"), "says what to grant:\n{log}");
    assert!(!log.contains("redis command failed"), "{log}");
    assert!(!log.contains("redis command refused"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minimal_worker_promptly_runs_the_job_waiting_at_its_first_wait_and_those_that_follow() {
    let redis = TestRedis::start();
    let q = QueueKeys::new(QUEUE);
    let mut c = redis.conn().await;
    let url = user(&redis, "workerpool-worker-minimal", "minimal", &[], &[]).await;
    // Started on an empty queue, the worker's first fetch finds nothing
    // and it prepares its first blocking wait, blocking 10 ms on the
    // probe key first: a job pushed then is waiting when the wait would be
    // sent, and a wait sent with a refused CLIENT REPLY SKIP would still
    // move it into the processing list, with no reply to say so. (No job
    // of this worker ends meanwhile, whose settlement could take it first.)
    let worker = Worker::start(&url, &[QUEUE]);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let clients: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query_async(&mut c)
            .await
            .expect("client list");
        let probing = clients.lines().any(|l| {
            l.contains(" user=minimal ") && l.contains(" flags=b ") && l.contains(" cmd=blmove ")
        });
        if probing {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the worker never blocked before its first wait"
        );
    }
    let _: () = c
        .lpush(q.waiting(), job("ok", "at-first-wait"))
        .await
        .expect("lpush");
    for id in ["after-1", "after-2"] {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let _: () = c.lpush(q.waiting(), job("ok", id)).await.expect("lpush");
    }
    // Promptly: polling every 100 ms, not after some later recovery.
    eventually(Duration::from_secs(3), "every job done", || {
        let (mut c, key) = (c.clone(), q.stats_processed());
        async move { (counter(&mut c, key).await == 3).then_some(()) }
    })
    .await;
    let instance = held_by(&mut c, &q).await;
    let held: usize = c.llen(q.processing(&instance)).await.expect("llen");
    assert_eq!(held, 0, "nothing sits in the processing list");
    let (clean, log) = worker.stop().await;
    assert!(clean, "the worker exits cleanly:\n{log}");
    assert_eq!(
        log.matches("may not run CLIENT REPLY").count(),
        1,
        "one warning about CLIENT REPLY:\n{log}"
    );
    assert!(!log.contains("that it does not run"), "{log}");
}

/// The instance of the one worker registered on `q`.
async fn held_by(c: &mut MultiplexedConnection, q: &QueueKeys) -> String {
    let workers: Vec<String> = c.zrange(q.workers(), 0, -1).await.expect("workers");
    assert_eq!(workers.len(), 1, "{workers:?}");
    workers[0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_refused_a_command_inside_a_script_is_unready_naming_it_until_granted() {
    let redis = TestRedis::start();
    let q = QueueKeys::new(QUEUE);
    let mut c = redis.conn().await;
    let url = user(&redis, "workerpool-worker", "no-rpop", &["+rpop"], &[]).await;
    let _: () = c.lpush(q.waiting(), job("ok", "a")).await.expect("lpush");
    let worker = Worker::start(&url, &[QUEUE]);
    let port = worker.port;
    let body = eventually(WAIT, "readyz to name RPOP", || async move {
        http_get(port, "/readyz")
            .and_then(|(status, body)| (status == 503 && body.contains("RPOP")).then_some(body))
    })
    .await;
    assert!(body.contains("+rpop"), "{body}");
    assert!(body.contains("docs/redis-acl.md"), "{body}");
    // Other operations (heartbeats) keep succeeding: still unready.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (status, again) = worker.readyz().expect("readyz answers");
    assert_eq!(status, 503, "{again}");
    let waiting: usize = c.llen(q.waiting()).await.expect("llen");
    assert_eq!(waiting, 1, "the job stays on the queue");

    // Granting the command is enough.
    let () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("no-rpop")
        .arg("+rpop")
        .query_async(&mut c)
        .await
        .expect("acl setuser");
    wait_counter(&c, q.stats_processed(), 1).await;
    worker.wait_ready().await;
    let (_, log) = worker.stop().await;
    let logged = log.matches("redis command refused").count();
    assert_eq!(logged, 1, "the refusal is logged once:\n{log}");
}

// --------------------------------------------------------- command line

/// Runs the `workerpool` binary; its exit status, stdout and stderr.
fn cli(url: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(workerpool_tests::bin_dir().join("workerpool"))
        .args(args)
        .args(["--redis-url", url, "--queue", QUEUE])
        .stdin(Stdio::null())
        .output()
        .expect("run workerpool");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ok(url: &str, args: &[&str]) -> String {
    let (success, out, err) = cli(url, args);
    assert!(success, "workerpool {args:?} failed: {err}");
    assert!(!err.contains("warning"), "workerpool {args:?}: {err}");
    out
}

/// What each group of subcommands does, run as `url`'s user.
async fn enqueue_commands(url: &str, c: &mut MultiplexedConnection, q: &QueueKeys) {
    let before: usize = c.llen(q.waiting()).await.expect("llen");
    let out = ok(url, &["enqueue", r#"{"task":"t","id":"e1"}"#]);
    assert_eq!(out.trim(), "e1");
    ok(url, &["enqueue", "--delay", "1h", r#"{"task":"t"}"#]);
    let unique = r#"{"task":"t","unique_key":"u1"}"#;
    ok(url, &["enqueue", unique]);
    assert_eq!(ok(url, &["enqueue", unique]).trim(), "duplicate");
    // A job that keeps its outcome is written waiting as it goes in.
    ok(url, &["enqueue", r#"{"task":"t","id":"k1","keep":60}"#]);
    let state: Option<String> = c.hget(q.outcome("k1"), "state").await.expect("hget");
    assert_eq!(state.as_deref(), Some("waiting"));
    let after: usize = c.llen(q.waiting()).await.expect("llen");
    assert_eq!(after, before + 3);
}

/// `job cancel` of a waiting kept job, then `job show` and `job wait` of it.
async fn cancel_commands(url: &str, c: &mut MultiplexedConnection, q: &QueueKeys) {
    ok(url, &["enqueue", r#"{"task":"t","id":"c1","keep":60}"#]);
    let cancelled = ok(url, &["job", "cancel", "c1"]);
    assert!(cancelled.contains("removed from the queue"), "{cancelled}");
    let shown = ok(url, &["job", "show", "c1"]);
    assert!(shown.contains("state: cancelled"), "{shown}");
    let state: Option<String> = c.hget(q.outcome("c1"), "state").await.expect("hget");
    assert_eq!(state.as_deref(), Some("cancelled"));
}

async fn read_commands(url: &str) {
    let stats: Value =
        serde_json::from_str(&ok(url, &["stats", "--json", "--no-rate"])).expect("stats JSON");
    assert!(stats["dead"].as_u64().is_some(), "{stats}");
    let workers = ok(url, &["workers"]);
    assert!(workers.contains("pod-1~00000001"), "{workers}");
    let dead = ok(url, &["dead", "list", "--limit", "1"]);
    assert!(dead.contains("d3"), "{dead}");
    ok(url, &["dead", "list", "--id", "d1"]);
}

async fn dead_commands(url: &str, c: &mut MultiplexedConnection, q: &QueueKeys) {
    ok(url, &["dead", "list"]);
    let retried = ok(url, &["dead", "retry", "--id", "d1"]);
    assert!(retried.contains("retried 1"), "{retried}");
    let removed = ok(url, &["dead", "purge", "--id", "d2"]);
    assert!(removed.contains("purged 1"), "{removed}");
    let all = ok(url, &["dead", "retry"]);
    assert!(all.contains("retried 1"), "{all}");
    let _: () = c.lpush(q.dead(), dead_letter("d4")).await.expect("lpush");
    let purged = ok(url, &["dead", "purge"]);
    assert!(purged.contains("purged 1"), "{purged}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_command_line_user_runs_its_subcommands() {
    let redis = TestRedis::start();
    let q = QueueKeys::new(QUEUE);
    let mut c = redis.conn().await;

    populate(&mut c, &q).await;
    let url = user(&redis, "workerpool-cli-read", "cli-read", &[], &[]).await;
    read_commands(&url).await;
    let url = user(&redis, "workerpool-cli-enqueue", "cli-enqueue", &[], &[]).await;
    enqueue_commands(&url, &mut c, &q).await;
    let url = user(&redis, "workerpool-cli-dead", "cli-dead", &[], &[]).await;
    dead_commands(&url, &mut c, &q).await;

    let _: () = redis::cmd("FLUSHALL")
        .query_async(&mut c)
        .await
        .expect("flush");
    populate(&mut c, &q).await;
    let url = user(&redis, "workerpool-cli", "cli", &[], &[]).await;
    read_commands(&url).await;
    enqueue_commands(&url, &mut c, &q).await;
    dead_commands(&url, &mut c, &q).await;
    cancel_commands(&url, &mut c, &q).await;

    // A read-only user is refused the write, with the command to grant.
    let url = user(&redis, "workerpool-cli-read", "cli-read", &[], &[]).await;
    let (success, _, err) = cli(&url, &["dead", "purge"]);
    assert!(!success);
    assert!(
        err.contains("may not run") && err.contains("docs/redis-acl.md"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_read_only_users_may_run_no_script_at_all() {
    let redis = TestRedis::start();
    let q = QueueKeys::new(QUEUE);
    for (doc_user, name) in [
        ("workerpool-cli-read", "cli-read"),
        ("workerpool-dashboard-read", "dash-read"),
    ] {
        let url = user(&redis, doc_user, name, &[], &[]).await;
        let mut c = connect(&url).await;
        // A script that would hold Redis for as long as it runs.
        let busy = "while true do end";
        let loaded: redis::RedisResult<String> = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(busy)
            .query_async(&mut c)
            .await;
        let refusal = loaded.expect_err("SCRIPT LOAD is refused");
        assert_eq!(refusal.code(), Some("NOPERM"), "{name}: {refusal}");
        for command in ["EVALSHA", "EVAL", "FCALL"] {
            let mut cmd = redis::cmd(command);
            match command {
                "EVALSHA" => cmd.arg("a42059b356c875f0717db19a51f6aaca9ae659ea"),
                "EVAL" => cmd.arg(busy),
                _ => cmd.arg("f"),
            };
            let ran: redis::RedisResult<redis::Value> =
                cmd.arg(1).arg(q.waiting()).query_async(&mut c).await;
            let refusal = ran.expect_err("refused");
            assert_eq!(
                refused(&refusal),
                Some(Refused::Command(Some(command.to_ascii_lowercase()))),
                "{name}: {refusal}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_info_the_command_line_says_why_it_cannot_check_the_eviction_policy() {
    let redis = TestRedis::start();
    let q = QueueKeys::new(QUEUE);
    let mut c = redis.conn().await;
    populate(&mut c, &q).await;
    let url = user(&redis, "workerpool-cli-read", "no-info", &["+info"], &[]).await;
    let (success, _, err) = cli(&url, &["stats", "--no-rate"]);
    assert!(success, "{err}");
    assert_eq!(err.matches("warning").count(), 1, "{err}");
    assert!(
        err.contains("may not run INFO") && err.contains("+info"),
        "{err}"
    );
}

// ------------------------------------------------------------- operator

/// What the operator reads and writes on a queue, through the functions
/// it calls: the snapshot it scales on, the eviction policy, the newest
/// dead letter, and a schedule's fires. Returns the first error.
async fn operator_round(url: &str) -> redis::RedisResult<()> {
    let mut conn = connect(url).await;
    let q = QueueKeys::new(QUEUE);
    let snap = workerpool_queue::snapshot::read(&mut conn, std::slice::from_ref(&q)).await?;
    assert_eq!(snap.queues[0].dead, 3);
    assert_eq!(snap.queues[0].workers.len(), 2);
    let memory = workerpool_queue::memory::read(&mut conn, &q).await?;
    let dead = admin::dead_letters(&mut conn, &q, None, Some(1)).await?;
    assert_eq!(dead[0].job_id(), Some("d3"));
    let now = admin::server_time_ms(&mut conn).await? as i64;
    let fire = |id: &str| {
        object(json!({"task": "report", "id": id, "unique_key": "report", "unique_for": 60}))
    };
    let fired = schedule::fire(&mut conn, &q, "ns/pool/daily", now, &fire("s-1")).await?;
    assert_eq!(fired, Fired::Enqueued);
    let again = schedule::fire(&mut conn, &q, "ns/pool/daily", now + 1, &fire("s-2")).await?;
    assert_eq!(
        again,
        Fired::Refused,
        "the previous fire's job holds the key"
    );
    let plain = object(json!({"task": "report", "id": "h-1"}));
    schedule::fire(&mut conn, &q, "ns/pool/hourly", now, &plain).await?;
    assert_eq!(
        schedule::last_fire(&mut conn, &q, "ns/pool/daily").await?,
        Some(now + 1)
    );
    let forgotten = schedule::forget_fires(&mut conn, &q, "ns/pool/", &["daily"]).await?;
    assert_eq!(forgotten, 1);
    assert_eq!(memory.policy.as_deref(), Some("noeviction"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_user_reads_queues_and_fires_schedules_and_needs_every_command() {
    let redis = TestRedis::start();
    let q = QueueKeys::new(QUEUE);
    let mut c = redis.conn().await;
    populate(&mut c, &q).await;
    let url = user(&redis, "workerpool-operator", "operator", &[], &[]).await;
    operator_round(&url).await.expect("the operator's round");

    // Without INFO: the policy is unknown and says why.
    let url = user(&redis, "workerpool-operator", "no-info", &["+info"], &[]).await;
    let memory = workerpool_queue::memory::read(&mut connect(&url).await, &q)
        .await
        .expect("a refused INFO is no error");
    assert!(memory.info_refused);
    let warning = memory.warning().expect("a warning");
    assert!(warning.contains("may not run INFO"), "{warning}");

    // Every other command is needed: without it, a refusal naming it.
    for command in commands("workerpool-operator") {
        if command == "+info" {
            continue;
        }
        let _: () = redis::cmd("FLUSHALL")
            .query_async(&mut c)
            .await
            .expect("flush");
        // Scripts loaded by earlier rounds would spare SCRIPT LOAD.
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut c)
            .await
            .expect("script flush");
        populate(&mut c, &q).await;
        let name = format!(
            "operator-{}",
            command.trim_start_matches('+').replace('|', "-")
        );
        let url = user(&redis, "workerpool-operator", &name, &[&command], &[]).await;
        let error = operator_round(&url)
            .await
            .expect_err(&format!("the operator works without {command}"));
        let shown = workerpool_queue::connection::describe(&error);
        let bare = command.trim_start_matches('+');
        assert_eq!(
            refused(&error),
            Some(Refused::Command(Some(bare.to_string()))),
            "{shown}"
        );
        assert!(
            shown.contains(&format!("grant it with {command}")),
            "{shown}"
        );
    }
}

// ------------------------------------------------------------ dashboard

async fn send(app: &axum::Router, req: Request<Body>) -> (StatusCode, String) {
    let resp = app.clone().oneshot(req).await.expect("router answers");
    let status = resp.status();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

async fn get(app: &axum::Router, uri: &str) -> (StatusCode, String) {
    send(app, Request::get(uri).body(Body::empty()).expect("request")).await
}

async fn post(app: &axum::Router, uri: &str, form: &str) -> (StatusCode, String) {
    let req = Request::post(uri)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(form.to_string()))
        .expect("request");
    send(app, req).await
}

fn csrf(page: &str) -> String {
    let marker = r#"name="csrf" value=""#;
    let at = page.find(marker).expect("a form with a csrf field") + marker.len();
    page[at..].split('"').next().unwrap_or_default().to_string()
}

async fn dashboard(url: &str, read_only: bool) -> axum::Router {
    let options = workerpool_dashboard::Options {
        read_only,
        redis_label: "redis://127.0.0.1".into(),
        ..workerpool_dashboard::Options::default()
    };
    workerpool_dashboard::Dashboard::new(connect(url).await, vec![QueueKeys::new(QUEUE)], options)
        .router()
}

/// Every page and JSON route of the dashboard answers 200 (no banner).
async fn every_read(app: &axum::Router) {
    for uri in [
        "/",
        "/api/overview",
        "/queues/jobs",
        "/api/queues/jobs",
        "/queues/jobs/waiting",
        "/queues/jobs/scheduled",
        "/queues/jobs/retries",
        "/queues/jobs/dead",
        "/api/queues/jobs/dead",
    ] {
        let (status, body) = get(app, uri).await;
        assert_eq!(status, StatusCode::OK, "{uri}: {body}");
        assert!(!body.contains("may not"), "{uri}: {body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_users_read_everything_and_only_the_writer_acts() {
    let redis = TestRedis::start();
    let q = QueueKeys::new(QUEUE);
    let mut c = redis.conn().await;
    populate(&mut c, &q).await;

    let url = user(&redis, "workerpool-dashboard-read", "dash-read", &[], &[]).await;
    every_read(&dashboard(&url, true).await).await;
    // The same user behind a dashboard with buttons: Redis refuses the
    // action, and the page names the command.
    let app = dashboard(&url, false).await;
    let token = csrf(&get(&app, "/queues/jobs").await.1);
    let (status, body) = post(&app, "/queues/jobs/dead/purge", &format!("csrf={token}")).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert!(body.contains("may not run"), "{body}");
    let dead: usize = c.llen(q.dead()).await.expect("llen");
    assert_eq!(dead, 3);

    let url = user(&redis, "workerpool-dashboard", "dash", &[], &[]).await;
    let app = dashboard(&url, false).await;
    every_read(&app).await;
    let token = csrf(&get(&app, "/queues/jobs").await.1);
    let (status, body) = post(
        &app,
        "/queues/jobs/dead/retry",
        &format!("csrf={token}&id=d1"),
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    let (status, body) = post(
        &app,
        "/queues/jobs/dead/purge",
        &format!("csrf={token}&id=d2"),
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    let (status, body) = post(&app, "/queues/jobs/dead/purge", &format!("csrf={token}")).await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    let dead: usize = c.llen(q.dead()).await.expect("llen");
    assert_eq!(dead, 0);
}

// -------------------------------------------------------------- cluster

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_the_lines_work_for_a_hash_tagged_queue_with_the_cluster_extras() {
    let cluster = TestRedisCluster::start(3, 0);
    let q = QueueKeys::new("{jobs}");
    let node = cluster.primary_not_owning(slot(q.name()));
    // ACL users are per node: each node gets them, patterns for `{jobs}`.
    let setuser = |doc_user: &str, name: &str, extras: &[&str]| {
        for n in 0..cluster.len() {
            let mut cmd = redis::cmd("ACL");
            cmd.arg("SETUSER").arg(name);
            for rule in rules(doc_user) {
                cmd.arg(rule.replace("jobs", "{jobs}"));
            }
            for extra in extras {
                cmd.arg(*extra);
            }
            let () = cluster.on_node(n, &cmd);
        }
        cluster
            .url(node)
            .replace("redis://", &format!("redis://{name}:secret@"))
    };
    let extras = ["+cluster|slots", "+ping"];
    let cli_url = setuser("workerpool-cli", "cli", &extras);
    let worker_url = setuser("workerpool-worker", "worker", &extras);
    let without = setuser("workerpool-cli", "no-slots", &["+ping"]);

    let run = |url: &str, args: &[&str]| {
        Command::new(workerpool_tests::bin_dir().join("workerpool"))
            .args(args)
            .args(["--redis-url", url, "--queue", q.name()])
            .env_remove("WORKERPOOL_REDIS_MODE")
            .stdin(Stdio::null())
            .output()
            .expect("run workerpool")
    };
    let out = run(&cli_url, &["enqueue", r#"{"task":"ok","id":"c1"}"#]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let worker = Worker::start(&worker_url, &[q.name()]);
    worker.wait_ready().await;
    let mut c = cluster.conn().await;
    eventually(WAIT, "the job processed", || {
        let mut c = c.clone();
        let key = q.stats_processed();
        async move {
            let n: Option<u64> = c.get(key).await.expect("get");
            (n == Some(1)).then_some(())
        }
    })
    .await;
    let out = run(&cli_url, &["stats", "--json", "--no-rate"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stats: Value = serde_json::from_slice(&out.stdout).expect("stats JSON");
    assert_eq!(stats["processed_total"], 1, "{stats}");
    let (clean, log) = worker.stop().await;
    assert!(clean, "{log}");
    assert!(
        !log.contains("NOPERM") && !log.contains("may not run"),
        "{log}"
    );
    let dead: usize = c.llen(q.dead()).await.expect("llen");
    assert_eq!(dead, 0);

    // Without CLUSTER SLOTS the client cannot learn the slots: refused.
    let out = run(&without, &["stats", "--no-rate"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("may not run CLUSTER SLOTS") && err.contains("+cluster|slots"),
        "{err}"
    );
}

// ------------------------------------------------------------ the page

/// The commands inside the scripts each component runs, read from the
/// scripts themselves: a command added to a script and not to the page
/// fails here, and so does a command on the page that nothing uses.
#[test]
fn every_line_grants_the_commands_of_its_scripts_and_nothing_unused() {
    let script = |name: &str| -> BTreeSet<String> {
        let path = format!("{}/../queue/src/lua/{name}.lua", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).expect("read script");
        text.match_indices("call(")
            .filter_map(|(at, _)| {
                let rest = text[at + 5..].trim_start();
                let rest = rest.strip_prefix('\'')?;
                Some(format!(
                    "+{}",
                    rest.split('\'').next()?.to_ascii_lowercase()
                ))
            })
            .collect()
    };
    let union = |names: &[&str], direct: &[&str]| -> BTreeSet<String> {
        let mut all: BTreeSet<String> = names.iter().flat_map(|n| script(n)).collect();
        all.extend(direct.iter().map(|d| d.to_string()));
        all.extend(["+evalsha".to_string(), "+script|load".to_string()]);
        all
    };
    // Commands sent as they are, without a script.
    let plain = |direct: &[&[&str]]| -> BTreeSet<String> {
        direct
            .iter()
            .flat_map(|d| d.iter())
            .map(|d| d.to_string())
            .collect()
    };
    // admin::dead_page: the list's length, then each entry by its place.
    let dead_page = ["+llen", "+lindex"];
    // snapshot::read: the clock and the registry, then one transaction.
    let snapshot = [
        "+time", "+zrange", "+multi", "+llen", "+zcount", "+zcard", "+get", "+lindex", "+exists",
        "+hget", "+exec",
    ];
    let prelude = ["guard", "now", "clock", "outcome"];
    let worker = union(
        &[
            &prelude[..],
            &[
                "stamp",
                "rate",
                "take",
                "unique",
                "fetch",
                "settle_intake",
                "settle",
                "give_back",
                "promote",
                "heartbeat",
                "reap",
                "deregister",
                "start",
                "progress",
            ],
        ]
        .concat(),
        // outcome::cancel_requested: one HEXISTS per running kept job.
        &[
            "+blmove",
            "+lrange",
            "+zrange",
            "+zrangebyscore",
            "+hexists",
        ],
    );
    let optional = ["+client|id", "+client|unblock", "+client|reply", "+info"];
    let with = |set: &BTreeSet<String>, extra: &[&str]| -> BTreeSet<String> {
        let mut all = set.clone();
        all.extend(extra.iter().map(|e| e.to_string()));
        all
    };
    let read = plain(&[
        &snapshot,
        &dead_page,
        &[
            "+exists", "+time", "+zrange", "+hgetall", "+lrange", "+llen",
        ],
    ]);
    let enqueue = union(
        &["guard", "now", "outcome", "enqueue"],
        &["+time", "+lpush", "+zadd"],
    );
    let dead = union(
        &["guard", "now", "resurrect", "purge", "remove", "dead_pick"],
        &[&dead_page[..], &["+exists", "+time", "+llen"]].concat(),
    );
    // fire.lua enqueues no job that keeps its outcome: the outcome piece
    // it carries never runs for the operator, which needs none of it.
    let operator = union(
        &["guard", "now", "enqueue", "fire"],
        &[&snapshot[..], &dead_page, &["+hkeys", "+hdel", "+hget"]].concat(),
    );
    // outcome::read and outcome::wait (`job show`, `job wait`).
    let job = plain(&[&["+hgetall", "+xread"]]);
    // outcome::cancel (`job cancel`).
    let cancel = union(&["guard", "now", "unique", "outcome", "cancel"], &[]);
    let cli: BTreeSet<String> = read
        .iter()
        .chain(&enqueue)
        .chain(&dead)
        .chain(&job)
        .chain(&cancel)
        .cloned()
        .collect();
    let cli_read: BTreeSet<String> = read.iter().chain(&job).cloned().collect();
    let dashboard: BTreeSet<String> = read.iter().chain(&dead).cloned().collect();
    let local: BTreeSet<String> = worker
        .iter()
        .chain(&operator)
        .chain(&dashboard)
        .cloned()
        .collect();
    let expected = [
        ("workerpool-worker", with(&worker, &optional)),
        ("workerpool-worker-minimal", worker.clone()),
        ("workerpool-operator", with(&operator, &["+info"])),
        ("workerpool-cli", with(&cli, &["+info"])),
        ("workerpool-cli-read", with(&cli_read, &["+info"])),
        ("workerpool-cli-enqueue", with(&enqueue, &["+info"])),
        ("workerpool-cli-dead", with(&dead, &["+info"])),
        ("workerpool-dashboard", with(&dashboard, &["+info"])),
        ("workerpool-dashboard-read", with(&read, &["+info"])),
        ("workerpool-local", with(&local, &optional)),
    ];
    let names: Vec<&str> = expected.iter().map(|(n, _)| *n).collect();
    assert_eq!(documented_users(), names, "the page's users");
    for (user, want) in expected {
        let granted: BTreeSet<String> = commands(user).into_iter().collect();
        assert_eq!(granted, want, "{user}: the page grants {granted:?}");
        let rules = rules(user);
        for rule in [
            "on",
            ">secret",
            "resetkeys",
            "~jobs",
            "~jobs:*",
            "resetchannels",
            "-@all",
        ] {
            assert!(rules.contains(&rule.to_string()), "{user} lacks {rule}");
        }
    }
}
