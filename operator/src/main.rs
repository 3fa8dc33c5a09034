//! `workerpool-operator`: command-line wiring only; the work is in the library.

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
            tokio::runtime::Runtime::new()?.block_on(workerpool_operator::run::run(args))
        }
        Command::Crd => {
            print!("{}", workerpool_operator::crd::crd_yaml());
            Ok(())
        }
        Command::Rbac => {
            print!("{}", workerpool_operator::rbac::rbac_yaml());
            Ok(())
        }
        Command::Simulate(args) => {
            print!("{}", workerpool_operator::simulate::cli::run(&args)?);
            Ok(())
        }
        Command::Local(args) => {
            let outcome =
                tokio::runtime::Runtime::new()?.block_on(workerpool_operator::local::run(args));
            if let Err(e) = outcome {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
            Ok(())
        }
    }
}

fn init_tracing() {
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
}
