//! The http and exec-per-job handlers and the Rust API, end to end: a real
//! `redis-server` per test, a real HTTP server for the http handler.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use serde_json::{Value, json};
use workerpool_queue::keys::QueueKeys;
use workerpool_tests::{TestRedis, eventually, free_port};
use workerpool_worker::handlers::http::{HttpHandler, JOB_ID_HEADER};
use workerpool_worker::{Config, Handler, Job, Metrics, Outcome, Shutdown, run};

#[path = "../examples/rust_handler.rs"]
#[allow(dead_code)]
mod example;

const WAIT: Duration = Duration::from_secs(15);

/// What the test server saw.
#[derive(Default)]
struct Seen {
    /// (job id header, body) per request.
    requests: Vec<(String, Value)>,
    /// Client addresses, one per TCP connection.
    peers: BTreeSet<SocketAddr>,
}

/// A receiver that answers each job with `data.status` (200 by default),
/// the body `data.body`, after `data.sleep_ms`.
async fn serve_jobs() -> (String, Arc<Mutex<Seen>>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    async fn receive(
        State(seen): State<Arc<Mutex<Seen>>>,
        ConnectInfo(peer): ConnectInfo<SocketAddr>,
        headers: HeaderMap,
        body: String,
    ) -> (StatusCode, String) {
        let job: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        let id = headers
            .get(JOB_ID_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        {
            let mut seen = seen.lock().expect("lock");
            seen.requests.push((id, job.clone()));
            seen.peers.insert(peer);
        }
        let data = &job["data"];
        if let Some(ms) = data["sleep_ms"].as_u64() {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        let status = data["status"].as_u64().unwrap_or(200) as u16;
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::IM_A_TEAPOT);
        (
            status,
            data["body"].as_str().unwrap_or_default().to_string(),
        )
    }
    let app = Router::new()
        .route("/jobs", post(receive))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .expect("serve");
    });
    (format!("http://{addr}/jobs"), seen)
}

fn config(redis: &TestRedis, queue: &str) -> Config {
    let mut c = Config::new(redis.url(), vec![queue.to_string()]);
    c.heartbeat_interval = Duration::from_millis(100);
    c.dead_after = Duration::from_millis(600);
    c.backoff_base = Duration::from_millis(10);
    c.backoff_max = Duration::from_millis(20);
    c.shutdown_timeout = Duration::from_secs(2);
    c.worker_id = "handler-test".into();
    c
}

async fn push(c: &mut MultiplexedConnection, queue: &str, jobs: &[Value]) {
    for j in jobs {
        let _: i64 = c.lpush(queue, j.to_string()).await.expect("lpush");
    }
}

async fn counter(c: &mut MultiplexedConnection, key: String) -> u64 {
    let v: Option<u64> = c.get(key).await.expect("get");
    v.unwrap_or(0)
}

/// Dead letters by job id.
async fn dead_by_id(c: &mut MultiplexedConnection, q: &QueueKeys) -> Vec<(String, Value)> {
    let raw: Vec<String> = c.lrange(q.dead(), 0, -1).await.expect("lrange");
    raw.iter()
        .map(|r| serde_json::from_str::<Value>(r).expect("dead letters are JSON"))
        .map(|d| (d["job"]["id"].as_str().unwrap_or_default().to_string(), d))
        .collect()
}

/// Waits until `done` jobs completed and `dead` were dead-lettered.
async fn settled(c: &MultiplexedConnection, q: &QueueKeys, done: u64, dead: u64) {
    eventually(WAIT, "every job to settle", || {
        let mut c = c.clone();
        let q = q.clone();
        async move {
            let p = counter(&mut c, q.stats_processed()).await;
            let d = counter(&mut c, q.stats_dead()).await;
            (p == done && d == dead).then_some(())
        }
    })
    .await;
}

#[tokio::test]
async fn http_2xx_completes_4xx_is_permanent_and_5xx_408_429_and_timeouts_retry() {
    let redis = TestRedis::start();
    let (url, seen) = serve_jobs().await;
    let q = QueueKeys::new("hooks");
    let mut c = redis.conn().await;
    let job = |id: &str, data: Value| json!({"id": id, "task": "hook", "data": data});
    push(
        &mut c,
        q.name(),
        &[
            job("ok", json!({})),
            job("created", json!({"status": 201})),
            job("not-found", json!({"status": 404, "body": "no such hook"})),
            job("invalid", json!({"status": 422, "body": "bad field"})),
            job("unavailable", json!({"status": 503, "body": "busy"})),
            job("server-error", json!({"status": 500})),
            job("slow-down", json!({"status": 429})),
            job("request-timeout", json!({"status": 408})),
            job("hangs", json!({"sleep_ms": 5000})),
        ],
    )
    .await;
    let mut cfg = config(&redis, q.name());
    cfg.max_attempts = 2;
    cfg.concurrency = 4;
    cfg.job_timeout = Duration::from_millis(300);
    let handler = HttpHandler::new(url.parse().expect("uri"));
    let shutdown = Shutdown::new();
    let worker = tokio::spawn(run(
        cfg,
        Arc::new(handler),
        Metrics::new(),
        shutdown.clone(),
    ));

    settled(&c, &q, 2, 7).await;
    let dead = dead_by_id(&mut c, &q).await;
    let letter = |id: &str| {
        dead.iter()
            .find(|(i, _)| i == id)
            .map(|(_, d)| d.clone())
            .unwrap_or_else(|| panic!("{id} must be dead-lettered: {dead:?}"))
    };
    for (id, error) in [
        ("not-found", "HTTP 404 Not Found: no such hook"),
        ("invalid", "HTTP 422 Unprocessable Entity: bad field"),
    ] {
        let d = letter(id);
        assert_eq!(d["reason"], "permanent", "{d}");
        assert_eq!(d["attempts"], 1, "{d}");
        assert_eq!(d["error"], error, "{d}");
    }
    for (id, error) in [
        ("unavailable", "HTTP 503 Service Unavailable: busy"),
        ("server-error", "HTTP 500 Internal Server Error"),
        ("slow-down", "HTTP 429 Too Many Requests"),
        ("request-timeout", "HTTP 408 Request Timeout"),
        ("hangs", "timed out after 300ms"),
    ] {
        let d = letter(id);
        assert_eq!(d["reason"], "exhausted", "{d}");
        assert_eq!(d["attempts"], 2, "{id} is retried once: {d}");
        assert_eq!(d["error"], error, "{d}");
    }
    {
        let seen = seen.lock().expect("lock");
        let count = |id: &str| seen.requests.iter().filter(|(i, _)| i == id).count();
        assert_eq!(count("ok"), 1);
        assert_eq!(count("not-found"), 1, "a permanent failure is not retried");
        assert_eq!(count("unavailable"), 2);
        let (_, body) = seen.requests.iter().find(|(i, _)| i == "ok").expect("seen");
        assert_eq!(body["task"], "hook", "the body is the job: {body}");
        assert_eq!(body["attempt"], 1, "{body}");
    }
    shutdown.drain();
    worker.await.expect("task").expect("clean exit");
}

#[tokio::test]
async fn http_connections_are_reused_across_jobs() {
    let (url, seen) = serve_jobs().await;
    let handler = HttpHandler::new(url.parse().expect("uri"));
    let job = |i: usize| {
        let Value::Object(fields) = json!({"id": format!("j{i}"), "attempt": 1}) else {
            unreachable!("an object")
        };
        Job::from_fields(fields)
    };
    for i in 0..20 {
        assert_eq!(handler.handle(&job(i)).await, Outcome::Done);
    }
    let seen = seen.lock().expect("lock");
    assert_eq!(seen.requests.len(), 20);
    assert!(
        seen.peers.len() <= 2,
        "20 sequential jobs should share a kept-alive connection, used {}",
        seen.peers.len()
    );
}

#[tokio::test]
async fn http_refused_connections_are_retried() {
    let url = format!("http://127.0.0.1:{}/jobs", free_port());
    let handler = HttpHandler::new(url.parse().expect("uri"));
    let Value::Object(fields) = json!({"id": "x", "attempt": 1}) else {
        unreachable!("an object")
    };
    match handler.handle(&Job::from_fields(fields)).await {
        Outcome::Failed { error, retry } => {
            assert!(retry, "{error}");
            assert!(error.contains("refused"), "{error}");
            assert!(error.contains(&url), "names the url: {error}");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn exec_per_job_runs_one_process_per_job_and_dead_letters_failures_with_stderr() {
    let redis = TestRedis::start();
    let q = QueueKeys::new("scripts");
    let mut c = redis.conn().await;
    push(
        &mut c,
        q.name(),
        &[
            json!({"id": "a", "data": {"exit": 0}}),
            json!({"id": "b", "data": {"exit": 4}}),
            json!({"id": "c", "data": {"exit": 0}}),
        ],
    )
    .await;
    let script = r#"read -r job
case "$job" in
  *'"exit":4'*) echo "connecting" >&2; echo "disk full on /data" >&2; exit 4 ;;
  *) exit 0 ;;
esac"#;
    let mut worker = Command::new(env!("CARGO_BIN_EXE_workerpool-worker"))
        .args(["--redis-url", &redis.url(), "--queue", q.name()])
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .args(["--handler", "exec-per-job", "--max-attempts", "1"])
        .args(["--concurrency", "2", "--", "sh", "-c", script])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn worker");
    settled(&c, &q, 2, 1).await;
    let _ = worker.kill();
    let _ = worker.wait();
    let dead = dead_by_id(&mut c, &q).await;
    assert_eq!(dead.len(), 1);
    let (id, letter) = &dead[0];
    assert_eq!(id, "b");
    assert_eq!(letter["reason"], "exhausted");
    assert_eq!(
        letter["error"], "handler exit status: 4: connecting\ndisk full on /data",
        "{letter}"
    );
}

#[tokio::test]
async fn a_handler_gets_the_job_as_pushed_on_one_line_numbers_and_spacing_kept() {
    let redis = TestRedis::start();
    let q = QueueKeys::new("lines");
    let mut c = redis.conn().await;
    let one_line = r#"{"id":"a", "data": {"big": 18446744073709551616, "f": 1.50}}"#;
    let pretty = "{\"id\":\"b\",\n  \"data\": [1,\r\n 2.0]}";
    for raw in [one_line, pretty] {
        let _: i64 = c.lpush(q.name(), raw).await.expect("lpush");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let seen = dir.path().join("seen");
    let script = format!("read -r job; printf '%s\\n' \"$job\" >> {}", seen.display());
    let mut worker = Command::new(env!("CARGO_BIN_EXE_workerpool-worker"))
        .args(["--redis-url", &redis.url(), "--queue", q.name()])
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .args(["--handler", "exec-per-job", "--concurrency", "1"])
        .args(["--", "sh", "-c", &script])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn worker");
    settled(&c, &q, 2, 0).await;
    let _ = worker.kill();
    let _ = worker.wait();
    let lines = std::fs::read_to_string(&seen).expect("the handler wrote what it got");
    let lines: Vec<&str> = lines.lines().collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    // The stamp in front, the rest byte for byte.
    assert!(lines[0].starts_with(r#"{"attempt":1,"#), "{}", lines[0]);
    assert!(lines[0].ends_with(&one_line[1..]), "{}", lines[0]);
    // Over several lines as pushed: one compact line, still the same object.
    let second: Value = serde_json::from_str(lines[1]).expect("JSON");
    assert_eq!(
        (&second["id"], &second["data"]),
        (&json!("b"), &json!([1, 2.0]))
    );
    assert_eq!(second["attempt"], 1);
    assert!(!lines[1].contains(' '), "{}", lines[1]);
}

#[tokio::test]
async fn the_rust_handler_example_runs_jobs_and_drains_on_its_shutdown_future() {
    let redis = TestRedis::start();
    let q = QueueKeys::new("emails");
    let mut c = redis.conn().await;
    push(
        &mut c,
        q.name(),
        &[
            json!({"id": "1", "task": "send_email", "data": {"to": "a@example.com"}}),
            json!({"id": "2", "task": "send_email", "data": {}}),
            json!({"id": "3", "task": "send_sms", "data": {"to": "a@example.com"}}),
            json!({"id": "4", "task": "send_email", "data": {"to": "b@example.com"}}),
        ],
    )
    .await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let url = redis.url();
    let worker = tokio::spawn(async move {
        example::serve(&url, "emails", async {
            stopped.await.ok();
        })
        .await
    });
    settled(&c, &q, 2, 2).await;
    let dead = dead_by_id(&mut c, &q).await;
    let errors: BTreeSet<(String, String)> = dead
        .iter()
        .map(|(id, d)| (id.clone(), d["error"].as_str().unwrap_or_default().into()))
        .collect();
    assert_eq!(
        errors,
        BTreeSet::from([
            ("2".to_string(), "data.to is missing".to_string()),
            (
                "3".to_string(),
                "unknown task Some(\"send_sms\")".to_string()
            ),
        ])
    );
    stop.send(()).expect("worker listening");
    worker.await.expect("task").expect("clean exit");
    let workers: u64 = c.zcard(q.workers()).await.expect("zcard");
    assert_eq!(workers, 0, "a drained worker leaves the registry");
}

/// A multiplexed child that answers some jobs twice and writes lines that
/// answer nothing: through the whole worker, each job is settled once, by
/// its first answer, and the rest is logged.
#[tokio::test]
async fn a_child_holding_many_jobs_is_settled_once_per_job_whatever_else_it_writes() {
    let redis = TestRedis::start();
    let q = QueueKeys::new("many");
    let mut c = redis.conn().await;
    let jobs: Vec<Value> = (0..20)
        .map(|i| json!({"id": format!("j{i}"), "data": {"twice": i % 2 == 0}}))
        .collect();
    push(&mut c, q.name(), &jobs).await;
    let child = r#"
import json, os, sys
assert os.environ["WORKERPOOL_JOBS_PER_CHILD"] == "8", os.environ.get("WORKERPOOL_JOBS_PER_CHILD")
def say(line):
    sys.stdout.write(line + "\n"); sys.stdout.flush()
for line in sys.stdin:
    job = json.loads(line)
    jid = job["id"]
    if job["data"]["twice"]:
        say(json.dumps({"id": jid, "ok": False, "error": "first answer", "retry": False}))
        say(json.dumps({"id": jid, "ok": True}))
    else:
        say("not json at all \x1b[31m")
        say(json.dumps({"id": "never-given", "ok": True}))
        say(json.dumps({"ok": True}))
        say(json.dumps({"id": jid, "ok": True}))
"#;
    let log = tempfile::NamedTempFile::new().expect("log file");
    let mut worker = Command::new(env!("CARGO_BIN_EXE_workerpool-worker"))
        .args(["--redis-url", &redis.url(), "--queue", q.name()])
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .args([
            "--max-attempts",
            "1",
            "--concurrency",
            "8",
            "--children",
            "1",
        ])
        .args(["--", "python3", "-c", child])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(log.reopen().expect("log"))
        .spawn()
        .expect("spawn worker");
    settled(&c, &q, 10, 10).await;
    // Nothing more is settled later by the extra answers.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(counter(&mut c, q.stats_processed()).await, 10);
    assert_eq!(counter(&mut c, q.stats_dead()).await, 10);
    let _ = worker.kill();
    let _ = worker.wait();
    let dead = dead_by_id(&mut c, &q).await;
    let ids: BTreeSet<_> = dead.iter().map(|(id, _)| id.clone()).collect();
    let even: BTreeSet<_> = (0..20).step_by(2).map(|i| format!("j{i}")).collect();
    assert_eq!(ids, even);
    assert!(
        dead.iter().all(|(_, d)| d["error"] == "first answer"),
        "{dead:?}"
    );
    let said = std::fs::read_to_string(log.path()).expect("log");
    assert!(said.contains("which the child does not hold"), "{said}");
    assert!(said.contains("names no job"), "{said}");
    assert!(said.contains("not json at all"), "{said}");
    assert!(!said.contains('\x1b'), "control bytes are escaped: {said}");
}
