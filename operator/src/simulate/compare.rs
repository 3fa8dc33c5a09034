//! The engine against KEDA as its users tune it: `minReplicaCount` 0 and 1, a short and
//! the default `cooldownPeriod`, a short and the default scale-down stabilization window.
//!
//! A KEDA setting *beats* the engine on a trace when it costs at most [`COST_SHARE`] of
//! the engine's replica-seconds and waits no longer at both the p95 and the p99, within
//! [`WAIT_MARGIN_SECONDS`] of the engine's at each: a user comparing the two would pick
//! KEDA. A setting cheaper only because its slowest jobs wait longer does not win.

use serde::Serialize;

use super::keda::{DEFAULT_COOLDOWN_SECONDS, DEFAULT_SCALE_DOWN_WINDOW_SECONDS};
use super::{KedaSettings, Policy, PolicyReport, SimConfig, run_each};
use crate::scaling::ScalingSpec;

/// How much longer KEDA's p95 and p99 waits may each be, in seconds, and still count
/// as level.
pub const WAIT_MARGIN_SECONDS: f64 = 1.0;
/// The share of the engine's replica-seconds at or below which KEDA is cheaper enough to win.
pub const COST_SHARE: f64 = 0.9;
/// The short `cooldownPeriod` and scale-down window users set, in seconds.
pub const SHORT_COOLDOWN_SECONDS: u32 = 30;

/// The KEDA settings the comparison runs, KEDA's defaults first: `minReplicaCount` 0 with
/// every mix of a 30 s or 300 s `cooldownPeriod` and scale-down window, and
/// `minReplicaCount` 1 with either window (the cooldown only matters at 0).
pub fn keda_settings(list_length: u32, max_replicas: i32) -> Vec<KedaSettings> {
    let defaults = KedaSettings::defaults(list_length, max_replicas);
    let short = SHORT_COOLDOWN_SECONDS;
    let long = DEFAULT_SCALE_DOWN_WINDOW_SECONDS;
    let mut all = Vec::new();
    for (cooldown, window) in [
        (DEFAULT_COOLDOWN_SECONDS, long),
        (short, long),
        (DEFAULT_COOLDOWN_SECONDS, short),
        (short, short),
    ] {
        all.push(KedaSettings {
            cooldown_seconds: cooldown,
            scale_down_window_seconds: window,
            ..defaults
        });
    }
    for window in [long, short] {
        all.push(KedaSettings {
            min_replicas: 1,
            scale_down_window_seconds: window,
            ..defaults
        });
    }
    all
}

/// One KEDA setting's outcome.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KedaRow {
    /// What differs from KEDA's defaults.
    pub setting: String,
    /// `minReplicaCount`.
    pub min_replicas: i32,
    /// `cooldownPeriod`, in seconds.
    pub cooldown_seconds: u32,
    /// The HPA's scale-down stabilization window, in seconds.
    pub scale_down_window_seconds: u32,
    /// The simulated outcome.
    pub report: PolicyReport,
    /// Whether this setting beats the engine (p95 within the margin, cost within the share).
    pub beats_engine: bool,
}

/// The engine and every KEDA setting on one trace.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Comparison {
    /// The engine's outcome.
    pub engine: PolicyReport,
    /// Each KEDA setting's outcome, KEDA's defaults first.
    pub keda: Vec<KedaRow>,
}

/// Whether `keda` waits as little as `engine`: p95 and p99 each within
/// [`WAIT_MARGIN_SECONDS`] of the engine's.
pub fn waits_as_little(keda: &PolicyReport, engine: &PolicyReport) -> bool {
    keda.p95_wait_s <= engine.p95_wait_s + WAIT_MARGIN_SECONDS
        && keda.p99_wait_s <= engine.p99_wait_s + WAIT_MARGIN_SECONDS
}

/// Whether `keda` beats `engine`: it waits as little ([`waits_as_little`]) at most
/// [`COST_SHARE`] of the replica-seconds.
pub fn beats(keda: &PolicyReport, engine: &PolicyReport) -> bool {
    waits_as_little(keda, engine) && keda.replica_seconds <= COST_SHARE * engine.replica_seconds
}

impl Comparison {
    /// Simulates the engine with `spec` and every setting of [`keda_settings`] on the
    /// trace, workers and seed of `base` (its own policies are ignored). The KEDA settings
    /// take their `listLength` and `maxReplicaCount` from `spec`.
    pub fn run(base: &SimConfig, spec: &ScalingSpec) -> Self {
        let settings = keda_settings(
            u32::try_from(spec.target_backlog_per_replica.max(1)).unwrap_or(1),
            spec.max_replicas,
        );
        let mut policies = vec![Policy::Engine(Box::new(spec.clone()))];
        policies.extend(settings.iter().copied().map(Policy::Keda));
        let config = SimConfig {
            policies,
            ..base.clone()
        };
        let mut reports = run_each(&config).into_iter();
        let engine = reports.next().unwrap_or_else(|| {
            unreachable!("run_each returns one report per policy, and the engine is one")
        });
        let keda = settings
            .iter()
            .zip(reports)
            .map(|(s, report)| KedaRow {
                setting: s.label(),
                min_replicas: s.min_replicas,
                cooldown_seconds: s.cooldown_seconds,
                scale_down_window_seconds: s.scale_down_window_seconds,
                beats_engine: beats(&report, &engine),
                report,
            })
            .collect();
        Comparison { engine, keda }
    }

    /// The KEDA settings that beat the engine.
    pub fn beaten_by(&self) -> Vec<&KedaRow> {
        self.keda.iter().filter(|row| row.beats_engine).collect()
    }

    /// KEDA with its defaults.
    pub fn keda_defaults(&self) -> Option<&KedaRow> {
        self.keda.iter().find(|row| row.setting == "defaults")
    }

    /// Whether the engine waits less than KEDA's defaults (p95) at fewer replica-seconds.
    pub fn ahead_of_keda_defaults(&self) -> bool {
        self.keda_defaults().is_some_and(|d| {
            self.engine.p95_wait_s < d.report.p95_wait_s
                && self.engine.replica_seconds < d.report.replica_seconds
        })
    }

    /// The comparison as a table, one row per policy, and a verdict line.
    pub fn render(&self) -> String {
        let mut out = format!(
            "{:<50} {:>9} {:>9} {:>15} {:>7}\n",
            "policy", "p95 wait", "p99 wait", "replica-seconds", "cost"
        );
        let row = |out: &mut String, name: &str, r: &PolicyReport, mark: &str| {
            let share = if self.engine.replica_seconds > 0.0 {
                format!(
                    "{:.0} %",
                    100.0 * r.replica_seconds / self.engine.replica_seconds
                )
            } else {
                "-".into()
            };
            out.push_str(&format!(
                "{:<50} {:>8.2}s {:>8.2}s {:>15.0} {:>7}{}\n",
                name, r.p95_wait_s, r.p99_wait_s, r.replica_seconds, share, mark
            ));
        };
        row(&mut out, "engine", &self.engine, "");
        for k in &self.keda {
            let mark = if k.beats_engine {
                "  <- beats the engine"
            } else {
                ""
            };
            row(&mut out, &format!("keda {}", k.setting), &k.report, mark);
        }
        let beaten = self.beaten_by();
        let lead = if self.ahead_of_keda_defaults() {
            "ahead of KEDA's defaults (lower p95, fewer replica-seconds)"
        } else {
            "NOT ahead of KEDA's defaults on both p95 and replica-seconds"
        };
        if beaten.is_empty() {
            out.push_str(&format!("not beaten by any KEDA setting; {lead}\n"));
        } else {
            out.push_str(&format!(
                "BEATEN by {} KEDA setting(s); {lead}\n",
                beaten.len()
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::simulate::{DurationDist, Trace};

    fn report(p95: f64, cost: f64) -> PolicyReport {
        PolicyReport::waits(p95, p95, cost)
    }

    #[test]
    fn keda_beats_the_engine_only_when_level_on_waits_and_clearly_cheaper() {
        let engine = report(10.0, 1000.0);
        assert!(beats(&report(11.0, 900.0), &engine), "at both limits");
        assert!(beats(&report(2.0, 500.0), &engine));
        assert!(!beats(&report(11.5, 500.0), &engine), "waits longer");
        assert!(!beats(&report(2.0, 901.0), &engine), "not cheaper enough");
    }

    #[test]
    fn the_settings_are_minimum_zero_and_one_with_short_and_default_cooldowns_defaults_first() {
        let all = keda_settings(5, 100);
        let labels: Vec<String> = all.iter().map(KedaSettings::label).collect();
        assert_eq!(
            labels,
            [
                "defaults",
                "min 0, cooldown 30s",
                "min 0, cooldown 300s, scale-down window 30s",
                "min 0, cooldown 30s, scale-down window 30s",
                "min 1",
                "min 1, scale-down window 30s",
            ]
        );
        assert!(
            all.iter()
                .all(|s| s.list_length == 5 && s.max_replicas == 100)
        );
    }

    #[test]
    fn a_comparison_runs_every_setting_on_the_same_jobs_and_renders_a_verdict() {
        let config = SimConfig {
            trace: Trace::parse_csv("0,300\n10,0\n600,30\n610,0\n1800,0\n").expect("trace"),
            policies: Vec::new(),
            pod_startup: Duration::from_secs(10),
            job_duration: DurationDist::Const(1.0),
            concurrency: 1,
            seed: 1,
            rate_limit: None,
            downstream: crate::simulate::Downstream::default(),
        };
        let comparison = Comparison::run(&config, &ScalingSpec::default());
        assert_eq!(comparison.keda.len(), keda_settings(5, 100).len());
        assert!(comparison.keda.iter().all(|k| k.report.jobs == 330));
        assert_eq!(comparison.engine.jobs, 330);
        assert_eq!(
            comparison.keda_defaults().map(|d| d.setting.as_str()),
            Some("defaults")
        );
        let text = comparison.render();
        assert!(text.starts_with("policy"), "{text}");
        assert!(text.contains("keda min 1, scale-down window 30s"), "{text}");
        let verdict = text.lines().last().unwrap_or_default();
        let marked = text.matches("<- beats the engine").count();
        assert_eq!(marked, comparison.beaten_by().len());
        assert!(
            verdict.starts_with(if marked == 0 { "not beaten" } else { "BEATEN" }),
            "{verdict}"
        );
    }
}
