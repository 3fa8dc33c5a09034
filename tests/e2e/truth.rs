//! What a pool says when things go wrong: the replica bounds held while the
//! queue cannot be read, a failing handler on the pool, and every step of a
//! scale-down as an event of its own.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};

use crate::E2e;
use crate::cluster::{Cluster, Namespace, eventually};
use crate::scenarios::{
    Pool, Redis, condition, deployment_at, event_reasons, is_ready, queue_reachable,
};

pub const ALL: &[crate::Scenario] = &[
    (
        "a_pool_whose_redis_cannot_be_read_holds_its_replica_bounds_and_says_so",
        a_pool_whose_redis_cannot_be_read_holds_its_replica_bounds_and_says_so,
    ),
    (
        "a_handler_that_fails_every_job_shows_on_the_pool_in_get_wp_and_in_events",
        a_handler_that_fails_every_job_shows_on_the_pool_in_get_wp_and_in_events,
    ),
    (
        "a_scale_down_in_steps_shows_every_step_as_its_own_event",
        a_scale_down_in_steps_shows_every_step_as_its_own_event,
    ),
    (
        "left_out_the_idle_hold_is_one_pod_start_up_after_a_lone_burst_and_says_so",
        left_out_the_idle_hold_is_one_pod_start_up_after_a_lone_burst_and_says_so,
    ),
];

/// A pool with no `idleSecondsBeforeZero` and no earlier idle spell: after a
/// lone burst it keeps its last worker one measured pod start-up, not 300 s,
/// and the event that takes it to zero says which hold and why.
fn left_out_the_idle_hold_is_one_pod_start_up_after_a_lone_burst_and_says_so(e2e: &E2e) {
    let k = &e2e.cluster;
    let ns = Namespace::create(k, "e2e-hold");
    let redis = Redis::start(k, &ns.name);
    let pool = Pool::new("mail", &redis).with(|spec| {
        if let Some(scaling) = spec["scaling"].as_object_mut() {
            scaling.remove("idleSecondsBeforeZero");
        }
    });
    k.apply(&ns.name, &pool.manifest());
    queue_reachable(k, &ns.name, "mail", Duration::from_secs(30));
    let ids: Vec<String> = (0..5).map(|i| format!("job-{i}")).collect();
    redis.push("mail", &ids, 300);
    every_job_done(&redis, ids.len());
    let done_at = std::time::Instant::now();
    // Well inside KEDA's 300 s: one start-up (a few seconds here) and a poll.
    deployment_at(k, &ns.name, "mail", 0, Duration::from_secs(120));
    let idle = done_at.elapsed();
    let wp = k.get(&["wp", "-n", &ns.name, "mail"]).expect("the pool");
    let startup = wp["status"]["podStartupSeconds"]
        .as_f64()
        .expect("a measured start-up");
    let steps = scale_events_to_zero(k, &ns.name, "mail");
    // "scaled down from 1 to 0: idle for 4 s (one pod start-up: ...)"
    let note = &steps.last().expect("a last step").3;
    assert!(note.contains(" s (one pod start-up"), "{note}");
    let held: f64 = note
        .split("idle for ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no hold in {note}"));
    // The hold is the start-up the engine measured (the status shows it to
    // a tenth of a second), rounded up to a whole second.
    assert!(
        held >= startup.floor() && held <= startup.ceil() + 1.0 && held < 300.0,
        "a hold of {held} s for a start-up of {startup} s: {note}"
    );
    assert!(
        idle < Duration::from_secs(100),
        "back at zero {idle:?} after the last job, with a start-up of {startup} s"
    );
    eprintln!("  back at zero {idle:.1?} after the last job (pods ready in {startup} s)");
}

/// Waits until `jobs` jobs have run.
fn every_job_done(redis: &Redis, jobs: usize) {
    eventually(Duration::from_secs(120), "every job done", |last| {
        let done = redis.done();
        *last = format!("{} of {jobs} done", done.len());
        (done.len() >= jobs).then_some(())
    });
}

/// The pool's scale events, once the last of them took it to zero.
fn scale_events_to_zero(
    k: &Cluster,
    namespace: &str,
    name: &str,
) -> Vec<(String, i64, i64, String)> {
    eventually(Duration::from_secs(30), "the scale events", |last| {
        let steps = scale_events(k, namespace, name);
        *last = format!("{steps:?}");
        (steps.last().map(|s| s.2) == Some(0)).then_some(steps)
    })
}

/// The `STATUS` column of `kubectl get wp NAME`, as a user reads it.
fn status_column(k: &Cluster, namespace: &str, name: &str) -> String {
    let table = k.kubectl(&["get", "wp", "-n", namespace, name]);
    let mut lines = table.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let row: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    header
        .iter()
        .position(|h| *h == "STATUS")
        .and_then(|at| row.get(at))
        .map_or_else(|| table.clone(), |s| s.to_string())
}

/// The pool's condition `type_` (the whole object).
fn condition_object(wp: &Value, type_: &str) -> Value {
    wp["status"]["conditions"]
        .as_array()
        .and_then(|all| all.iter().find(|c| c["type"] == type_))
        .cloned()
        .unwrap_or_default()
}

fn a_pool_whose_redis_cannot_be_read_holds_its_replica_bounds_and_says_so(e2e: &E2e) {
    let k = &e2e.cluster;
    let ns = Namespace::create(k, "e2e-unreachable");
    // Nothing listens there: every read is refused.
    let url = "redis://127.0.0.1:1/0";
    let pool = Pool::at("mail", url, "127.0.0.1").with(|spec| {
        spec["scaling"]["minReplicas"] = 2.into();
        spec["scaling"]["maxReplicas"] = 3.into();
    });
    k.apply(&ns.name, &pool.manifest());

    // minReplicas holds although the queue was never read.
    deployment_at(k, &ns.name, "mail", 2, Duration::from_secs(60));
    let wp = eventually(Duration::from_secs(30), "Ready=False", |last| {
        let wp = k.get(&["wp", "-n", &ns.name, "mail"])?;
        *last = wp["status"].to_string();
        (condition_object(&wp, "Ready")["reason"] == "RedisUnreachable").then_some(wp)
    });
    assert_eq!(condition(&wp, "Ready"), Some("False"), "{}", wp["status"]);
    assert_eq!(condition(&wp, "QueueReachable"), Some("False"));
    let reachable = condition_object(&wp, "QueueReachable");
    assert!(
        reachable["message"]
            .as_str()
            .unwrap_or_default()
            .contains("127.0.0.1:1"),
        "the message names the endpoint: {reachable}"
    );
    assert_eq!(status_column(k, &ns.name, "mail"), "RedisUnreachable");
    eventually(
        Duration::from_secs(30),
        "a RedisUnreachable event",
        |last| {
            let reasons = event_reasons(k, &ns.name, "mail");
            *last = format!("{reasons:?}");
            reasons.contains("RedisUnreachable").then_some(())
        },
    );
    // The workers run but do not say they are ready: they cannot take jobs.
    let pods = eventually(Duration::from_secs(60), "two Running workers", |last| {
        let pods = k.get(&["pods", "-n", &ns.name, "-l", "workerpool.dev/pool=mail"])?;
        let items = pods["items"].as_array()?.clone();
        *last = format!("{pods}");
        let running = items
            .iter()
            .filter(|p| p["status"]["phase"] == "Running")
            .count();
        (running == 2).then_some(items)
    });
    std::thread::sleep(Duration::from_secs(3));
    for pod in &pods {
        let name = pod["metadata"]["name"].as_str().unwrap_or_default();
        let now = k
            .get(&["pod", "-n", &ns.name, name])
            .expect("the worker Pod");
        assert!(
            !is_ready(&now),
            "a worker without Redis is not ready: {now}"
        );
    }

    // maxReplicas lowered while the queue still cannot be read: it holds.
    k.kubectl(&[
        "patch",
        "wp",
        "mail",
        "-n",
        &ns.name,
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"scaling":{"minReplicas":1,"maxReplicas":1}}}"#,
    ]);
    eventually(
        Duration::from_secs(30),
        "the Deployment at the new maxReplicas",
        |last| {
            let d = k.get(&["deployment", "-n", &ns.name, "mail"])?;
            let wp = k.get(&["wp", "-n", &ns.name, "mail"])?;
            *last = format!("{} / {}", d["spec"], wp["status"]);
            (d["spec"]["replicas"] == 1 && wp["status"]["desiredReplicas"] == 1).then_some(())
        },
    );
    assert_eq!(status_column(k, &ns.name, "mail"), "RedisUnreachable");
}

/// A handler that says why on stderr and exits on every job.
const CRASHING: &str = r#"
import sys
for line in sys.stdin:
    print("boom: the mail server refused the connection", file=sys.stderr, flush=True)
    sys.exit(3)
"#;

fn a_handler_that_fails_every_job_shows_on_the_pool_in_get_wp_and_in_events(e2e: &E2e) {
    let k = &e2e.cluster;
    let ns = Namespace::create(k, "e2e-failing");
    let redis = Redis::start(k, &ns.name);
    let pool = Pool::new("mail", &redis).manual(1).with(|spec| {
        spec["template"]["spec"]["containers"][0]["args"] =
            json!(["--", "python3", "-c", CRASHING]);
        spec["worker"]["maxAttempts"] = 1.into();
    });
    k.apply(&ns.name, &pool.manifest());
    let ids: Vec<String> = (0..6).map(|i| format!("job-{i}")).collect();
    redis.push("mail", &ids, 0);

    // The first jobs die with the handler's own words in their dead letters.
    let dead = eventually(Duration::from_secs(90), "dead letters", |last| {
        let dead = redis.cli(&["LRANGE", "mail:dead", "0", "-1"]);
        *last = dead.clone();
        (!dead.trim().is_empty()).then_some(dead)
    });
    let letter: Value = serde_json::from_str(dead.lines().next().unwrap_or_default())
        .unwrap_or_else(|e| panic!("a dead letter is JSON ({e}): {dead}"));
    let error = letter["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("boom: the mail server refused the connection"),
        "the dead letter keeps the handler's stderr: {letter}"
    );

    // The pool says so, where people look.
    let wp = eventually(
        Duration::from_secs(90),
        "Ready=False HandlerFailing",
        |last| {
            let wp = k.get(&["wp", "-n", &ns.name, "mail"])?;
            *last = wp["status"].to_string();
            (condition_object(&wp, "Ready")["reason"] == "HandlerFailing").then_some(wp)
        },
    );
    let ready = condition_object(&wp, "Ready");
    assert!(
        ready["message"]
            .as_str()
            .unwrap_or_default()
            .contains("boom: the mail server refused the connection"),
        "Ready carries the handler's words: {ready}"
    );
    assert_eq!(
        condition(&wp, "JobsFailing"),
        Some("True"),
        "{}",
        wp["status"]
    );
    assert_eq!(status_column(k, &ns.name, "mail"), "HandlerFailing");
    eventually(Duration::from_secs(30), "the Warning events", |last| {
        let reasons = event_reasons(k, &ns.name, "mail");
        *last = format!("{reasons:?}");
        (reasons.contains("HandlerFailing") && reasons.contains("JobsFailing")).then_some(())
    });
    let pods = k
        .get(&["pods", "-n", &ns.name, "-l", "workerpool.dev/pool=mail"])
        .expect("the worker Pod");
    let items = pods["items"].as_array().cloned().unwrap_or_default();
    assert!(
        !items.is_empty() && items.iter().all(|p| !is_ready(p)),
        "a worker whose handler cannot run is not ready: {pods}"
    );

    // A broken handler stops eating the queue: past the first failures the
    // jobs go back uncounted, and none is lost.
    let count = |args: &[&str]| -> usize { redis.cli(args).trim().parse().unwrap_or(0) };
    let dead = count(&["LLEN", "mail:dead"]);
    assert!(
        dead <= 2,
        "{dead} dead letters: the handler's failures to start were charged to the jobs"
    );
    assert_eq!(
        redis.jobs_anywhere("mail"),
        ids.len(),
        "every job is somewhere"
    );
}

fn a_scale_down_in_steps_shows_every_step_as_its_own_event(e2e: &E2e) {
    let k = &e2e.cluster;
    let ns = Namespace::create(k, "e2e-steps");
    let redis = Redis::start(k, &ns.name);
    // At most one pod removed per 4 s, counted as the HPA counts it: from
    // the replicas at the start of the period (a scale-up within the
    // period counts too).
    let pool = Pool::new("mail", &redis)
        .max(3)
        .per_replica(10)
        .concurrency(2)
        .with(|spec| {
            spec["scaling"]["behavior"]["scaleDown"] = json!({
                "stabilizationWindowSeconds": 0,
                "policies": [{"type": "Pods", "value": 1, "periodSeconds": 4}],
            });
            // Longer than the policy takes from 3 (maxReplicas) to 1 (two
            // steps of 4 s, and a poll): whenever the last job ends, at
            // whatever size the pool then has, it is down to its last
            // replica before it has been idle long enough to go to zero.
            // Going to zero is not a scale-down step: it is taken at once,
            // from any size.
            spec["scaling"]["idleSecondsBeforeZero"] = 20.into();
        });
    k.apply(&ns.name, &pool.manifest());
    queue_reachable(k, &ns.name, "mail", Duration::from_secs(30));
    // Jobs long enough to be worth more than one pod (the engine starts
    // only the pods that will find work when they are ready): 2 s each.
    let ids: Vec<String> = (0..30).map(|i| format!("job-{i}")).collect();
    redis.push("mail", &ids, 2_000);
    eventually(
        Duration::from_secs(60),
        "the pool past one worker",
        |last| {
            let d = k.get(&["deployment", "-n", &ns.name, "mail"])?;
            *last = d["spec"].to_string();
            (d["spec"]["replicas"].as_i64() >= Some(2)).then_some(())
        },
    );
    every_job_done(&redis, ids.len());
    deployment_at(k, &ns.name, "mail", 0, Duration::from_secs(90));

    // Every step, in order, with its numbers and its reason.
    let steps = scale_events_to_zero(k, &ns.name, "mail");
    let mut at = 0;
    for (reason, from, to, note) in &steps {
        assert_eq!(*from, at, "no step is missing: {steps:#?}");
        assert_eq!(
            reason,
            if to > from { "ScaledUp" } else { "ScaledDown" },
            "{steps:#?}"
        );
        assert!(note.contains(": "), "each step says why: {note}");
        at = *to;
    }
    let downs: Vec<(i64, i64)> = steps
        .iter()
        .filter(|s| s.0 == "ScaledDown")
        .map(|s| (s.1, s.2))
        .collect();
    assert_eq!(downs.last(), Some(&(1, 0)), "{steps:#?}");
    // Down in steps: the backlog target, then the last replica kept until
    // the pool has been idle long enough, then zero.
    assert!(downs.len() >= 2, "a scale-down in steps: {steps:#?}");
    let to_zero = &steps.last().expect("a last step").3;
    assert!(to_zero.contains("scaling to zero"), "{to_zero}");
    // `kubectl describe` shows each of them.
    let described = k.kubectl(&["describe", "wp", "-n", &ns.name, "mail"]);
    for (_, from, to, _) in &steps {
        let line = format!("from {from} to {to}");
        assert!(described.contains(&line), "{line} in:\n{described}");
    }
}

/// The pool's `ScaledUp` and `ScaledDown` events in the order they
/// happened: reason, from, to, note.
fn scale_events(k: &Cluster, namespace: &str, name: &str) -> Vec<(String, i64, i64, String)> {
    let Some(list) = k.get(&["events.v1.events.k8s.io", "-n", namespace]) else {
        return Vec::new();
    };
    let mut timed: BTreeMap<(String, usize), (String, i64, i64, String)> = BTreeMap::new();
    for (n, e) in list["items"].as_array().into_iter().flatten().enumerate() {
        let reason = e["reason"].as_str().unwrap_or_default();
        if e["regarding"]["name"] != name || e["regarding"]["kind"] != "WorkerPool" {
            continue;
        }
        if reason != "ScaledUp" && reason != "ScaledDown" {
            continue;
        }
        let note = e["note"].as_str().unwrap_or_default().to_string();
        // "scaled down from 3 to 2: ..."
        let numbers: Vec<i64> = note
            .split(':')
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        let [from, to] = numbers[..] else { continue };
        let time = e["eventTime"].as_str().unwrap_or_default().to_string();
        timed.insert((time, n), (reason.to_string(), from, to, note));
    }
    timed.into_values().collect()
}
