//! Redis inspection helpers shared by the worker's integration tests.
// Each test binary uses a different subset.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use serde_json::Value;
use tokio::sync::Semaphore;
use workerpool_queue::keys::QueueKeys;
use workerpool_tests::TestRedis;
use workerpool_worker::{Config, Handler, Job, Metrics, Outcome, Shutdown, run};

/// Pushes jobs as producers do (`LPUSH`), in order.
pub async fn push<J: ToString>(
    c: &mut MultiplexedConnection,
    queue: &str,
    jobs: impl IntoIterator<Item = J>,
) {
    for j in jobs {
        let _: i64 = c.lpush(queue, j.to_string()).await.expect("lpush");
    }
}

/// A counter's value, 0 when unset.
pub async fn counter(c: &mut MultiplexedConnection, key: String) -> u64 {
    let v: Option<u64> = c.get(key).await.expect("get");
    v.unwrap_or(0)
}

/// A list's length.
pub async fn len(c: &mut MultiplexedConnection, key: &str) -> usize {
    c.llen(key).await.expect("llen")
}

/// Jobs held in every processing list of the queue, registered worker or not.
pub async fn processing_total(c: &mut MultiplexedConnection, q: &QueueKeys) -> usize {
    let keys: Vec<String> = c.keys(q.processing("*")).await.expect("keys");
    let mut n = 0;
    for k in keys {
        n += len(c, &k).await;
    }
    n
}

/// The dead list's envelopes, newest first.
pub async fn dead_letters(c: &mut MultiplexedConnection, q: &QueueKeys) -> Vec<Value> {
    let raw: Vec<String> = c.lrange(q.dead(), 0, -1).await.expect("lrange");
    raw.iter()
        .map(|r| serde_json::from_str(r).expect("dead letters are JSON"))
        .collect()
}

/// The Redis server's clock, unix milliseconds.
pub async fn server_time_ms(c: &mut MultiplexedConnection) -> u64 {
    workerpool_queue::admin::server_time_ms(c)
        .await
        .expect("time")
}

/// Records every attempt, then answers as `decide` says.
pub struct Recorder {
    seen: Mutex<Vec<Job>>,
    decide: fn(&Job) -> Outcome,
    gate: Option<Arc<Semaphore>>,
}

impl Recorder {
    pub fn new(decide: fn(&Job) -> Outcome) -> Arc<Self> {
        Arc::new(Self {
            seen: Mutex::new(Vec::new()),
            decide,
            gate: None,
        })
    }

    /// Each attempt waits for a permit of `gate` before answering.
    pub fn gated(gate: Arc<Semaphore>) -> Arc<Self> {
        Arc::new(Self {
            seen: Mutex::new(Vec::new()),
            decide: |_| Outcome::Done,
            gate: Some(gate),
        })
    }

    pub fn seen(&self) -> Vec<Job> {
        self.seen.lock().expect("lock").clone()
    }
}

impl Handler for Recorder {
    fn handle<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Outcome> {
        self.seen.lock().expect("lock").push(job.clone());
        Box::pin(async move {
            if let Some(gate) = &self.gate {
                gate.acquire().await.expect("open").forget();
            }
            (self.decide)(job)
        })
    }
}

pub struct Running {
    pub shutdown: Shutdown,
    pub handle: tokio::task::JoinHandle<Result<(), workerpool_worker::Error>>,
    pub metrics: Metrics,
}

impl Running {
    pub async fn stop(self) {
        self.shutdown.drain();
        self.handle.await.expect("worker task").expect("clean exit");
    }
}

/// A worker configuration with short timings for tests.
pub fn config(redis: &TestRedis, queues: &[&str], worker_id: &str) -> Config {
    let mut c = Config::new(redis.url(), queues.iter().map(|q| q.to_string()).collect());
    c.heartbeat_interval = Duration::from_millis(100);
    c.dead_after = Duration::from_millis(600);
    c.backoff_base = Duration::from_millis(20);
    c.backoff_max = Duration::from_millis(80);
    c.shutdown_timeout = Duration::from_secs(2);
    c.worker_id = worker_id.into();
    c
}

/// Runs a worker in a task of the test's runtime.
pub fn start(config: Config, handler: Arc<dyn Handler>) -> Running {
    let shutdown = Shutdown::new();
    let metrics = Metrics::new();
    let handle = tokio::spawn(run(config, handler, metrics.clone(), shutdown.clone()));
    Running {
        shutdown,
        handle,
        metrics,
    }
}

/// Sends SIGTERM to a worker process, waits up to 10 s for it to exit
/// (killing it after), and returns what it wrote to stderr.
pub fn stop(mut child: std::process::Child) -> String {
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    stderr(&mut child)
}

/// What a finished child process wrote to its piped stderr.
pub fn stderr(child: &mut std::process::Child) -> String {
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    err
}
