//! The naive reliable-fetch floor that `scripts/bench.sh` compares the
//! worker with: no framework, nothing but `BLMOVE` into a processing list
//! and `LREM` out of it per job, on `connections` connections at once (no
//! retries, no attempt accounting, no heartbeats, no stats).
//!
//! ```sh
//! cargo run --release -p workerpool-worker --example floor -- redis://127.0.0.1:6379 bench 20000 10
//! ```
//! Arguments: Redis URL, queue, jobs to take, connections. Drains the queue
//! until `jobs` were taken and prints one JSON line: jobs, seconds, jobs/s.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

fn arg<T: std::str::FromStr>(args: &[String], i: usize, what: &str) -> T {
    args.get(i).and_then(|a| a.parse().ok()).unwrap_or_else(|| {
        eprintln!("usage: floor REDIS_URL QUEUE JOBS CONNECTIONS ({what} missing or invalid)");
        std::process::exit(2)
    })
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> redis::RedisResult<()> {
    let args: Vec<String> = std::env::args().collect();
    let url: String = arg(&args, 1, "REDIS_URL");
    let queue: String = arg(&args, 2, "QUEUE");
    let jobs: u64 = arg(&args, 3, "JOBS");
    let connections: usize = arg(&args, 4, "CONNECTIONS");
    let client = redis::Client::open(url)?;
    let taken = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    // When the last job was taken: the other connections may still be in a
    // blocking wait that ends at its timeout.
    let finished = Arc::new(std::sync::OnceLock::new());
    let mut tasks = Vec::new();
    for n in 0..connections {
        let mut conn = client.get_multiplexed_async_connection().await?;
        let (queue, taken, finished) = (queue.clone(), taken.clone(), finished.clone());
        let processing = format!("{queue}:floor:{n}");
        tasks.push(tokio::spawn(async move {
            while taken.load(Ordering::Relaxed) < jobs {
                let job: Option<Vec<u8>> = redis::cmd("BLMOVE")
                    .arg(&queue)
                    .arg(&processing)
                    .arg("RIGHT")
                    .arg("LEFT")
                    .arg(0.1)
                    .query_async(&mut conn)
                    .await?;
                let Some(job) = job else { continue };
                let _: i64 = redis::cmd("LREM")
                    .arg(&processing)
                    .arg(1)
                    .arg(job)
                    .query_async(&mut conn)
                    .await?;
                if taken.fetch_add(1, Ordering::Relaxed) + 1 == jobs {
                    let _ = finished.set(started.elapsed());
                }
            }
            Ok::<(), redis::RedisError>(())
        }));
    }
    for task in tasks {
        match task.await {
            Ok(result) => result?,
            Err(e) => eprintln!("floor: a connection's task failed: {e}"),
        }
    }
    let seconds = finished
        .get()
        .copied()
        .unwrap_or_else(|| started.elapsed())
        .as_secs_f64();
    let done = taken.load(Ordering::Relaxed);
    println!(
        "{{\"jobs\":{done},\"seconds\":{seconds:.3},\"jobs_per_s\":{:.0}}}",
        done as f64 / seconds
    );
    Ok(())
}
