//! `workerpool`: enqueue jobs and inspect or operate a queue.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use workerpool_cli::{Cli, execute};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match execute(cli).await {
        Ok(out) => {
            // A closed pipe (`| head`) is not an error worth reporting.
            let _ = std::io::stdout().lock().write_all(out.as_bytes());
            ExitCode::SUCCESS
        }
        Err(e) => {
            let _ = writeln!(workerpool_worker::log::Stderr, "error: {e}");
            ExitCode::FAILURE
        }
    }
}
