//! Chaos soak: a producer, several `workerpool-worker` processes with an
//! exec handler, and on timers kill -9 and SIGTERM of workers and restarts
//! of Redis (append-only file, fsync always). At the end the queue is
//! drained and every job is accounted for: produced, done, missing,
//! duplicate runs, dead letters by reason, worker RSS. Exits 1 when a job
//! is missing, a malformed payload is not dead-lettered, or a worker exits
//! in a way it should not. Run by `scripts/soak.sh`.
//!
//! ```sh
//! cargo run --release -p workerpool-worker --example soak -- \
//!   --worker-bin target/release/workerpool-worker --duration 30m
//! ```

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

const QUEUE: &str = "soak";

/// The handler each worker runs: records every run's id, then answers ok.
const HANDLER: &str = r#"
import json, os, sys
log = open(os.path.join(sys.argv[1], "%d.log" % os.getpid()), "a", buffering=1)
for line in sys.stdin:
    log.write(json.loads(line)["id"] + "\n")
    sys.stdout.write('{"ok":true}\n')
    sys.stdout.flush()
"#;

/// Chaos soak of workerpool-worker against a real redis-server.
#[derive(Debug, Parser)]
struct Args {
    /// The worker binary.
    #[arg(long)]
    worker_bin: PathBuf,
    /// How long to produce jobs and cause trouble.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Worker processes.
    #[arg(long, default_value_t = 3)]
    workers: usize,
    /// Jobs each worker runs at once.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// Jobs produced per second.
    #[arg(long, default_value_t = 500)]
    rate: u64,
    /// Share of payloads that are malformed (fifteen kinds, raw bytes among them).
    #[arg(long, default_value_t = 1.0)]
    malformed_percent: f64,
    /// Shortest time between two worker kills.
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    kill_min: Duration,
    /// Longest time between two worker kills.
    #[arg(long, default_value = "40s", value_parser = humantime::parse_duration)]
    kill_max: Duration,
    /// Time between Redis restarts (0s: never).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    redis_restart_every: Duration,
    /// Seed of the random choices.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Python interpreter for the handler.
    #[arg(long, default_value = "python3")]
    python: String,
}

fn malformed(kind: usize, rng: &mut StdRng) -> Vec<u8> {
    match kind {
        0 => b"not json".to_vec(),
        1 => b"[1,2,3]".to_vec(),
        2 => b"\"a string\"".to_vec(),
        3 => br#"{"attempt":"two"}"#.to_vec(),
        4 => br#"{"id":7}"#.to_vec(),
        5 => Vec::new(),
        6 => b"\xff\xfe raw".to_vec(),
        7 => (0..rng.random_range(1..64)).map(|_| rng.random()).collect(),
        8 => b"{\"task\":\"caf\xe9\"}".to_vec(),
        9 => b"\0\0\0".to_vec(),
        10 => "[".repeat(1000).into_bytes(),
        11 => br#"{"data":1e400}"#.to_vec(),
        12 => br#"{"task":"\ud800"}"#.to_vec(),
        13 => br#"{"task":"#.to_vec(),
        _ => b"null".to_vec(),
    }
}
const MALFORMED_KINDS: usize = 15;

#[derive(Default)]
struct Tally {
    produced: AtomicU64,
    malformed: AtomicU64,
    kills: AtomicU64,
    terms: AtomicU64,
    redis_restarts: AtomicU64,
    unexpected_exits: Mutex<Vec<String>>,
    max_rss_kb: AtomicU64,
}

async fn connect(url: &str) -> Option<MultiplexedConnection> {
    let client = redis::Client::open(url).ok()?;
    client.get_multiplexed_async_connection().await.ok()
}

async fn wait_for_redis(url: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Some(mut c) = connect(url).await
            && redis::cmd("PING")
                .query_async::<String>(&mut c)
                .await
                .is_ok()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("redis-server did not answer at {url}");
}

fn start_redis(port: u16, dir: &Path) -> Child {
    Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .args(["--appendonly", "yes", "--appendfsync", "always"])
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("redis-server must be installed")
}

fn signal(pid: u32, sig: &str) {
    let _ = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status();
}

/// Produces `rate` jobs a second until `stop`, retrying pushes while Redis
/// is away. Valid jobs get ids `s-<n>`.
async fn produce(url: String, args: Arc<Args>, tally: Arc<Tally>, stop: Arc<AtomicBool>) {
    let mut rng = StdRng::seed_from_u64(args.seed);
    let mut conn = None;
    let tick = Duration::from_millis(20);
    let per_tick = (args.rate as f64 * tick.as_secs_f64()).max(1.0);
    let mut owed = 0.0;
    let mut next_id = 0u64;
    let mut interval = tokio::time::interval(tick);
    while !stop.load(Ordering::Relaxed) {
        interval.tick().await;
        owed += per_tick;
        let mut batch: Vec<Vec<u8>> = Vec::new();
        let (mut valid, mut bad) = (0, 0);
        while owed >= 1.0 {
            owed -= 1.0;
            if rng.random_bool(args.malformed_percent / 100.0) {
                let kind = rng.random_range(0..MALFORMED_KINDS);
                batch.push(malformed(kind, &mut rng));
                bad += 1;
            } else {
                let n = next_id + valid;
                batch.push(
                    format!(r#"{{"id":"s-{n}","task":"soak","data":{{"n":{n}}}}}"#).into_bytes(),
                );
                valid += 1;
            }
        }
        if batch.is_empty() {
            continue;
        }
        // The same batch again until Redis takes it.
        loop {
            if conn.is_none() {
                conn = connect(&url).await;
            }
            if let Some(c) = conn.as_mut() {
                let pushed: redis::RedisResult<u64> = c.lpush(QUEUE, &batch).await;
                if pushed.is_ok() {
                    break;
                }
                conn = None;
            }
            if stop.load(Ordering::Relaxed) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        next_id += valid;
        tally.produced.store(next_id, Ordering::Relaxed);
        tally.malformed.fetch_add(bad, Ordering::Relaxed);
    }
}

enum Order {
    Kill,
    Term,
    Stop,
}

/// Runs one worker slot: restarts its worker under the same id after
/// every exit, as a kubelet restarts a container in its pod.
async fn supervise(
    slot: usize,
    args: Arc<Args>,
    url: String,
    dir: PathBuf,
    pids: Arc<Mutex<Vec<Option<u32>>>>,
    tally: Arc<Tally>,
    mut orders: mpsc::UnboundedReceiver<Order>,
) {
    let handler = dir.join("handler.py");
    let runs = dir.join("runs");
    loop {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("worker-{slot}.log")))
            .expect("worker log");
        let mut child = Command::new(&args.worker_bin)
            .args(["--redis-url", &url, "--queue", QUEUE])
            .args(["--concurrency", &args.concurrency.to_string()])
            .args(["--worker-id", &format!("soak-{slot}")])
            .args(["--listen", "127.0.0.1:0"])
            .args(["--heartbeat-interval", "1s", "--dead-after", "5s"])
            .args(["--shutdown-timeout", "5s", "--max-attempts", "10"])
            .args(["--backoff-base", "100ms", "--backoff-max", "2s"])
            .arg("--")
            .arg(&args.python)
            .arg(&handler)
            .arg(&runs)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("start the worker");
        let pid = child.id().unwrap_or(0);
        pids.lock().expect("pids")[slot] = Some(pid);
        let order = tokio::select! {
            status = child.wait() => {
                tally.unexpected_exits.lock().expect("exits").push(format!("soak-{slot} exited on its own: {status:?}"));
                None
            }
            order = orders.recv() => Some(order.unwrap_or(Order::Stop)),
        };
        let stop = match order {
            None => false,
            Some(Order::Kill) => {
                tally.kills.fetch_add(1, Ordering::Relaxed);
                let _ = child.kill().await;
                false
            }
            Some(o @ (Order::Term | Order::Stop)) => {
                if matches!(o, Order::Term) {
                    tally.terms.fetch_add(1, Ordering::Relaxed);
                }
                signal(pid, "-TERM");
                match tokio::time::timeout(Duration::from_secs(20), child.wait()).await {
                    Ok(Ok(status)) if status.success() => {}
                    other => {
                        let _ = child.kill().await;
                        tally
                            .unexpected_exits
                            .lock()
                            .expect("exits")
                            .push(format!("soak-{slot} after SIGTERM: {other:?}"));
                    }
                }
                matches!(o, Order::Stop)
            }
        };
        pids.lock().expect("pids")[slot] = None;
        if stop {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn rss_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

async fn backlog(url: &str) -> Option<(u64, u64, u64)> {
    let mut c = connect(url).await?;
    let waiting: u64 = c.llen(QUEUE).await.ok()?;
    let retry: u64 = c.zcard(format!("{QUEUE}:retry")).await.ok()?;
    let scheduled: u64 = c.zcard(format!("{QUEUE}:scheduled")).await.ok()?;
    let lists: Vec<String> = c.keys(format!("{QUEUE}:processing:*")).await.ok()?;
    let mut held = 0;
    for l in lists {
        held += c.llen::<_, u64>(l).await.ok()?;
    }
    Some((waiting, retry + scheduled, held))
}

#[tokio::main]
async fn main() {
    let args = Arc::new(Args::parse());
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().to_path_buf();
    std::fs::create_dir_all(path.join("runs")).expect("runs dir");
    std::fs::write(path.join("handler.py"), HANDLER).expect("handler");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let url = format!("redis://127.0.0.1:{port}/0");
    let mut redis = start_redis(port, &path);
    wait_for_redis(&url).await;

    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let pids = Arc::new(Mutex::new(vec![None; args.workers]));
    let mut orders = Vec::new();
    let mut slots = Vec::new();
    for slot in 0..args.workers {
        let (tx, rx) = mpsc::unbounded_channel();
        orders.push(tx);
        slots.push(tokio::spawn(supervise(
            slot,
            args.clone(),
            url.clone(),
            path.clone(),
            pids.clone(),
            tally.clone(),
            rx,
        )));
    }
    let producer = tokio::spawn(produce(
        url.clone(),
        args.clone(),
        tally.clone(),
        stop.clone(),
    ));
    let sampler = {
        let (pids, tally, stop) = (pids.clone(), tally.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let now: Vec<u32> = pids
                    .lock()
                    .expect("pids")
                    .iter()
                    .flatten()
                    .copied()
                    .collect();
                for pid in now {
                    if let Some(kb) = rss_kb(pid) {
                        tally.max_rss_kb.fetch_max(kb, Ordering::Relaxed);
                    }
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };

    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(args.seed ^ 0x5eed);
    let mut next_kill = started + rng.random_range(args.kill_min..=args.kill_max);
    let mut next_restart =
        (!args.redis_restart_every.is_zero()).then(|| started + args.redis_restart_every);
    let end = started + args.duration;
    eprintln!(
        "soak: {} workers x {} slots, {} jobs/s, {}% malformed, for {}",
        args.workers,
        args.concurrency,
        args.rate,
        args.malformed_percent,
        humantime::format_duration(args.duration)
    );
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = Instant::now();
        if now >= next_kill {
            let slot = rng.random_range(0..args.workers);
            let order = if rng.random_bool(0.5) {
                Order::Kill
            } else {
                Order::Term
            };
            let _ = orders[slot].send(order);
            next_kill = now + rng.random_range(args.kill_min..=args.kill_max);
        }
        if let Some(at) = next_restart
            && now >= at
        {
            if let Some(pid) = redis.id() {
                signal(pid, "-TERM");
            }
            let _ = redis.wait().await;
            redis = start_redis(port, &path);
            wait_for_redis(&url).await;
            tally.redis_restarts.fetch_add(1, Ordering::Relaxed);
            next_restart = Some(Instant::now() + args.redis_restart_every);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let _ = producer.await;
    let _ = sampler.await;

    // Every job settles: nothing waiting, retrying or held. Lost workers'
    // jobs come back after their dead-after window.
    let drain_deadline = Instant::now() + Duration::from_secs(120);
    let mut drained = false;
    while Instant::now() < drain_deadline {
        if let Some((0, 0, 0)) = backlog(&url).await {
            drained = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for tx in &orders {
        let _ = tx.send(Order::Stop);
    }
    for s in slots {
        let _ = s.await;
    }

    let mut runs: HashMap<String, u64> = HashMap::new();
    for entry in std::fs::read_dir(path.join("runs"))
        .expect("runs")
        .flatten()
    {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        for id in text.lines() {
            *runs.entry(id.to_string()).or_default() += 1;
        }
    }
    let produced = tally.produced.load(Ordering::Relaxed);
    let missing: Vec<u64> = (0..produced)
        .filter(|n| !runs.contains_key(&format!("s-{n}")))
        .collect();
    let duplicates: u64 = runs.values().map(|r| r.saturating_sub(1)).sum();
    let mut dead: BTreeMap<String, u64> = BTreeMap::new();
    let mut c = connect(&url).await.expect("redis at the end");
    let letters: Vec<Vec<u8>> = c
        .lrange(format!("{QUEUE}:dead"), 0, -1)
        .await
        .expect("dead list");
    for l in &letters {
        let reason = serde_json::from_slice::<serde_json::Value>(l)
            .ok()
            .and_then(|v| v["reason"].as_str().map(str::to_string))
            .unwrap_or_else(|| "unreadable".into());
        *dead.entry(reason).or_default() += 1;
    }
    let malformed = tally.malformed.load(Ordering::Relaxed);
    let dead_malformed = dead.get("malformed").copied().unwrap_or(0);
    let exits = tally.unexpected_exits.lock().expect("exits").clone();
    let _ = redis.kill().await;

    println!(
        "duration:        {}",
        humantime::format_duration(args.duration)
    );
    println!(
        "produced:        {produced} jobs, {malformed} malformed payloads ({:.0} jobs/s)",
        produced as f64 / args.duration.as_secs_f64()
    );
    println!("done:            {} distinct jobs", runs.len());
    println!("missing:         {}", missing.len());
    println!("duplicate runs:  {duplicates}");
    println!("dead by reason:  {dead:?}");
    println!(
        "chaos:           {} kill -9, {} SIGTERM, {} Redis restarts",
        tally.kills.load(Ordering::Relaxed),
        tally.terms.load(Ordering::Relaxed),
        tally.redis_restarts.load(Ordering::Relaxed)
    );
    println!(
        "worker RSS:      max {:.1} MB",
        tally.max_rss_kb.load(Ordering::Relaxed) as f64 / 1024.0
    );
    // Each check: what it guards, and what went wrong when it failed.
    let mut checks: Vec<(&str, Option<String>)> = Vec::new();
    checks.push((
        "the queue drained",
        (!drained).then(|| "the queue did not drain within 120 s".to_string()),
    ));
    checks.push((
        "every job ran",
        (!missing.is_empty()).then(|| {
            let first: Vec<String> = missing.iter().take(10).map(|n| format!("s-{n}")).collect();
            format!("{} jobs never ran, first: {first:?}", missing.len())
        }),
    ));
    // More dead than pushed only when a push whose reply was lost to a Redis
    // restart was repeated; fewer means payloads were lost.
    checks.push((
        "every malformed payload dead-lettered",
        (dead_malformed < malformed).then(|| {
            format!(
                "{malformed} malformed payloads pushed, only {dead_malformed} dead-lettered as malformed"
            )
        }),
    ));
    checks.push((
        "no valid job dead",
        dead.keys()
            .any(|r| r != "malformed")
            .then(|| format!("valid jobs in the dead list: {dead:?}")),
    ));
    checks.push((
        "workers exited only when told, cleanly on SIGTERM",
        (!exits.is_empty()).then(|| exits.join("; ")),
    ));
    let failed: Vec<(&str, String)> = checks
        .iter()
        .filter_map(|(what, problem)| problem.clone().map(|p| (*what, p)))
        .collect();
    for (what, problem) in &failed {
        println!("FAILED {what}: {problem}");
    }
    if !failed.is_empty() {
        let kept = dir.keep();
        println!("worker logs kept in {}", kept.display());
    }
    println!(
        "soak: {} passed, {} failed",
        checks.len() - failed.len(),
        failed.len()
    );
    if !failed.is_empty() {
        std::process::exit(1);
    }
}
