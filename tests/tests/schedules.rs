//! Recurring schedules in local mode, end to end: `workerpool-operator
//! local` enqueues each fire on a real Redis, real `workerpool-worker`
//! processes run the jobs, and a handler writes down when each job started
//! and ended, so the tests see what ran and when.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use workerpool_tests::{Local, TestRedis, eventually, local_command};

/// The directory holding `workerpool-operator` and `workerpool-worker`,
/// building them there when they are missing.
/// A pool on queue `sched` with `replicas` workers of `concurrency` slots
/// whose jobs take `seconds` and are logged to `log`, and one schedule.
fn manifest(schedule: &str, replicas: u32, concurrency: u32, seconds: &str, log: &Path) -> String {
    let log = log.display();
    let script = format!(
        "while IFS= read -r job; do echo \"start $(date +%s%3N) $job\" >> {log}; sleep {seconds}; \
         echo \"end $(date +%s%3N) $job\" >> {log}; echo '{{\"ok\":true}}'; done"
    );
    let args = serde_json::to_string(&["--", "sh", "-c", &script]).expect("args as JSON");
    format!(
        r#"apiVersion: workerpool.dev/v1alpha1
kind: WorkerPool
metadata: {{name: reports}}
spec:
  queue: {{redis: {{url: "redis://127.0.0.1:1/0", key: sched}}}}
  template:
    spec:
      containers:
      - name: worker
        image: ghcr.io/workerpool-dev/workerpool-worker:0.1.0
        args: {args}
  worker: {{concurrency: {concurrency}, maxAttempts: 1, jobTimeoutSeconds: 30}}
  replicas: {replicas}
  shutdown: {{gracePeriodSeconds: 5}}
  schedules:
  - {schedule}
"#
    )
}

/// One job as the handler saw it: its fire time (from its id) and when it
/// started and ended (unix ms).
#[derive(Debug, Clone, Default)]
struct Run {
    fire_ms: i64,
    starts: Vec<i64>,
    end: Option<i64>,
}

/// The handler's log, by job id.
fn runs(log: &Path) -> BTreeMap<String, Run> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut out: BTreeMap<String, Run> = BTreeMap::new();
    for line in text.lines() {
        let mut parts = line.splitn(3, ' ');
        let (Some(kind), Some(ms), Some(job)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let (Ok(ms), Ok(job)) = (ms.parse::<i64>(), serde_json::from_str::<Value>(job)) else {
            continue;
        };
        let id = job["id"].as_str().unwrap_or_default().to_string();
        assert_eq!(
            job["schedule"], "tick",
            "a fire's job names its schedule: {job}"
        );
        assert!(
            id.starts_with("default/reports/tick/"),
            "a fire's id is namespace/pool/schedule/fire time: {id}"
        );
        let run = out.entry(id.clone()).or_default();
        run.fire_ms = id
            .rsplit('/')
            .next()
            .and_then(|ms| ms.parse().ok())
            .unwrap_or(0);
        match kind {
            "start" => run.starts.push(ms),
            _ => run.end = Some(ms),
        }
    }
    out
}

/// Jobs whose fire time is in `[from, from + window)`.
fn fired_within(runs: &BTreeMap<String, Run>, from: i64, window: Duration) -> usize {
    let to = from + window.as_millis() as i64;
    runs.values()
        .filter(|r| r.fire_ms >= from && r.fire_ms < to)
        .count()
}

async fn first_fire(log: &Path) -> i64 {
    eventually(Duration::from_secs(60), "the first fire's job", || async {
        runs(log).values().map(|r| r.fire_ms).min()
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn an_allow_schedule_every_second_enqueues_a_job_about_once_a_second() {
    let redis = TestRedis::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("jobs.log");
    let schedule =
        "{name: tick, schedule: \"@every 1s\", concurrencyPolicy: Allow, job: {task: tick}}";
    // The claim of a schedule an earlier run of the pool had.
    let mut conn = redis.conn().await;
    let _: () = redis::cmd("HSET")
        .arg(&["sched:fires", "default/reports/gone", "5"])
        .query_async(&mut conn)
        .await
        .expect("hset");
    let local = Local::start(&redis, &manifest(schedule, 1, 2, "0", &log));
    let first = first_fire(&log).await;
    let claims: Vec<String> = redis::cmd("HKEYS")
        .arg("sched:fires")
        .query_async(&mut conn)
        .await
        .expect("hkeys");
    assert_eq!(
        claims,
        ["default/reports/tick"],
        "only the pool's schedules keep claims"
    );
    tokio::time::sleep(Duration::from_secs(6)).await;
    let seen = runs(&log);
    let n = fired_within(&seen, first, Duration::from_secs(4));
    assert!(
        (3..=5).contains(&n),
        "{n} fires in 4 s: {seen:?}\n{}",
        local.report()
    );
    for (id, run) in &seen {
        assert_eq!(run.starts.len(), 1, "{id} ran once: {seen:?}");
        assert_eq!(run.fire_ms % 1000, 0, "fires are on whole seconds: {id}");
    }
    // Allow: the jobs hold no key.
    let held: i64 = redis::cmd("HLEN")
        .arg("sched:unique")
        .query_async(&mut conn)
        .await
        .expect("hlen");
    assert_eq!(held, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_forbid_schedule_never_runs_two_of_its_jobs_at_once_and_says_it_skipped() {
    let redis = TestRedis::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("jobs.log");
    // Room for four jobs at once: only Forbid keeps them apart.
    let schedule = "{name: tick, schedule: \"@every 1s\", job: {task: tick}}";
    let local = Local::start(&redis, &manifest(schedule, 2, 2, "3", &log));
    first_fire(&log).await;
    eventually(Duration::from_secs(30), "three jobs done", || async {
        (runs(&log).values().filter(|r| r.end.is_some()).count() >= 3).then_some(())
    })
    .await;
    let seen = runs(&log);
    let mut spans: Vec<(i64, i64, &String)> = seen
        .iter()
        .filter_map(|(id, r)| Some((*r.starts.first()?, r.end.unwrap_or(i64::MAX), id)))
        .collect();
    spans.sort();
    for pair in spans.windows(2) {
        let ((_, end, a), (start, _, b)) = (pair[0], pair[1]);
        assert!(
            start >= end,
            "{b} started at {start}, before {a} ended at {end}: {seen:?}"
        );
    }
    assert!(
        local
            .lines()
            .iter()
            .any(|l| l.contains("schedule tick: skipped a fire: previous job still running")),
        "the skip is noted: {}",
        local.report()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn two_local_processes_on_one_pool_enqueue_each_fire_once() {
    let redis = TestRedis::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("jobs.log");
    let schedule =
        "{name: tick, schedule: \"@every 1s\", concurrencyPolicy: Allow, job: {task: tick}}";
    let text = manifest(schedule, 1, 2, "0", &log);
    let mut one = Local::start(&redis, &text);
    let two = Local::start(&redis, &text);
    let first = first_fire(&log).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let seen = runs(&log);
    let n = fired_within(&seen, first, Duration::from_secs(4));
    assert!(
        (3..=5).contains(&n),
        "{n} fires in 4 s with two processes: {seen:?}\n{}\n{}",
        one.report(),
        two.report()
    );

    // The other goes on alone: its fires were not all lost to the first.
    one.stop();
    let stopped = now_ms();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let seen = runs(&log);
    let after = fired_within(&seen, stopped + 1000, Duration::from_secs(4));
    assert!(
        (3..=5).contains(&after),
        "{after} fires in 4 s after one process stopped: {seen:?}\n{}",
        two.report()
    );
    let mut ids = HashSet::new();
    for (id, run) in &seen {
        assert_eq!(run.starts.len(), 1, "{id} ran once: {seen:?}");
        assert!(ids.insert(run.fire_ms), "one job per fire: {id}");
    }
}

/// The wall clock in unix ms.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[test]
fn a_bad_schedule_stops_local_mode_with_one_line_naming_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("pool.yaml");
    for (schedule, message) in [
        (
            "{name: nightly, schedule: \"61 2 * * *\"}",
            "spec.schedules[0] (nightly): schedule \"61 2 * * *\" cannot be used",
        ),
        (
            "{name: nightly, schedule: \"30 2 * * *\", timeZone: Mars/Olympus}",
            "spec.schedules[0] (nightly): timeZone \"Mars/Olympus\" is not an IANA time zone",
        ),
        (
            "{name: nightly, schedule: \"30 2 * *\"}",
            "schedule nightly: 30 2 * * is not a schedule",
        ),
    ] {
        std::fs::write(
            &path,
            manifest(schedule, 1, 1, "0", &dir.path().join("log")),
        )
        .expect("write manifest");
        let out = local_command(&path).output().expect("run local mode");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{schedule}: refused");
        assert!(stderr.contains(message), "{schedule}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    }
}
