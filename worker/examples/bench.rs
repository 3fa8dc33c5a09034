//! Pick-up latency of an idle worker: the time from just before a job is
//! pushed to the moment its handler starts, measured in-process so both
//! ends read the same clock. Used by `scripts/bench.sh`.
//!
//! ```sh
//! cargo run --release -p workerpool-worker --example bench -- redis://127.0.0.1:6379 10 2000
//! ```
//! Arguments: Redis URL, worker concurrency, samples. Prints one JSON line.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::future::BoxFuture;
use redis::AsyncCommands;
use tokio::sync::mpsc;
use workerpool_worker::{Config, Handler, Job, Metrics, Outcome, Shutdown, run};

const QUEUE: &str = "bench:latency";

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Reports `now - data.t_us` for each job, then completes it.
struct Stamp(mpsc::UnboundedSender<u64>);

impl Handler for Stamp {
    fn handle<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Outcome> {
        let started = now_us();
        if let Some(t) = job.data().get("t_us").and_then(|v| v.as_u64()) {
            let _ = self.0.send(started.saturating_sub(t));
        }
        Box::pin(std::future::ready(Outcome::Done))
    }
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or(0)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let concurrency: usize = args.next().map_or(Ok(1), |a| a.parse())?;
    let samples: usize = args.next().map_or(Ok(2000), |a| a.parse())?;

    let mut producer = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let _: () = redis::cmd("DEL")
        .arg(QUEUE)
        .query_async(&mut producer)
        .await?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut config = Config::new(url, vec![QUEUE.into()]);
    config.concurrency = concurrency;
    config.worker_id = "bench".into();
    let shutdown = Shutdown::new();
    let worker = tokio::spawn(run(
        config,
        Arc::new(Stamp(tx)),
        Metrics::new(),
        shutdown.clone(),
    ));
    // Let the worker register and settle into its blocking wait.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut latencies = Vec::with_capacity(samples);
    for _ in 0..samples {
        let job = format!(r#"{{"task":"noop","data":{{"t_us":{}}}}}"#, now_us());
        let _: () = producer.lpush(QUEUE, job).await?;
        match tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {
            Ok(Some(us)) => latencies.push(us),
            _ => return Err("a job was not picked up within 5s".into()),
        }
        // Back to idle: the worker finishes its round and blocks again.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    shutdown.drain();
    worker.await??;
    latencies.sort_unstable();
    println!(
        r#"{{"concurrency":{concurrency},"samples":{samples},"p50_us":{},"p99_us":{},"max_us":{}}}"#,
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        latencies.last().copied().unwrap_or(0)
    );
    Ok(())
}
