//! A pool on a Redis that speaks only TLS and wants client certificates:
//! the CA and the client certificate come from Secrets, the operator reads
//! the queue with them and the worker Pods get them mounted.

use std::time::Duration;

use serde_json::json;
use workerpool_tests::tls::Certificates;

use crate::E2e;
use crate::cluster::{Cluster, Namespace, eventually};
use crate::scenarios::{condition, is_ready, queue_reachable, redis_image, worker_image};

pub const ALL: &[crate::Scenario] = &[(
    "a_pool_on_a_mutual_tls_redis_reads_its_queue_and_runs_its_jobs",
    a_pool_on_a_mutual_tls_redis_reads_its_queue_and_runs_its_jobs,
)];

/// `kubectl create secret -n namespace ARGS...` (`generic NAME --from-file=...`,
/// `tls NAME --cert=... --key=...`).
pub fn secret_from_files(k: &Cluster, namespace: &str, args: &[&str]) {
    let mut all = vec!["create", "secret", "-n", namespace];
    all.extend_from_slice(args);
    k.kubectl(&all);
}

fn a_pool_on_a_mutual_tls_redis_reads_its_queue_and_runs_its_jobs(e2e: &E2e) {
    let k = &e2e.cluster;
    let ns = Namespace::create(k, "e2e-tls");
    // The Service first: the server certificate names its ClusterIP.
    k.apply(
        &ns.name,
        &json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "redis"},
                "spec": {"selector": {"app": "redis-tls"}, "ports": [{"port": 6379}]}})
        .to_string(),
    );
    let ip = k.cluster_ip(&ns.name, "redis");
    let dir = tempfile::tempdir().expect("temp dir");
    let certs = Certificates::make_for(dir.path(), &[&ip]);
    let file = |p: &std::path::Path| p.display().to_string();
    secret_from_files(
        k,
        &ns.name,
        &[
            "generic",
            "redis-server-tls",
            &format!("--from-file=server.crt={}", file(&certs.server_cert)),
            &format!("--from-file=server.key={}", file(&certs.server_key)),
            &format!("--from-file=ca.crt={}", file(&certs.ca)),
            &format!("--from-file=client.crt={}", file(&certs.client_cert)),
            &format!("--from-file=client.key={}", file(&certs.client_key)),
        ],
    );
    secret_from_files(
        k,
        &ns.name,
        &[
            "generic",
            "redis-ca",
            &format!("--from-file=ca.crt={}", file(&certs.ca)),
        ],
    );
    secret_from_files(
        k,
        &ns.name,
        &[
            "tls",
            "redis-client",
            &format!("--cert={}", file(&certs.client_cert)),
            &format!("--key={}", file(&certs.client_key)),
        ],
    );
    let tls_cli = [
        "redis-cli",
        "--tls",
        "--cacert",
        "/tls/ca.crt",
        "--cert",
        "/tls/client.crt",
        "--key",
        "/tls/client.key",
    ];
    let mut probe: Vec<&str> = tls_cli.to_vec();
    probe.push("ping");
    k.apply(
        &ns.name,
        &json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "redis", "labels": {"app": "redis-tls"}},
            "spec": {
                "containers": [{
                    "name": "redis", "image": redis_image(), "imagePullPolicy": "Never",
                    "command": ["redis-server", "--port", "0", "--tls-port", "6379",
                                "--tls-cert-file", "/tls/server.crt", "--tls-key-file", "/tls/server.key",
                                "--tls-ca-cert-file", "/tls/ca.crt", "--tls-auth-clients", "yes",
                                "--save", "", "--appendonly", "no", "--protected-mode", "no", "--bind", "0.0.0.0"],
                    "volumeMounts": [{"name": "tls", "mountPath": "/tls", "readOnly": true}],
                    "readinessProbe": {"exec": {"command": probe}, "periodSeconds": 1},
                }],
                "volumes": [{"name": "tls", "secret": {"secretName": "redis-server-tls"}}],
                "terminationGracePeriodSeconds": 1,
            },
        })
        .to_string(),
    );
    eventually(Duration::from_secs(60), "a Ready TLS Redis", |last| {
        let pod = k.get(&["pod", "-n", &ns.name, "redis"])?;
        *last = pod["status"].to_string();
        is_ready(&pod).then_some(())
    });
    let cli = |args: &[&str]| {
        let mut all = vec!["exec", "-n", &ns.name, "redis", "--"];
        all.extend_from_slice(&tls_cli);
        all.extend_from_slice(args);
        k.kubectl(&all)
    };

    let pool = json!({
        "apiVersion": "workerpool.dev/v1alpha1", "kind": "WorkerPool",
        "metadata": {"name": "secure"},
        "spec": {
            "queue": {"redis": {"url": format!("rediss://{ip}:6379/0"), "key": "secure", "tls": {
                "caSecretRef": {"name": "redis-ca", "key": "ca.crt"},
                "clientCertificateSecretRef": {"name": "redis-client"},
            }}},
            "template": {"spec": {"containers": [{
                "name": "worker",
                "image": worker_image(),
                "imagePullPolicy": "Never",
                "args": ["--", "sh", "-c", "while IFS= read -r job; do echo '{\"ok\":true}'; done"],
            }]}},
            "worker": {"concurrency": 2},
            "replicas": 1,
        },
    });
    k.apply(&ns.name, &pool.to_string());
    // Over TLS.
    queue_reachable(k, &ns.name, "secure", Duration::from_secs(60));
    let mut push = vec!["LPUSH", "secure"];
    let jobs: Vec<String> = (0..20)
        .map(|n| format!(r#"{{"data":{{"n":{n}}}}}"#))
        .collect();
    push.extend(jobs.iter().map(String::as_str));
    cli(&push);
    eventually(
        Duration::from_secs(90),
        "20 jobs done by a worker Pod over TLS",
        |last| {
            let done = cli(&["GET", "secure:stats:processed"]);
            *last = done.clone();
            (done.trim() == "20").then_some(())
        },
    );
    // The worker takes jobs as soon as it has registered, which can be
    // before the kubelet's first readiness probe passes: the pool's Ready
    // follows the probe, not the jobs.
    eventually(Duration::from_secs(60), "the pool Ready", |last| {
        let wp = k.get(&["wp", "-n", &ns.name, "secure"])?;
        *last = wp["status"].to_string();
        (condition(&wp, "Ready") == Some("True")).then_some(())
    });
}
