//! `workerpool-operator`: command-line wiring only; the work is in the library.

use std::io::Write;

use anyhow::Result;
use clap::{Parser, Subcommand};
use workerpool_operator::simulate::cli::SimulateArgs;

#[derive(Parser, Debug)]
#[command(version, about = "Scales queue workers on queue depth and flow")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the controller (in a cluster, or against the current kubeconfig).
    Run(workerpool_operator::run::RunArgs),
    /// Print the WorkerPool CustomResourceDefinition as YAML.
    Crd,
    /// Print the RBAC rules the controller needs (ClusterRole and leader-election Role) as YAML.
    Rbac,
    /// Run a WorkerPool manifest on this machine: the scaling engine starts and stops
    /// workerpool-worker processes.
    Local(workerpool_operator::local::LocalArgs),
    /// Replay a day of arrivals through the scaling engine and a KEDA baseline, or compare
    /// the engine with KEDA as its users tune it.
    Simulate(SimulateArgs),
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Run(args) => {
            init_tracing();
            let runtime = tokio::runtime::Runtime::new()?;
            let outcome = runtime.block_on(workerpool_operator::run::run(args));
            // What still runs once `run` returns (a reconcile past its
            // drain, a DNS lookup of the API server on a blocking thread)
            // must not hold the exit: dropping the runtime would wait for
            // blocking work without end.
            runtime.shutdown_timeout(std::time::Duration::from_secs(1));
            outcome
        }
        Command::Crd => {
            out(&workerpool_operator::crd::crd_yaml());
            Ok(())
        }
        Command::Rbac => {
            out(&workerpool_operator::rbac::rbac_yaml());
            Ok(())
        }
        Command::Simulate(args) => {
            out(&workerpool_operator::simulate::cli::run(&args)?);
            Ok(())
        }
        Command::Local(args) => {
            let outcome =
                tokio::runtime::Runtime::new()?.block_on(workerpool_operator::local::run(args));
            if let Err(e) = outcome {
                let _ = writeln!(Stderr, "error: {e}");
                std::process::exit(1);
            }
            Ok(())
        }
    }
}

/// Writes `text` to stdout; a closed pipe (`| head`) is not worth a panic.
fn out(text: &str) {
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

fn init_tracing() {
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(workerpool_operator::run::log_filter(
            std::env::var("RUST_LOG").ok().as_deref(),
        ))
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(|| Stderr)
        .log_internal_errors(false)
        .init();
}

/// Standard error that never fails: a log line that cannot be written (a
/// pipe with no reader left) is dropped. `eprintln!` and the fmt
/// subscriber's own fallback would panic instead, in whatever task logged.
#[derive(Debug, Clone, Copy)]
struct Stderr;

impl Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        Ok(std::io::stderr().write(buf).unwrap_or(buf.len()))
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        let _ = std::io::stderr().write_all(buf);
        Ok(())
    }

    fn write_fmt(&mut self, args: std::fmt::Arguments<'_>) -> std::io::Result<()> {
        let _ = std::io::stderr().write_fmt(args);
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}
