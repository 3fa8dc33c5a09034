//! Tracing on the cluster: a pool with `spec.tracing` exports a span per
//! attempt, continuing the producer's trace, to a collector in the cluster.

use std::time::Duration;

use serde_json::json;

use crate::E2e;
use crate::cluster::{Namespace, eventually};
use crate::scenarios::{Pool, Redis, is_ready, ready_workers, worker_image};

pub const ALL: &[crate::Scenario] = &[(
    "a_pool_with_spec_tracing_exports_its_attempts_to_the_collector_in_the_cluster",
    a_pool_with_spec_tracing_exports_its_attempts_to_the_collector_in_the_cluster,
)];

/// A stand-in collector: keeps the body of every OTLP/HTTP request in
/// /tmp/otlp and answers 200 (python3 from the worker image).
const COLLECTOR: &str = r#"
import http.server, os
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
http.server.ThreadingHTTPServer(("0.0.0.0", 4318), Collector).serve_forever()
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
    let ip = k
        .get(&["service", "-n", &ns.name, "collector"])
        .and_then(|s| s["spec"]["clusterIP"].as_str().map(String::from))
        .expect("the collector's ClusterIP");

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
    let hex = |s: &str| s.bytes().map(|b| format!("{b:02x}")).collect::<String>();
    eventually(
        Duration::from_secs(30),
        "the attempt's span at the collector",
        |last| {
            let out = k
                .try_kubectl(&[
                    "exec",
                    "-n",
                    &ns.name,
                    "collector",
                    "--",
                    "python3",
                    "-c",
                    COUNT,
                    trace_id,
                    &hex("traced-job-1"),
                    &hex("process traced"),
                    &hex(&workers[0]),
                ])
                .ok()?;
            *last = out.clone();
            let counts: Vec<u64> = out
                .split_whitespace()
                .filter_map(|n| n.parse().ok())
                .collect();
            (counts.len() == 5 && counts[0] > 0 && counts[1..].iter().all(|n| *n > 0)).then_some(())
        },
    );

    // Over gRPC: the API server takes `protocol: grpc`, the operator passes
    // it on, and the worker rolls out Ready with it (the spans' way over
    // gRPC is tested against a gRPC receiver in worker/tests/tracing.rs).
    let grpc = pool.clone().with(|spec| {
        spec["tracing"] = json!({"endpoint": format!("http://{ip}:4317"), "protocol": "grpc"});
    });
    k.apply(&ns.name, &grpc.manifest());
    eventually(
        Duration::from_secs(120),
        "a Ready worker with OTEL_EXPORTER_OTLP_PROTOCOL=grpc",
        |last| {
            let d = k.get(&["deployment", "-n", &ns.name, "traced"])?;
            let env = &d["spec"]["template"]["spec"]["containers"][0]["env"];
            let protocol = env
                .as_array()?
                .iter()
                .find(|e| e["name"] == "OTEL_EXPORTER_OTLP_PROTOCOL")?["value"]
                .clone();
            let status = &d["status"];
            *last = format!("protocol {protocol}, status {status}");
            (protocol == "grpc"
                && status["observedGeneration"] == d["metadata"]["generation"]
                && status["updatedReplicas"] == 1
                && status["readyReplicas"] == 1
                && status["replicas"] == 1)
                .then_some(())
        },
    );
}
