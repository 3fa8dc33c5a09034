//! Redis over TLS (`rediss://`), against a real `redis-server` listening
//! only on a TLS port, with certificates made by `openssl` in the test:
//! the worker and the CLI with a private CA, mutual TLS, and a certificate
//! that is not trusted.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use workerpool_queue::keys::QueueKeys;
use workerpool_tests::{TestTlsRedis, eventually, free_port};

mod common;
use common::{counter, len, stop};
use workerpool_tests::http_get;

const WAIT: Duration = Duration::from_secs(20);

fn cli(redis: &TestTlsRedis, ca: &Path, client: bool, args: &[&str]) -> Output {
    let mut cmd = Command::new(workerpool_tests::bin_dir().join("workerpool"));
    cmd.args(args)
        .env("WORKERPOOL_REDIS_URL", redis.url())
        .env("WORKERPOOL_REDIS_CA_FILE", ca)
        .env_remove("WORKERPOOL_QUEUE")
        .stdin(Stdio::null());
    if client {
        cmd.env("WORKERPOOL_REDIS_CLIENT_CERT", &redis.certs.client_cert)
            .env("WORKERPOOL_REDIS_CLIENT_KEY", &redis.certs.client_key);
    }
    cmd.output().expect("run workerpool")
}

fn worker(redis: &TestTlsRedis, ca: &Path, client: bool, port: u16) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_workerpool-worker"));
    cmd.args([
        "--redis-url",
        &redis.url(),
        "--queue",
        "secure",
        "--handler",
        "noop",
    ])
    .args([
        "--concurrency",
        "4",
        "--listen",
        &format!("127.0.0.1:{port}"),
    ])
    .arg("--redis-ca-file")
    .arg(ca)
    .env("RUST_LOG", "warn")
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    if client {
        cmd.arg("--redis-client-cert")
            .arg(&redis.certs.client_cert)
            .arg("--redis-client-key")
            .arg(&redis.certs.client_key);
    }
    cmd.spawn().expect("spawn workerpool-worker")
}

async fn drains_over_tls(mutual: bool) {
    let redis = TestTlsRedis::start(mutual);
    let q = QueueKeys::new("secure");
    let jobs: Vec<String> = (0..50)
        .map(|n| format!(r#"{{"data":{{"n":{n}}}}}"#))
        .collect();
    let mut args = vec!["enqueue", "--queue", "secure"];
    args.extend(jobs.iter().map(String::as_str));
    let out = cli(&redis, &redis.certs.ca, mutual, &args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let port = free_port();
    let w = worker(&redis, &redis.certs.ca, mutual, port);
    let c = redis.conn().await;
    eventually(WAIT, "50 jobs done over TLS", || {
        let mut c = c.clone();
        let key = q.stats_processed();
        async move { (counter(&mut c, key).await == 50).then_some(()) }
    })
    .await;
    assert_eq!(http_get(port, "/readyz").map(|r| r.0), Some(200));
    let stats = cli(
        &redis,
        &redis.certs.ca,
        mutual,
        &["stats", "--queue", "secure", "--json", "--no-rate"],
    );
    assert!(
        stats.status.success(),
        "{}",
        String::from_utf8_lossy(&stats.stderr)
    );
    let stats: Value = serde_json::from_slice(&stats.stdout).expect("json");
    assert_eq!(stats["processed_total"], Value::from(50), "{stats}");
    let log = stop(w);
    assert!(!log.contains("WARN") && !log.contains("ERROR"), "{log}");
}

#[tokio::test]
async fn the_worker_and_the_cli_work_over_tls_with_a_private_ca() {
    drains_over_tls(false).await;
}

#[tokio::test]
async fn the_worker_and_the_cli_work_with_mutual_tls() {
    drains_over_tls(true).await;
}

#[tokio::test]
async fn an_untrusted_certificate_is_named_and_the_worker_keeps_trying_unready() {
    let redis = TestTlsRedis::start(false);
    let mut c = redis.conn().await;
    let q = QueueKeys::new("secure");
    let _: () = redis::cmd("LPUSH")
        .arg(q.name())
        .arg("{}")
        .query_async(&mut c)
        .await
        .expect("lpush");
    let port = free_port();
    let mut w = worker(&redis, &redis.certs.other_ca, false, port);
    eventually(WAIT, "the worker serves /readyz", || async move {
        http_get(port, "/readyz").map(|r| r.0)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(http_get(port, "/readyz").map(|r| r.0), Some(503));
    assert_eq!(http_get(port, "/healthz").map(|r| r.0), Some(200));
    assert!(matches!(w.try_wait(), Ok(None)), "it keeps retrying");
    assert_eq!(len(&mut c, q.name()).await, 1, "nothing ran");
    let log = stop(w);
    assert!(
        log.contains("TLS: the server's certificate is not signed by a trusted CA"),
        "{log}"
    );

    // The CLI says the same, and exits 1.
    let out = cli(
        &redis,
        &redis.certs.other_ca,
        false,
        &["stats", "--queue", "secure"],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not signed by a trusted CA"), "{err}");
    // Without its client certificate, a mutual-TLS server refuses the CLI.
    let mutual = TestTlsRedis::start(true);
    let out = cli(
        &mutual,
        &mutual.certs.ca,
        false,
        &["stats", "--queue", "secure"],
    );
    assert!(!out.status.success());
}

#[test]
fn tls_options_on_a_plain_url_are_refused_with_what_to_fix() {
    let out = Command::new(env!("CARGO_BIN_EXE_workerpool-worker"))
        .args([
            "--redis-url",
            "redis://127.0.0.1:1",
            "--queue",
            "q",
            "--handler",
            "noop",
        ])
        .args(["--redis-ca-file", "/nonexistent/ca.pem"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--redis-ca-file is a TLS option but --redis-url redis://127.0.0.1:1 is plain redis://; use rediss://"),
        "{err}"
    );
}

#[test]
fn a_password_in_the_url_never_reaches_logs_metrics_or_errors() {
    const PASSWORD: &str = "s3cr3t-Pa55";
    let url = format!("redis://admin:{PASSWORD}@127.0.0.1:{}/0", free_port());
    let port = free_port();
    let mut worker = Command::new(env!("CARGO_BIN_EXE_workerpool-worker"))
        .args(["--redis-url", &url, "--queue", "q", "--handler", "noop"])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("RUST_LOG", "debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn workerpool-worker");
    let deadline = Instant::now() + Duration::from_secs(10);
    let metrics = loop {
        if let Some((200, body)) = http_get(port, "/metrics")
            && body.contains("workerpool_redis_errors_total")
        {
            break body;
        }
        assert!(Instant::now() < deadline, "no /metrics with a Redis error");
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = worker.kill();
    let out = worker.wait_with_output().expect("output");
    let logs = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(logs.contains("redis unreachable"), "{logs}");
    assert!(!logs.contains(PASSWORD), "{logs}");
    assert!(!metrics.contains(PASSWORD), "{metrics}");

    let cli = Command::new(workerpool_tests::bin_dir().join("workerpool"))
        .args(["stats", "--queue", "q", "--redis-url", &url])
        .output()
        .expect("run workerpool");
    let err = String::from_utf8_lossy(&cli.stderr);
    assert!(!cli.status.success());
    assert!(err.contains("redis://admin:***@127.0.0.1"), "{err}");
    assert!(!err.contains(PASSWORD), "{err}");
}
