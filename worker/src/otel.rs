//! OpenTelemetry: one span per attempt, a child of the producer's trace
//! (the job's `traceparent`), exported with OTLP over HTTP when the
//! standard `OTEL_*` variables ask for it. With none set, nothing is built
//! and the hot path pays one `Option` check per job.
//!
//! Export runs on a thread of its own with a bounded queue: a slow or
//! absent collector never blocks a job, and every span that cannot be sent
//! (the queue full, the export failed) is counted in
//! `workerpool_trace_spans_dropped_total{reason}`.

use std::sync::Mutex;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, Instant, UNIX_EPOCH};

use opentelemetry::trace::{
    Link, Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{
    SdkTracer, SdkTracerProvider, Span, SpanData, SpanExporter as _, SpanProcessor,
};
use prometheus::{IntCounter, IntCounterVec};
use workerpool_queue::job::Job;

use crate::handler::Outcome;

/// Spans waiting for export at most; more are dropped and counted.
const QUEUE: usize = 2048;
/// Spans per export request at most.
const BATCH: usize = 512;
/// How long a span waits for its batch at most.
const DELAY: Duration = Duration::from_secs(2);
/// The longest error text a span keeps.
const ERROR_CHARS: usize = 500;

/// Why tracing cannot start as the environment asks.
#[derive(Debug, thiserror::Error)]
#[error("OpenTelemetry: {0}")]
pub struct OtelError(String);

/// The counters the exporter keeps (the worker's `/metrics`).
#[derive(Clone, Debug)]
pub struct SpanCounters {
    /// Spans sent to the collector.
    pub exported: IntCounter,
    /// Spans lost, by reason: `queue_full` or `export_failed`.
    pub dropped: IntCounterVec,
}

/// The worker's tracer, when tracing is on.
#[derive(Debug)]
pub struct Otel {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

impl Otel {
    /// Tracing as the standard variables ask: on when
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`
    /// is set, unless `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`.
    /// The exporter reads the endpoint (http:// or https://, trusted by the
    /// system's roots and `OTEL_EXPORTER_OTLP_CERTIFICATE`, presenting
    /// `OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE` and `_CLIENT_KEY` to a
    /// collector that asks for a client certificate),
    /// `OTEL_EXPORTER_OTLP_HEADERS` and the timeout; the resource reads `OTEL_SERVICE_NAME` (else
    /// `workerpool-worker`) and `OTEL_RESOURCE_ATTRIBUTES`; the sampler
    /// reads `OTEL_TRACES_SAMPLER` (parent-based, always on by default). A
    /// setting the exporter or SDK would ignore without a word is refused.
    pub fn from_env(counters: SpanCounters) -> Result<Option<Otel>, OtelError> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        match var("OTEL_TRACES_EXPORTER").as_deref() {
            None | Some("otlp") => {}
            Some("none") => return Ok(None),
            Some(other) => {
                return Err(OtelError(format!(
                    "OTEL_TRACES_EXPORTER={other} is not supported: use otlp or none"
                )));
            }
        }
        let endpoint =
            var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or(var("OTEL_EXPORTER_OTLP_ENDPOINT"));
        let Some(endpoint) = endpoint else {
            return Ok(None);
        };
        let protocol = Protocol::from_vars(var)?;
        let gzip = gzip_from_vars(var)?;
        let timeout = timeout_from_vars(var)?;
        check_sampler(var)?;
        if !endpoint.starts_with("http://") && !endpoint.starts_with("https://") {
            return Err(OtelError(format!(
                "the OTLP endpoint {endpoint:?} must be an http:// or https:// URL"
            )));
        }
        let tls = TlsFiles::from_vars(var)?.client_config()?;
        let transport = match protocol {
            Protocol::HttpProtobuf => Transport::Http(
                hyper_rustls::HttpsConnectorBuilder::new()
                    .with_tls_config(tls)
                    .https_or_http()
                    .enable_http1()
                    .build(),
            ),
            Protocol::Grpc => Transport::Grpc(
                Box::new(
                    tonic::transport::Endpoint::from_shared(endpoint.clone())
                        .map_err(|e| {
                            OtelError(format!("the OTLP endpoint {endpoint:?} is not a URL: {e}"))
                        })?
                        .timeout(timeout),
                ),
                hyper_rustls::HttpsConnectorBuilder::new()
                    .with_tls_config(tls)
                    .https_or_http()
                    .enable_http2()
                    .build(),
            ),
        };
        let mut resource = Resource::builder();
        let named = var("OTEL_SERVICE_NAME").is_some()
            || var("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|a| a.contains("service.name="));
        if !named {
            resource = resource.with_service_name("workerpool-worker");
        }
        let resource = resource.build();
        // The export thread builds and owns the exporter (a gRPC channel
        // lives on that thread's runtime); it gets the resource first.
        let build = {
            let resource = resource.clone();
            move || {
                let mut exporter = transport.exporter(gzip, timeout)?;
                exporter.set_resource(&resource);
                Ok(exporter)
            }
        };
        let processor = Exporter::start(build, counters)?;
        let provider = SdkTracerProvider::builder()
            .with_resource(resource)
            .with_span_processor(processor)
            .build();
        let tracer = provider.tracer("workerpool-worker");
        tracing::info!(endpoint = %endpoint, protocol = protocol.name(), "tracing: one span per attempt, exported with OTLP");
        Ok(Some(Otel { provider, tracer }))
    }

    /// Starts the span of one attempt at `job` of `queue`: a child of the
    /// producer's `traceparent` when it has a valid one (a malformed one is
    /// ignored with a warning), with the time the job waited as a span of
    /// its own from `enqueued_at`.
    pub fn start_attempt(&self, queue: &str, job: &Job, now_ms: u64) -> Attempt {
        let parent = match job.trace_context() {
            Some(Ok((tp, state))) => {
                let state = state
                    .and_then(|s| s.parse::<TraceState>().ok())
                    .unwrap_or_default();
                Context::new().with_remote_span_context(SpanContext::new(
                    TraceId::from_bytes(tp.trace_id),
                    SpanId::from_bytes(tp.parent_id),
                    TraceFlags::new(tp.flags),
                    true,
                    state,
                ))
            }
            Some(Err(reason)) => {
                tracing::warn!(queue, id = %workerpool_queue::text::safe_line(job.id(), 100), %reason, "ignoring the job's trace context");
                Context::new()
            }
            None => Context::new(),
        };
        let mut attributes = vec![
            KeyValue::new("messaging.system", "workerpool"),
            KeyValue::new("messaging.operation.type", "process"),
            KeyValue::new("messaging.operation.name", "process"),
            KeyValue::new("messaging.destination.name", queue.to_string()),
            KeyValue::new("messaging.message.id", job.id().to_string()),
            KeyValue::new("workerpool.job.attempt", i64::from(job.attempt())),
        ];
        if let Some(task) = job.task() {
            attributes.push(KeyValue::new("workerpool.job.task", task.to_string()));
        }
        if let Some(at) = job.enqueued_at().filter(|at| *at <= now_ms) {
            attributes.push(KeyValue::new(
                "workerpool.job.wait_ms",
                (now_ms - at) as i64,
            ));
            let mut wait = self
                .tracer
                .span_builder(format!("wait {queue}"))
                .with_kind(SpanKind::Internal)
                .with_start_time(UNIX_EPOCH + Duration::from_millis(at))
                .with_attributes([
                    KeyValue::new("messaging.destination.name", queue.to_string()),
                    KeyValue::new("messaging.message.id", job.id().to_string()),
                ])
                .start_with_context(&self.tracer, &parent);
            wait.end_with_timestamp(UNIX_EPOCH + Duration::from_millis(now_ms));
        }
        // A retry links to the attempt that failed before it.
        let links = job
            .previous_attempt()
            .map(|tp| {
                vec![Link::with_context(SpanContext::new(
                    TraceId::from_bytes(tp.trace_id),
                    SpanId::from_bytes(tp.parent_id),
                    TraceFlags::new(tp.flags),
                    true,
                    TraceState::default(),
                ))]
            })
            .unwrap_or_default();
        let span = self
            .tracer
            .span_builder(format!("process {queue}"))
            .with_kind(SpanKind::Consumer)
            .with_attributes(attributes)
            .with_links(links)
            .start_with_context(&self.tracer, &parent);
        Attempt { span }
    }

    /// Records the recovery of a lost worker's jobs: a span of its own
    /// (the reaper does not see the jobs' traces), with a `recovered`
    /// event naming the lost worker and how many jobs went back.
    pub fn recovered(&self, queue: &str, lost: &str, jobs: u64) {
        let mut span = self
            .tracer
            .span_builder(format!("recover {queue}"))
            .with_kind(SpanKind::Internal)
            .with_attributes([
                KeyValue::new("messaging.system", "workerpool"),
                KeyValue::new("messaging.destination.name", queue.to_string()),
            ])
            .start(&self.tracer);
        span.add_event(
            "recovered",
            vec![
                KeyValue::new(
                    "workerpool.lost_worker",
                    workerpool_queue::text::safe_line(lost, 200),
                ),
                KeyValue::new("workerpool.jobs", i64::try_from(jobs).unwrap_or(i64::MAX)),
            ],
        );
        span.end();
    }

    /// Sends what is queued and stops the exporter (at shutdown), waiting
    /// up to `timeout`.
    pub fn shutdown(&self, timeout: Duration) {
        if let Err(e) = self.provider.shutdown_with_timeout(timeout) {
            tracing::warn!(error = %e, "tracing: spans not sent at shutdown");
        }
    }
}

/// The span of one attempt.
#[derive(Debug)]
pub struct Attempt {
    span: Span,
}

impl Attempt {
    /// The `traceparent` the handler gets: this span's.
    pub fn traceparent(&self) -> String {
        let c = self.span.span_context();
        format!(
            "00-{}-{}-{:02x}",
            c.trace_id(),
            c.span_id(),
            c.trace_flags().to_u8()
        )
    }

    /// Ends the span with the attempt's outcome: an error status with the
    /// error's text (one line, bounded) when it failed; `dead` marks a
    /// dead letter with an event.
    pub fn end(mut self, outcome: &Outcome, dead: Option<&str>) {
        let failure = match outcome {
            Outcome::Done | Outcome::Returned(_) | Outcome::ResultNotKept(_) => None,
            Outcome::Failed { error, retry } => {
                Some((error, if *retry { "failed" } else { "permanent" }))
            }
            Outcome::NotRun { error, .. } => Some((error, "not_run")),
        };
        if let Some((error, kind)) = failure {
            let text = workerpool_queue::text::safe_line(&redacted(error), ERROR_CHARS);
            self.span.set_attribute(KeyValue::new("error.type", kind));
            self.span.set_status(Status::error(text));
        }
        if let Some(reason) = dead {
            self.span.add_event(
                "dead_lettered",
                vec![KeyValue::new("workerpool.dead.reason", reason.to_string())],
            );
        }
        self.span.end();
    }

    /// Ends the span of an attempt given back unfinished at shutdown.
    pub fn given_back(mut self) {
        self.span.add_event(
            "given_back",
            vec![KeyValue::new("workerpool.reason", "shutdown")],
        );
        self.span.end();
    }
}

/// How spans travel to the collector: `OTEL_EXPORTER_OTLP_PROTOCOL`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Protocol {
    /// OTLP/HTTP with protobuf bodies (a Collector's port 4318), the default.
    HttpProtobuf,
    /// OTLP/gRPC (a Collector's port 4317).
    Grpc,
}

impl Protocol {
    /// The protocol the variables ask for (the `_TRACES_` one wins).
    fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Protocol, OtelError> {
        let Some((name, value)) = setting(
            &var,
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ) else {
            return Ok(Protocol::HttpProtobuf);
        };
        match value.trim() {
            "http/protobuf" => Ok(Protocol::HttpProtobuf),
            "grpc" => Ok(Protocol::Grpc),
            other => Err(OtelError(format!(
                "{name}={other} is not supported: use http/protobuf (an OpenTelemetry \
                 Collector's port 4318) or grpc (its port 4317)"
            ))),
        }
    }

    /// Its name in `OTEL_EXPORTER_OTLP_PROTOCOL`.
    fn name(self) -> &'static str {
        match self {
            Protocol::HttpProtobuf => "http/protobuf",
            Protocol::Grpc => "grpc",
        }
    }
}

/// Whether `OTEL_EXPORTER_OTLP_COMPRESSION` asks for gzip (`none`, or
/// unset, sends bodies as they are); any other value is refused, as the
/// exporter would otherwise ignore it without a word.
fn gzip_from_vars(var: impl Fn(&str) -> Option<String>) -> Result<bool, OtelError> {
    match setting(
        var,
        "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
        "OTEL_EXPORTER_OTLP_COMPRESSION",
    ) {
        None => Ok(false),
        Some((_, v)) if v.trim().eq_ignore_ascii_case("gzip") => Ok(true),
        Some((_, v)) if v.trim().eq_ignore_ascii_case("none") => Ok(false),
        Some((name, other)) => Err(OtelError(format!(
            "{name}={other} is not supported: use gzip or none"
        ))),
    }
}

/// Refuses an `OTEL_TRACES_SAMPLER` (or its ratio) that the SDK would
/// replace with its default without a word: a sampler it does not have, or
/// a ratio that is not a number from 0 to 1 (read as the SDK reads it).
fn check_sampler(var: impl Fn(&str) -> Option<String>) -> Result<(), OtelError> {
    let Some(sampler) = var("OTEL_TRACES_SAMPLER") else {
        return Ok(());
    };
    match sampler.as_str() {
        "always_on" | "always_off" | "parentbased_always_on" | "parentbased_always_off" => Ok(()),
        "traceidratio" | "parentbased_traceidratio" => match var("OTEL_TRACES_SAMPLER_ARG") {
            // The specification's default ratio, 1.
            None => Ok(()),
            Some(arg) => match arg.parse::<f64>() {
                Ok(ratio) if (0.0..=1.0).contains(&ratio) => Ok(()),
                _ => Err(OtelError(format!(
                    "OTEL_TRACES_SAMPLER_ARG={arg} is not a ratio: give a number from 0 to 1, \
                     such as 0.25 to sample a quarter of the traces"
                ))),
            },
        },
        other => Err(OtelError(format!(
            "OTEL_TRACES_SAMPLER={other} is not supported: use always_on, always_off, \
             traceidratio, or parentbased_always_on, parentbased_always_off, \
             parentbased_traceidratio"
        ))),
    }
}

/// The longest one export request may take, unless
/// `OTEL_EXPORTER_OTLP_TIMEOUT` says otherwise (the specification's default).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// `OTEL_EXPORTER_OTLP_TIMEOUT`: whole milliseconds, at least 1; anything
/// else is refused, as the exporter would otherwise take its default
/// without a word.
fn timeout_from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Duration, OtelError> {
    let Some((name, value)) = setting(
        var,
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
    ) else {
        return Ok(EXPORT_TIMEOUT);
    };
    match value.trim().parse::<u64>() {
        Ok(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
        _ => Err(OtelError(format!(
            "{name}={value} is not a timeout: give whole milliseconds, such as 10000"
        ))),
    }
}

type Connector = hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>;

/// The connection to the collector, ready to become an exporter.
enum Transport {
    /// OTLP/HTTP through the hyper client.
    Http(Connector),
    /// OTLP/gRPC through a tonic channel to this endpoint.
    Grpc(Box<tonic::transport::Endpoint>, Connector),
}

impl Transport {
    /// The exporter over this transport. A gRPC channel starts its
    /// connection task on the current Tokio runtime: call it inside the one
    /// that will run the exports.
    /// With `gzip`, every request body is gzipped; each request may take
    /// `timeout`.
    fn exporter(
        self,
        gzip: bool,
        timeout: Duration,
    ) -> Result<opentelemetry_otlp::SpanExporter, String> {
        use opentelemetry_otlp::{Compression, WithExportConfig};
        let built = match self {
            Transport::Http(connector) => {
                use opentelemetry_otlp::WithHttpConfig;
                let builder = opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .with_timeout(timeout)
                    .with_http_client(opentelemetry_http::hyper::HyperClient::new(
                        connector, timeout, None,
                    ));
                match gzip {
                    true => builder.with_compression(Compression::Gzip).build(),
                    false => builder.build(),
                }
            }
            Transport::Grpc(endpoint, connector) => {
                use opentelemetry_otlp::WithTonicConfig;
                let builder = opentelemetry_otlp::SpanExporter::builder()
                    .with_tonic()
                    .with_timeout(timeout)
                    .with_channel(endpoint.connect_with_connector_lazy(connector));
                match gzip {
                    true => builder.with_compression(Compression::Gzip).build(),
                    false => builder.build(),
                }
            }
        };
        built.map_err(|e| format!("building the OTLP exporter: {e}"))
    }
}

/// A variable's name and the value (a path) it holds.
type Named = (&'static str, String);

/// The value of the signal's own variable (`traces`), or else of the
/// general one, as the OpenTelemetry specification orders them; with the
/// name of the variable it came from.
fn setting(
    var: impl Fn(&str) -> Option<String>,
    traces: &'static str,
    general: &'static str,
) -> Option<Named> {
    var(traces)
        .map(|v| (traces, v))
        .or_else(|| var(general).map(|v| (general, v)))
}

/// The PEM files of TLS to an https:// collector, each with the variable
/// that named it (the `_TRACES_` one wins over the general one, as the
/// OpenTelemetry specification says).
#[derive(Debug, Default, PartialEq, Eq)]
struct TlsFiles {
    /// A CA to trust besides the system's roots: `OTEL_EXPORTER_OTLP_CERTIFICATE`.
    ca: Option<Named>,
    /// The worker's own certificate chain and key, for a collector that asks
    /// for one (mutual TLS): `OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE` and
    /// `OTEL_EXPORTER_OTLP_CLIENT_KEY`.
    client: Option<(Named, Named)>,
}

impl TlsFiles {
    /// The files the variables name (`var` reads one, `None` when unset or blank).
    fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<TlsFiles, OtelError> {
        let setting = |traces, general| setting(&var, traces, general);
        let ca = setting(
            "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
        );
        let cert = setting(
            "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
        );
        let key = setting(
            "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
            "OTEL_EXPORTER_OTLP_CLIENT_KEY",
        );
        let client = match (cert, key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            (Some((name, _)), None) => {
                return Err(OtelError(format!(
                    "{name} is set without OTEL_EXPORTER_OTLP_CLIENT_KEY: \
                     a client certificate needs its private key"
                )));
            }
            (None, Some((name, _))) => {
                return Err(OtelError(format!(
                    "{name} is set without OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE: \
                     a client key needs its certificate"
                )));
            }
        };
        Ok(TlsFiles { ca, client })
    }

    /// TLS as these files ask: the system's roots and the CA, and the
    /// client certificate when there is one.
    fn client_config(&self) -> Result<rustls::ClientConfig, OtelError> {
        use rustls::pki_types::PrivateKeyDer;
        use rustls::pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_native_certs::load_native_certs().certs {
            let _ = roots.add(cert);
        }
        if let Some((name, path)) = &self.ca {
            for cert in certificates(name, path)? {
                roots
                    .add(cert)
                    .map_err(|e| OtelError(format!("{name} {path:?}: {e}")))?;
            }
        }
        let builder = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| OtelError(format!("TLS: {e}")))?
        .with_root_certificates(roots);
        let Some(((cert_name, cert_path), (key_name, key_path))) = &self.client else {
            return Ok(builder.with_no_client_auth());
        };
        let chain = certificates(cert_name, cert_path)?;
        let key = PrivateKeyDer::from_pem_file(key_path).map_err(|e| {
            OtelError(format!(
                "{key_name} {key_path:?}: no PEM private key could be read ({e})"
            ))
        })?;
        builder.with_client_auth_cert(chain, key).map_err(|e| {
            OtelError(format!(
                "{cert_name} {cert_path:?} and {key_name} {key_path:?} do not make a client \
                 identity: {e}"
            ))
        })
    }
}

/// The certificates in the PEM file `path`, which `name` gave: at least one.
fn certificates(
    name: &str,
    path: &str,
) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, OtelError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect())
        .map_err(|e| OtelError(format!("{name} {path:?}: {e}")))?;
    if certs.is_empty() {
        return Err(OtelError(format!(
            "{name} {path:?} holds no PEM certificate"
        )));
    }
    Ok(certs)
}

/// `text` with the password of every URL in it masked (`redis://u:***@h`):
/// a handler's error often quotes the URL it could not reach, and a span
/// leaves the cluster for a tracing backend.
fn redacted(text: &str) -> String {
    text.split_inclusive(char::is_whitespace)
        .map(|word| {
            let trimmed = word.trim_end();
            if trimmed.contains("://") && trimmed.contains('@') {
                let mut out = workerpool_queue::connection::redact(trimmed);
                out.push_str(&word[trimmed.len()..]);
                out
            } else {
                word.to_string()
            }
        })
        .collect()
}

enum Message {
    Span(Box<SpanData>),
    Flush(SyncSender<()>),
}

/// A batching span processor on a thread of its own, sending through the
/// OTLP exporter on that thread's own runtime: the worker's runtime never
/// waits for the collector.
#[derive(Debug)]
struct Exporter {
    queue: Mutex<Option<SyncSender<Message>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    counters: SpanCounters,
}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Message")
    }
}

impl Exporter {
    /// Starts the export thread, which builds its exporter with `build`
    /// inside its own runtime; fails as building it does.
    fn start(
        build: impl FnOnce() -> Result<opentelemetry_otlp::SpanExporter, String> + Send + 'static,
        counters: SpanCounters,
    ) -> Result<Exporter, OtelError> {
        let (tx, rx) = sync_channel(QUEUE);
        let (built_tx, built) = sync_channel(1);
        let thread_counters = counters.clone();
        let thread = std::thread::Builder::new()
            .name("otlp-export".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| format!("starting the export runtime: {e}"));
                let exporter = runtime.and_then(|runtime| {
                    let exporter = {
                        let _inside = runtime.enter();
                        build()?
                    };
                    Ok((runtime, exporter))
                });
                match exporter {
                    Ok((runtime, exporter)) => {
                        let _ = built_tx.send(Ok(()));
                        export_loop(&runtime, exporter, rx, thread_counters);
                    }
                    Err(e) => {
                        let _ = built_tx.send(Err(e));
                    }
                }
            })
            .map_err(|e| OtelError(format!("starting the export thread: {e}")))?;
        match built.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(OtelError(e)),
            Err(_) => return Err(OtelError("the export thread stopped while starting".into())),
        }
        Ok(Exporter {
            queue: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
            counters,
        })
    }

    fn sender(&self) -> Option<SyncSender<Message>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl SpanProcessor for Exporter {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        let Some(tx) = self.sender() else {
            self.counters
                .dropped
                .with_label_values(&["shut_down"])
                .inc();
            return;
        };
        match tx.try_send(Message::Span(Box::new(span))) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                self.counters
                    .dropped
                    .with_label_values(&["queue_full"])
                    .inc();
            }
            Err(TrySendError::Disconnected(_)) => {
                self.counters
                    .dropped
                    .with_label_values(&["shut_down"])
                    .inc();
            }
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        let Some(tx) = self.sender() else {
            return Err(OTelSdkError::AlreadyShutdown);
        };
        let (done, wait) = sync_channel(1);
        tx.send(Message::Flush(done))
            .map_err(|_| OTelSdkError::AlreadyShutdown)?;
        wait.recv_timeout(Duration::from_secs(10))
            .map_err(|_| OTelSdkError::Timeout(Duration::from_secs(10)))
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        let Some(tx) = self.queue.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return Err(OTelSdkError::AlreadyShutdown);
        };
        let (done, wait) = sync_channel(1);
        let flushed = tx.send(Message::Flush(done)).is_ok() && wait.recv_timeout(timeout).is_ok();
        drop(tx);
        if let Some(thread) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take()
            && flushed
        {
            let _ = thread.join();
        }
        if flushed {
            Ok(())
        } else {
            Err(OTelSdkError::Timeout(timeout))
        }
    }
}

fn export_loop(
    runtime: &tokio::runtime::Runtime,
    exporter: opentelemetry_otlp::SpanExporter,
    rx: Receiver<Message>,
    counters: SpanCounters,
) {
    let send = |batch: &mut Vec<SpanData>| {
        if batch.is_empty() {
            return;
        }
        let n = batch.len() as u64;
        match runtime.block_on(exporter.export(std::mem::take(batch))) {
            Ok(()) => counters.exported.inc_by(n),
            Err(e) => {
                counters
                    .dropped
                    .with_label_values(&["export_failed"])
                    .inc_by(n);
                tracing::warn!(error = %e, spans = n, "tracing: export failed; those spans are dropped");
            }
        }
    };
    let mut batch: Vec<SpanData> = Vec::with_capacity(BATCH);
    let mut deadline: Option<Instant> = None;
    loop {
        let wait = deadline.map_or(Duration::from_secs(3600), |d| {
            d.saturating_duration_since(Instant::now())
        });
        match rx.recv_timeout(wait) {
            Ok(Message::Span(span)) => {
                batch.push(*span);
                deadline.get_or_insert_with(|| Instant::now() + DELAY);
                if batch.len() >= BATCH {
                    send(&mut batch);
                    deadline = None;
                }
            }
            Ok(Message::Flush(done)) => {
                send(&mut batch);
                deadline = None;
                let _ = done.send(());
            }
            Err(RecvTimeoutError::Timeout) => {
                send(&mut batch);
                deadline = None;
            }
            Err(RecvTimeoutError::Disconnected) => {
                send(&mut batch);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::TlsFiles;

    fn vars(set: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let set: Vec<(String, String)> = set
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        move |name| set.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone())
    }

    #[test]
    fn the_traces_variables_win_over_the_general_ones_and_each_file_keeps_its_variable() {
        let files = TlsFiles::from_vars(vars(&[
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/general/ca.pem"),
            ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "/traces/ca.pem"),
            ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "/general/cert.pem"),
            ("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", "/traces/key.pem"),
        ]))
        .expect("a whole client identity");
        assert_eq!(
            files,
            TlsFiles {
                ca: Some((
                    "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
                    "/traces/ca.pem".into()
                )),
                client: Some((
                    (
                        "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
                        "/general/cert.pem".into()
                    ),
                    (
                        "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
                        "/traces/key.pem".into()
                    ),
                )),
            }
        );
        assert_eq!(
            TlsFiles::from_vars(vars(&[])).ok(),
            Some(TlsFiles::default())
        );
    }

    #[test]
    fn the_protocol_is_http_protobuf_unless_grpc_is_asked_and_anything_else_is_refused() {
        use super::Protocol;
        assert_eq!(
            Protocol::from_vars(vars(&[])).ok(),
            Some(Protocol::HttpProtobuf)
        );
        assert_eq!(
            Protocol::from_vars(vars(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")])).ok(),
            Some(Protocol::Grpc)
        );
        assert_eq!(
            Protocol::from_vars(vars(&[
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
            ]))
            .ok(),
            Some(Protocol::HttpProtobuf),
            "the traces variable wins"
        );
        let err = Protocol::from_vars(vars(&[("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")]))
            .expect_err("JSON bodies are not sent");
        assert!(
            err.to_string()
                .contains("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/json is not supported"),
            "{err}"
        );
    }

    #[test]
    fn compression_is_gzip_or_none_and_anything_else_is_refused() {
        use super::gzip_from_vars;
        assert_eq!(gzip_from_vars(vars(&[])).ok(), Some(false));
        assert_eq!(
            gzip_from_vars(vars(&[("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")])).ok(),
            Some(true)
        );
        assert_eq!(
            gzip_from_vars(vars(&[
                ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
                ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "none"),
            ]))
            .ok(),
            Some(false),
            "the traces variable wins"
        );
        let err = gzip_from_vars(vars(&[("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd")]))
            .expect_err("zstd is not built in");
        assert!(
            err.to_string()
                .contains("OTEL_EXPORTER_OTLP_COMPRESSION=zstd is not supported: use gzip or none"),
            "{err}"
        );
    }

    #[test]
    fn the_timeout_is_whole_milliseconds_ten_seconds_by_default() {
        use super::timeout_from_vars;
        use std::time::Duration;
        assert_eq!(
            timeout_from_vars(vars(&[])).ok(),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            timeout_from_vars(vars(&[
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "30000"),
                ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "2500"),
            ]))
            .ok(),
            Some(Duration::from_millis(2500)),
            "the traces variable wins"
        );
        for bad in ["10s", "0", "-1", "1.5"] {
            let err =
                timeout_from_vars(vars(&[("OTEL_EXPORTER_OTLP_TIMEOUT", bad)])).expect_err(bad);
            assert!(
                err.to_string().contains(&format!(
                    "OTEL_EXPORTER_OTLP_TIMEOUT={bad} is not a timeout"
                )),
                "{err}"
            );
        }
    }

    #[test]
    fn a_sampler_the_sdk_would_replace_without_a_word_is_refused() {
        use super::check_sampler;
        for good in [
            vars(&[]),
            vars(&[("OTEL_TRACES_SAMPLER", "always_off")]),
            vars(&[("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")]),
            vars(&[
                ("OTEL_TRACES_SAMPLER", "traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
            ]),
        ] {
            assert!(check_sampler(good).is_ok());
        }
        for (set, says) in [
            (
                vars(&[("OTEL_TRACES_SAMPLER", "xray")]),
                "OTEL_TRACES_SAMPLER=xray is not supported",
            ),
            (
                vars(&[
                    ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
                    ("OTEL_TRACES_SAMPLER_ARG", "25"),
                ]),
                "OTEL_TRACES_SAMPLER_ARG=25 is not a ratio",
            ),
            (
                vars(&[
                    ("OTEL_TRACES_SAMPLER", "traceidratio"),
                    ("OTEL_TRACES_SAMPLER_ARG", "half"),
                ]),
                "OTEL_TRACES_SAMPLER_ARG=half is not a ratio",
            ),
        ] {
            let err = check_sampler(set).expect_err(says);
            assert!(err.to_string().contains(says), "{err}");
        }
    }

    #[test]
    fn half_a_client_identity_is_refused_naming_what_is_missing() {
        let err = TlsFiles::from_vars(vars(&[(
            "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
            "/c.pem",
        )]))
        .expect_err("a certificate without its key");
        assert!(
            err.to_string().contains(
                "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE is set without \
                 OTEL_EXPORTER_OTLP_CLIENT_KEY"
            ),
            "{err}"
        );
        let err = TlsFiles::from_vars(vars(&[("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/k.pem")]))
            .expect_err("a key without its certificate");
        assert!(
            err.to_string()
                .contains("without OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"),
            "{err}"
        );
    }

    #[test]
    fn unreadable_or_empty_files_are_refused_naming_the_variable_and_the_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "no PEM here\n").expect("write");
        let empty = empty.to_string_lossy().into_owned();
        let missing = dir
            .path()
            .join("missing.pem")
            .to_string_lossy()
            .into_owned();
        let ca_err = TlsFiles {
            ca: Some(("OTEL_EXPORTER_OTLP_CERTIFICATE", empty.clone())),
            client: None,
        }
        .client_config()
        .expect_err("an empty CA file");
        assert!(
            ca_err.to_string().contains(&format!(
                "OTEL_EXPORTER_OTLP_CERTIFICATE {empty:?} holds no PEM certificate"
            )),
            "{ca_err}"
        );
        let key_err = TlsFiles {
            ca: None,
            client: Some((
                ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", missing.clone()),
                ("OTEL_EXPORTER_OTLP_CLIENT_KEY", missing.clone()),
            )),
        }
        .client_config()
        .expect_err("a missing certificate file");
        assert!(
            key_err.to_string().starts_with(&format!(
                "OpenTelemetry: OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE {missing:?}"
            )),
            "{key_err}"
        );
    }

    #[test]
    fn passwords_of_urls_in_an_error_are_masked_and_the_rest_kept() {
        assert_eq!(
            super::redacted("cannot reach redis://app:s3cret@db:6379/0 (refused)\nretrying"),
            "cannot reach redis://app:***@db:6379/0 (refused)\nretrying"
        );
        assert_eq!(
            super::redacted("plain words, a@b and c://d"),
            "plain words, a@b and c://d"
        );
    }
}
