//! Tracing on the cluster: a pool with `spec.tracing` exports a span per
//! attempt, continuing the producer's trace, to a collector in the cluster.

use std::time::Duration;

use serde_json::json;

use crate::E2e;
use crate::cluster::{Namespace, eventually};
use crate::scenarios::{Pool, Redis, is_ready, ready_workers, worker_image};
use crate::tls::secret_from_files;
use workerpool_tests::tls::Certificates;

pub const ALL: &[crate::Scenario] = &[(
    "a_pool_with_spec_tracing_exports_its_attempts_to_the_collector_in_the_cluster",
    a_pool_with_spec_tracing_exports_its_attempts_to_the_collector_in_the_cluster,
)];

/// A stand-in collector: keeps the body of every OTLP/HTTP request in
/// /tmp/otlp and answers 200 (python3 from the worker image). On `PORT`
/// (4318 by default); with `TLS_DIR`, over TLS with the `server.crt` and
/// `server.key` there, taking only clients whose certificate its `ca.crt`
/// signed.
const COLLECTOR: &str = r#"
import http.server, os, ssl
os.makedirs("/tmp/otlp", exist_ok=True)
class Collector(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        n = len(os.listdir("/tmp/otlp"))
        with open(f"/tmp/otlp/{n}-{self.path.strip('/').replace('/', '_')}", "wb") as f:
            f.write(body)
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()
server = http.server.ThreadingHTTPServer(("0.0.0.0", int(os.environ.get("PORT", "4318"))), Collector)
tls = os.environ.get("TLS_DIR")
if tls:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(f"{tls}/server.crt", f"{tls}/server.key")
    context.load_verify_locations(f"{tls}/ca.crt")
    context.verify_mode = ssl.CERT_REQUIRED
    server.socket = context.wrap_socket(server.socket, server_side=True)
server.serve_forever()
"#;

/// Counts, over every body the collector kept, the requests to `/v1/traces`
/// and the bodies holding each of the byte strings given in hex.
const COUNT: &str = r#"
import glob, sys
bodies = [(p, open(p, "rb").read()) for p in glob.glob("/tmp/otlp/*")]
traces = [b for p, b in bodies if p.endswith("v1_traces")]
print(len(traces), *[sum(bytes.fromhex(h) in b for b in traces) for h in sys.argv[1:]])
"#;

fn a_pool_with_spec_tracing_exports_its_attempts_to_the_collector_in_the_cluster(e2e: &E2e) {
    let k = &e2e.cluster;
    let ns = Namespace::create(k, "e2e-tracing");
    let redis = Redis::start(k, &ns.name);
    let collector = json!({
        "apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": "collector", "labels": {"app": "collector"}},
             "spec": {"containers": [{"name": "collector", "image": worker_image(), "imagePullPolicy": "Never",
                                      "command": ["python3", "-c", COLLECTOR],
                                      "ports": [{"containerPort": 4318}],
                                      "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                                      "readinessProbe": {"tcpSocket": {"port": 4318}, "periodSeconds": 1}}],
                      "volumes": [{"name": "tmp", "emptyDir": {}}],
                      "terminationGracePeriodSeconds": 1}},
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "collector"},
             "spec": {"selector": {"app": "collector"}, "ports": [{"port": 4318}]}},
        ]
    });
    k.apply(&ns.name, &collector.to_string());
    eventually(Duration::from_secs(60), "a Ready collector", |last| {
        let pod = k.get(&["pod", "-n", &ns.name, "collector"])?;
        *last = pod["status"].to_string();
        is_ready(&pod).then_some(())
    });
    let ip = k.cluster_ip(&ns.name, "collector");

    let pool = Pool::new("traced", &redis).with(|spec| {
        spec["scaling"]["minReplicas"] = 1.into();
        spec["tracing"] = json!({"endpoint": format!("http://{ip}:4318")});
    });
    k.apply(&ns.name, &pool.manifest());
    let workers = ready_workers(k, &ns.name, "traced", 1);
    let pod = k
        .get(&["pod", "-n", &ns.name, &workers[0]])
        .expect("the worker pod");
    let env = pod["spec"]["containers"][0]["env"].to_string();
    assert!(
        env.contains("OTEL_EXPORTER_OTLP_ENDPOINT") && env.contains("OTEL_SERVICE_NAME"),
        "the operator injected the OTEL_* variables: {env}"
    );

    // A job enqueued inside a producer's trace.
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let job = json!({"id": "traced-job-1", "task": "e2e", "data": {"ms": 10},
                     "traceparent": format!("00-{trace_id}-00f067aa0ba902b7-01")});
    redis.cli(&["LPUSH", "traced", &job.to_string()]);
    eventually(Duration::from_secs(60), "the job done", |last| {
        let done = redis.done();
        *last = format!("{done:?}");
        done.contains_key("traced-job-1").then_some(())
    });
    // Its attempt's span at the collector, in the OTLP protobuf: the
    // producer's trace id, the job id, the span's name, and the pod's name
    // (the resource attribute the kubelet expanded from the worker id).
    spans_reach(
        k,
        &ns.name,
        "collector",
        &[trace_id, "traced-job-1", "process traced", &workers[0]],
    );

    // Over gRPC: the API server takes `protocol: grpc`, the operator passes
    // it on, and the worker rolls out Ready with it (the spans' way over
    // gRPC is tested against a gRPC receiver in worker/tests/tracing.rs).
    let grpc = pool.clone().with(|spec| {
        spec["tracing"] = json!({"endpoint": format!("http://{ip}:4317"), "protocol": "grpc"});
    });
    k.apply(&ns.name, &grpc.manifest());
    rolled_out(k, &ns.name, "OTEL_EXPORTER_OTLP_PROTOCOL=grpc", |worker| {
        worker["env"].as_array().is_some_and(|env| {
            env.iter()
                .any(|e| e["name"] == "OTEL_EXPORTER_OTLP_PROTOCOL" && e["value"] == "grpc")
        })
    });

    // Over TLS to a collector that asks for a client certificate, with the
    // CA and the certificate from Secrets the operator mounts.
    k.apply(
        &ns.name,
        &json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "collector-tls"},
                "spec": {"selector": {"app": "collector-tls"}, "ports": [{"port": 4319}]}})
        .to_string(),
    );
    let tls_ip = k.cluster_ip(&ns.name, "collector-tls");
    let dir = tempfile::tempdir().expect("temp dir");
    let certs = Certificates::make_for(dir.path(), &[&tls_ip]);
    let file = |p: &std::path::Path| p.display().to_string();
    secret_from_files(
        k,
        &ns.name,
        &[
            "generic",
            "collector-tls",
            &format!("--from-file=server.crt={}", file(&certs.server_cert)),
            &format!("--from-file=server.key={}", file(&certs.server_key)),
            &format!("--from-file=ca.crt={}", file(&certs.ca)),
        ],
    );
    secret_from_files(
        k,
        &ns.name,
        &[
            "generic",
            "otel-ca",
            &format!("--from-file=ca.crt={}", file(&certs.ca)),
        ],
    );
    secret_from_files(
        k,
        &ns.name,
        &[
            "tls",
            "otel-client",
            &format!("--cert={}", file(&certs.client_cert)),
            &format!("--key={}", file(&certs.client_key)),
        ],
    );
    k.apply(
        &ns.name,
        &json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "collector-tls", "labels": {"app": "collector-tls"}},
                "spec": {"containers": [{"name": "collector", "image": worker_image(), "imagePullPolicy": "Never",
                                         "command": ["python3", "-c", COLLECTOR],
                                         "env": [{"name": "PORT", "value": "4319"}, {"name": "TLS_DIR", "value": "/tls"}],
                                         "ports": [{"containerPort": 4319}],
                                         "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"},
                                                          {"name": "tls", "mountPath": "/tls", "readOnly": true}],
                                         "readinessProbe": {"tcpSocket": {"port": 4319}, "periodSeconds": 1}}],
                         "volumes": [{"name": "tmp", "emptyDir": {}},
                                     {"name": "tls", "secret": {"secretName": "collector-tls"}}],
                         "terminationGracePeriodSeconds": 1}})
        .to_string(),
    );
    eventually(Duration::from_secs(60), "a Ready TLS collector", |last| {
        let pod = k.get(&["pod", "-n", &ns.name, "collector-tls"])?;
        *last = pod["status"].to_string();
        is_ready(&pod).then_some(())
    });
    let tls = pool.clone().with(|spec| {
        spec["tracing"] = json!({"endpoint": format!("https://{tls_ip}:4319"),
                                 "tls": {"caSecretRef": {"name": "otel-ca", "key": "ca.crt"},
                                         "clientCertificateSecretRef": {"name": "otel-client"}}});
    });
    k.apply(&ns.name, &tls.manifest());
    rolled_out(
        k,
        &ns.name,
        "the collector's CA and client certificate mounted",
        |worker| {
            worker["volumeMounts"]
                .to_string()
                .contains("/etc/workerpool/otel-client")
        },
    );
    let job = json!({"id": "traced-job-2", "task": "e2e", "data": {"ms": 10},
                     "traceparent": format!("00-{trace_id}-00f067aa0ba902b7-01")});
    redis.cli(&["LPUSH", "traced", &job.to_string()]);
    spans_reach(
        k,
        &ns.name,
        "collector-tls",
        &[trace_id, "traced-job-2", "process traced"],
    );
}

/// Waits until the pool `traced` has rolled out one Ready worker whose
/// container (in the Deployment's template) passes `check`.
fn rolled_out(
    k: &crate::cluster::Cluster,
    namespace: &str,
    what: &str,
    check: impl Fn(&serde_json::Value) -> bool,
) {
    eventually(
        Duration::from_secs(120),
        &format!("a Ready worker with {what}"),
        |last| {
            let d = k.get(&["deployment", "-n", namespace, "traced"])?;
            let status = &d["status"];
            let worker = &d["spec"]["template"]["spec"]["containers"][0];
            *last = format!("worker {worker}, status {status}");
            (check(worker)
                && status["observedGeneration"] == d["metadata"]["generation"]
                && status["updatedReplicas"] == 1
                && status["readyReplicas"] == 1
                && status["replicas"] == 1)
                .then_some(())
        },
    );
}

/// Waits until the collector Pod `collector` holds a `/v1/traces` body
/// holding each of `texts` (the trace id in hex, the others as their bytes).
fn spans_reach(k: &crate::cluster::Cluster, namespace: &str, collector: &str, texts: &[&str]) {
    let hex = |s: &str| s.bytes().map(|b| format!("{b:02x}")).collect::<String>();
    let mut args = vec![
        "exec".to_string(),
        "-n".into(),
        namespace.into(),
        collector.into(),
        "--".into(),
        "python3".into(),
        "-c".into(),
        COUNT.into(),
    ];
    for (i, text) in texts.iter().enumerate() {
        // The first is the trace id, already hex.
        args.push(if i == 0 { text.to_string() } else { hex(text) });
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    eventually(
        Duration::from_secs(60),
        &format!("the attempt's span at {collector}"),
        |last| {
            let out = k.try_kubectl(&args).ok()?;
            *last = out.clone();
            let counts: Vec<u64> = out
                .split_whitespace()
                .filter_map(|n| n.parse().ok())
                .collect();
            (counts.len() == texts.len() + 1 && counts[0] > 0 && counts[1..].iter().all(|n| *n > 0))
                .then_some(())
        },
    );
}
