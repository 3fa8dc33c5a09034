//! A worker whose handler is written in Rust.
//!
//! ```sh
//! cargo run -p workerpool-worker --example rust_handler -- redis://localhost:6379 emails
//! redis-cli LPUSH emails '{"task":"send_email","data":{"to":"a@example.com"}}'
//! ```
//!
//! Ctrl-C drains: running jobs get the shutdown timeout, the rest go back
//! to the head of the queue. Retries, dead letters, heartbeats and the
//! recovery of lost workers' jobs are the runtime's, as in the binary.

use std::time::Duration;

use workerpool_worker::{Config, Error, Job, Outcome, handler_fn, run_until};

/// What the worker does with one job. `job.id()` is stable across retries:
/// use it to make a second run harmless.
pub async fn send_email(job: Job) -> Outcome {
    match job.task() {
        Some("send_email") => {}
        other => return Outcome::permanent(format!("unknown task {other:?}")),
    }
    let Some(to) = job.data().get("to").and_then(|v| v.as_str()) else {
        // Retrying cannot fix a job without an address.
        return Outcome::permanent("data.to is missing");
    };
    if !to.contains('@') {
        return Outcome::permanent(format!("{to:?} is not an address"));
    }
    // Stands in for the real call to a mail service.
    tokio::time::sleep(Duration::from_millis(1)).await;
    Outcome::Done
}

/// Runs the worker on `queue` until `shutdown` completes.
pub async fn serve(
    redis_url: &str,
    queue: &str,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let mut config = Config::new(redis_url, vec![queue.to_string()]);
    config.concurrency = 8;
    config.max_attempts = 3;
    run_until(config, handler_fn(send_email), shutdown).await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let redis_url = args
        .next()
        .unwrap_or_else(|| "redis://localhost:6379".to_string());
    let queue = args.next().unwrap_or_else(|| "emails".to_string());
    serve(&redis_url, &queue, async {
        // An error installing the handler means no Ctrl-C will come: stop.
        tokio::signal::ctrl_c().await.ok();
    })
    .await?;
    Ok(())
}
