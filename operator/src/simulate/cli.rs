//! `workerpool-operator simulate`: its arguments and its report.

use std::fmt::Write as _;
use std::time::Duration;

use clap::{Args, ValueEnum};

use super::{DurationDist, Policy, Shape, SimConfig, Trace};
use crate::scaling::ScalingSpec;

/// Why a simulation could not run; says what to fix.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SimulateError(String);

/// `workerpool-operator simulate`.
#[derive(Args, Debug)]
pub struct SimulateArgs {
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

/// Which policies to simulate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Which {
    /// The scaling engine.
    Engine,
    /// The KEDA baseline.
    Keda,
    /// Both, side by side.
    Both,
}

/// Runs the simulation the arguments describe; returns the report as text
/// (a table, or JSON with `--json`).
pub fn run(args: &SimulateArgs) -> Result<String, SimulateError> {
    let mut out = String::new();
    let trace = match &args.trace {
        Some(path) => {
            let text = read(path)?;
            Trace::parse_csv(&text)
                .map_err(|e| SimulateError(format!("parsing {}: {e}", path.display())))?
        }
        None => Trace::generate(args.generate, args.seed),
    };
    if args.emit_trace {
        return Ok(trace.to_csv());
    }
    let target = i32::try_from(args.target_backlog)
        .map_err(|_| SimulateError("--target-backlog is too large".into()))?;
    let mut spec = match &args.engine_spec {
        Some(path) => {
            let text = read(path)?;
            serde_json::from_str(&text)
                .map_err(|e| SimulateError(format!("parsing {}: {e}", path.display())))?
        }
        None => ScalingSpec::default(),
    };
    spec.target_backlog_per_replica = target;
    spec.max_replicas = args.max_replicas;
    if let Some(problem) = spec.problems().first() {
        return Err(SimulateError(format!("engine spec: {problem}")));
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
    let report = super::run(&config);
    if args.json {
        let json = serde_json::to_string_pretty(&report)
            .map_err(|e| SimulateError(format!("report: {e}")))?;
        return Ok(json + "\n");
    }
    writeln!(
        out,
        "{:<8} {:>9} {:>9} {:>9} {:>9} {:>11} {:>15} {:>12}",
        "policy",
        "jobs",
        "p50 wait",
        "p95 wait",
        "p99 wait",
        "max backlog",
        "replica-seconds",
        "scale events"
    )
    .map_err(|e| SimulateError(e.to_string()))?;
    for (name, r) in &report.policies {
        writeln!(
            out,
            "{:<8} {:>9} {:>8.2}s {:>8.2}s {:>8.2}s {:>11} {:>15.0} {:>12}",
            name,
            r.jobs,
            r.p50_wait_s,
            r.p95_wait_s,
            r.p99_wait_s,
            r.max_backlog,
            r.replica_seconds,
            r.scale_events
        )
        .map_err(|e| SimulateError(e.to_string()))?;
    }
    Ok(out)
}

fn read(path: &std::path::Path) -> Result<String, SimulateError> {
    std::fs::read_to_string(path)
        .map_err(|e| SimulateError(format!("reading {}: {e}", path.display())))
}
