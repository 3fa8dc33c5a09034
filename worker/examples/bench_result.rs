//! The worker binary with one handler in place of the flag's: every job is
//! done at once and returns a 100-byte JSON result, which a job that keeps
//! its outcome keeps. `scripts/bench-outcomes.sh` drains kept jobs with it,
//! so that the cost measured is the outcome's, not a handler's.
//!
//! ```sh
//! cargo run --release -p workerpool-worker --example bench_result -- \
//!     --redis-url redis://127.0.0.1:6379 --queue bench --concurrency 50 --handler noop
//! ```
//! Takes the worker's flags, which must name a handler (`--handler noop`); it
//! runs its own.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use workerpool_worker::config::Args;
use workerpool_worker::log::Stderr;
use workerpool_worker::{Metrics, Outcome, Shutdown, handler_fn, run};

/// 100 bytes of JSON.
const RESULT: &str = r#"{"output":"s3://bucket/videos/2026/12/07/6b1f0c2e9a4d4f0e.mp4","seconds":12.125,"codec":"h264-high"}"#;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    workerpool_worker::log::init();
    let (config, _) = match Args::parse().into_config() {
        Ok(parsed) => parsed,
        Err(e) => {
            let _ = writeln!(Stderr, "error: {e}");
            return ExitCode::from(2);
        }
    };
    let shutdown = match Shutdown::on_signals() {
        Ok(s) => s,
        Err(e) => {
            let _ = writeln!(Stderr, "error: cannot install signal handlers: {e}");
            return ExitCode::FAILURE;
        }
    };
    let handler = handler_fn(|_job| async { Outcome::Returned(RESULT.to_string()) });
    match run(
        config,
        std::sync::Arc::new(handler),
        Metrics::new(),
        shutdown,
    )
    .await
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(Stderr, "error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_result_is_100_bytes_of_json() {
        assert_eq!(super::RESULT.len(), 100);
        assert!(serde_json::from_str::<serde_json::Value>(super::RESULT).is_ok());
    }
}
