//! A pool whose jobs share a downstream that admits a few at a time: the engine
//! measures where more pods stop raising completions, holds the pool there instead
//! of at `maxReplicas`, says so on the pool, and grows again when the downstream
//! admits more.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::E2e;
use crate::cluster::{Cluster, Namespace, eventually};
use crate::scenarios::{
    Pool, Redis, condition, event_reasons, metrics, pod_with_service, queue_reachable,
};

pub const ALL: &[crate::Scenario] = &[(
    "a_pool_on_a_downstream_that_admits_few_settles_at_its_knee_says_saturated_and_grows_when_it_admits_more",
    a_pool_on_a_downstream_that_admits_few_settles_at_its_knee_says_saturated_and_grows_when_it_admits_more,
)];

/// Seconds the downstream serves a request for, once admitted.
const SERVICE: f64 = 0.2;
const POOL: &str = "orders";
const MAX_REPLICAS: i64 = 10;

/// A small HTTP service that admits `/tmp/capacity` requests at a time (as a
/// database's connection pool would); the others wait their turn. The capacity is
/// read at every admission, so writing the file changes it at once.
const DOWNSTREAM: &str = r#"
import http.server, threading, time
SERVICE = float(__import__("sys").argv[1])
lock = threading.Condition()
busy = 0
def capacity():
    try:
        with open("/tmp/capacity") as f:
            return int(f.read().strip() or "1")
    except (OSError, ValueError):
        return 1
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global busy
        with lock:
            while busy >= capacity():
                lock.wait(0.05)
            busy += 1
        try:
            time.sleep(SERVICE)
        finally:
            with lock:
                busy -= 1
                lock.notify_all()
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("", 8080), Handler).serve_forever()
"#;

/// Pushes `ARGV[2]` jobs named `ARGV[1]-1 ...` whose handler calls `ARGV[3]`.
const PUSH: &str = "for i = 1, tonumber(ARGV[2]) do \
    redis.call('LPUSH', KEYS[1], cjson.encode({id = ARGV[1] .. '-' .. i, task = 'e2e', \
    data = {call = ARGV[3]}})) end return tonumber(ARGV[2])";

/// The downstream Pod and its Service; returns its URL.
fn start_downstream(k: &Cluster, namespace: &str, capacity: u32) -> String {
    let command = format!("echo {capacity} > /tmp/capacity && exec python3 -c \"$0\" {SERVICE}");
    let container = json!({
        "command": ["sh", "-c", command, DOWNSTREAM],
        "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
    });
    pod_with_service(k, namespace, "downstream", container, 8080);
    format!("http://{}:8080/", k.cluster_ip(namespace, "downstream"))
}

fn set_capacity(k: &Cluster, namespace: &str, capacity: u32) {
    let write = format!("echo {capacity} > /tmp/capacity");
    k.kubectl(&[
        "exec",
        "-n",
        namespace,
        "downstream",
        "--",
        "sh",
        "-c",
        &write,
    ]);
}

/// The Deployment's wanted replicas.
fn replicas(k: &Cluster, namespace: &str) -> i64 {
    k.get(&["deployment", "-n", namespace, POOL])
        .and_then(|d| d["spec"]["replicas"].as_i64())
        .unwrap_or(0)
}

/// The knee the pool's `Saturated` condition names ("... above N pods ..."), flat
/// or climbing.
fn knee_of(message: &str) -> Option<i64> {
    message
        .rsplit(" above ")
        .next()
        .and_then(|rest| rest.split(" pod").next())
        .and_then(|n| n.trim().parse().ok())
}

/// The pool's `Saturated` condition: its status, reason and message.
fn saturated(wp: &Value) -> (String, String, String) {
    let found = wp["status"]["conditions"]
        .as_array()
        .and_then(|all| all.iter().find(|c| c["type"] == "Saturated"))
        .cloned()
        .unwrap_or_default();
    let text = |f: &str| found[f].as_str().unwrap_or_default().to_string();
    (text("status"), text("reason"), text("message"))
}

fn a_pool_on_a_downstream_that_admits_few_settles_at_its_knee_says_saturated_and_grows_when_it_admits_more(
    e2e: &E2e,
) {
    let k = &e2e.cluster;
    let ns = Namespace::create(k, "e2e-knee");
    let redis = Redis::start(k, &ns.name);
    // Three requests at a time, 0.2 s each: 15 jobs a second, whatever the pool's size.
    let url = start_downstream(k, &ns.name, 3);
    let pool = Pool::new(POOL, &redis).max(MAX_REPLICAS).with(|spec| {
        spec["scaling"]["minReplicas"] = 1.into();
    });
    k.apply(&ns.name, &pool.manifest());
    queue_reachable(k, &ns.name, POOL, Duration::from_secs(30));

    // Light traffic first, as a pool has before its busy hour: one pod takes it, a
    // job or two in flight, and the workers measure a job's own duration.
    let trickle = "for i in $(seq 1 60); do redis-cli EVAL \"$0\" 1 \"$1\" w$i 4 \"$2\" > /dev/null; sleep 1; done";
    k.kubectl(&[
        "exec", "-n", &ns.name, "redis", "--", "sh", "-c", trickle, PUSH, POOL, &url,
    ]);
    // Below what the downstream admits, so those durations are the jobs' own.
    let light = replicas(k, &ns.name);
    assert!(light <= 3, "light traffic took {light} pods");

    // Then far more than the downstream serves: the engine sizes on the work
    // (thousands of jobs), and every pod above the knee only stretches the jobs.
    let burst = Instant::now();
    redis.cli(&["EVAL", PUSH, "1", POOL, "b", "8000", &url]);
    let (reason, message) = eventually(Duration::from_secs(240), "the pool Saturated", |last| {
        let wp = k.get(&["wp", "-n", &ns.name, POOL])?;
        let (status, reason, message) = saturated(&wp);
        *last = format!(
            "{status} {reason}: {message} (replicas {}, {})",
            replicas(k, &ns.name),
            wp["status"]["reason"]
        );
        (status == "True").then_some((reason, message))
    });
    eprintln!(
        "  saturated {:.0?} after the burst: {message}",
        burst.elapsed()
    );
    // The downstream now admits eight at a time (40 jobs a second). The engine
    // probes a quarter above the knee as soon as it finds it: that probe pays, and
    // so does each next one, which follows at once, so the pool climbs. (Had the
    // first probe been over before the downstream changed, the next would come
    // within 300 s.) What the pool says below holds until then.
    set_capacity(k, &ns.name, 8);
    let raised = Instant::now();
    assert_eq!(reason, "AtKnee", "{message}");
    assert!(message.contains("completions flat at ~"), "{message}");
    let knee = knee_of(&message).unwrap_or_else(|| panic!("a knee in {message:?}"));
    // 15 jobs a second at about 5 a pod (0.2 s jobs, one a pod): three pods, four
    // with the handler's own time beside the downstream's.
    assert!((3..=4).contains(&knee), "a knee of {knee}: {message}");

    // It settles at the knee (or a probe a pod above it), not at maxReplicas, and
    // every place a user looks says why.
    let step = (knee / 4).max(1);
    let settled = eventually(Duration::from_secs(60), "the pool at its knee", |last| {
        let n = replicas(k, &ns.name);
        *last = format!("{n} replicas for a knee of {knee}");
        (n <= knee + step).then_some(n)
    });
    eprintln!("  at {settled} replicas (knee {knee}, maxReplicas {MAX_REPLICAS})");
    let wide = k.kubectl(&["get", "wp", "-n", &ns.name, POOL, "-o", "wide"]);
    assert!(
        wide.contains("Saturated"),
        "kubectl get wp -o wide:\n{wide}"
    );
    let wp = k.get(&["wp", "-n", &ns.name, POOL]).expect("the pool");
    assert_eq!(
        condition(&wp, "ScalingLimited"),
        Some("True"),
        "{}",
        wp["status"]
    );
    let events = event_reasons(k, &ns.name, POOL);
    assert!(events.contains("Saturated"), "events: {events:?}");
    let exported = metrics(k);
    let this_pool = |l: &&str| {
        l.contains(&format!("namespace=\"{}\"", ns.name)) && l.contains(&format!("pool=\"{POOL}\""))
    };
    assert!(
        exported
            .lines()
            .filter(this_pool)
            .any(|l| l.starts_with("workerpool_pool_saturated{") && l.ends_with(" 1")),
        "workerpool_pool_saturated is not 1 for the pool:\n{}",
        exported
            .lines()
            .filter(|l| l.contains("saturated") || l.contains("knee"))
            .collect::<Vec<_>>()
            .join("\n")
    );

    // The pool climbs past its old knee, and the knee it shows climbs with it; while
    // its probes pay, the condition says so rather than "flat".
    let mut climbing = None;
    let (grown, message) = eventually(
        Duration::from_secs(420),
        "the pool past its old knee",
        |last| {
            let wp = k.get(&["wp", "-n", &ns.name, POOL])?;
            let (_, _, message) = saturated(&wp);
            let n = replicas(k, &ns.name);
            *last = format!("{n} replicas: {message}");
            if message.contains("completions rose to ~") {
                climbing.get_or_insert_with(|| message.clone());
            }
            (n >= knee + 3 && knee_of(&message).is_none_or(|now| now > knee))
                .then_some((n, message))
        },
    );
    eprintln!(
        "  {grown} replicas {:.0?} after the downstream admitted more: {message}",
        raised.elapsed()
    );
    let climbing = climbing.unwrap_or_else(|| panic!("no climbing message on the way up"));
    eprintln!("  on the way: {climbing}");
    assert!(knee_of(&climbing).is_some_and(|k| k > knee), "{climbing}");
    // Jobs ran throughout, and none was lost or failed.
    let dead = redis.cli(&["LLEN", &format!("{POOL}:dead")]);
    assert_eq!(dead.trim(), "0", "dead-lettered jobs");
}
