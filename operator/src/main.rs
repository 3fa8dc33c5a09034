//! `workerpool-operator`: command-line wiring only; the work is in the library.

use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use workerpool_operator::scaling::ScalingSpec;
use workerpool_operator::simulate::{self, DurationDist, Policy, Shape, SimConfig, Trace};

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
    /// Replay a day of arrivals through the scaling engine and a KEDA baseline.
    Simulate(SimulateArgs),
}

#[derive(Args, Debug)]
struct SimulateArgs {
    /// CSV of `t_seconds,jobs` rows.
    #[arg(long, conflicts_with = "generate")]
    trace: Option<std::path::PathBuf>,
    /// Generate a day of traffic: steady, burst, diurnal, spikes or sparse.
    #[arg(long, default_value = "steady")]
    generate: Shape,
    /// Print the trace as CSV and exit.
    #[arg(long)]
    emit_trace: bool,
    /// Which policies to simulate.
    #[arg(long, value_enum, default_value_t = Which::Both)]
    policy: Which,
    /// Time from pod creation to readiness (e.g. 15s).
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    pod_startup: Duration,
    /// Job duration distribution: const:DUR, exp:DUR or lognormal:MEDIAN,SIGMA.
    #[arg(long, default_value = "exp:1s")]
    job_duration: DurationDist,
    /// Jobs one pod runs at once.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    concurrency: u32,
    /// Waiting jobs per replica for both policies (KEDA's listLength).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    target_backlog: u32,
    /// Most replicas for both policies.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i32).range(1..))]
    max_replicas: i32,
    /// KEDA's minReplicaCount (0 by default, as in KEDA; 1 or more keeps KEDA from
    /// toggling between 0 and 1 replica).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i32).range(0..))]
    keda_min_replicas: i32,
    /// A JSON ScalingSpec for the engine (its targetBacklogPerReplica and maxReplicas are
    /// replaced by --target-backlog and --max-replicas, which both policies share).
    #[arg(long)]
    engine_spec: Option<std::path::PathBuf>,
    /// Seed for arrival times, job durations and generated traces.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print one JSON object keyed by policy.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Which {
    Engine,
    Keda,
    Both,
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
        Command::Simulate(args) => simulate_command(args),
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

fn simulate_command(args: SimulateArgs) -> Result<()> {
    let trace = match &args.trace {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            Trace::parse_csv(&text).with_context(|| format!("parsing {}", path.display()))?
        }
        None => Trace::generate(args.generate, args.seed),
    };
    if args.emit_trace {
        print!("{}", trace.to_csv());
        return Ok(());
    }
    let target = i32::try_from(args.target_backlog).context("--target-backlog is too large")?;
    let mut spec = match &args.engine_spec {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?
        }
        None => ScalingSpec::default(),
    };
    spec.target_backlog_per_replica = target;
    spec.max_replicas = args.max_replicas;
    if let Some(problem) = spec.problems().first() {
        anyhow::bail!("engine spec: {problem}");
    }
    let engine = Policy::Engine(Box::new(spec));
    let keda = Policy::Keda {
        list_length: args.target_backlog,
        min_replicas: args.keda_min_replicas,
        max_replicas: args.max_replicas,
    };
    let policies = match args.policy {
        Which::Engine => vec![engine],
        Which::Keda => vec![keda],
        Which::Both => vec![engine, keda],
    };
    let config = SimConfig {
        trace,
        policies,
        pod_startup: args.pod_startup,
        job_duration: args.job_duration,
        concurrency: args.concurrency,
        seed: args.seed,
    };
    let report = simulate::run(&config);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "{:<8} {:>9} {:>9} {:>9} {:>9} {:>11} {:>15} {:>12}",
        "policy",
        "jobs",
        "p50 wait",
        "p95 wait",
        "p99 wait",
        "max backlog",
        "replica-seconds",
        "scale events"
    );
    for (name, r) in &report.policies {
        println!(
            "{:<8} {:>9} {:>8.2}s {:>8.2}s {:>8.2}s {:>11} {:>15.0} {:>12}",
            name,
            r.jobs,
            r.p50_wait_s,
            r.p95_wait_s,
            r.p99_wait_s,
            r.max_backlog,
            r.replica_seconds,
            r.scale_events
        );
    }
    Ok(())
}
