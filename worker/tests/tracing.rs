//! Traces through the queue, against real OTLP/HTTP and OTLP/gRPC receivers
//! that decode the official protobuf definitions: the producer's trace continued by one
//! span per attempt, the handler handed that span's traceparent, failures
//! marked, and a collector that is gone costing no job.

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::HeaderMap;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::json;
use workerpool_queue::keys::QueueKeys;
use workerpool_tests::{TestRedis, eventually, free_port, http_get};

mod common;

const WAIT: Duration = Duration::from_secs(20);
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PRODUCER_SPAN: &str = "00f067aa0ba902b7";

/// An OTLP/HTTP receiver on a free port: every span it was sent.
async fn receiver() -> (u16, Arc<Mutex<Vec<Span>>>) {
    let (port, spans, stop) = stoppable_receiver().await;
    std::mem::forget(stop);
    (port, spans)
}

/// [`receiver`], and what stops it: dropped or fired, the receiver closes
/// its port (the collector goes away).
async fn stoppable_receiver() -> (u16, Arc<Mutex<Vec<Span>>>, tokio::sync::oneshot::Sender<()>) {
    let (port, (spans, _), stop) = plain_receiver(Protocol::Http).await;
    (port, spans, stop)
}

/// A receiver of `protocol` without TLS (gRPC: HTTP/2 with prior
/// knowledge), and what stops it.
async fn plain_receiver(protocol: Protocol) -> (u16, Kept, tokio::sync::oneshot::Sender<()>) {
    let (app, kept) = collector_app(protocol);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stopped.await;
            })
            .await
    });
    (port, kept, stop)
}

/// What a receiver was sent: the spans, and the headers (or gRPC metadata)
/// of each request.
type Kept = (Arc<Mutex<Vec<Span>>>, Arc<Mutex<Vec<HeaderMap>>>);

/// Keeps the spans and headers of one export request, checking that its
/// resource names the service from `OTEL_SERVICE_NAME`.
fn keep(request: ExportTraceServiceRequest, headers: HeaderMap, (spans, seen): &Kept) {
    seen.lock().unwrap_or_else(|e| e.into_inner()).push(headers);
    let mut all = spans.lock().unwrap_or_else(|e| e.into_inner());
    for resource in request.resource_spans {
        let service = resource
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .any(|a| a.key == "service.name" && format!("{:?}", a.value).contains("traced-worker"));
        assert!(
            service,
            "the resource names the service from OTEL_SERVICE_NAME: {:?}",
            resource.resource
        );
        for scope in resource.scope_spans {
            all.extend(scope.spans);
        }
    }
}

/// An OTLP/gRPC receiver: the collector's `TraceService`.
struct GrpcCollector(Kept);

#[tonic::async_trait]
impl TraceService for GrpcCollector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let headers = request.metadata().clone().into_headers();
        keep(request.into_inner(), headers, &self.0);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// The receiver's routes: over HTTP, `/v1/traces` decodes each request and
/// keeps its spans; over gRPC, the `TraceService` does.
fn collector_app(protocol: Protocol) -> (axum::Router, Kept) {
    let kept: Kept = Default::default();
    let app = match protocol {
        Protocol::Grpc => tonic::service::Routes::new(
            TraceServiceServer::new(GrpcCollector(kept.clone()))
                .accept_compressed(tonic::codec::CompressionEncoding::Gzip),
        )
        .into_axum_router(),
        Protocol::Http => {
            let kept = kept.clone();
            axum::Router::new().route(
                "/v1/traces",
                post(move |headers: HeaderMap, body: Bytes| {
                    let kept = kept.clone();
                    async move {
                        let body = match headers.get("content-encoding") {
                            Some(e) if e == "gzip" => {
                                use std::io::Read;
                                let mut out = Vec::new();
                                flate2::read::GzDecoder::new(&body[..])
                                    .read_to_end(&mut out)
                                    .expect("a gzip body");
                                Bytes::from(out)
                            }
                            Some(other) => panic!("content-encoding {other:?}"),
                            None => body,
                        };
                        let request =
                            ExportTraceServiceRequest::decode(body).expect("an OTLP trace request");
                        keep(request, headers, &kept);
                        (
                            [("content-type", "application/x-protobuf")],
                            ExportTraceServiceResponse::default().encode_to_vec(),
                        )
                    }
                }),
            )
        }
    };
    (app, kept)
}

/// How a receiver takes OTLP.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Http,
    Grpc,
}

/// A TLS listener for axum: TCP, then the handshake with `acceptor`.
struct TlsListener {
    tcp: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((tcp, addr)) = self.tcp.accept().await else {
                continue;
            };
            if let Ok(tls) = self.acceptor.accept(tcp).await {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

/// The receiver over TLS, with the server certificate of `certs` (for
/// 127.0.0.1); with `client_auth`, only for a client whose certificate
/// `certs.ca` signed (mutual TLS).
async fn tls_receiver(
    certs: &workerpool_tests::tls::Certificates,
    client_auth: bool,
    protocol: Protocol,
) -> (u16, Arc<Mutex<Vec<Span>>>) {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&certs.server_cert)
        .expect("server cert")
        .collect::<Result<_, _>>()
        .expect("pem");
    let key = PrivateKeyDer::from_pem_file(&certs.server_key).expect("server key");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("versions");
    let builder = if client_auth {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(&certs.ca).expect("ca") {
            roots.add(cert.expect("pem")).expect("ca cert");
        }
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .expect("client verifier");
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let mut config = builder.with_single_cert(chain, key).expect("server config");
    if protocol == Protocol::Grpc {
        config.alpn_protocols = vec![b"h2".to_vec()];
    }
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = tcp.local_addr().expect("addr").port();
    let listener = TlsListener {
        tcp,
        acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
    };
    let (app, (spans, _)) = collector_app(protocol);
    tokio::spawn(async move { axum::serve(listener, app).await });
    (port, spans)
}

/// The exec handler: records `<id> <traceparent it got>` in a file, and
/// fails permanently the jobs whose data says so.
const HANDLER: &str = r#"
import json, sys
out = open(sys.argv[1], "a")
for line in sys.stdin:
    job = json.loads(line)
    out.write(f"{job['id']} {job.get('traceparent', '-')}\n")
    out.flush()
    if job.get("data", {}).get("flaky") and job.get("attempt") == 1:
        print(json.dumps({"ok": False, "error": "flaky once"}), flush=True)
    elif job.get("data", {}).get("fail"):
        print(json.dumps({"ok": False, "error": "boom: the\nsecond line", "retry": False}), flush=True)
    else:
        print(json.dumps({"ok": True}), flush=True)
"#;

struct Worker {
    child: Child,
    port: u16,
}

impl Worker {
    fn start(redis: &TestRedis, endpoint: &str, record: &std::path::Path) -> Worker {
        let record = record.to_string_lossy().into_owned();
        Worker::with_handler(redis, endpoint, &["--", "python3", "-c", HANDLER, &record])
    }

    fn with_handler(redis: &TestRedis, endpoint: &str, handler: &[&str]) -> Worker {
        Worker::with_env(redis, endpoint, handler, &[])
    }

    fn with_env(
        redis: &TestRedis,
        endpoint: &str,
        handler: &[&str],
        env: &[(&str, &str)],
    ) -> Worker {
        let port = free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_workerpool-worker"))
            .args(["--redis-url", &redis.url(), "--queue", "traced", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .args(["--heartbeat-interval", "200ms", "--dead-after", "1s"])
            .args(["--backoff-base", "100ms", "--backoff-max", "200ms"])
            .args(handler)
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
            .env("OTEL_SERVICE_NAME", "traced-worker")
            .envs(env.iter().copied())
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn workerpool-worker");
        Worker { child, port }
    }

    fn metric(&self, name: &str) -> f64 {
        http_get(self.port, "/metrics")
            .map(|(_, body)| body)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attribute(span: &Span, key: &str) -> String {
    span.attributes
        .iter()
        .find(|a| a.key == key)
        .map(|a| format!("{:?}", a.value))
        .unwrap_or_default()
}

#[tokio::test]
async fn an_attempt_continues_the_producers_trace_and_its_handler_gets_the_attempts_traceparent() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let (port, spans) = receiver().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let record = dir.path().join("seen");
    let producer = format!("00-{TRACE}-{PRODUCER_SPAN}-01");
    // Stamped by their producer a second ago: the wait is a span of its own.
    let at = common::server_time_ms(&mut c).await - 1000;
    common::push(
        &mut c,
        "traced",
        &[
            json!({"id": "traced", "task": "t", "enqueued_at": at, "traceparent": producer, "tracestate": "vendor=1"})
                .to_string(),
            json!({"id": "malformed", "enqueued_at": at, "traceparent": "00-not-a-trace-01"}).to_string(),
            json!({"id": "failing", "enqueued_at": at, "traceparent": producer, "data": {"fail": true}}).to_string(),
        ],
    )
    .await;
    let worker = Worker::start(&redis, &format!("http://127.0.0.1:{port}"), &record);

    let found = eventually(WAIT, "three process spans and their waits", || {
        let spans = spans.clone();
        async move {
            let all = spans.lock().ok()?.clone();
            let process = all.iter().filter(|s| s.name == "process traced").count();
            (process == 3 && all.iter().filter(|s| s.name == "wait traced").count() == 3)
                .then_some(all)
        }
    })
    .await;
    let by_id = |id: &str, name: &str| {
        found
            .iter()
            .find(|s| s.name == name && attribute(s, "messaging.message.id").contains(id))
            .cloned()
            .unwrap_or_else(|| panic!("a {name} span of {id} in {found:#?}"))
    };

    // The attempt is the producer span's child, a consumer span of the queue.
    let traced = by_id("traced", "process traced");
    assert_eq!(hex(&traced.trace_id), TRACE);
    assert_eq!(hex(&traced.parent_span_id), PRODUCER_SPAN);
    assert_eq!(traced.kind, 5, "SPAN_KIND_CONSUMER");
    assert!(attribute(&traced, "messaging.destination.name").contains("traced"));
    assert!(attribute(&traced, "messaging.system").contains("workerpool"));
    assert!(attribute(&traced, "workerpool.job.attempt").contains('1'));
    assert_eq!(
        traced.status.as_ref().map_or(0, |s| s.code),
        0,
        "unset: done"
    );
    let wait = by_id("traced", "wait traced");
    assert_eq!(hex(&wait.parent_span_id), PRODUCER_SPAN);
    assert!(wait.end_time_unix_nano <= traced.start_time_unix_nano + 1_000_000);
    let waited_ms = (wait.end_time_unix_nano - wait.start_time_unix_nano) / 1_000_000;
    assert!(
        (1000..5000).contains(&waited_ms),
        "waited {waited_ms} ms from enqueued_at"
    );

    // The handler got the attempt's own traceparent, not the producer's.
    let seen = std::fs::read_to_string(&record).expect("the handler's record");
    let expected = format!("traced 00-{TRACE}-{}-01", hex(&traced.span_id));
    assert!(seen.lines().any(|l| l == expected), "{expected} in {seen}");

    // A malformed traceparent: the job ran all the same, in a trace of its own.
    let malformed = by_id("malformed", "process traced");
    assert!(malformed.parent_span_id.is_empty(), "{malformed:?}");
    assert!(
        seen.lines().any(|l| l.starts_with("malformed 00-")),
        "{seen}"
    );

    // A failed attempt: an error with the handler's words on one line, and
    // the dead letter as an event.
    let failing = by_id("failing", "process traced");
    let status = failing.status.clone().expect("a status");
    assert_eq!(status.code, 2, "STATUS_CODE_ERROR");
    assert!(
        status.message.contains("boom") && !status.message.contains('\n'),
        "{status:?}"
    );
    assert!(
        failing.events.iter().any(|e| e.name == "dead_lettered"),
        "{failing:?}"
    );

    assert!(worker.metric("workerpool_trace_spans_exported_total") >= 6.0);
    assert_eq!(worker.metric("workerpool_trace_spans_dropped_total"), 0.0);
}

#[tokio::test]
async fn a_retried_job_gives_two_attempt_spans_the_second_linked_to_the_failed_first() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let (port, spans) = receiver().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let producer = format!("00-{TRACE}-{PRODUCER_SPAN}-01");
    common::push(
        &mut c,
        "traced",
        &[json!({"id": "flaky", "traceparent": producer, "data": {"flaky": true}}).to_string()],
    )
    .await;
    let _worker = Worker::start(
        &redis,
        &format!("http://127.0.0.1:{port}"),
        &dir.path().join("seen"),
    );
    let attempts = eventually(WAIT, "two attempt spans", || {
        let spans = spans.clone();
        async move {
            let all = spans.lock().ok()?.clone();
            let mut process: Vec<Span> = all
                .into_iter()
                .filter(|s| s.name == "process traced")
                .collect();
            process.sort_by_key(|s| s.start_time_unix_nano);
            (process.len() == 2).then_some(process)
        }
    })
    .await;
    let (first, second) = (&attempts[0], &attempts[1]);
    assert!(attribute(first, "workerpool.job.attempt").contains('1'));
    assert!(attribute(second, "workerpool.job.attempt").contains('2'));
    assert_eq!(
        first.status.as_ref().map(|s| s.code),
        Some(2),
        "the failed one is an error"
    );
    assert!(
        first
            .status
            .as_ref()
            .is_some_and(|s| s.message.contains("flaky once")),
        "{first:?}"
    );
    assert_eq!(
        second.status.as_ref().map_or(0, |s| s.code),
        0,
        "the second did it"
    );
    // Both continue the producer's trace; the second links to the first.
    for s in [first, second] {
        assert_eq!(hex(&s.parent_span_id), PRODUCER_SPAN);
    }
    assert_eq!(second.links.len(), 1, "{second:?}");
    assert_eq!(second.links[0].span_id, first.span_id);
    assert_eq!(second.links[0].trace_id, first.trace_id);
}

/// Pushes one job in the producer's trace, runs a worker that exports to
/// `endpoint` with `env`, and returns the job's attempt span once `spans`
/// holds it, checked to be the producer's child.
async fn attempt_in_producers_trace(
    redis: &TestRedis,
    spans: &Arc<Mutex<Vec<Span>>>,
    endpoint: &str,
    env: &[(&str, &str)],
) -> Span {
    let mut c = redis.conn().await;
    let producer = format!("00-{TRACE}-{PRODUCER_SPAN}-01");
    common::push(
        &mut c,
        "traced",
        &[json!({"id": "one", "traceparent": producer}).to_string()],
    )
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let record = dir.path().join("seen").to_string_lossy().into_owned();
    let _worker = Worker::with_env(
        redis,
        endpoint,
        &["--", "python3", "-c", HANDLER, &record],
        env,
    );
    let attempt = the_attempt(spans).await;
    assert_eq!(hex(&attempt.trace_id), TRACE);
    assert_eq!(hex(&attempt.parent_span_id), PRODUCER_SPAN);
    attempt
}

/// Pushes one job, runs a worker that exports to `endpoint` with `env`,
/// which the collector refuses: the job is done all the same, its spans are
/// counted as dropped, and `spans` stays empty.
async fn the_job_runs_and_its_spans_are_dropped(
    redis: &TestRedis,
    spans: &Arc<Mutex<Vec<Span>>>,
    endpoint: &str,
    env: &[(&str, &str)],
) {
    let c = redis.conn().await;
    let q = QueueKeys::new("traced");
    common::push(
        &mut c.clone(),
        "traced",
        &[json!({"id": "refused"}).to_string()],
    )
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let record = dir.path().join("seen").to_string_lossy().into_owned();
    let worker = Worker::with_env(
        redis,
        endpoint,
        &["--", "python3", "-c", HANDLER, &record],
        env,
    );
    eventually(WAIT, "the job done", || {
        let mut c = c.clone();
        let q = q.clone();
        async move { (common::counter(&mut c, q.stats_processed()).await >= 1).then_some(()) }
    })
    .await;
    eventually(WAIT, "the dropped spans counted", || {
        let dropped =
            worker.metric("workerpool_trace_spans_dropped_total{reason=\"export_failed\"}");
        async move { (dropped >= 1.0).then_some(()) }
    })
    .await;
    assert!(spans.lock().map(|s| s.is_empty()).unwrap_or(false));
}

/// Asserts that the receiver got requests, each with `name: value`.
fn every_request_has(headers: &Arc<Mutex<Vec<HeaderMap>>>, name: &str, value: &str) {
    let seen = headers.lock().map(|h| h.clone()).unwrap_or_default();
    assert!(
        !seen.is_empty() && seen.iter().all(|h| h.get(name).is_some_and(|v| v == value)),
        "{name}: {value} in every request: {seen:?}"
    );
}

/// The paths of the CA, and of the client certificate and key, of `certs`.
fn client_files(certs: &workerpool_tests::tls::Certificates) -> [String; 3] {
    [&certs.ca, &certs.client_cert, &certs.client_key].map(|p| p.to_string_lossy().into_owned())
}

/// The variables that give a worker the CA and the client certificate and
/// key of `files` ([`client_files`]).
fn mutual_tls([ca, cert, key]: &[String; 3]) -> [(&'static str, &str); 3] {
    [
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", ca.as_str()),
        ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", cert.as_str()),
        ("OTEL_EXPORTER_OTLP_CLIENT_KEY", key.as_str()),
    ]
}

/// The attempt span of the one job in `spans`, once exported.
async fn the_attempt(spans: &Arc<Mutex<Vec<Span>>>) -> Span {
    eventually(WAIT, "the attempt's span", || {
        let spans = spans.clone();
        async move {
            let all = spans.lock().ok()?.clone();
            all.into_iter().find(|s| s.name == "process traced")
        }
    })
    .await
}

#[tokio::test]
async fn an_exec_per_job_command_gets_the_attempts_traceparent_as_traceparent_in_its_environment() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let (port, spans) = receiver().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let record = dir.path().join("env");
    let producer = format!("00-{TRACE}-{PRODUCER_SPAN}-01");
    common::push(
        &mut c,
        "traced",
        &[json!({"id": "one", "traceparent": producer}).to_string()],
    )
    .await;
    let script = format!("echo \"$TRACEPARENT\" > {}", record.display());
    let _worker = Worker::with_handler(
        &redis,
        &format!("http://127.0.0.1:{port}"),
        &["--handler", "exec-per-job", "--", "sh", "-c", &script],
    );
    let attempt = the_attempt(&spans).await;
    assert_eq!(hex(&attempt.parent_span_id), PRODUCER_SPAN);
    let seen = std::fs::read_to_string(&record).expect("the command's record");
    assert_eq!(
        seen.trim(),
        format!("00-{TRACE}-{}-01", hex(&attempt.span_id))
    );
}

#[tokio::test]
async fn an_http_handler_gets_the_attempts_traceparent_header() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let (port, spans) = receiver().await;
    let got: Arc<Mutex<Vec<String>>> = Arc::default();
    let kept = got.clone();
    let app = axum::Router::new().route(
        "/jobs",
        post(move |headers: axum::http::HeaderMap| {
            let kept = kept.clone();
            async move {
                let tp = headers
                    .get("traceparent")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("-")
                    .to_string();
                kept.lock().unwrap_or_else(|e| e.into_inner()).push(tp);
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let handler_port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let producer = format!("00-{TRACE}-{PRODUCER_SPAN}-01");
    common::push(
        &mut c,
        "traced",
        &[json!({"id": "one", "traceparent": producer}).to_string()],
    )
    .await;
    let url = format!("http://127.0.0.1:{handler_port}/jobs");
    let _worker = Worker::with_handler(
        &redis,
        &format!("http://127.0.0.1:{port}"),
        &["--handler", "http", "--http-url", &url],
    );
    let attempt = the_attempt(&spans).await;
    assert_eq!(hex(&attempt.parent_span_id), PRODUCER_SPAN);
    let headers = got.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert_eq!(
        headers,
        vec![format!("00-{TRACE}-{}-01", hex(&attempt.span_id))]
    );
}

#[tokio::test]
async fn the_recovery_of_a_lost_workers_jobs_is_a_span_with_a_recovered_event() {
    use redis::AsyncCommands;
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let (port, spans) = receiver().await;
    let q = QueueKeys::new("traced");
    // A worker that went silent a minute ago holding one job.
    let long_ago = common::server_time_ms(&mut c).await - 60_000;
    let _: () = c.zadd(q.workers(), "gone~1", long_ago).await.expect("zadd");
    let _: () = c
        .lpush(q.processing("gone~1"), json!({"id": "held"}).to_string())
        .await
        .expect("lpush");
    let dir = tempfile::tempdir().expect("tempdir");
    let _worker = Worker::start(
        &redis,
        &format!("http://127.0.0.1:{port}"),
        &dir.path().join("seen"),
    );
    let recover = eventually(WAIT, "the recovery's span", || {
        let spans = spans.clone();
        async move {
            let all = spans.lock().ok()?.clone();
            all.into_iter().find(|s| s.name == "recover traced")
        }
    })
    .await;
    let event = recover
        .events
        .iter()
        .find(|e| e.name == "recovered")
        .expect("a recovered event");
    let text = format!("{:?}", event.attributes);
    assert!(
        text.contains("gone~1") && text.contains("IntValue(1)"),
        "{text}"
    );
}

#[tokio::test]
async fn spans_reach_an_https_collector_trusted_through_otel_exporter_otlp_certificate() {
    let redis = TestRedis::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let certs = workerpool_tests::tls::Certificates::make(dir.path());
    let (port, spans) = tls_receiver(&certs, false, Protocol::Http).await;
    let [ca, ..] = client_files(&certs);
    attempt_in_producers_trace(
        &redis,
        &spans,
        &format!("https://127.0.0.1:{port}"),
        &[("OTEL_EXPORTER_OTLP_CERTIFICATE", ca.as_str())],
    )
    .await;
}

#[tokio::test]
async fn a_collector_that_asks_for_a_client_certificate_gets_spans_only_from_a_worker_that_has_one()
{
    let redis = TestRedis::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let certs = workerpool_tests::tls::Certificates::make(dir.path());
    let (port, spans) = tls_receiver(&certs, true, Protocol::Http).await;
    let endpoint = format!("https://127.0.0.1:{port}");
    let files = client_files(&certs);
    // Without a client certificate the handshake fails.
    the_job_runs_and_its_spans_are_dropped(
        &redis,
        &spans,
        &endpoint,
        &[("OTEL_EXPORTER_OTLP_CERTIFICATE", files[0].as_str())],
    )
    .await;

    // With one that the collector's CA signed, the attempt arrives.
    attempt_in_producers_trace(&redis, &spans, &endpoint, &mutual_tls(&files)).await;
}

#[tokio::test]
async fn with_protocol_grpc_spans_reach_a_grpc_collector_with_the_headers_as_metadata() {
    let redis = TestRedis::start();
    let (port, (spans, headers), _stop) = plain_receiver(Protocol::Grpc).await;
    attempt_in_producers_trace(
        &redis,
        &spans,
        &format!("http://127.0.0.1:{port}"),
        &[
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer t0ken"),
        ],
    )
    .await;
    every_request_has(&headers, "authorization", "Bearer t0ken");
}

#[tokio::test]
async fn with_compression_gzip_the_bodies_are_gzipped_over_http_and_grpc() {
    for (protocol, name, header) in [
        (Protocol::Http, "http/protobuf", "content-encoding"),
        (Protocol::Grpc, "grpc", "grpc-encoding"),
    ] {
        let redis = TestRedis::start();
        let (port, (spans, headers), _stop) = plain_receiver(protocol).await;
        attempt_in_producers_trace(
            &redis,
            &spans,
            &format!("http://127.0.0.1:{port}"),
            &[
                ("OTEL_EXPORTER_OTLP_PROTOCOL", name),
                ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
            ],
        )
        .await;
        every_request_has(&headers, header, "gzip");
    }
}

#[tokio::test]
async fn a_grpc_collector_over_mutual_tls_gets_spans_from_a_worker_with_a_client_certificate() {
    let redis = TestRedis::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let certs = workerpool_tests::tls::Certificates::make(dir.path());
    let (port, spans) = tls_receiver(&certs, true, Protocol::Grpc).await;
    let files = client_files(&certs);
    let mut env = vec![("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")];
    env.extend(mutual_tls(&files));
    attempt_in_producers_trace(&redis, &spans, &format!("https://127.0.0.1:{port}"), &env).await;
}

#[tokio::test]
async fn an_https_collector_whose_certificate_is_not_trusted_gets_nothing_and_the_jobs_run() {
    let redis = TestRedis::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let certs = workerpool_tests::tls::Certificates::make(dir.path());
    let (port, spans) = tls_receiver(&certs, false, Protocol::Http).await;
    // No CA given: the private CA is not among the system's roots.
    the_job_runs_and_its_spans_are_dropped(
        &redis,
        &spans,
        &format!("https://127.0.0.1:{port}"),
        &[],
    )
    .await;
}

#[tokio::test]
async fn with_the_collector_stopped_mid_run_no_job_is_lost_or_stalled_and_the_dropped_spans_are_counted()
 {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("traced");
    let (port, spans, stop) = stoppable_receiver().await;
    let jobs = |from: usize| -> Vec<String> {
        (from..from + 100)
            .map(|n| json!({"id": format!("j{n}"), "traceparent": format!("00-{TRACE}-{PRODUCER_SPAN}-01")}).to_string())
            .collect()
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let worker = Worker::start(
        &redis,
        &format!("http://127.0.0.1:{port}"),
        &dir.path().join("seen"),
    );
    let reader = c.clone();
    let processed = |n: u64| {
        let (c, q) = (reader.clone(), q.clone());
        async move {
            eventually(WAIT, &format!("{n} jobs done"), || {
                let mut c = c.clone();
                let q = q.clone();
                async move { (common::counter(&mut c, q.stats_processed()).await == n).then_some(()) }
            })
            .await
        }
    };
    common::push(&mut c, "traced", &jobs(0)).await;
    processed(100).await;
    eventually(WAIT, "the first spans at the collector", || {
        let n = spans.lock().map(|s| s.len()).unwrap_or(0);
        async move { (n >= 100).then_some(()) }
    })
    .await;
    // The collector goes away; the jobs keep coming.
    let _ = stop.send(());
    common::push(&mut c, "traced", &jobs(100)).await;
    processed(200).await;
    // At least the span of every attempt after it went was lost, and counted.
    eventually(WAIT, "the dropped spans counted", || {
        let dropped =
            worker.metric("workerpool_trace_spans_dropped_total{reason=\"export_failed\"}");
        async move { (dropped >= 100.0).then_some(()) }
    })
    .await;
    assert!(worker.metric("workerpool_trace_spans_exported_total") >= 100.0);
}

#[test]
fn a_tracing_setting_the_worker_cannot_honour_stops_it_at_start_naming_the_variable() {
    for (name, value) in [
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s"),
        ("OTEL_TRACES_SAMPLER", "xray"),
        (
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
            "/nonexistent/cert.pem",
        ),
    ] {
        // No Redis is needed: the settings are read before it is reached.
        let out = Command::new(env!("CARGO_BIN_EXE_workerpool-worker"))
            .args(["--redis-url", "redis://127.0.0.1:1", "--queue", "traced"])
            .args(["--", "cat"])
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
            .env(name, value)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .output()
            .expect("run workerpool-worker");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}={value}: {stderr}");
        assert!(
            stderr.contains(name) && stderr.contains("OpenTelemetry"),
            "{name}={value}: {stderr}"
        );
    }
}
