//! What waiting costs Redis: `WAITERS` waits (`outcome::wait`, each on a
//! connection of its own, as a waiter must) on jobs that do not end, for
//! `SECONDS`, while Redis's CPU time and command count are read before and
//! after. `scripts/bench-outcomes.sh` runs it.
//!
//! ```sh
//! cargo run --release -p workerpool-queue --example waiters -- redis://127.0.0.1:6379 1000 30
//! ```
//! Prints one JSON line: waiters, seconds, Redis CPU seconds, its share of
//! one core, and commands per second.

use std::time::Duration;

use workerpool_queue::keys::QueueKeys;
use workerpool_queue::outcome;

fn arg<T: std::str::FromStr>(args: &[String], i: usize, what: &str) -> T {
    args.get(i).and_then(|a| a.parse().ok()).unwrap_or_else(|| {
        eprintln!("usage: waiters REDIS_URL WAITERS SECONDS ({what} missing or invalid)");
        std::process::exit(2)
    })
}

/// Redis's CPU seconds so far and the commands it has run.
async fn redis_load(
    conn: &mut redis::aio::MultiplexedConnection,
) -> redis::RedisResult<(f64, u64)> {
    let info: String = redis::cmd("INFO").arg("all").query_async(conn).await?;
    let field = |name: &str| -> f64 {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().parse().ok())
            .unwrap_or(0.0)
    };
    Ok((
        field("used_cpu_user") + field("used_cpu_sys"),
        field("total_commands_processed") as u64,
    ))
}

#[tokio::main]
async fn main() -> redis::RedisResult<()> {
    let args: Vec<String> = std::env::args().collect();
    let url: String = arg(&args, 1, "REDIS_URL");
    let waiters: usize = arg(&args, 2, "WAITERS");
    let seconds: u64 = arg(&args, 3, "SECONDS");
    let client = redis::Client::open(url)?;
    let queue = QueueKeys::new("waiters");
    // Each waiter's connection allows a reply to take a slice and a margin.
    let config = redis::AsyncConnectionConfig::new()
        .set_response_timeout(Some(outcome::WAIT_SLICE + Duration::from_secs(5)));
    let mut conns = Vec::with_capacity(waiters);
    for _ in 0..waiters {
        conns.push(
            client
                .get_multiplexed_async_connection_with_config(&config)
                .await?,
        );
    }
    let mut probe = client.get_multiplexed_async_connection().await?;
    let mut tasks = Vec::with_capacity(waiters);
    for (i, mut conn) in conns.into_iter().enumerate() {
        let queue = queue.clone();
        tasks.push(tokio::spawn(async move {
            outcome::wait(
                &mut conn,
                &queue,
                &format!("never-{i}"),
                Duration::from_secs(seconds + 10),
            )
            .await
        }));
    }
    // Every waiter has started its first slice.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (cpu_before, commands_before) = redis_load(&mut probe).await?;
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let (cpu_after, commands_after) = redis_load(&mut probe).await?;
    for task in &tasks {
        task.abort();
    }
    let cpu = cpu_after - cpu_before;
    println!(
        "{{\"waiters\":{waiters},\"seconds\":{seconds},\"redis_cpu_s\":{cpu:.3},\"redis_core_share\":{:.4},\"commands_per_s\":{:.1}}}",
        cpu / seconds as f64,
        (commands_after - commands_before) as f64 / seconds as f64
    );
    Ok(())
}
