use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use workerpool_worker::config::Args;
use workerpool_worker::log::Stderr;
use workerpool_worker::{Metrics, Shutdown, build_handler, run};

#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

// One thread: the worker only waits on Redis, sockets and child processes,
// and a single-threaded runtime avoids the cross-thread wake-ups that cost
// more CPU than the jobs themselves (docs/benchmarks.md: about twice the
// throughput at every concurrency, half the CPU).
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    // This binary started again to kill its handlers' process groups
    // should the worker die (see the keeper's module).
    if let Some(code) = workerpool_worker::handlers::keeper::serve_if_asked() {
        return code;
    }
    // Logging never panics: a stderr nobody reads must not stop a job
    // from settling or the drain from running.
    workerpool_worker::log::init();
    let (config, choice) = match Args::parse().into_config() {
        Ok(parsed) => parsed,
        Err(e) => {
            let _ = writeln!(Stderr, "error: {e}");
            return ExitCode::from(2);
        }
    };
    let metrics = Metrics::new();
    let shutdown = match Shutdown::on_signals() {
        Ok(s) => s,
        Err(e) => {
            let _ = writeln!(Stderr, "error: cannot install signal handlers: {e}");
            return ExitCode::FAILURE;
        }
    };
    let handler = match build_handler(choice, &config, &metrics) {
        Ok(h) => h,
        Err(e) => {
            let _ = writeln!(Stderr, "error: {e}");
            return ExitCode::FAILURE;
        }
    };
    match run(config, handler, metrics, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(Stderr, "error: {e}");
            ExitCode::FAILURE
        }
    }
}
