//! `workerpool-operator simulate`: its arguments and its report.

use std::time::Duration;

use clap::{Args, ValueEnum};

use super::compare::Comparison;
use super::fuzz::{Case, Outcome};
use super::keda::{DEFAULT_COOLDOWN_SECONDS, DEFAULT_SCALE_DOWN_WINDOW_SECONDS};
use super::{DurationDist, KedaSettings, Policy, PolicyReport, Shape, SimConfig, Trace};
use crate::scaling::ScalingSpec;

/// Why a simulation could not run; says what to fix.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SimulateError(String);

/// `workerpool-operator simulate`.
#[derive(Args, Debug)]
pub struct SimulateArgs {
    /// CSV of `t_seconds,jobs` rows; repeat the flag to simulate several traces in turn.
    #[arg(long, conflicts_with = "generate")]
    trace: Vec<std::path::PathBuf>,
    /// Generate a day of traffic: steady, burst, diurnal, spikes, sparse, short-spikes or
    /// ramp.
    #[arg(long, default_value = "steady")]
    generate: Shape,
    /// Print the trace as CSV and exit.
    #[arg(long)]
    emit_trace: bool,
    /// Run N random cases (traffic shapes, job durations, concurrency, start-up times,
    /// rate limits drawn from seeds --seed, --seed + 1, ...) against every KEDA setting,
    /// print one line per case and the worst; exits non-zero when KEDA beats the engine
    /// on any. Replay one case with --fuzz 1 --seed S.
    #[arg(long, value_name = "N", conflicts_with_all = ["trace", "emit_trace", "policy", "compare_keda", "keda_min_replicas", "keda_cooldown", "keda_scale_down_window"])]
    fuzz: Option<u64>,
    /// Which policies to simulate.
    #[arg(long, value_enum, default_value_t = Which::Both)]
    policy: Which,
    /// Run the engine against KEDA as its users tune it (minReplicaCount 0 and 1,
    /// cooldownPeriod and scale-down window of 30 s and 300 s) and mark every KEDA setting
    /// that beats it: p95 and p99 waits each within 1 s of the engine's at no more than
    /// 90 % of its replica-seconds.
    #[arg(long, conflicts_with_all = ["policy", "keda_min_replicas", "keda_cooldown", "keda_scale_down_window"])]
    compare_keda: bool,
    /// Time from pod creation to readiness (e.g. 15s).
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    pod_startup: Duration,
    /// Job duration distribution: const:DUR, exp:DUR or lognormal:MEDIAN,SIGMA.
    #[arg(long, default_value = "exp:1s")]
    job_duration: DurationDist,
    /// Jobs one pod runs at once.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    concurrency: u32,
    /// The queue's rate limit, N/PERIOD (20/s, 600/1m): jobs start no faster, and the
    /// engine knows it (spec.worker.rateLimit).
    #[arg(long, value_name = "N/PERIOD", value_parser = parse_rate_limit)]
    rate_limit: Option<workerpool_queue::rate::RateLimit>,
    /// A downstream every job uses that serves N jobs at once at full speed (a
    /// database's connection pool): with more in service, each slows to N/in-service
    /// of its speed. Neither policy is told; the workers see their jobs take longer.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    downstream_capacity: Option<u32>,
    /// A downstream every job uses that admits R jobs a second (an external API's
    /// limit the pool does not know): each job waits its turn in its slot.
    #[arg(long, value_name = "R", value_parser = parse_positive)]
    downstream_rate: Option<f64>,
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
    /// KEDA's cooldownPeriod in seconds: how long after the last poll that saw jobs it
    /// scales to zero.
    #[arg(long, default_value_t = DEFAULT_COOLDOWN_SECONDS)]
    keda_cooldown: u32,
    /// The scale-down stabilization window of KEDA's HPA in seconds
    /// (advanced.horizontalPodAutoscalerConfig.behavior).
    #[arg(long, default_value_t = DEFAULT_SCALE_DOWN_WINDOW_SECONDS, value_parser = clap::value_parser!(u32).range(0..=3600))]
    keda_scale_down_window: u32,
    /// A JSON ScalingSpec for the engine (its targetBacklogPerReplica and maxReplicas are
    /// replaced by --target-backlog and --max-replicas, which both policies share).
    #[arg(long)]
    engine_spec: Option<std::path::PathBuf>,
    /// Seed for arrival times, job durations and generated traces.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// After the table (or the one case that --fuzz 1 replays), every change of the
    /// engine's replica count: when, from and to, the jobs waiting and running at that
    /// poll, and the reason, as status and events give it.
    #[arg(long, conflicts_with_all = ["json", "compare_keda"])]
    timeline: bool,
    /// Print JSON: one object keyed by policy (with --compare-keda, the engine and one row
    /// per KEDA setting); with several traces, one such object per trace, keyed by trace.
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
/// (tables, or JSON with `--json`).
pub fn run(args: &SimulateArgs) -> Result<String, SimulateError> {
    if let Some(cases) = args.fuzz {
        return fuzz(args, cases);
    }
    let traces: Vec<(String, Trace)> = if args.trace.is_empty() {
        vec![(
            format!("generated {} (seed {})", args.generate.name(), args.seed),
            Trace::generate(args.generate, args.seed),
        )]
    } else {
        args.trace
            .iter()
            .map(|path| {
                let text = read(path)?;
                let trace = Trace::parse_csv(&text)
                    .map_err(|e| SimulateError(format!("parsing {}: {e}", path.display())))?;
                Ok((path.display().to_string(), trace))
            })
            .collect::<Result<_, SimulateError>>()?
    };
    if args.emit_trace {
        return match traces.as_slice() {
            [(_, trace)] => Ok(trace.to_csv()),
            _ => Err(SimulateError(
                "--emit-trace prints one trace; give at most one --trace".into(),
            )),
        };
    }
    let spec = engine_spec(args)?;
    let engine = Policy::Engine(Box::new(spec.clone()));
    let keda = Policy::Keda(KedaSettings {
        min_replicas: args.keda_min_replicas,
        cooldown_seconds: args.keda_cooldown,
        scale_down_window_seconds: args.keda_scale_down_window,
        ..KedaSettings::defaults(args.target_backlog, args.max_replicas)
    });
    let policies = match args.policy {
        Which::Engine => vec![engine],
        Which::Keda => vec![keda],
        Which::Both => vec![engine, keda],
    };
    let several = traces.len() > 1;
    let mut json = serde_json::Map::new();
    let mut out = String::new();
    for (name, trace) in traces {
        let config = SimConfig {
            trace,
            policies: policies.clone(),
            pod_startup: args.pod_startup,
            job_duration: args.job_duration,
            concurrency: args.concurrency,
            seed: args.seed,
            rate_limit: args.rate_limit,
            downstream: crate::simulate::Downstream {
                capacity: args.downstream_capacity,
                rate: args.downstream_rate,
            },
        };
        if several && !args.json {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&format!("{name}\n"));
        }
        if args.compare_keda {
            let comparison = Comparison::run(&config, &spec);
            if args.json {
                json.insert(name, to_json(&comparison)?);
            } else {
                out.push_str(&comparison.render());
            }
            continue;
        }
        let report = super::run(&config);
        if args.json {
            json.insert(name, to_json(&report)?);
            continue;
        }
        out.push_str(&format!(
            "{:<8} {:>9} {:>9} {:>9} {:>9} {:>11} {:>15} {:>12} {:>11}\n",
            "policy",
            "jobs",
            "p50 wait",
            "p95 wait",
            "p99 wait",
            "max backlog",
            "replica-seconds",
            "scale events",
            "utilization"
        ));
        for (name, r) in &report.policies {
            out.push_str(&format!(
                "{:<8} {:>9} {:>8.2}s {:>8.2}s {:>8.2}s {:>11} {:>15.0} {:>12} {:>10.0}%\n",
                name,
                r.jobs,
                r.p50_wait_s,
                r.p95_wait_s,
                r.p99_wait_s,
                r.max_backlog,
                r.replica_seconds,
                r.scale_events,
                100.0 * r.utilization
            ));
        }
        if args.timeline {
            for (name, r) in &report.policies {
                out.push_str(&timeline(name, r));
            }
        }
        // On steady traffic, the physical bound beside what each spent.
        if let Some(rate) = config.trace.steady_rate() {
            let mean = config.job_duration.mean();
            let slots = f64::from(config.concurrency.max(1));
            let seconds = config.trace.end().max(1.0);
            for (name, r) in &report.policies {
                if let Some(servers) = super::erlang::servers_for_p95(rate, mean, r.p95_wait_s) {
                    let replicas = (f64::from(servers) / slots).ceil();
                    out.push_str(&format!(
                        "{name}: steady {rate:.2} jobs/s; at its p95 wait of {:.2} s the Erlang-C minimum (M/M/c) is {replicas} replica{} ({servers} slots); it ran {:.2} on average\n",
                        r.p95_wait_s,
                        if replicas == 1.0 { "" } else { "s" },
                        r.replica_seconds / seconds
                    ));
                }
            }
        }
    }
    if args.json {
        // One trace: the object itself, as before; several: keyed by trace.
        let value = if several {
            serde_json::Value::Object(json)
        } else {
            json.into_iter()
                .next()
                .map_or(serde_json::Value::Null, |(_, v)| v)
        };
        let text = serde_json::to_string_pretty(&value)
            .map_err(|e| SimulateError(format!("report: {e}")))?;
        return Ok(text + "\n");
    }
    Ok(out)
}

/// The engine's spec: `--engine-spec` or the defaults, with the target and maximum that
/// both policies share.
fn engine_spec(args: &SimulateArgs) -> Result<ScalingSpec, SimulateError> {
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
    Ok(spec)
}

/// `--fuzz N`: N generated cases against every KEDA setting, one line each, then the
/// worst; an error (a non-zero exit) when KEDA beats the engine on any.
fn fuzz(args: &SimulateArgs, cases: u64) -> Result<String, SimulateError> {
    if args.timeline && cases > 1 {
        return Err(SimulateError(format!(
            "--timeline prints the steps of one case: replay one of these {cases} with \
             --fuzz 1 --seed S (S = the seed its line names)"
        )));
    }
    let spec = engine_spec(args)?;
    let outcomes: Vec<Outcome> = (args.seed..args.seed.saturating_add(cases))
        .map(|seed| Outcome::run(&Case::new(seed), &spec))
        .collect();
    let beaten: Vec<&Outcome> = outcomes
        .iter()
        .filter(|o| !o.comparison.beaten_by().is_empty())
        .collect();
    let out = if args.json {
        serde_json::to_string_pretty(&outcomes)
            .map_err(|e| SimulateError(format!("report: {e}")))?
            + "\n"
    } else {
        let mut out = String::new();
        for outcome in &outcomes {
            out.push_str(&outcome.line());
            out.push('\n');
            // One case (a replay): every policy's figures too.
            if outcomes.len() == 1 {
                out.push_str(&outcome.comparison.render());
                if args.timeline {
                    out.push_str(&timeline("engine", &outcome.comparison.engine));
                }
            }
        }
        let worst = outcomes
            .iter()
            .filter_map(|o| o.closest().map(|(_, ratio)| (o, ratio)))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        if let Some((o, ratio)) = worst {
            out.push_str(&format!(
                "worst: seed {} (the engine costs {ratio:.2}x the closest KEDA setting that waits as little; beaten above {:.2}x)\n",
                o.seed,
                1.0 / super::compare::COST_SHARE
            ));
        }
        out.push_str(&format!(
            "{} of {} cases beaten by a KEDA setting{}\n",
            beaten.len(),
            outcomes.len(),
            if beaten.is_empty() {
                String::new()
            } else {
                format!(
                    ": seeds {}",
                    beaten
                        .iter()
                        .map(|o| o.seed.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        ));
        out
    };
    if beaten.is_empty() {
        Ok(out)
    } else {
        Err(SimulateError(out))
    }
}

/// `--timeline`: every change of a policy's replica count, one line each (nothing for a
/// policy that keeps no steps).
fn timeline(name: &str, report: &PolicyReport) -> String {
    if report.steps.is_empty() {
        return String::new();
    }
    let mut out = format!("{name} timeline:\n");
    for step in &report.steps {
        out.push_str(&format!(
            "{:>9.1}s {:>4} -> {:<4} backlog {:<6} in flight {:<5} {}\n",
            step.at_s, step.from, step.to, step.backlog, step.in_flight, step.reason
        ));
    }
    out
}

/// `--rate-limit`, with the accepted forms in the error.
fn parse_positive(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("{text:?} is not a number above 0")),
    }
}

fn parse_rate_limit(text: &str) -> Result<workerpool_queue::rate::RateLimit, String> {
    text.parse()
        .map_err(|e: workerpool_queue::rate::RateLimitError| e.to_string())
}

fn to_json(value: &impl serde::Serialize) -> Result<serde_json::Value, SimulateError> {
    serde_json::to_value(value).map_err(|e| SimulateError(format!("report: {e}")))
}

fn read(path: &std::path::Path) -> Result<String, SimulateError> {
    std::fs::read_to_string(path)
        .map_err(|e| SimulateError(format!("reading {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: super::SimulateArgs,
    }

    fn run(args: &[&str]) -> String {
        let cli = Cli::try_parse_from(std::iter::once("simulate").chain(args.iter().copied()))
            .expect("arguments");
        super::run(&cli.args).expect("a report")
    }

    /// The lines of the engine's timeline: those after its heading, up to a replayed
    /// fuzz case's summary.
    fn timeline_steps(out: &str) -> Vec<&str> {
        out.lines()
            .skip_while(|l| *l != "engine timeline:")
            .skip(1)
            .take_while(|l| !l.starts_with("worst:"))
            .collect()
    }

    #[test]
    fn steady_traffic_gets_the_erlang_c_minimum_beside_each_policy_and_bursts_do_not() {
        let steady = run(&["--generate", "steady", "--seed", "3"]);
        let lines: Vec<&str> = steady
            .lines()
            .filter(|l| l.contains("Erlang-C minimum"))
            .collect();
        assert_eq!(lines.len(), 2, "{steady}");
        assert!(
            lines[0].starts_with("engine: steady ") && lines[1].starts_with("keda: steady "),
            "{steady}"
        );
        let burst = run(&["--generate", "burst", "--seed", "3"]);
        assert!(!burst.contains("Erlang-C"), "{burst}");
    }

    #[test]
    fn the_timeline_lists_every_change_of_the_engine_with_its_reason() {
        let trace = std::env::temp_dir().join(format!("timeline-{}.csv", std::process::id()));
        std::fs::write(&trace, "t_seconds,jobs\n0,200\n10,0\n900,0\n").expect("a trace");
        let path = trace.to_string_lossy().into_owned();
        let out = run(&["--trace", &path, "--policy", "engine", "--timeline"]);
        let _ = std::fs::remove_file(&trace);
        let steps = timeline_steps(&out);
        // Woken from zero for the burst, and back to zero once idle; as many lines as the
        // table counts scale events.
        let events: usize = out
            .lines()
            .find(|l| l.starts_with("engine "))
            .and_then(|l| l.split_whitespace().nth(7))
            .and_then(|n| n.parse().ok())
            .expect("scale events");
        assert_eq!(steps.len(), events, "{out}");
        assert!(
            steps[0].contains("0 -> ") && steps[0].contains("waking from zero"),
            "{out}"
        );
        let last = steps.last().expect("a last step");
        assert!(
            last.contains("-> 0 ") && last.contains("IdleToZero"),
            "{out}"
        );
        assert!(!out.contains("keda timeline"), "{out}");
    }

    #[test]
    fn timeline_over_several_fuzz_cases_is_refused_with_how_to_replay_one() {
        let cli =
            Cli::try_parse_from(["simulate", "--fuzz", "3", "--timeline"]).expect("arguments");
        let err = super::run(&cli.args).expect_err("several cases have no one timeline");
        assert!(err.to_string().contains("--fuzz 1 --seed S"), "{err}");
    }

    #[test]
    fn a_replayed_fuzz_case_prints_both_percentiles_and_with_timeline_the_engine_s_steps() {
        let plain = run(&["--fuzz", "1", "--seed", "1"]);
        let line = plain.lines().next().expect("the case's line");
        assert!(
            line.starts_with("seed 1 ") && line.matches(" p99 ").count() == 2,
            "the engine's and the closest setting's p99: {plain}"
        );
        assert!(!plain.contains("timeline"), "{plain}");
        let out = run(&["--fuzz", "1", "--seed", "1", "--timeline"]);
        let steps = timeline_steps(&out);
        assert!(
            steps
                .first()
                .is_some_and(|s| s.contains("waking from zero")),
            "{out}"
        );
        assert!(steps.iter().all(|s| s.contains(" -> ")), "{out}");
    }
}
