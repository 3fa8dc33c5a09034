//! The simulator held against the cluster: a trace fed at its rates into a Redis on the
//! cluster, served by the real operator and real worker Pods running jobs of a fixed
//! duration, and the same trace through `workerpool-operator simulate` with the pod
//! start-up and job duration that run measured. It prints both side by side.
//!
//! It takes the trace's length (ten minutes for `tests/replay/short.csv`), so it is not
//! among the scenarios that run by default: `scripts/replay.sh` (or `make replay`)
//! runs it by name. `WORKERPOOL_REPLAY_TRACE` picks another trace; `WORKERPOOL_REPLAY_OUT`
//! names a file to write the comparison to as well.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::E2e;
use crate::cluster::{Cluster, Namespace, root};
use crate::scenarios::{Pool, Redis, is_ready, queue_reachable};

pub const MANUAL: &[crate::Scenario] = &[(
    "replay_a_trace_on_the_cluster_beside_the_simulator",
    replay_a_trace_on_the_cluster_beside_the_simulator,
)];

const POOL: &str = "replay";
/// Each job's duration in the handler.
const JOB_MS: u64 = 1000;
const MAX_REPLICAS: i64 = 10;
const TARGET_BACKLOG: i64 = 5;

/// Feeds the trace (`argv[1]`, `t_seconds,jobs` rows; each row's jobs spread at random
/// over the time until the next row, as the simulator spreads them) into the queue
/// `argv[3]` from the Redis Pod, each job stamped with its `enqueued_at`.
const FEEDER: &str = r#"
import json, random, socket, sys, time
rows = []
for line in sys.argv[1].splitlines():
    parts = line.strip().split(",")
    if len(parts) == 2 and parts[0].replace(".", "").isdigit():
        rows.append((float(parts[0]), int(parts[1])))
random.seed(int(sys.argv[2]))
queue, ms = sys.argv[3], int(sys.argv[4])
arrivals = []
for (t, n), (after, _) in zip(rows, rows[1:]):
    arrivals += [random.uniform(t, after) for _ in range(n)]
arrivals.sort()
redis = socket.create_connection(("127.0.0.1", 6379))
replies = redis.makefile("rb")
def command(*args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a.encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out
start = time.time()
for i, at in enumerate(arrivals):
    delay = start + at - time.time()
    if delay > 0:
        time.sleep(delay)
    job = {"id": "r%d" % i, "task": "e2e", "data": {"ms": ms}, "enqueued_at": int(time.time() * 1000)}
    redis.sendall(command("LPUSH", queue, json.dumps(job)))
    replies.readline()
print(len(arrivals))
"#;

/// What one run showed, as the simulator reports it.
#[derive(Debug, Default)]
struct Figures {
    jobs: usize,
    p50: f64,
    p95: f64,
    p99: f64,
    replica_seconds: f64,
    scale_events: u64,
}

fn trace_path() -> PathBuf {
    std::env::var_os("WORKERPOOL_REPLAY_TRACE")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("tests/replay/short.csv"))
}

/// The trace's end: its last row's time.
fn trace_end(trace: &str) -> f64 {
    trace
        .lines()
        .filter_map(|l| l.split(',').next()?.trim().parse::<f64>().ok())
        .fold(0.0, f64::max)
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let at = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[at]
}

/// The worker Pods that exist (starting, ready or draining) and those ready.
fn pods(k: &Cluster, namespace: &str) -> (usize, usize) {
    let selector = format!("workerpool.dev/pool={POOL}");
    let Some(list) = k.get(&["pods", "-n", namespace, "-l", &selector]) else {
        return (0, 0);
    };
    let items = list["items"].as_array().cloned().unwrap_or_default();
    let alive = items
        .iter()
        .filter(|p| !matches!(p["status"]["phase"].as_str(), Some("Succeeded" | "Failed")))
        .count();
    let ready = items.iter().filter(|p| is_ready(p)).count();
    (alive, ready)
}

fn replay_a_trace_on_the_cluster_beside_the_simulator(e2e: &E2e) {
    let k = &e2e.cluster;
    let path = trace_path();
    let trace = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("read the trace {}: {e}", path.display()));
    let end = trace_end(&trace);
    let ns = Namespace::create(k, "e2e-replay");
    let redis = Redis::start(k, &ns.name);
    let scaling = json!({
        "minReplicas": 0,
        "maxReplicas": MAX_REPLICAS,
        "targetBacklogPerReplica": TARGET_BACKLOG,
    });
    let pool = Pool::new(POOL, &redis).with(|spec| spec["scaling"] = scaling.clone());
    k.apply(&ns.name, &pool.manifest());
    queue_reachable(k, &ns.name, POOL, Duration::from_secs(30));

    let mut feeder = k.spawn_kubectl(&[
        "exec",
        "-n",
        &ns.name,
        "redis",
        "--",
        "python3",
        "-c",
        FEEDER,
        &trace,
        "1",
        POOL,
        &JOB_MS.to_string(),
    ]);
    let started = Instant::now();
    let (mut alive_seconds, mut ready_seconds, mut events) = (0.0, 0.0, 0u64);
    let mut last = (started, 0usize, 0usize, None::<i64>);
    let mut timeline = Vec::new();
    while started.elapsed().as_secs_f64() < end {
        std::thread::sleep(Duration::from_secs(1));
        let (alive, ready) = pods(k, &ns.name);
        let desired = k
            .get(&["deployment", "-n", &ns.name, POOL])
            .and_then(|d| d["spec"]["replicas"].as_i64());
        let now = Instant::now();
        let dt = (now - last.0).as_secs_f64();
        alive_seconds += dt * (last.1 + alive) as f64 / 2.0;
        ready_seconds += dt * (last.2 + ready) as f64 / 2.0;
        if let (Some(before), Some(after)) = (last.3, desired)
            && before != after
        {
            events += 1;
            timeline.push(format!(
                "{:>5.0} s  {before} -> {after}",
                started.elapsed().as_secs_f64()
            ));
        }
        last = (now, alive, ready, desired.or(last.3));
    }
    let fed = feeder.wait().map(|s| s.success()).unwrap_or(false);
    assert!(fed, "the feeder failed");

    // Every job's wait (enqueued to started) and duration, as the handler noted them.
    let (mut waits, mut durations) = (Vec::new(), Vec::new());
    for line in redis.cli(&["LRANGE", "e2e:waits", "0", "-1"]).lines() {
        let mut parts = line.split_whitespace().map(|n| n.parse::<f64>().ok());
        if let (Some(Some(wait)), Some(Some(duration))) = (parts.next(), parts.next()) {
            waits.push(wait / 1000.0);
            durations.push(duration / 1000.0);
        }
    }
    waits.sort_by(f64::total_cmp);
    let jobs = waits.len();
    let job_seconds = durations.iter().sum::<f64>() / durations.len().max(1) as f64;
    let wp = k.get(&["wp", "-n", &ns.name, POOL]).expect("the pool");
    let startup = wp["status"]["podStartupSeconds"].as_f64().unwrap_or(0.0);
    let cluster = Figures {
        jobs,
        p50: percentile(&waits, 0.50),
        p95: percentile(&waits, 0.95),
        p99: percentile(&waits, 0.99),
        replica_seconds: alive_seconds,
        scale_events: events,
    };
    let simulated = simulate(&path, &scaling, startup, job_seconds);
    let table = comparison(
        &path,
        startup,
        job_seconds,
        ready_seconds,
        &cluster,
        &simulated,
    );
    eprintln!(
        "{table}\n  the Deployment's replicas over the run:\n    {}",
        timeline.join("\n    ")
    );
    if let Some(out) = std::env::var_os("WORKERPOOL_REPLAY_OUT") {
        std::fs::write(&out, format!("{table}\n")).expect("write WORKERPOOL_REPLAY_OUT");
    }
    let expected = trace
        .lines()
        .filter_map(|l| l.split(',').nth(1)?.trim().parse::<usize>().ok())
        .sum::<usize>();
    assert_eq!(jobs, expected, "every job of the trace ran once");
    assert_eq!(simulated.jobs, expected, "the simulator ran the same jobs");
}

/// `workerpool-operator simulate` on the trace, with what the cluster measured.
fn simulate(trace: &Path, scaling: &Value, startup: f64, job_seconds: f64) -> Figures {
    let exe = std::env::current_exe().expect("test executable path");
    let bins = exe
        .parent()
        .and_then(Path::parent)
        .expect("<target>/<profile>/deps");
    let spec = std::env::temp_dir().join(format!("replay-spec-{}.json", std::process::id()));
    std::fs::write(&spec, scaling.to_string()).expect("write the engine spec");
    let output = Command::new(bins.join("workerpool-operator"))
        .args(["simulate", "--policy", "engine", "--json", "--trace"])
        .arg(trace)
        .args([
            "--pod-startup",
            &format!("{:.0}ms", startup * 1000.0),
            "--job-duration",
            &format!("const:{:.0}ms", job_seconds * 1000.0),
            "--max-replicas",
            &MAX_REPLICAS.to_string(),
            "--target-backlog",
            &TARGET_BACKLOG.to_string(),
            "--engine-spec",
        ])
        .arg(&spec)
        .output()
        .expect("run workerpool-operator simulate");
    let _ = std::fs::remove_file(&spec);
    assert!(
        output.status.success(),
        "simulate failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: BTreeMap<String, Value> =
        serde_json::from_slice(&output.stdout).expect("simulate's JSON");
    let engine = &report["engine"];
    let number = |key: &str| engine[key].as_f64().unwrap_or(f64::NAN);
    Figures {
        jobs: engine["jobs"].as_u64().unwrap_or(0) as usize,
        p50: number("p50_wait_s"),
        p95: number("p95_wait_s"),
        p99: number("p99_wait_s"),
        replica_seconds: number("replica_seconds"),
        scale_events: engine["scale_events"].as_u64().unwrap_or(0),
    }
}

fn comparison(
    trace: &Path,
    startup: f64,
    job_seconds: f64,
    ready_seconds: f64,
    cluster: &Figures,
    simulated: &Figures,
) -> String {
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
    let row = |what: &str, c: f64, s: f64, unit: &str| {
        format!(
            "| {what} | {c:.2}{unit} | {s:.2}{unit} | {:.2} |",
            ratio(c, s)
        )
    };
    [
        format!(
            "trace {} (jobs of {job_seconds:.3} s measured, pods ready {startup:.1} s after creation, \
             maxReplicas {MAX_REPLICAS}, targetBacklogPerReplica {TARGET_BACKLOG})",
            trace.file_name().map(|n| n.to_string_lossy()).unwrap_or_default()
        ),
        "| measure | cluster | simulator | cluster / simulator |".into(),
        "| --- | --- | --- | --- |".into(),
        format!("| jobs | {} | {} | |", cluster.jobs, simulated.jobs),
        row("p50 wait", cluster.p50, simulated.p50, " s"),
        row("p95 wait", cluster.p95, simulated.p95, " s"),
        row("p99 wait", cluster.p99, simulated.p99, " s"),
        row(
            "replica-seconds (Pods that exist)",
            cluster.replica_seconds,
            simulated.replica_seconds,
            "",
        ),
        format!("| replica-seconds (Pods ready) | {ready_seconds:.0} | | |"),
        row(
            "scale events",
            cluster.scale_events as f64,
            simulated.scale_events as f64,
            "",
        ),
    ]
    .join("\n")
}
