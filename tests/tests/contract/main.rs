//! The conformance suite of the queue contract (`contract/README.md`): every
//! case of `contract/cases/` runs against a real Redis (plain, TLS, mutual
//! TLS or a 3-node cluster) and the real `workerpool-worker`, once per
//! producer (the `workerpool enqueue` command line and each client's
//! adapter in `produce` mode, checked by the reference handler) and once per
//! handler adapter (`handle` mode under `--handler exec`, fed by the command
//! line). The outcome steps (`status`, `wait`, `cancel`) ask the producer
//! under test. `CONTRACT_ADAPTERS=rust,python,node` (a comma list) picks
//! the adapters; unset, all run.

mod adapters;
mod case;
mod json;
mod run;

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use adapters::{
    Producer, Program, adapter, bins, chosen_adapters, reference_handler, system_python,
};
use case::{Case, RedisKind, SideKind, Step, load_cases};
use run::run_case;
use workerpool_tests::root;

/// One entry of the matrix: a case, a producer and a handler.
struct Entry {
    case: String,
    producer: Producer,
    handler: Program,
}

/// Runs `entries` on `threads` threads; the failures, each naming its case,
/// producer and handler.
fn run_all(cases: &HashMap<String, Case>, entries: Vec<Entry>, threads: usize) -> Vec<String> {
    let queue = Arc::new(Mutex::new(entries));
    let failures = Arc::new(Mutex::new(Vec::new()));
    std::thread::scope(|s| {
        for _ in 0..threads {
            let (queue, failures) = (queue.clone(), failures.clone());
            s.spawn(move || {
                loop {
                    let Some(entry) = queue.lock().expect("queue").pop() else {
                        return;
                    };
                    let started = Instant::now();
                    // A helper that panics (a Redis that would not start) fails
                    // this run only, named like any other failure.
                    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        run_case(&cases[&entry.case], &entry.producer, &entry.handler)
                    }))
                    .unwrap_or_else(|panic| {
                        let said = panic
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_default();
                        Err(format!("panicked: {said}"))
                    });
                    let name = format!(
                        "case {} (producer {}, handler {})",
                        entry.case,
                        entry.producer.name(),
                        entry.handler.name
                    );
                    let line = format!("{name}: {:.1} s", started.elapsed().as_secs_f64());
                    let _ = writeln!(std::io::stderr(), "{line}");
                    if let Err(e) = result {
                        failures
                            .lock()
                            .expect("failures")
                            .push(format!("{name}: {e}"));
                    }
                }
            });
        }
    });
    let mut out = failures.lock().expect("failures").clone();
    out.sort();
    out
}

fn cases_dir() -> PathBuf {
    root().join("contract/cases")
}

fn cases_by_name() -> HashMap<String, Case> {
    match load_cases(&cases_dir()) {
        Ok(cases) => cases.into_iter().collect(),
        Err(errors) => panic!("case files that do not load:\n{}", errors.join("\n")),
    }
}

// ---------------------------------------------------------------------------
// The suite.

#[test]
fn every_case_holds_for_every_producer_and_handler() {
    let cases = cases_by_name();
    let mut names: Vec<&String> = cases.keys().collect();
    names.sort();
    // Adapters that cannot run, each saying what to run or merge.
    let mut problems = Vec::new();
    let mut producers = Vec::new();
    let mut handlers = Vec::new();
    for name in chosen_adapters() {
        if name == "rust" {
            producers.push(Producer::Cli);
            continue;
        }
        match (
            adapter(&root(), &name, "produce"),
            adapter(&root(), &name, "handle"),
        ) {
            (Ok(p), Ok(h)) => {
                producers.push(Producer::Adapter(p));
                handlers.push(h);
            }
            (Err(e), _) | (_, Err(e)) => problems.push(e),
        }
    }
    let mut entries = Vec::new();
    for name in &names {
        let case = &cases[*name];
        if case.sides.contains(&SideKind::Producer) {
            for p in &producers {
                entries.push(Entry {
                    case: name.to_string(),
                    producer: p.clone(),
                    handler: reference_handler(),
                });
            }
        }
        if case.sides.contains(&SideKind::Handler) {
            for h in &handlers {
                entries.push(Entry {
                    case: name.to_string(),
                    producer: Producer::Cli,
                    handler: h.clone(),
                });
            }
        }
    }
    // Longest first (clusters, TLS, waits), so the threads finish together.
    entries.sort_by_key(|e| {
        let case = &cases[&e.case];
        (case.redis == RedisKind::Plain, e.case.contains("delay"))
    });
    entries.reverse();
    let runs = entries.len();
    let failed = run_all(&cases, entries, 3);
    assert!(
        problems.is_empty() && failed.is_empty(),
        "{} adapters unavailable, {} of {runs} runs failed:\n\n{}",
        problems.len(),
        failed.len(),
        problems
            .into_iter()
            .chain(failed)
            .collect::<Vec<_>>()
            .join("\n\n")
    );
}

// ---------------------------------------------------------------------------
// Self-checks: the runner catches what it is there to catch.

#[test]
fn a_case_file_that_does_not_parse_is_named() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("broken.json"),
        "{\"description\": \"x\", \"steps\": [",
    )
    .expect("write");
    std::fs::write(
        dir.path().join("typo.json"),
        r#"{"description": "x", "sides": ["producer"], "steps": [{"produce": {"queue": "q", "jobz": []}}]}"#,
    )
    .expect("write");
    std::fs::write(
        dir.path().join("unknown_label.json"),
        r#"{"description": "x", "sides": ["producer"], "steps": [
            {"produce": {"queue": "q", "jobs": [{"label": "a", "task": "record"}]}},
            {"worker": {"queues": ["q"]}},
            {"expect": {"records": [{"job": "b"}]}}]}"#,
    )
    .expect("write");
    let errors = load_cases(dir.path()).expect_err("the cases must not load");
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert!(
        errors[0].contains("broken.json") && errors[0].contains("EOF"),
        "{errors:?}"
    );
    assert!(
        errors[1].contains("typo.json") && errors[1].contains("jobz"),
        "{errors:?}"
    );
    assert!(
        errors[2].contains("unknown_label.json") && errors[2].contains("\"b\" is not produced"),
        "{errors:?}"
    );
    // The suite's own cases all load.
    assert!(
        load_cases(&cases_dir()).is_ok(),
        "{:?}",
        load_cases(&cases_dir()).err()
    );
}

/// A producer adapter in Python's standard library that enqueues through
/// `workerpool enqueue`, passing on neither `unique_key` nor `delay_ms`,
/// and misbehaves further as `FAKE_MODE` says: `wrong-id`
/// answers an id it did not enqueue, `mangle` loses non-ASCII text.
const FAKE_PRODUCER: &str = r#"
import json, os, subprocess, sys
mode = os.environ["FAKE_MODE"]
cli = os.path.join(os.environ["FAKE_BINS"], "workerpool")
def mangle(v):
    if isinstance(v, str): return v.encode("ascii", "replace").decode()
    if isinstance(v, list): return [mangle(x) for x in v]
    if isinstance(v, dict): return {mangle(k): mangle(x) for k, x in v.items()}
    return v
for line in sys.stdin:
    req = json.loads(line)
    ids = []
    for job in req["jobs"]:
        fields = {"task": job["task"], "data": mangle(job["data"]) if mode == "mangle" else job["data"]}
        if job["id"] is not None: fields["id"] = job["id"]
        out = subprocess.run([cli, "enqueue", "--redis-url", req["url"], "--queue", req["queue"],
                              json.dumps(fields)], capture_output=True, text=True, check=True)
        ids.append(out.stdout.strip())
    if mode == "wrong-id": ids = ["0123456789abcdef0123456789abcdef" if i == ids[-1] else i for i in ids]
    print(json.dumps({"ids": ids}), flush=True)
"#;

/// A handler adapter that rounds every number with a fraction to 6 places,
/// as a client that parsed floats lossily would.
const FAKE_HANDLER: &str = r#"
import json, os, sys
for line in sys.stdin:
    job = json.loads(line, parse_float=lambda s: round(float(s), 6))
    with open(os.environ["CONTRACT_RECORD"], "a") as f:
        f.write(json.dumps({"id": job["id"], "attempt": job["attempt"], "task": job["task"], "data": job.get("data")}) + "\n")
    print(json.dumps({"ok": True}), flush=True)
"#;

/// A multiplexed handler that runs the tasks of `handler_many_at_once` on
/// threads and misbehaves around each answer: a line that is not JSON, an
/// answer for a job it never got, and every answer twice (the second a
/// failure). The worker must settle each job once, by its first answer.
const ROGUE_MULTIPLEXED_HANDLER: &str = r#"
import json, os, sys, threading, time
lock = threading.Lock()
met = {}
cond = threading.Condition(lock)
def say(line):
    with lock:
        sys.stdout.write(line + "\n"); sys.stdout.flush()
def record(job):
    with lock:
        with open(os.environ["CONTRACT_RECORD"], "a") as f:
            f.write(json.dumps({"id": job["id"], "attempt": job["attempt"], "task": job["task"], "data": job.get("data")}) + "\n")
def run(job):
    data = job.get("data") or {}
    if job["task"] == "sleep":
        time.sleep(data["ms"] / 1000)
    if job["task"] == "meet":
        with cond:
            met[data["group"]] = met.get(data["group"], 0) + 1
            cond.notify_all()
            cond.wait_for(lambda: met[data["group"]] >= data["n"], timeout=5)
    record(job)
    say("this is not an answer")
    say(json.dumps({"id": "never-given-" + job["id"], "ok": True}))
    say(json.dumps({"id": job["id"], "ok": True}))
    say(json.dumps({"id": job["id"], "ok": False, "error": "a second answer", "retry": False}))
for line in sys.stdin:
    threading.Thread(target=run, args=(json.loads(line),), daemon=True).start()
"#;

fn fake(dir: &Path, name: &str, script: &str, mode: &str) -> Program {
    let path = dir.join(format!("{name}.py"));
    std::fs::write(&path, script).expect("write the fake adapter");
    Program {
        name: name.into(),
        argv: vec![system_python(), path.display().to_string()],
        env: vec![
            ("FAKE_MODE".into(), mode.into()),
            ("FAKE_BINS".into(), bins().display().to_string()),
        ],
    }
}

#[test]
fn a_producer_that_answers_a_wrong_id_is_caught() {
    let dir = tempfile::tempdir().expect("temp dir");
    let producer = Producer::Adapter(fake(dir.path(), "wrong-id", FAKE_PRODUCER, "wrong-id"));
    let cases = cases_by_name();
    let err = run_case(&cases["ids_and_envelope"], &producer, &reference_handler())
        .expect_err("a wrong id must fail the case");
    assert!(
        err.contains("\"no-data\"")
            && err.contains("0 payloads with the id \"0123456789abcdef0123456789abcdef\""),
        "{err}"
    );
}

#[test]
fn a_producer_that_mangles_data_is_caught() {
    let dir = tempfile::tempdir().expect("temp dir");
    let producer = Producer::Adapter(fake(dir.path(), "mangler", FAKE_PRODUCER, "mangle"));
    let cases = cases_by_name();
    let err = run_case(&cases["payload_unicode"], &producer, &reference_handler())
        .expect_err("mangled text must fail the case");
    assert!(
        err.contains("job \"scripts\"")
            && err.contains(
                "the payload's data differs: at data.fr: \"d?j? vu\" instead of \"déjà vu\""
            ),
        "{err}"
    );
}

#[test]
fn a_handler_that_mangles_data_is_caught() {
    let dir = tempfile::tempdir().expect("temp dir");
    let handler = fake(dir.path(), "rounder", FAKE_HANDLER, "");
    let cases = cases_by_name();
    let err = run_case(&cases["payload_numbers"], &Producer::Cli, &handler)
        .expect_err("rounded floats must fail the case");
    assert!(
        err.contains("job \"floats\": the data differs from what was enqueued: at data.pi: 3.141593 instead of 3.141592653589793"),
        "{err}"
    );
}

#[test]
fn a_multiplexed_handler_that_answers_twice_or_names_jobs_it_never_got_settles_each_job_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let handler = fake(dir.path(), "rogue", ROGUE_MULTIPLEXED_HANDLER, "");
    let cases = cases_by_name();
    // Every job recorded once, 12 processed and nothing dead: the second
    // answers (failures) and the stray lines settled nothing.
    run_case(&cases["handler_many_at_once"], &Producer::Cli, &handler)
        .unwrap_or_else(|e| panic!("extra answers must change nothing: {e}"));
}

#[test]
fn a_missing_adapter_names_what_to_run() {
    let empty = tempfile::tempdir().expect("temp dir");
    let python = adapter(empty.path(), "python", "produce").expect_err("no adapter there");
    assert!(
        python.contains("contract/adapters/python_adapter.py is missing"),
        "{python}"
    );
    std::fs::create_dir_all(empty.path().join("contract/adapters")).expect("mkdir");
    std::fs::write(empty.path().join("contract/adapters/node_adapter.mjs"), "").expect("write");
    let node = adapter(empty.path(), "node", "produce").expect_err("no environment there");
    assert!(node.contains("run scripts/sdk-env-node.sh"), "{node}");
    let other = adapter(empty.path(), "ruby", "produce").expect_err("unknown");
    assert!(
        other.contains("known: rust, python, node") && other.contains("set CONTRACT_ADAPTER_RUBY"),
        "{other}"
    );
}

#[test]
fn a_producer_that_ignores_unique_keys_is_caught() {
    let dir = tempfile::tempdir().expect("temp dir");
    // The fake producer passes neither unique_key nor delay_ms on.
    let producer = Producer::Adapter(fake(dir.path(), "careless", FAKE_PRODUCER, "careless"));
    let cases = cases_by_name();
    let err = run_case(&cases["unique_concurrent"], &producer, &reference_handler())
        .expect_err("four accepted duplicates must fail the case");
    assert!(
        err.contains("job \"first\": of 4 producers at once, exactly one must be accepted"),
        "{err}"
    );
}

#[test]
fn a_producer_that_ignores_delays_is_caught() {
    let dir = tempfile::tempdir().expect("temp dir");
    let producer = Producer::Adapter(fake(dir.path(), "careless", FAKE_PRODUCER, "careless"));
    let cases = cases_by_name();
    let err = run_case(&cases["delayed"], &producer, &reference_handler())
        .expect_err("a job run at once must fail the case");
    assert!(
        err.contains("job \"delayed\": a delayed job must carry \"run_at\""),
        "{err}"
    );
}

#[test]
fn a_result_that_differs_is_caught() {
    let mut case = cases_by_name()["outcome_result"].clone();
    for step in &mut case.steps {
        if let Step::Wait(w) = step
            && w.expect["result"]["doubled"] == 4
        {
            w.expect["result"]["doubled"] = 5.into();
        }
    }
    let err = run_case(&case, &Producer::Cli, &reference_handler())
        .expect_err("a result other than the one expected must fail the case");
    assert!(
        err.contains(
            "the final outcome of the wait for job \"kept\": at result.doubled: 4 instead of 5"
        ),
        "{err}"
    );
}

#[test]
fn a_handler_that_never_hears_a_cancel_is_caught() {
    // One job per child, and the reference handler never says it accepts a
    // cancel line: the worker sends none, so the held job runs to its end
    // (done) instead of ending cancelled.
    let mut case = cases_by_name()["outcome_cancel"].clone();
    for step in &mut case.steps {
        match step {
            Step::Worker(w) => w.children = None,
            Step::Produce(p) => {
                for job in &mut p.jobs {
                    if job.task == "hold" {
                        job.data = serde_json::json!({"ms": 300});
                    }
                }
            }
            _ => {}
        }
    }
    let err = run_case(&case, &Producer::Cli, &reference_handler())
        .expect_err("a job that ran to its end must fail the case");
    assert!(
        err.contains("the final outcome of the wait for job \"held\": at state: \"done\" instead of \"cancelled\""),
        "{err}"
    );
}
