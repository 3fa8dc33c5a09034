use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;
use workerpool_worker::config::Args;
use workerpool_worker::{Metrics, Shutdown, build_handler, run};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

// One thread: the worker only waits on Redis, sockets and child processes,
// and a single-threaded runtime avoids the cross-thread wake-ups that cost
// more CPU than the jobs themselves (docs/benchmarks.md: about twice the
// throughput at every concurrency, half the CPU).
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let (config, choice) = match Args::parse().into_config() {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let metrics = Metrics::new();
    let shutdown = match Shutdown::on_signals() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: cannot install signal handlers: {e}");
            return ExitCode::FAILURE;
        }
    };
    let handler = match build_handler(choice, &config, &metrics) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    match run(config, handler, metrics, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
