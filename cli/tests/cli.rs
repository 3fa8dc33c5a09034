//! The `workerpool` command line against a real `redis-server` holding a
//! seeded queue.

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use serde_json::{Value, json};
use workerpool_queue::job::{DeadLetter, DeadReason, Intake, intake};
use workerpool_queue::keys::QueueKeys;
use workerpool_queue::ops;
use workerpool_tests::{TestRedis, eventually, free_port};
use workerpool_worker::{Config, Job, Outcome, handler_fn, run_until};

const WAIT: Duration = Duration::from_secs(15);

/// Runs `workerpool` with `args` (and `stdin`), returning its output.
fn workerpool(redis_url: &str, args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_workerpool"))
        .args(args)
        .env("WORKERPOOL_REDIS_URL", redis_url)
        .env_remove("WORKERPOOL_QUEUE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn workerpool");
    let mut input = child.stdin.take().expect("stdin");
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).expect("write stdin");
    }
    drop(input);
    child.wait_with_output().expect("workerpool output")
}

/// Stdout of a successful run.
fn ok(output: Output) -> String {
    assert!(
        output.status.success(),
        "{:?}: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("utf-8")
}

/// Stderr of a failed run.
fn failed(output: Output) -> String {
    assert!(!output.status.success(), "must fail");
    assert!(output.stdout.is_empty());
    String::from_utf8(output.stderr).expect("utf-8")
}

fn json_of(output: Output) -> Value {
    serde_json::from_str(&ok(output)).expect("JSON output")
}

async fn now_ms(c: &mut MultiplexedConnection) -> u64 {
    workerpool_queue::admin::server_time_ms(c)
        .await
        .expect("time")
}

fn letter(id: &str, reason: DeadReason, error: &str, died_at: u64) -> String {
    DeadLetter {
        reason,
        error: error.into(),
        attempts: 3,
        died_at,
        worker: "w~1".into(),
        job: json!({"task": "t", "id": id, "attempt": 3, "error": error}),
        encoding: None,
        size: None,
    }
    .to_json()
}

/// A queue with 3 waiting jobs, one due and one later retry, one delayed
/// job, two dead letters, a live worker holding two jobs, a lost one
/// holding one, and counters.
async fn seed(c: &mut MultiplexedConnection, q: &QueueKeys) {
    let now = now_ms(c).await;
    for i in 0..3 {
        let _: () = c
            .lpush(q.waiting(), json!({"id": format!("w{i}")}).to_string())
            .await
            .expect("lpush");
    }
    let _: () = c
        .zadd(q.retry(), json!({"id": "r-due"}).to_string(), 0)
        .await
        .expect("zadd");
    let _: () = c
        .zadd(
            q.retry(),
            json!({"id": "r-later"}).to_string(),
            now + 3_600_000,
        )
        .await
        .expect("zadd");
    let _: () = c
        .zadd(
            q.scheduled(),
            json!({"id": "s"}).to_string(),
            now + 3_600_000,
        )
        .await
        .expect("zadd");
    for (id, error) in [("d1", "boom"), ("d2", "HTTP 404 Not Found")] {
        let _: () = c
            .lpush(
                q.dead(),
                letter(id, DeadReason::Exhausted, error, now - 5000),
            )
            .await
            .expect("lpush");
    }
    let details = [
        ("pid", "4242".to_string()),
        ("concurrency", "8".to_string()),
        ("dead_after_ms", "30000".to_string()),
    ];
    ops::heartbeat(c, q, "live~1", Duration::from_secs(60), &details)
        .await
        .expect("beat");
    let _: () = c
        .lpush(
            q.processing("live~1"),
            &[
                json!({"id": "p1"}).to_string(),
                json!({"id": "p2"}).to_string(),
            ],
        )
        .await
        .expect("lpush");
    let _: () = c
        .zadd(q.workers(), "lost~2", now - 3_600_000)
        .await
        .expect("zadd");
    let _: () = c
        .lpush(q.processing("lost~2"), json!({"id": "p3"}).to_string())
        .await
        .expect("lpush");
    let _: () = c.set(q.stats_processed(), 10).await.expect("set");
    let _: () = c.set(q.stats_failed(), 4).await.expect("set");
}

#[tokio::test]
async fn enqueue_prints_ids_and_keeps_fifo_order_from_arguments_and_stdin() {
    let redis = TestRedis::start();
    let url = redis.url();
    let q = QueueKeys::new("jobs");
    let mut c = redis.conn().await;

    let from_args = ok(workerpool(
        &url,
        &[
            "enqueue",
            "--queue",
            "jobs",
            r#"{"task":"a"}"#,
            r#"{"task":"b","id":"mine"}"#,
        ],
        None,
    ));
    let from_stdin = ok(workerpool(
        &url,
        &["enqueue", "--queue", "jobs"],
        Some("{\"task\":\"c\"}\n\n{\"task\":\"d\"}\n"),
    ));
    let ids: Vec<&str> = from_args.lines().chain(from_stdin.lines()).collect();
    assert_eq!(ids.len(), 4, "{ids:?}");
    assert_eq!(ids[1], "mine", "a producer's id is kept");

    let queued: Vec<String> = c.lrange(q.waiting(), 0, -1).await.expect("lrange");
    let oldest_first: Vec<Value> = queued
        .iter()
        .rev()
        .map(|r| serde_json::from_str(r).expect("json"))
        .collect();
    let tasks: Vec<&str> = oldest_first
        .iter()
        .map(|j| j["task"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(tasks, ["a", "b", "c", "d"], "workers take the first first");
    for (job, id) in oldest_first.iter().zip(&ids) {
        assert_eq!(job["id"], *id);
        assert!(job["enqueued_at"].is_u64(), "{job}");
    }

    let refused = failed(workerpool(
        &url,
        &["enqueue", "--queue", "jobs"],
        Some("{\"task\":\"e\"}\n[1]\n"),
    ));
    assert!(refused.contains("line 2"), "{refused}");
    let len: u64 = c.llen(q.waiting()).await.expect("llen");
    assert_eq!(len, 4, "a bad line enqueues nothing");

    let before = now_ms(&mut c).await;
    let delayed = ok(workerpool(
        &url,
        &["enqueue", "--queue", "jobs", "--delay", "1h", "{}"],
        None,
    ));
    let parked: Vec<(String, f64)> = c
        .zrange_withscores(q.scheduled(), 0, -1)
        .await
        .expect("zrange");
    assert_eq!(parked.len(), 1);
    let (payload, score) = &parked[0];
    let job: Value = serde_json::from_str(payload).expect("json");
    assert_eq!(job["id"], delayed.trim());
    assert_eq!(job["run_at"].as_f64(), Some(*score));
    assert!(*score >= (before + 3_600_000) as f64, "{score} vs {before}");
}

#[tokio::test]
async fn enqueue_prints_duplicate_for_a_job_whose_unique_key_is_held_and_refuses_a_bad_key() {
    let redis = TestRedis::start();
    let url = redis.url();
    let q = QueueKeys::new("reports");
    let mut c = redis.conn().await;

    let out = ok(workerpool(
        &url,
        &["enqueue", "--queue", "reports"],
        Some(concat!(
            "{\"task\":\"report\",\"unique_key\":\"daily\"}\n",
            "{\"task\":\"report\",\"unique_key\":\"daily\"}\n",
            "{\"task\":\"other\"}\n",
        )),
    ));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert_eq!(lines[1], "duplicate");
    assert_ne!(lines[0], "duplicate");
    assert_ne!(lines[2], "duplicate");
    let again = ok(workerpool(
        &url,
        &["enqueue", "--queue", "reports", r#"{"unique_key":"daily"}"#],
        None,
    ));
    assert_eq!(again, "duplicate\n");
    let len: u64 = c.llen(q.waiting()).await.expect("llen");
    assert_eq!(len, 2);

    let refused = failed(workerpool(
        &url,
        &["enqueue", "--queue", "reports", r#"{"unique_key":["x"]}"#],
        None,
    ));
    assert!(
        refused.contains("argument 1") && refused.contains("unique_key"),
        "{refused}"
    );
}

#[tokio::test]
async fn enqueue_traceparent_puts_the_producers_trace_on_every_job_and_refuses_a_malformed_one() {
    let redis = TestRedis::start();
    let url = redis.url();
    let q = QueueKeys::new("traced");
    let mut c = redis.conn().await;
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    ok(workerpool(
        &url,
        &[
            "enqueue",
            "--queue",
            "traced",
            "--traceparent",
            tp,
            r#"{"task":"a"}"#,
            r#"{"task":"b"}"#,
        ],
        None,
    ));
    let jobs: Vec<String> = c.lrange(q.waiting(), 0, -1).await.expect("lrange");
    assert_eq!(jobs.len(), 2);
    for job in &jobs {
        let job: Value = serde_json::from_str(job).expect("json");
        assert_eq!(job["traceparent"], tp, "{job}");
    }
    let refused = failed(workerpool(
        &url,
        &[
            "enqueue",
            "--queue",
            "traced",
            "--traceparent",
            "00-abc-01",
            r#"{"task":"c"}"#,
        ],
        None,
    ));
    assert!(
        refused.contains("--traceparent") && refused.contains("version-traceid-parentid-flags"),
        "{refused}"
    );
    let len: u64 = c.llen(q.waiting()).await.expect("llen");
    assert_eq!(len, 2, "nothing enqueued");
}

#[tokio::test]
async fn stats_reports_every_count_of_a_seeded_queue() {
    let redis = TestRedis::start();
    let q = QueueKeys::new("seeded");
    let mut c = redis.conn().await;
    seed(&mut c, &q).await;

    let s = json_of(workerpool(
        &redis.url(),
        &["stats", "--queue", "seeded", "--json", "--no-rate"],
        None,
    ));
    for (field, expected) in [
        ("waiting", json!(3)),
        ("backlog", json!(4)),
        ("in_flight", json!(2)),
        ("held_by_lost_workers", json!(1)),
        ("retries_due", json!(1)),
        ("retries_scheduled", json!(1)),
        ("scheduled", json!(1)),
        ("scheduled_due", json!(0)),
        ("dead", json!(2)),
        ("workers_live", json!(1)),
        ("workers_lost", json!(1)),
        ("processed_total", json!(10)),
        ("failed_total", json!(4)),
        ("processed_per_second", Value::Null),
        ("queue", json!("seeded")),
    ] {
        assert_eq!(s[field], expected, "{field}: {s}");
    }

    let table = ok(workerpool(
        &redis.url(),
        &["stats", "--queue", "seeded", "--interval", "100ms"],
        None,
    ));
    assert!(table.contains("waiting               3"), "{table}");
    assert!(table.contains("backlog               4"), "{table}");
    assert!(table.contains("processed rate        0.0/s"), "{table}");
}

#[tokio::test]
async fn workers_shows_each_worker_alive_or_lost_with_its_beat_age_and_jobs() {
    let redis = TestRedis::start();
    let q = QueueKeys::new("seeded");
    let mut c = redis.conn().await;
    seed(&mut c, &q).await;

    let w = json_of(workerpool(
        &redis.url(),
        &["workers", "--queue", "seeded", "--json"],
        None,
    ));
    let by_name = |name: &str| {
        w.as_array()
            .and_then(|a| a.iter().find(|x| x["instance"] == name))
            .cloned()
            .unwrap_or_else(|| panic!("{name} listed: {w}"))
    };
    let live = by_name("live~1");
    assert_eq!(live["alive"], true);
    assert_eq!(live["pid"], 4242);
    assert_eq!(live["jobs"], json!(["p2", "p1"]));
    assert!(live["last_beat_age_ms"].as_u64() < Some(30_000), "{live}");
    let lost = by_name("lost~2");
    assert_eq!(lost["alive"], false);
    assert_eq!(lost["jobs"], json!(["p3"]));
    assert!(
        lost["last_beat_age_ms"].as_u64() >= Some(3_600_000),
        "{lost}"
    );

    let table = ok(workerpool(
        &redis.url(),
        &["workers", "--queue", "seeded"],
        None,
    ));
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("INSTANCE"), "{table}");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("lost~2") && l.contains("lost") && l.contains("1h")),
        "{table}"
    );
}

// The worker runs on the test's runtime while the test waits on `workerpool`
// processes: a runtime thread of its own keeps it working meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_list_retry_brings_a_job_back_to_completion_and_purge_empties_the_list() {
    let redis = TestRedis::start();
    let url = redis.url();
    let q = QueueKeys::new("mail");
    let mut c = redis.conn().await;
    // Fails every job permanently until "fixed".
    let fixed = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(std::sync::Mutex::new(Vec::<Job>::new()));
    let handler = {
        let fixed = fixed.clone();
        let seen = seen.clone();
        handler_fn(move |job: Job| {
            seen.lock().expect("lock").push(job.clone());
            let fixed = fixed.load(Ordering::SeqCst);
            async move {
                if fixed {
                    Outcome::Done
                } else {
                    Outcome::permanent("smtp said no")
                }
            }
        })
    };
    let mut config = Config::new(url.clone(), vec!["mail".into()]);
    config.heartbeat_interval = Duration::from_millis(100);
    config.dead_after = Duration::from_millis(600);
    config.worker_id = "cli-test".into();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn(run_until(config, handler, async {
        stopped.await.ok();
    }));

    ok(workerpool(
        &url,
        &[
            "enqueue",
            "--queue",
            "mail",
            r#"{"id":"a","task":"send"}"#,
            r#"{"id":"b","task":"send"}"#,
        ],
        None,
    ));
    eventually(WAIT, "both jobs to die", || {
        let mut c = c.clone();
        let q = q.clone();
        async move { (c.llen::<_, u64>(q.dead()).await.ok()? == 2).then_some(()) }
    })
    .await;

    let listed = json_of(workerpool(
        &url,
        &["dead", "list", "--queue", "mail", "--json"],
        None,
    ));
    let ids: Vec<&str> = listed
        .as_array()
        .map(|a| a.iter().filter_map(|d| d["job"]["id"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(ids, ["b", "a"], "newest first");
    assert_eq!(listed[0]["reason"], "permanent");
    let only_a = json_of(workerpool(
        &url,
        &["dead", "list", "--queue", "mail", "--id", "a", "--json"],
        None,
    ));
    assert_eq!(only_a.as_array().map(Vec::len), Some(1));
    let table = ok(workerpool(&url, &["dead", "list", "--queue", "mail"], None));
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("a ") && l.contains("permanent") && l.contains("smtp said no")),
        "{table}"
    );

    fixed.store(true, Ordering::SeqCst);
    let retried = ok(workerpool(
        &url,
        &["dead", "retry", "--queue", "mail", "--id", "a"],
        None,
    ));
    assert_eq!(retried, "retried 1 dead job onto mail\n");
    eventually(WAIT, "the retried job to complete", || {
        let mut c = c.clone();
        let q = q.clone();
        async move {
            let done: Option<u64> = c.get(q.stats_processed()).await.ok()?;
            (done == Some(1)).then_some(())
        }
    })
    .await;
    let rerun = seen
        .lock()
        .expect("lock")
        .iter()
        .rfind(|j| j.id() == "a")
        .cloned()
        .expect("a ran again");
    assert_eq!(rerun.attempt(), 1, "a fresh start");
    assert!(rerun.get("error").is_none(), "{rerun:?}");
    let left = json_of(workerpool(
        &url,
        &["dead", "list", "--queue", "mail", "--json"],
        None,
    ));
    assert_eq!(left.as_array().map(Vec::len), Some(1), "only b stays dead");

    let purged = ok(workerpool(
        &url,
        &["dead", "purge", "--queue", "mail"],
        None,
    ));
    assert_eq!(purged, "purged 1 dead letter\n");
    let dead: u64 = c.llen(q.dead()).await.expect("llen");
    assert_eq!(dead, 0);

    stop.send(()).expect("worker running");
    worker.await.expect("task").expect("clean exit");
}

#[tokio::test]
async fn an_unreachable_redis_and_an_unknown_queue_are_clear_errors() {
    let nowhere = format!("redis://:hunter2@127.0.0.1:{}/0", free_port());
    let err = failed(workerpool(&nowhere, &["stats", "--queue", "q"], None));
    assert!(
        err.contains("cannot reach Redis at redis://:***@127.0.0.1"),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");

    let redis = TestRedis::start();
    for args in [
        &["stats", "--queue", "nope"][..],
        &["workers", "--queue", "nope"][..],
        &["dead", "list", "--queue", "nope"][..],
    ] {
        let err = failed(workerpool(&redis.url(), args, None));
        assert!(err.contains("queue \"nope\" not found"), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }

    // A TLS URL pointed at a plain server: not just "timed out".
    let plain_as_tls = format!("rediss://127.0.0.1:{}/0", redis.port());
    let err = failed(workerpool(&plain_as_tls, &["stats", "--queue", "q"], None));
    assert!(err.contains("is this port TLS?"), "{err}");
}

#[tokio::test]
async fn dead_letters_of_any_bytes_are_listed_skipped_by_retry_and_purged() {
    let redis = TestRedis::start();
    let url = redis.url();
    let q = QueueKeys::new("raw");
    let mut c = redis.conn().await;
    let Intake::Dead(letter) = intake(b"\xff\xfe{\"task\":1}", 5, 5, "w~1") else {
        panic!("bytes that are not UTF-8 are dead");
    };
    let _: () = c.lpush(q.dead(), letter.to_json()).await.expect("lpush");
    // An entry someone pushed by hand that is not even a dead letter.
    let _: () = c
        .lpush(q.dead(), b"\xfa not a letter".as_slice())
        .await
        .expect("lpush");

    let table = ok(workerpool(&url, &["dead", "list", "--queue", "raw"], None));
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    assert!(
        lines[1].contains("unreadable") && lines[1].contains(r"\xfa not a letter"),
        "{table}"
    );
    assert!(
        lines[2].contains("malformed") && lines[2].contains("payload is not UTF-8"),
        "{table}"
    );

    // The newest first, as many as asked for, and how many there are.
    let newest = ok(workerpool(
        &url,
        &["dead", "list", "--queue", "raw", "--limit", "1"],
        None,
    ));
    let lines: Vec<&str> = newest.lines().collect();
    assert_eq!(lines.len(), 3, "{newest}");
    assert!(lines[1].contains(r"\xfa not a letter"), "{newest}");
    assert_eq!(lines[2], "the 1 newest of 2 dead letters (--limit)");
    let all = ok(workerpool(
        &url,
        &["dead", "list", "--queue", "raw", "--limit", "2"],
        None,
    ));
    assert_eq!(all, table);

    let listed = json_of(workerpool(
        &url,
        &["dead", "list", "--queue", "raw", "--json"],
        None,
    ));
    assert_eq!(listed[0], json!(r"\xfa not a letter"));
    assert_eq!(listed[1]["encoding"], json!("base64"));
    let kept: DeadLetter = serde_json::from_value(listed[1].clone()).expect("a dead letter");
    assert_eq!(
        kept.raw_payload().as_deref(),
        Some(b"\xff\xfe{\"task\":1}".as_slice())
    );

    let retried = ok(workerpool(&url, &["dead", "retry", "--queue", "raw"], None));
    assert!(retried.contains("retried 0"), "{retried}");
    assert_eq!(dead_len(&mut c, &q.dead()).await, 2);
    let purged = ok(workerpool(&url, &["dead", "purge", "--queue", "raw"], None));
    assert!(purged.contains("purged 2"), "{purged}");
    assert_eq!(dead_len(&mut c, &q.dead()).await, 0);
}

async fn dead_len(c: &mut MultiplexedConnection, key: &str) -> usize {
    c.llen(key).await.expect("llen")
}

#[tokio::test]
async fn every_command_warns_on_stderr_when_redis_may_evict_jobs_and_stdout_stays_clean() {
    let redis = TestRedis::start();
    let url = redis.url();
    let mut c = redis.conn().await;
    let enqueue = |url: &str| {
        workerpool(
            url,
            &["enqueue", "--queue", "mail", r#"{"task":"t"}"#],
            None,
        )
    };
    let quiet = enqueue(&url);
    assert!(quiet.status.success());
    assert!(
        quiet.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&quiet.stderr)
    );
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("allkeys-lru")
        .query_async(&mut c)
        .await
        .expect("config set");
    for args in [
        vec!["enqueue", "--queue", "mail", r#"{"task":"t"}"#],
        vec!["stats", "--queue", "mail", "--no-rate", "--json"],
        vec!["dead", "list", "--queue", "mail"],
    ] {
        let out = workerpool(&url, &args, None);
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("warning: ")
                && stderr.contains("allkeys-lru")
                && stderr.contains("noeviction"),
            "{args:?}: {stderr}"
        );
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("allkeys"),
            "{args:?}"
        );
    }
    let stats = workerpool(
        &url,
        &["stats", "--queue", "mail", "--no-rate", "--json"],
        None,
    );
    let _: Value = serde_json::from_slice(&stats.stdout).expect("stdout is still JSON");
}

/// What a producer can put in a job: an OSC 52 clipboard write, a window
/// title, a clear screen, CR/LF, a C1 CSI, and bidi controls.
const HOSTILE: &str = "\u{1b}]52;c;ZXZpbA==\u{7}\u{1b}]0;pwned\u{7}\u{1b}[2J\r\nFAKE level=INFO all good\u{9b}31m\u{202e}gnp.exe\u{2066}\u{200f}\u{61c}";

/// A character a terminal acts on instead of showing: control characters
/// (C0, DEL, C1) and bidi controls.
fn acts_on_a_terminal(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}' | '\u{61c}')
}

/// `text` holds no character a terminal acts on but the line ends.
fn assert_terminal_safe(text: &str) {
    for line in text.lines() {
        assert!(
            !line.chars().any(acts_on_a_terminal),
            "raw control or bidi character in {line:?}"
        );
    }
    assert!(!text.contains('\r'), "{text:?}");
}

#[tokio::test]
async fn dead_list_and_workers_show_control_and_bidi_characters_escaped() {
    let redis = TestRedis::start();
    let url = redis.url();
    let q = QueueKeys::new("hostile");
    let mut c = redis.conn().await;
    let now = now_ms(&mut c).await;
    let id = format!("id-{HOSTILE}");
    let envelope = DeadLetter {
        reason: DeadReason::Permanent,
        error: format!("error-{HOSTILE}"),
        attempts: 1,
        died_at: now,
        worker: format!("w-{HOSTILE}"),
        job: json!({"id": id, "task": format!("task-{HOSTILE}")}),
        encoding: None,
        size: None,
    }
    .to_json();
    let _: () = c.lpush(q.dead(), envelope).await.expect("lpush");
    let instance = format!("worker-{HOSTILE}~1");
    ops::heartbeat(&mut c, &q, &instance, Duration::from_secs(60), &[])
        .await
        .expect("beat");
    let _: () = c
        .lpush(q.processing(&instance), json!({"id": id}).to_string())
        .await
        .expect("lpush");

    let dead = ok(workerpool(
        &url,
        &["dead", "list", "--queue", "hostile"],
        None,
    ));
    assert_terminal_safe(&dead);
    assert_eq!(dead.lines().count(), 2, "a header and one row: {dead}");
    let row = dead.lines().nth(1).unwrap_or_default();
    for shown in [
        "id-",
        "task-",
        "error-",
        r"\u{1b}]52;c;",
        r"\r\nFAKE",
        r"\u{202e}",
    ] {
        assert!(row.contains(shown), "{shown} in {row}");
    }

    let workers = ok(workerpool(&url, &["workers", "--queue", "hostile"], None));
    assert_terminal_safe(&workers);
    assert_eq!(
        workers.lines().count(),
        2,
        "a header and one row: {workers}"
    );
    let row = workers.lines().nth(1).unwrap_or_default();
    assert!(row.starts_with(r"worker-\u{1b}]52;c;"), "{row}");
    assert!(row.contains(r"id-\u{1b}]52;c;"), "{row}");

    // JSON escapes control characters itself and keeps every value whole.
    let listed = workerpool(
        &url,
        &["dead", "list", "--queue", "hostile", "--json"],
        None,
    );
    let text = ok(listed);
    assert!(!text.contains('\u{1b}') && !text.contains('\r'), "{text:?}");
    let listed: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(listed[0]["job"]["id"], json!(id));
    let w = json_of(workerpool(
        &url,
        &["workers", "--queue", "hostile", "--json"],
        None,
    ));
    assert_eq!(w[0]["instance"], json!(instance));
}

#[tokio::test]
async fn ids_and_tasks_of_70000_characters_are_shortened_in_tables_and_kept_in_json() {
    let redis = TestRedis::start();
    let url = redis.url();
    let q = QueueKeys::new("long");
    let mut c = redis.conn().await;
    let now = now_ms(&mut c).await;
    let id = "i".repeat(70_000);
    let task = "t".repeat(70_000);
    let envelope = DeadLetter {
        reason: DeadReason::Exhausted,
        error: "e".repeat(70_000),
        attempts: 3,
        died_at: now,
        worker: "w~1".into(),
        job: json!({"id": id, "task": task}),
        encoding: None,
        size: None,
    }
    .to_json();
    let _: () = c.lpush(q.dead(), envelope).await.expect("lpush");
    let _: () = c
        .lpush(
            q.dead(),
            letter("short", DeadReason::Exhausted, "boom", now),
        )
        .await
        .expect("lpush");
    let instance = format!("{}~1", "n".repeat(70_000));
    ops::heartbeat(&mut c, &q, &instance, Duration::from_secs(60), &[])
        .await
        .expect("beat");
    let _: () = c
        .lpush(q.processing(&instance), json!({"id": id}).to_string())
        .await
        .expect("lpush");

    let dead = ok(workerpool(&url, &["dead", "list", "--queue", "long"], None));
    let lines: Vec<&str> = dead.lines().collect();
    assert_eq!(lines.len(), 3, "{dead}");
    assert!(lines[1].starts_with("short "), "{dead}");
    assert!(lines[2].starts_with("iiii"), "{dead}");
    assert!(lines[2].contains("more chars]"), "the cut is said: {dead}");
    for line in &lines {
        assert!(line.chars().count() < 1_000, "{line}");
    }

    let workers = ok(workerpool(&url, &["workers", "--queue", "long"], None));
    let lines: Vec<&str> = workers.lines().collect();
    assert_eq!(lines.len(), 2, "{workers}");
    assert!(lines[1].starts_with("nnnn"), "{workers}");
    assert!(lines.iter().all(|l| l.chars().count() < 1_000), "{workers}");

    // The whole values stay in --json.
    let listed = json_of(workerpool(
        &url,
        &["dead", "list", "--queue", "long", "--json"],
        None,
    ));
    assert_eq!(listed[1]["job"]["id"], json!(id));
    assert_eq!(listed[1]["job"]["task"], json!(task));
    let w = json_of(workerpool(
        &url,
        &["workers", "--queue", "long", "--json"],
        None,
    ));
    assert_eq!(w[0]["instance"], json!(instance));
}

/// A too_large dead letter as the taking script writes it, keeping a job
/// of `len` bytes whose id is written last.
fn too_large_letter(id: &str, len: usize) -> (Vec<u8>, Vec<u8>) {
    let head = r#"{"task":"big","data":""#;
    let tail = format!(r#"","id":"{id}","enqueued_at":1767225600000}}"#);
    let job = format!("{head}{}{tail}", "x".repeat(len - head.len() - tail.len())).into_bytes();
    let mut entry = format!(
        r#"{{"reason":"too_large","error":"payload of {len} bytes is over the limit of 1000 bytes (--max-payload-bytes); it starts: \"{{\\\"task\\\"\"","attempts":0,"died_at":1767225600000,"worker":"w~1","size":{len},"encoding":"raw","job":"#
    )
    .into_bytes();
    entry.extend_from_slice(&job);
    entry.push(b'}');
    (entry, job)
}

#[tokio::test]
async fn dead_list_reads_a_huge_dead_letter_as_its_start_and_size_and_retry_and_purge_still_find_it()
 {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("huge");
    let len = 5 * 1024 * 1024;
    let (first, first_job) = too_large_letter("huge-1", len);
    let (second, _) = too_large_letter("huge-2", len);
    let _: () = c.lpush(q.dead(), &first).await.expect("lpush");
    let _: () = c.lpush(q.dead(), &second).await.expect("lpush");
    let url = redis.url();

    let table = ok(workerpool(
        &url,
        &["dead", "list", "--queue", "huge", "--limit", "1"],
        None,
    ));
    assert!(
        table.contains("huge-2") && table.contains("too_large"),
        "{table}"
    );
    assert!(!table.contains("huge-1"), "one entry: {table}");
    assert!(
        table.contains(&format!("payload of {len} bytes")),
        "{table}"
    );
    let out = workerpool(&url, &["dead", "list", "--queue", "huge", "--json"], None);
    assert!(
        out.stdout.len() < 64 * 1024,
        "{} bytes printed",
        out.stdout.len()
    );
    let listed = json_of(out);
    let entry = &listed[0];
    assert_eq!(entry["reason"], "too_large");
    assert_eq!(entry["cut"], true);
    assert_eq!(entry["entry_bytes"], json!(second.len()));
    assert_eq!(entry["size"], json!(len));
    assert!(
        entry["job"]
            .as_str()
            .is_some_and(|j| j.starts_with(r#"{"task":"big","data":"xxx"#)),
        "{entry}"
    );

    let purged = ok(workerpool(
        &url,
        &["dead", "purge", "--queue", "huge", "--id", "huge-2"],
        None,
    ));
    assert_eq!(purged, "purged 1 dead letter\n");
    let retried = ok(workerpool(
        &url,
        &["dead", "retry", "--queue", "huge", "--id", "huge-1"],
        None,
    ));
    assert!(retried.starts_with("retried 1 dead job"), "{retried}");
    assert_eq!(dead_len(&mut c, &q.dead()).await, 0);
    let back: Vec<u8> = c.lindex(q.waiting(), 0).await.expect("lindex");
    assert!(
        back == first_job,
        "the job back on the queue, byte for byte"
    );
}

/// A job enqueued with `keep`: `job wait` blocks until it is done and
/// prints what the handler returned, `job show` prints it as JSON, a dead
/// one makes `job wait` fail with its error, and a job that did not ask
/// has none.
// The worker runs on the test's runtime while the test waits on `workerpool`
// processes: a runtime thread of its own keeps it working meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_wait_prints_a_kept_jobs_result_and_job_show_its_state() {
    let redis = TestRedis::start();
    let url = redis.url();
    let handler = handler_fn(|job: Job| async move {
        match job.task() {
            Some("double") => {
                tokio::time::sleep(Duration::from_millis(300)).await;
                let n = job.data().get("n").and_then(Value::as_i64).unwrap_or(0);
                Outcome::returning(&json!({"doubled": n * 2}))
            }
            _ => Outcome::permanent("no such file: input.mp4"),
        }
    });
    let mut config = Config::new(url.clone(), vec!["{media}".into()]);
    config.heartbeat_interval = Duration::from_millis(100);
    config.worker_id = "cli-test".into();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn(run_until(config, handler, async {
        stopped.await.ok();
    }));
    ok(workerpool(
        &url,
        &[
            "enqueue",
            "--queue",
            "{media}",
            r#"{"id":"kept","task":"double","data":{"n":21},"keep":60}"#,
            r#"{"id":"broken","task":"transcode","keep":60}"#,
            r#"{"id":"forgotten","task":"double","data":{"n":1}}"#,
        ],
        None,
    ));
    let waited = tokio::task::spawn_blocking({
        let url = url.clone();
        move || {
            workerpool(
                &url,
                &[
                    "job",
                    "wait",
                    "--queue",
                    "{media}",
                    "kept",
                    "--timeout",
                    "10s",
                ],
                None,
            )
        }
    })
    .await
    .expect("job wait");
    let said = ok(waited);
    assert!(said.contains("state: done\n"), "{said}");
    assert!(said.contains(r#"result: {"doubled":42}"#), "{said}");
    let shown = json_of(workerpool(
        &url,
        &["job", "show", "--queue", "{media}", "kept", "--json"],
        None,
    ));
    assert_eq!(shown["state"], "done");
    assert_eq!(shown["result"], json!({"doubled": 42}));
    assert_eq!(shown["attempt"], 1);
    let dead = failed(workerpool(
        &url,
        &[
            "job",
            "wait",
            "--queue",
            "{media}",
            "broken",
            "--timeout",
            "10s",
        ],
        None,
    ));
    assert!(dead.contains("is dead"), "{dead}");
    assert!(dead.contains("error: no such file: input.mp4"), "{dead}");
    let none = failed(workerpool(
        &url,
        &["job", "show", "--queue", "{media}", "forgotten"],
        None,
    ));
    assert!(none.contains("no outcome is kept"), "{none}");
    let timed_out = failed(workerpool(
        &url,
        &[
            "job",
            "wait",
            "--queue",
            "{media}",
            "never-enqueued",
            "--timeout",
            "200ms",
        ],
        None,
    ));
    assert!(
        timed_out.contains("did not end within 200ms"),
        "{timed_out}"
    );
    let _ = stop.send(());
    worker.await.expect("worker task").expect("worker");
}

/// `job cancel`: a waiting job is removed and ends cancelled; a running one
/// is asked to stop, its handler sees it, and failing then it ends
/// cancelled rather than retried. A running job's progress shows in `job
/// show`. A second cancel says the job already ended; an id nobody knows
/// is refused with why.
// The worker runs on the test's runtime while the test waits on `workerpool`
// processes: a runtime thread of its own keeps it working meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_cancel_removes_a_waiting_job_and_stops_a_running_one_that_listens() {
    let redis = TestRedis::start();
    let url = redis.url();
    let handler = handler_fn(|job: Job| async move {
        for step in 0..600 {
            workerpool_worker::progress(&json!({"step": step, "of": 600}));
            if workerpool_worker::cancel_requested() {
                return Outcome::retry(format!("stopped at step {step}, as asked"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = job;
        Outcome::Done
    });
    let mut config = Config::new(url.clone(), vec!["{media}".into()]);
    config.heartbeat_interval = Duration::from_millis(100);
    config.concurrency = 1;
    config.worker_id = "cli-cancel".into();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn(run_until(config, handler, async {
        stopped.await.ok();
    }));
    ok(workerpool(
        &url,
        &[
            "enqueue",
            "--queue",
            "{media}",
            r#"{"id":"long","task":"transcode","keep":60}"#,
        ],
        None,
    ));
    let mut c = redis.conn().await;
    let q = QueueKeys::new("{media}");
    eventually(Duration::from_secs(10), "the job reports progress", || {
        let url = url.clone();
        async move {
            let shown = json_of(workerpool(
                &url,
                &["job", "show", "--queue", "{media}", "long", "--json"],
                None,
            ));
            (shown["state"] == "running" && shown["progress"]["step"].as_u64() > Some(0))
                .then_some(())
        }
    })
    .await;
    // The one slot is busy: this one waits in the queue.
    ok(workerpool(
        &url,
        &[
            "enqueue",
            "--queue",
            "{media}",
            r#"{"id":"queued","task":"transcode","keep":60}"#,
        ],
        None,
    ));
    let removed = ok(workerpool(
        &url,
        &["job", "cancel", "--queue", "{media}", "queued"],
        None,
    ));
    assert!(removed.contains("removed from the queue"), "{removed}");
    let depth: i64 = c.llen(q.waiting()).await.expect("llen");
    assert_eq!(depth, 0);
    let asked = json_of(workerpool(
        &url,
        &["job", "cancel", "--queue", "{media}", "long", "--json"],
        None,
    ));
    assert_eq!(asked, json!({"did": "requested", "state": "running"}));
    let ended = tokio::task::spawn_blocking({
        let url = url.clone();
        move || {
            workerpool(
                &url,
                &[
                    "job",
                    "wait",
                    "--queue",
                    "{media}",
                    "long",
                    "--timeout",
                    "10s",
                ],
                None,
            )
        }
    })
    .await
    .expect("job wait");
    let ended = failed(ended);
    assert!(ended.contains("is cancelled"), "{ended}");
    assert!(ended.contains("as asked"), "{ended}");
    let retries: i64 = c.zcard(q.retry()).await.expect("zcard");
    assert_eq!(retries, 0, "not retried");
    let again = failed(workerpool(
        &url,
        &["job", "cancel", "--queue", "{media}", "long"],
        None,
    ));
    assert!(again.contains("already ended: cancelled"), "{again}");
    let nobody = failed(workerpool(
        &url,
        &["job", "cancel", "--queue", "{media}", "nobody"],
        None,
    ));
    assert!(
        nobody.contains("not waiting, scheduled or retrying"),
        "{nobody}"
    );
    let _ = stop.send(());
    worker.await.expect("join").expect("worker");
}
