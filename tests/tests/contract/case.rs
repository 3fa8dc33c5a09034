//! The case format (documented in contract/README.md) and its loading:
//! a case that does not load names its file and what to fix.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

/// One case file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Case {
    pub(crate) description: String,
    #[serde(default)]
    pub(crate) redis: RedisKind,
    pub(crate) sides: Vec<SideKind>,
    pub(crate) steps: Vec<Step>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RedisKind {
    #[default]
    Plain,
    Tls,
    Mtls,
    Cluster,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum SideKind {
    Producer,
    Handler,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum Step {
    Produce(Produce),
    Worker(WorkerStep),
    Expect(Expect),
    Status(StatusStep),
    Wait(WaitStep),
    Cancel(CancelStep),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Produce {
    pub(crate) queue: String,
    #[serde(default)]
    pub(crate) many: bool,
    #[serde(default = "one")]
    pub(crate) concurrent: usize,
    pub(crate) jobs: Vec<CaseJob>,
    pub(crate) accepted: Option<Vec<bool>>,
    #[serde(default)]
    pub(crate) error: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CaseJob {
    pub(crate) label: String,
    pub(crate) task: String,
    #[serde(default)]
    pub(crate) data: Value,
    pub(crate) id: Option<String>,
    pub(crate) delay_ms: Option<u64>,
    pub(crate) run_at_in_ms: Option<u64>,
    pub(crate) unique_key: Option<String>,
    pub(crate) unique_for_s: Option<f64>,
    pub(crate) keep_s: Option<f64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WorkerStep {
    pub(crate) queues: Vec<String>,
    #[serde(default = "one")]
    pub(crate) concurrency: usize,
    /// Handler processes sharing the slots; `None`: one per slot.
    #[serde(default)]
    pub(crate) children: Option<usize>,
    #[serde(default = "three")]
    pub(crate) max_attempts: u32,
    #[serde(default = "backoff_base")]
    pub(crate) backoff_base: String,
    #[serde(default = "backoff_max")]
    pub(crate) backoff_max: String,
    /// `--heartbeat-interval` (the worker's default when absent): how soon
    /// a running job learns of a cancel.
    #[serde(default)]
    pub(crate) heartbeat: Option<String>,
}

/// Reads a job's outcome through the producer under test.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StatusStep {
    pub(crate) queue: String,
    pub(crate) job: Option<String>,
    /// A literal id instead of a job's label (one no job has).
    pub(crate) id: Option<String>,
    /// Reads again (every 50 ms) until `expect` holds, for up to this long;
    /// 0: one read.
    #[serde(default)]
    pub(crate) within_ms: u64,
    /// null: no outcome is kept; else an object of outcome fields, each a
    /// value or a matcher.
    pub(crate) expect: Value,
}

/// Waits for a job's final outcome through the producer under test.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WaitStep {
    pub(crate) queue: String,
    pub(crate) job: Option<String>,
    pub(crate) id: Option<String>,
    #[serde(default = "wait_ms")]
    pub(crate) timeout_ms: u64,
    /// The wait must run out of time; `expect` is then the last outcome read.
    #[serde(default)]
    pub(crate) times_out: bool,
    pub(crate) expect: Value,
}

/// Cancels a job through the producer under test.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CancelStep {
    pub(crate) queue: String,
    pub(crate) job: Option<String>,
    pub(crate) id: Option<String>,
    /// `did` and `from` or `state`, each a value or a matcher.
    pub(crate) expect: Value,
}

/// The fields of an outcome (the queue crate's `Outcome`) a status or wait
/// step may expect.
pub(crate) const OUTCOME_FIELDS: [&str; 13] = [
    "id",
    "state",
    "attempt",
    "worker",
    "result",
    "result_error",
    "error",
    "next_at_ms",
    "updated_at_ms",
    "ended_at_ms",
    "progress",
    "progress_at_ms",
    "cancel_requested_at_ms",
];

/// The fields of a cancel's answer (the queue crate's `Cancel`).
pub(crate) const CANCEL_FIELDS: [&str; 3] = ["did", "from", "state"];

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Expect {
    #[serde(default)]
    pub(crate) records: Vec<RecordExpect>,
    #[serde(default)]
    pub(crate) dead: Vec<DeadExpect>,
    #[serde(default)]
    pub(crate) order: Vec<Vec<String>>,
    #[serde(default)]
    pub(crate) processed: BTreeMap<String, u64>,
    #[serde(default)]
    pub(crate) failed: BTreeMap<String, u64>,
    #[serde(default = "timeout_ms")]
    pub(crate) timeout_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RecordExpect {
    pub(crate) job: String,
    #[serde(default = "one_u64")]
    pub(crate) attempt: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DeadExpect {
    pub(crate) queue: String,
    pub(crate) job: String,
    pub(crate) reason: String,
    pub(crate) attempts: u64,
    pub(crate) error_contains: String,
}

fn one() -> usize {
    1
}
fn one_u64() -> u64 {
    1
}
fn three() -> u32 {
    3
}
fn backoff_base() -> String {
    "10ms".into()
}
fn backoff_max() -> String {
    "50ms".into()
}
fn timeout_ms() -> u64 {
    20_000
}
fn wait_ms() -> u64 {
    5_000
}

/// Tasks the reference handler knows; a producer-side case may use only these.
pub(crate) const REFERENCE_TASKS: [&str; 6] = [
    "record",
    "fail",
    "permanent",
    "returning",
    "progress",
    "hold",
];

/// Checks the `expect` of a status, wait or cancel step: null (no outcome,
/// where `null_ok`) or an object of `fields`, each a value or a matcher
/// (`crate::json::matches`).
fn check_outcome_expect(expect: &Value, fields: &[&str], null_ok: bool) -> Result<(), String> {
    let Some(object) = expect.as_object() else {
        if expect.is_null() && null_ok {
            return Ok(());
        }
        return Err(format!(
            "\"expect\" must be an object{}",
            if null_ok { " or null" } else { "" }
        ));
    };
    for (field, want) in object {
        if !fields.contains(&field.as_str()) {
            return Err(format!(
                "\"expect\" names {field:?}, which is none of {fields:?}"
            ));
        }
        crate::json::check_matcher(want).map_err(|e| format!("\"expect\".{field}: {e}"))?;
    }
    Ok(())
}

/// Reads and checks one case file; the error names the file.
pub(crate) fn load_case(path: &Path) -> Result<Case, String> {
    let name = path.display();
    let text = std::fs::read_to_string(path).map_err(|e| format!("{name}: cannot read: {e}"))?;
    let case: Case = serde_json::from_str(&text)
        .map_err(|e| format!("{name}: not a valid case ({e}); see contract/README.md"))?;
    let bad = |what: String| Err(format!("{name}: {what}; see contract/README.md"));
    if case.description.trim().is_empty() {
        return bad("\"description\" is empty".into());
    }
    if case.sides.is_empty() {
        return bad("\"sides\" names neither \"producer\" nor \"handler\"".into());
    }
    let mut labels = HashSet::new();
    let mut worker = false;
    for (n, step) in case.steps.iter().enumerate() {
        let n = n + 1;
        match step {
            Step::Produce(p) => {
                if p.jobs.is_empty() {
                    return bad(format!("step {n}: no jobs"));
                }
                if p.concurrent == 0 {
                    return bad(format!("step {n}: \"concurrent\" must be 1 or more"));
                }
                if let Some(a) = &p.accepted
                    && a.len() != p.jobs.len()
                {
                    return bad(format!(
                        "step {n}: \"accepted\" has {} entries for {} jobs",
                        a.len(),
                        p.jobs.len()
                    ));
                }
                for job in &p.jobs {
                    if !labels.insert(job.label.clone()) {
                        return bad(format!("step {n}: label {:?} used twice", job.label));
                    }
                    if job.delay_ms.is_some() && job.run_at_in_ms.is_some() {
                        return bad(format!(
                            "step {n}: job {:?} has both delay_ms and run_at_in_ms",
                            job.label
                        ));
                    }
                    if case.sides.contains(&SideKind::Producer)
                        && !REFERENCE_TASKS.contains(&job.task.as_str())
                    {
                        return bad(format!(
                            "step {n}: job {:?} has task {:?}, which only a handler adapter runs: \
                             make the case \"sides\": [\"handler\"] or use one of {REFERENCE_TASKS:?}",
                            job.label, job.task
                        ));
                    }
                }
            }
            Step::Worker(w) => {
                if worker {
                    return bad(format!("step {n}: a second worker step"));
                }
                if w.queues.is_empty() || w.concurrency == 0 || w.max_attempts == 0 {
                    return bad(format!(
                        "step {n}: a worker needs queues, concurrency and max_attempts above 0"
                    ));
                }
                if w.children.is_some_and(|c| c == 0 || c > w.concurrency) {
                    return bad(format!(
                        "step {n}: children must be between 1 and the concurrency"
                    ));
                }
                worker = true;
            }
            Step::Status(StatusStep {
                job, id, expect, ..
            })
            | Step::Wait(WaitStep {
                job, id, expect, ..
            })
            | Step::Cancel(CancelStep {
                job, id, expect, ..
            }) => {
                match (job, id) {
                    (Some(label), None) if !labels.contains(label) => {
                        return bad(format!(
                            "step {n}: job {label:?} is not produced by an earlier step"
                        ));
                    }
                    (Some(_), None) | (None, Some(_)) => {}
                    _ => return bad(format!("step {n}: name either \"job\" (a label) or \"id\"")),
                }
                let checked = match step {
                    Step::Cancel(_) => check_outcome_expect(expect, &CANCEL_FIELDS, false),
                    _ => check_outcome_expect(expect, &OUTCOME_FIELDS, true),
                };
                if let Err(e) = checked {
                    return bad(format!("step {n}: {e}"));
                }
            }
            Step::Expect(e) => {
                if !worker {
                    return bad(format!("step {n}: an expect step before the worker step"));
                }
                let named = e
                    .records
                    .iter()
                    .map(|r| &r.job)
                    .chain(e.dead.iter().map(|d| &d.job))
                    .chain(e.order.iter().flatten());
                for label in named {
                    if !labels.contains(label) {
                        return bad(format!(
                            "step {n}: job {label:?} is not produced by an earlier step"
                        ));
                    }
                }
                let recorded: HashSet<&String> = e.records.iter().map(|r| &r.job).collect();
                if let Some(label) = e.order.iter().flatten().find(|l| !recorded.contains(l)) {
                    return bad(format!(
                        "step {n}: job {label:?} is in \"order\" but not in the step's \"records\""
                    ));
                }
            }
        }
    }
    Ok(case)
}

/// Every case of `dir`, by file stem, sorted; the errors name the files.
pub(crate) fn load_cases(dir: &Path) -> Result<Vec<(String, Case)>, Vec<String>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| vec![format!("{}: cannot list: {e}", dir.display())])?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    let (mut cases, mut errors) = (Vec::new(), Vec::new());
    for path in paths {
        let stem = path.file_stem().unwrap_or_default().to_string_lossy();
        match load_case(&path) {
            Ok(case) => cases.push((stem.into_owned(), case)),
            Err(e) => errors.push(e),
        }
    }
    if cases.is_empty() && errors.is_empty() {
        errors.push(format!("{}: no case files (*.json)", dir.display()));
    }
    if errors.is_empty() {
        Ok(cases)
    } else {
        Err(errors)
    }
}
