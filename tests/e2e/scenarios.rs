//! The scenarios, in the order they run. The first installs the operator
//! with helm; the others run pools on it, each in its own namespace with
//! its own Redis.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::E2e;
use crate::cluster::{Cluster, Namespace, eventually};

/// The tag `scripts/images.sh` gives the images for this run.
pub const IMAGE_TAG: &str = "e2e";
const OPERATOR_NAMESPACE: &str = "workerpool-system";
const RELEASE: &str = "workerpool-operator";
/// The cluster's Debian image with redis-server (the one-node kit's base image).
pub fn redis_image() -> String {
    std::env::var("WORKERPOOL_E2E_REDIS_IMAGE").unwrap_or_else(|_| "local/debian:12".into())
}
pub fn worker_image() -> String {
    format!("local/workerpool-worker:{IMAGE_TAG}")
}

/// The scenario that installs the operator; the others need it.
pub const INSTALL: &str = "helm_install_runs_the_operator_which_holds_the_lease_and_serves_metrics";

pub const ALL: &[crate::Scenario] = &[
    (
        INSTALL,
        helm_install_runs_the_operator_which_holds_the_lease_and_serves_metrics,
    ),
    (
        "a_backlog_wakes_a_pool_from_zero_every_job_runs_and_the_pool_returns_to_zero",
        a_backlog_wakes_a_pool_from_zero_every_job_runs_and_the_pool_returns_to_zero,
    ),
    (
        "a_deleted_busy_worker_finishes_its_jobs_within_the_grace_period",
        a_deleted_busy_worker_finishes_its_jobs_within_the_grace_period,
    ),
    (
        "a_job_longer_than_the_grace_period_goes_back_to_the_queue_and_runs_elsewhere",
        a_job_longer_than_the_grace_period_goes_back_to_the_queue_and_runs_elsewhere,
    ),
    (
        "a_killed_worker_container_takes_back_its_jobs_at_its_restart_not_after_dead_after",
        a_killed_worker_container_takes_back_its_jobs_at_its_restart_not_after_dead_after,
    ),
    (
        "a_scale_down_removes_the_idle_workers_and_the_busy_one_finishes",
        a_scale_down_removes_the_idle_workers_and_the_busy_one_finishes,
    ),
    (
        "a_missing_secret_shows_in_conditions_and_an_event_and_the_pool_recovers_once_it_exists",
        a_missing_secret_shows_in_conditions_and_an_event_and_the_pool_recovers_once_it_exists,
    ),
    (
        "a_spec_refused_by_cel_names_the_field_to_fix",
        a_spec_refused_by_cel_names_the_field_to_fix,
    ),
    (
        "kubectl_scale_drives_a_manual_pool_and_deleting_the_pool_removes_its_deployment",
        kubectl_scale_drives_a_manual_pool_and_deleting_the_pool_removes_its_deployment,
    ),
    (
        "the_video_platform_example_scales_both_pools_on_their_queues",
        the_video_platform_example_scales_both_pools_on_their_queues,
    ),
    (
        "a_schedule_fires_once_per_fire_time_and_wakes_its_pool_from_zero",
        a_schedule_fires_once_per_fire_time_and_wakes_its_pool_from_zero,
    ),
    (
        "a_restarted_operator_does_not_shrink_a_busy_pool",
        a_restarted_operator_does_not_shrink_a_busy_pool,
    ),
    (
        "with_two_operators_one_leads_and_the_other_takes_over_when_it_goes",
        with_two_operators_one_leads_and_the_other_takes_over_when_it_goes,
    ),
];

fn helm_install_runs_the_operator_which_holds_the_lease_and_serves_metrics(e2e: &E2e) {
    let k = &e2e.cluster;
    // A leftover release of an interrupted run goes first.
    let _ = k.helm(&[
        "uninstall",
        RELEASE,
        "-n",
        OPERATOR_NAMESPACE,
        "--ignore-not-found",
    ]);
    let tag = format!("image.tag={IMAGE_TAG}");
    k.helm(&[
        "install",
        RELEASE,
        "charts/workerpool-operator",
        "--namespace",
        OPERATOR_NAMESPACE,
        "--create-namespace",
        "--set",
        "image.repository=local/workerpool-operator",
        "--set",
        &tag,
        "--set",
        "image.pullPolicy=Never",
        // Each reconcile is logged, for the logs a failed scenario prints.
        "--set",
        "logLevel=info\\,workerpool_operator=debug",
    ])
    .unwrap_or_else(|e| panic!("{e}"));

    let pod = eventually(Duration::from_secs(120), "a Ready operator Pod", |last| {
        let pods = k.get(&[
            "pods",
            "-n",
            OPERATOR_NAMESPACE,
            "-l",
            "app.kubernetes.io/name=workerpool-operator",
        ])?;
        *last = summary_of_pods(&pods);
        ready_pods(&pods).into_iter().next()
    });

    // The chart's RBAC lets it take the Lease...
    eventually(
        Duration::from_secs(60),
        "the operator Pod to hold the Lease",
        |last| {
            let lease = k.get(&["lease", "-n", OPERATOR_NAMESPACE, RELEASE])?;
            let holder = lease["spec"]["holderIdentity"].as_str()?;
            *last = holder.to_string();
            (holder == pod).then_some(())
        },
    );

    // ... and its Service serves /metrics (the pool scenarios read it).
    metrics(k);
    // It has run without a restart.
    let json = k
        .get(&["pod", "-n", OPERATOR_NAMESPACE, &pod])
        .expect("the operator Pod");
    assert_eq!(json["status"]["containerStatuses"][0]["restartCount"], 0);
}

/// The operator's /metrics, through its Service.
pub fn metrics(k: &Cluster) -> String {
    let path = format!(
        "/api/v1/namespaces/{OPERATOR_NAMESPACE}/services/{RELEASE}-metrics:8080/proxy/metrics"
    );
    eventually(
        Duration::from_secs(30),
        "/metrics through the Service",
        |last| {
            k.try_kubectl(&["get", "--raw", &path])
                .map_err(|e| *last = e)
                .ok()
        },
    )
}

/// Uninstalls the operator and removes the CRD (helm leaves CRDs behind).
pub fn uninstall(e2e: &E2e) {
    let k = &e2e.cluster;
    let _ = k.helm(&[
        "uninstall",
        RELEASE,
        "-n",
        OPERATOR_NAMESPACE,
        "--ignore-not-found",
    ]);
    let _ = k.try_kubectl(&[
        "delete",
        "namespace",
        OPERATOR_NAMESPACE,
        "--ignore-not-found",
        "--timeout=120s",
    ]);
    let _ = k.try_kubectl(&[
        "delete",
        "crd",
        "workerpools.workerpool.dev",
        "--ignore-not-found",
    ]);
}

fn a_backlog_wakes_a_pool_from_zero_every_job_runs_and_the_pool_returns_to_zero(e2e: &E2e) {
    let k = &e2e.cluster;
    let ns = Namespace::create(k, "e2e-wake");
    let redis = Redis::start(k, &ns.name);
    let pool = Pool::new("mail", &redis)
        .max(3)
        .per_replica(10)
        .concurrency(2);
    k.apply(&ns.name, &pool.manifest());

    // The operator creates the Deployment (server-side apply of a new
    // object: the 403 this suite was written for), at zero replicas.
    deployment_at(k, &ns.name, "mail", 0, Duration::from_secs(30));
    let status = queue_reachable(k, &ns.name, "mail", Duration::from_secs(30));
    assert_eq!(status["replicas"], 0, "{status}");

    // Idle at zero, the pool is looked at every second, but a look that
    // changes nothing writes nothing: no apply of the Deployment, no status
    // patch; and it reads the Deployment from the operator's watch, not
    // with a GET (the API server's own request counters say so).
    eventually(
        Duration::from_secs(30),
        "a 4 s window without writes or Deployment reads for the idle pool",
        |last| {
            let before = operator_requests(k);
            std::thread::sleep(Duration::from_secs(4));
            let after = operator_requests(k);
            let sent = (after.0 - before.0, after.1 - before.1, after.2 - before.2);
            *last = format!(
                "{} Deployment applies, {} status patches, {} Deployment GETs",
                sent.0, sent.1, sent.2
            );
            (sent.0 <= 1.0 && sent.1 <= 1.0 && sent.2 <= 1.0).then_some(())
        },
    );

    let ids: Vec<String> = (0..30).map(|i| format!("job-{i}")).collect();
    let started = Instant::now();
    redis.push("mail", &ids, 500);

    // A backlog of 30 at 10 per worker: three workers, Ready through /readyz.
    let mut peak = 0;
    eventually(Duration::from_secs(90), "three Ready workers", |last| {
        let d = k.get(&["deployment", "-n", &ns.name, "mail"])?;
        let ready = d["status"]["readyReplicas"].as_i64().unwrap_or(0);
        peak = peak.max(ready);
        *last = d["status"].to_string();
        (ready == 3 || redis.done().len() == ids.len()).then_some(())
    });
    let done = eventually(Duration::from_secs(120), "every job done", |last| {
        let done = redis.done();
        *last = format!("{} of {} done", done.len(), ids.len());
        (done.len() >= ids.len()).then_some(done)
    });
    let ran: BTreeSet<&str> = done.keys().map(String::as_str).collect();
    let wanted: BTreeSet<&str> = ids.iter().map(String::as_str).collect();
    assert_eq!(ran, wanted, "every job ran");
    let workers: BTreeSet<&String> = done.values().flatten().collect();
    assert!(
        workers.len() > 1,
        "the jobs spread over several workers: {workers:?}"
    );
    assert_eq!(redis.cli(&["LLEN", "mail:dead"]).trim(), "0");
    let text = metrics(k);
    assert!(
        text.contains(r#"workerpool_pool_desired_replicas{namespace="e2e-wake",pool="mail"}"#),
        "{text}"
    );
    eprintln!(
        "  {} jobs on {} workers (peak {peak} ready) in {:.1?}",
        ids.len(),
        workers.len(),
        started.elapsed()
    );

    // Idle for idleSecondsBeforeZero: back to zero, every worker Pod gone.
    eventually(Duration::from_secs(90), "the pool back at zero", |last| {
        let d = k.get(&["deployment", "-n", &ns.name, "mail"])?;
        let pods = k.get(&["pods", "-n", &ns.name, "-l", "workerpool.dev/pool=mail"])?;
        let left = pods["items"].as_array().map_or(0, Vec::len);
        *last = format!("spec {} pods {left}", d["spec"]["replicas"]);
        (d["spec"]["replicas"] == 0 && left == 0).then_some(())
    });

    // The story, as a user reads it.
    let wp = eventually(Duration::from_secs(30), "status at zero", |last| {
        let wp = k.get(&["wp", "-n", &ns.name, "mail"])?;
        *last = wp["status"].to_string();
        (wp["status"]["replicas"] == 0 && wp["status"]["desiredReplicas"] == 0).then_some(wp)
    });
    assert_eq!(condition(&wp, "QueueReachable"), Some("True"));
    assert_eq!(
        wp["status"]["observedGeneration"], wp["metadata"]["generation"],
        "{}",
        wp["status"]
    );
    assert_eq!(wp["status"]["selector"], "workerpool.dev/pool=mail");
    // The wake's pods were timed from the scale-up to Ready, and the time is
    // kept at zero, for the next operator that leads.
    let startup = wp["status"]["podStartupSeconds"].as_f64();
    assert!(
        startup.is_some_and(|s| s > 0.0 && s < 90.0),
        "{}",
        wp["status"]
    );
    eprintln!(
        "  pods ready {:.1} s after the scale-up",
        startup.unwrap_or(0.0)
    );
    let reasons = event_reasons(k, &ns.name, "mail");
    for reason in ["ScaledUp", "ScaledDown"] {
        assert!(reasons.contains(reason), "no {reason} event: {reasons:?}");
    }
    // `kubectl get wp -o wide`: the CRD's printer columns, with the pool's
    // numbers at zero.
    let crd = k
        .get(&["crd", "workerpools.workerpool.dev"])
        .expect("the WorkerPool CRD");
    let columns: Vec<String> = std::iter::once("NAME".to_string())
        .chain(
            crd["spec"]["versions"][0]["additionalPrinterColumns"]
                .as_array()
                .expect("printer columns")
                .iter()
                .filter_map(|c| c["name"].as_str().map(str::to_uppercase)),
        )
        .collect();
    let table = k.kubectl(&["get", "wp", "-n", &ns.name, "-o", "wide"]);
    let mut lines = table.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(header, columns, "{table}");
    let row: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    for column in ["BACKLOG", "IN-FLIGHT", "DESIRED", "READY"] {
        let at = header.iter().position(|h| *h == column).expect("a column");
        assert_eq!(row.get(at), Some(&"0"), "{column} in {table}");
    }
}

/// The API server's count of Deployment applies, WorkerPool status patches
/// and Deployment GETs so far (`apiserver_request_total`).
fn operator_requests(k: &Cluster) -> (f64, f64, f64) {
    let text = k.kubectl(&["get", "--raw", "/metrics"]);
    let count = |labels: &[&str]| -> f64 {
        text.lines()
            .filter(|l| l.starts_with("apiserver_request_total{"))
            .filter(|l| labels.iter().all(|label| l.contains(label)))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    (
        count(&[r#"resource="deployments""#, r#"verb="APPLY""#]),
        count(&[
            r#"resource="workerpools""#,
            r#"subresource="status""#,
            r#"verb="PATCH""#,
        ]),
        count(&[r#"resource="deployments""#, r#"verb="GET""#]),
    )
}

/// Waits for `n` Ready worker Pods of a pool; returns their names.
pub fn ready_workers(k: &Cluster, namespace: &str, pool: &str, n: usize) -> Vec<String> {
    let selector = format!("workerpool.dev/pool={pool}");
    eventually(
        Duration::from_secs(90),
        &format!("{n} Ready workers"),
        |last| {
            let pods = k.get(&["pods", "-n", namespace, "-l", &selector])?;
            *last = summary_of_pods(&pods);
            let ready = ready_pods(&pods);
            (ready.len() == n).then_some(ready)
        },
    )
}

/// Deletes a Pod as `kubectl delete pod` does (graceful, waiting for it to
/// be gone) while watching it; returns how long that took and how its
/// worker container ended: exit code 0 when the worker stopped by itself,
/// 137 when the kubelet had to SIGKILL it at the end of the grace period.
fn delete_pod(k: &Cluster, namespace: &str, pod: &str) -> (Duration, Option<i64>) {
    let mut watch = k.spawn_kubectl(&[
        "get",
        "pod",
        "-n",
        namespace,
        pod,
        "-w",
        "-o",
        "json",
        "--output-watch-events",
    ]);
    let stdout = watch.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let events = serde_json::Deserializer::from_reader(std::io::BufReader::new(stdout));
        for event in events.into_iter::<Value>().map_while(Result::ok) {
            let exit = event["object"]["status"]["containerStatuses"]
                .as_array()
                .and_then(|all| all.iter().find(|c| c["name"] == "worker"))
                .and_then(|c| c["state"]["terminated"]["exitCode"].as_i64());
            if event["type"] == "DELETED" {
                let _ = tx.send(exit);
                return;
            }
        }
    });
    let t = Instant::now();
    k.kubectl(&[
        "delete",
        "pod",
        "-n",
        namespace,
        pod,
        "--wait=true",
        "--timeout=120s",
    ]);
    let took = t.elapsed();
    let exit = rx.recv_timeout(Duration::from_secs(10)).ok().flatten();
    let _ = watch.kill();
    let _ = watch.wait();
    (took, exit)
}

/// Checks that every job ran exactly once and nothing is left anywhere.
fn every_job_ran_once(redis: &Redis, queue: &str, ids: &[String]) -> BTreeMap<String, Vec<String>> {
    let done = eventually(Duration::from_secs(120), "every job done", |last| {
        let done = redis.done();
        *last = format!("{done:?}");
        (done.len() >= ids.len()).then_some(done)
    });
    let ran: BTreeSet<&str> = done.keys().map(String::as_str).collect();
    let wanted: BTreeSet<&str> = ids.iter().map(String::as_str).collect();
    assert_eq!(ran, wanted, "every job ran");
    for (id, workers) in &done {
        assert_eq!(workers.len(), 1, "{id} ran more than once: {workers:?}");
    }
    for key in [
        queue.to_string(),
        format!("{queue}:dead"),
        format!("{queue}:retry"),
    ] {
        let len = redis.cli(&["EXISTS", &key]);
        assert_eq!(len.trim(), "0", "{key} is not empty");
    }
    done
}

fn a_deleted_busy_worker_finishes_its_jobs_within_the_grace_period(e2e: &E2e) {
    let k = &e2e.cluster;
    let ns = Namespace::create(k, "e2e-delete");
    let redis = Redis::start(k, &ns.name);
    // Two workers of two slots; 10 s of grace, so 7.5 s for running jobs.
    let pool = Pool::new("mail", &redis).manual(2).concurrency(2).grace(10);
    k.apply(&ns.name, &pool.manifest());
    ready_workers(k, &ns.name, "mail", 2);

    let ids: Vec<String> = (0..4).map(|i| format!("job-{i}")).collect();
    redis.push("mail", &ids, 4000);
    let holding = eventually(Duration::from_secs(30), "both workers busy", |last| {
        let holding = redis.holding("mail");
        *last = format!("{holding:?}");
        (holding.len() == 2 && holding.values().all(|jobs| jobs.len() == 2)).then_some(holding)
    });
    let (victim, its_jobs) = holding.iter().next().expect("a busy worker");

    // SIGTERM mid-job: the worker stops taking jobs, finishes its two and
    // exits on its own, well before the kubelet would SIGKILL it.
    let (took, exit) = delete_pod(k, &ns.name, victim);
    assert_eq!(exit, Some(0), "the worker exited by itself, not SIGKILLed");
    let done = every_job_ran_once(&redis, "mail", &ids);
    for id in its_jobs {
        assert_eq!(
            done[id].as_slice(),
            std::slice::from_ref(victim),
            "{id} finished on the deleted worker"
        );
    }
    eprintln!("  deleted {victim} with 2 jobs running: gone in {took:.1?}, both finished there");
}

fn a_job_longer_than_the_grace_period_goes_back_to_the_queue_and_runs_elsewhere(e2e: &E2e) {
    let k = &e2e.cluster;
    let ns = Namespace::create(k, "e2e-long");
    let redis = Redis::start(k, &ns.name);
    // 8 s of grace: the worker returns what is still running after 6 s.
    let pool = Pool::new("mail", &redis).manual(2).grace(8);
    k.apply(&ns.name, &pool.manifest());
    ready_workers(k, &ns.name, "mail", 2);

    let ids = vec!["long".to_string()];
    redis.push("mail", &ids, 12_000);
    let holding = eventually(
        Duration::from_secs(30),
        "a worker running the job",
        |last| {
            let holding = redis.holding("mail");
            *last = format!("{holding:?}");
            (holding.len() == 1).then_some(holding)
        },
    );
    let first = holding.keys().next().expect("a busy worker").clone();
    let (took, exit) = delete_pod(k, &ns.name, &first);
    // The worker returned the job and exited by itself: no SIGKILL.
    assert_eq!(exit, Some(0), "the worker exited by itself, not SIGKILLed");
    let done = every_job_ran_once(&redis, "mail", &ids);
    let ran_on = &done["long"][0];
    assert_ne!(ran_on, &first, "the job ran again on another worker");
    eprintln!("  {first} returned the job after {took:.1?}; {ran_on} ran it");
}

/// SIGKILLs the worker process of a Pod's worker container, as the
/// kernel's out-of-memory killer would: the container ends (its PID 1,
/// tini, exits with the worker's status) and the kubelet restarts it in
/// the same Pod.
fn kill_worker_process(k: &Cluster, namespace: &str, pod: &str) {
    const KILL: &str = r#"
import os, signal
for p in filter(str.isdigit, os.listdir("/proc")):
    try:
        argv0 = open("/proc/%s/cmdline" % p, "rb").read().split(b"\0")[0]
    except OSError:
        continue
    if argv0.endswith(b"/workerpool-worker"):
        os.kill(int(p), signal.SIGKILL)
"#;
    let killed = k.try_kubectl(&[
        "exec", "-n", namespace, pod, "-c", "worker", "--", "python3", "-c", KILL,
    ]);
    // The container may end before this process does, taking it along.
    if let Err(e) = killed
        && !e.contains("exit code 137")
    {
        panic!("{e}");
    }
}

fn a_killed_worker_container_takes_back_its_jobs_at_its_restart_not_after_dead_after(e2e: &E2e) {
    let k = &e2e.cluster;
    let ns = Namespace::create(k, "e2e-crash");
    let redis = Redis::start(k, &ns.name);
    // One worker of four slots, declaring a minute before it counts as
    // lost: jobs back within half of that were not returned by waiting for
    // its heartbeat to go stale.
    let dead_after = Duration::from_secs(60);
    let pool = Pool::new("mail", &redis)
        .manual(1)
        .concurrency(4)
        .with(|spec| {
            spec["template"]["spec"]["containers"][0]["env"]
                .as_array_mut()
                .expect("env")
                .push(json!({"name": "WORKERPOOL_DEAD_AFTER", "value": "60s"}));
        });
    k.apply(&ns.name, &pool.manifest());
    let pod = ready_workers(k, &ns.name, "mail", 1).remove(0);

    let ids: Vec<String> = (0..12).map(|i| format!("job-{i}")).collect();
    redis.push("mail", &ids, 3000);
    let holding = eventually(Duration::from_secs(30), "the worker busy", |last| {
        let holding = redis.holding("mail");
        *last = format!("{holding:?}");
        (holding.get(&pod).map(Vec::len) == Some(4)).then_some(holding)
    });
    let killed_with = holding[&pod].clone();
    kill_worker_process(k, &ns.name, &pod);
    let killed = Instant::now();

    let restarted = eventually(Duration::from_secs(60), "the container restarted", |last| {
        let p = k.get(&["pod", "-n", &ns.name, &pod])?;
        let worker = p["status"]["containerStatuses"]
            .as_array()?
            .iter()
            .find(|c| c["name"] == "worker")?
            .clone();
        *last = worker.to_string();
        (worker["restartCount"] == 1 && worker["state"]["running"].is_object()).then_some(worker)
    });
    let restart_took = killed.elapsed();
    assert_eq!(
        restarted["lastState"]["terminated"]["exitCode"],
        json!(137),
        "the container ended with the SIGKILLed worker: {restarted}"
    );

    let done = eventually(Duration::from_secs(120), "every job done", |last| {
        let done = redis.done();
        *last = format!("{} of {}: {done:?}", done.len(), ids.len());
        (done.len() == ids.len()).then_some(done)
    });
    let took = killed.elapsed();
    assert!(
        took < dead_after / 2,
        "the 12 jobs took {took:.1?} after the kill: the restarted container waited for its \
         previous run's heartbeat ({dead_after:?}) instead of taking back its jobs"
    );
    // At least once: only a job in hand at the kill may have run twice.
    for (id, ran_on) in &done {
        assert!(
            ran_on.len() == 1 || killed_with.contains(id),
            "{id} ran more than once: {ran_on:?}"
        );
        assert!(ran_on.iter().all(|p| *p == pod), "{id}: {ran_on:?}");
    }
    assert_eq!(
        redis.cli(&["GET", "mail:stats:recovered"]).trim(),
        "4",
        "the four jobs in hand at the kill were returned"
    );
    // The last acknowledgements follow the handler's records closely.
    eventually(Duration::from_secs(10), "nothing left anywhere", |last| {
        let left = redis.jobs_anywhere("mail");
        *last = format!("{left} jobs");
        (left == 0).then_some(())
    });
    let log = k.kubectl(&["logs", "-n", &ns.name, &pod, "-c", "worker"]);
    assert!(
        log.contains("returned the jobs of this container's previous run at once"),
        "{log}"
    );
    eprintln!(
        "  killed {pod}'s worker with 4 of 12 jobs in hand: restarted in {restart_took:.1?}, \
         all 12 done {took:.1?} after the kill (dead-after {dead_after:?})"
    );
}

fn a_scale_down_removes_the_idle_workers_and_the_busy_one_finishes(e2e: &E2e) {
    let k = &e2e.cluster;
    let ns = Namespace::create(k, "e2e-scale-down");
    let redis = Redis::start(k, &ns.name);
    // One job per worker, up to three workers.
    let pool = Pool::new("mail", &redis).max(3).per_replica(1).grace(30);
    k.apply(&ns.name, &pool.manifest());
    eventually(Duration::from_secs(30), "the pool's Deployment", |_| {
        k.get(&["deployment", "-n", &ns.name, "mail"])
    });

    // Three jobs wake three workers; two are short, one runs long.
    let ids: Vec<String> = ["long", "short-1", "short-2"].map(String::from).to_vec();
    redis.push("mail", &ids[..1], 40_000);
    redis.push("mail", &ids[1..], 8000);
    let workers = ready_workers(k, &ns.name, "mail", 3);
    let busy = eventually(Duration::from_secs(60), "the long job running", |last| {
        let holding = redis.holding("mail");
        *last = format!("{holding:?}");
        holding
            .into_iter()
            .find(|(_, jobs)| jobs.contains(&"long".to_string()))
            .map(|(pod, _)| pod)
    });

    // With the short jobs done, one job in flight needs one worker: the
    // operator marks the idle Pods cheapest to delete and the ReplicaSet
    // removes them, not the busy one.
    let left = eventually(
        Duration::from_secs(90),
        "the pool down to one worker",
        |last| {
            let pods = k.get(&["pods", "-n", &ns.name, "-l", "workerpool.dev/pool=mail"])?;
            *last = summary_of_pods(&pods);
            let names: Vec<String> = pods["items"]
                .as_array()?
                .iter()
                .filter_map(|p| p["metadata"]["name"].as_str().map(String::from))
                .collect();
            (names.len() == 1).then_some(names)
        },
    );
    assert_eq!(
        left.as_slice(),
        std::slice::from_ref(&busy),
        "the busy worker stayed; the pool had {workers:?}"
    );
    let done = every_job_ran_once(&redis, "mail", &ids);
    assert_eq!(done["long"].as_slice(), std::slice::from_ref(&busy));
    let reasons = event_reasons(k, &ns.name, "mail");
    assert!(reasons.contains("ScaledDown"), "{reasons:?}");
}

fn a_missing_secret_shows_in_conditions_and_an_event_and_the_pool_recovers_once_it_exists(
    e2e: &E2e,
) {
    let k = &e2e.cluster;
    let ns = Namespace::create(k, "e2e-secret");
    let redis = Redis::start(k, &ns.name);
    let pool = Pool::new("mail", &redis).url_from_secret("redis-url", "url");
    k.apply(&ns.name, &pool.manifest());

    let wp = eventually(Duration::from_secs(30), "QueueReachable False", |last| {
        let wp = k.get(&["wp", "-n", &ns.name, "mail"])?;
        *last = wp["status"].to_string();
        (condition(&wp, "QueueReachable") == Some("False")).then_some(wp)
    });
    let reachable = wp["status"]["conditions"]
        .as_array()
        .and_then(|all| all.iter().find(|c| c["type"] == "QueueReachable"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(reachable["reason"], "SecretNotFound", "{reachable}");
    assert!(
        reachable["message"]
            .as_str()
            .unwrap_or_default()
            .contains("redis-url"),
        "the message names the Secret: {reachable}"
    );
    eventually(Duration::from_secs(30), "a SecretNotFound event", |last| {
        let reasons = event_reasons(k, &ns.name, "mail");
        *last = format!("{reasons:?}");
        reasons.contains("SecretNotFound").then_some(())
    });

    // The Secret appears: the pool reads its queue, wakes and runs jobs with
    // the URL the kubelet gives its workers from the same Secret.
    let literal = format!("--from-literal=url={}", redis.url());
    k.kubectl(&[
        "create",
        "secret",
        "generic",
        "redis-url",
        "-n",
        &ns.name,
        &literal,
    ]);
    queue_reachable(k, &ns.name, "mail", Duration::from_secs(30));
    let ids: Vec<String> = (0..3).map(|i| format!("job-{i}")).collect();
    redis.push("mail", &ids, 100);
    every_job_ran_once(&redis, "mail", &ids);
}

fn a_spec_refused_by_cel_names_the_field_to_fix(e2e: &E2e) {
    let k = &e2e.cluster;
    let ns = Namespace::create(k, "e2e-cel");
    // No Redis needed: the API server refuses these before anything runs.
    let mut pool = json!({
        "apiVersion": "workerpool.dev/v1alpha1",
        "kind": "WorkerPool",
        "metadata": {"name": "bad"},
        "spec": {
            "queue": {"redis": {"url": "redis://10.0.0.9:6379/0", "key": "mail"}},
            "template": {"spec": {"containers": [{"name": "worker", "image": worker_image()}]}},
            "scaling": {"minReplicas": 5, "maxReplicas": 2},
        },
    });
    let refused = |pool: &Value| {
        k.kubectl_with_input(
            &["apply", "-n", &ns.name, "-f", "-"],
            Some(&pool.to_string()),
        )
        .expect_err("the API server refuses the pool")
    };
    let error = refused(&pool);
    assert!(
        error.contains("spec.scaling.minReplicas must not exceed spec.scaling.maxReplicas"),
        "{error}"
    );
    pool["spec"]["scaling"]["minReplicas"] = 0.into();
    pool["spec"]["replicas"] = 2.into();
    let error = refused(&pool);
    assert!(
        error.contains("set exactly one of spec.replicas") && error.contains("spec.scaling"),
        "{error}"
    );
    pool["spec"]["replicas"] = Value::Null;
    pool["spec"]["queue"]["redis"]["keys"] = json!(["a", "b"]);
    let error = refused(&pool);
    assert!(error.contains("spec.queue.redis.key"), "{error}");
    pool["spec"]["queue"]["redis"]["keys"] = Value::Null;
    pool["spec"]["worker"] = json!({"concurrency": 4, "children": 5});
    let error = refused(&pool);
    assert!(
        error.contains("spec.worker.children must be at most spec.worker.concurrency"),
        "{error}"
    );
    assert!(
        k.get(&["wp", "-n", &ns.name, "bad"]).is_none(),
        "nothing was created"
    );
}

fn kubectl_scale_drives_a_manual_pool_and_deleting_the_pool_removes_its_deployment(e2e: &E2e) {
    let k = &e2e.cluster;
    let ns = Namespace::create(k, "e2e-manual");
    let redis = Redis::start(k, &ns.name);
    let pool = Pool::new("mail", &redis).manual(1);
    k.apply(&ns.name, &pool.manifest());
    ready_workers(k, &ns.name, "mail", 1);

    // A hand edit of the Deployment's spec is put back: it moves the
    // Deployment's generation, so the operator applies its own again.
    k.kubectl(&[
        "scale",
        "deployment",
        "mail",
        "-n",
        &ns.name,
        "--replicas=2",
    ]);
    eventually(
        Duration::from_secs(30),
        "the Deployment back at 1",
        |last| {
            let d = k.get(&["deployment", "-n", &ns.name, "mail"])?;
            *last = format!(
                "spec.replicas {} generation {}",
                d["spec"]["replicas"], d["metadata"]["generation"]
            );
            (d["spec"]["replicas"] == 1 && d["metadata"]["generation"].as_i64()? >= 3).then_some(())
        },
    );

    // So is a hand edit of its labels, which leaves the generation as it
    // was.
    k.kubectl(&[
        "label",
        "deployment",
        "mail",
        "-n",
        &ns.name,
        "--overwrite",
        "workerpool.dev/pool=other",
    ]);
    eventually(
        Duration::from_secs(60),
        "the Deployment's pool label back",
        |last| {
            let d = k.get(&["deployment", "-n", &ns.name, "mail"])?;
            *last = d["metadata"]["labels"].to_string();
            (d["metadata"]["labels"]["workerpool.dev/pool"] == "mail").then_some(())
        },
    );

    // The scale subresource points at spec.replicas.
    k.kubectl(&["scale", "wp", "mail", "-n", &ns.name, "--replicas=3"]);
    ready_workers(k, &ns.name, "mail", 3);
    let path = format!(
        "/apis/workerpool.dev/v1alpha1/namespaces/{}/workerpools/mail/scale",
        ns.name
    );
    let scale: Value = serde_json::from_str(&k.kubectl(&["get", "--raw", &path]))
        .expect("the scale subresource is JSON");
    assert_eq!(scale["spec"]["replicas"], 3, "{scale}");
    eventually(Duration::from_secs(30), "status.readyReplicas 3", |last| {
        let wp = k.get(&["wp", "-n", &ns.name, "mail"])?;
        *last = wp["status"].to_string();
        (wp["status"]["readyReplicas"] == 3).then_some(())
    });
    k.kubectl(&["scale", "wp", "mail", "-n", &ns.name, "--replicas=1"]);
    eventually(Duration::from_secs(60), "one worker left", |last| {
        let pods = k.get(&["pods", "-n", &ns.name, "-l", "workerpool.dev/pool=mail"])?;
        *last = summary_of_pods(&pods);
        (pods["items"].as_array()?.len() == 1).then_some(())
    });

    // The Deployment is owned by the pool: deleting the pool removes it.
    k.kubectl(&[
        "delete",
        "wp",
        "mail",
        "-n",
        &ns.name,
        "--wait=true",
        "--timeout=60s",
    ]);
    eventually(
        Duration::from_secs(60),
        "the Deployment and its Pods gone",
        |last| {
            let deployment = k.get(&["deployment", "-n", &ns.name, "mail"]);
            let pods = k.get(&["pods", "-n", &ns.name, "-l", "workerpool.dev/pool=mail"])?;
            let left = pods["items"].as_array()?.len();
            *last = format!("deployment {} pods {left}", deployment.is_some());
            (deployment.is_none() && left == 0).then_some(())
        },
    );
}

fn the_video_platform_example_scales_both_pools_on_their_queues(e2e: &E2e) {
    let k = &e2e.cluster;
    let ns = Namespace::create(k, "e2e-video");
    let redis = Redis::start(k, &ns.name);
    // The example as published, but on this cluster: the Redis ClusterIP,
    // the worker image built here running the test handler, and CPU cut to
    // fit a two-core node (requests still equal limits for the transcoder).
    // Memory, probes, security contexts, volumes, concurrency, scaling and
    // grace periods stay as written.
    let path = crate::cluster::root().join("manifests/examples/video-platform.yaml");
    let text = std::fs::read_to_string(&path).expect("read the example");
    let mut pools = Vec::new();
    for document in serde_yaml_ng::Deserializer::from_str(&text) {
        let mut pool: Value = serde::Deserialize::deserialize(document).expect("a YAML document");
        pool["spec"]["queue"]["redis"]["url"] = redis.url().into();
        let container = &mut pool["spec"]["template"]["spec"]["containers"][0];
        container["image"] = worker_image().into();
        container["imagePullPolicy"] = "Never".into();
        container["args"] = json!(["--", "python3", "-c", HANDLER]);
        container["env"] = json!([{"name": "E2E_REDIS", "value": redis.ip}]);
        let resources = &mut container["resources"];
        for kind in ["requests", "limits"] {
            if resources[kind]["cpu"].is_string() {
                resources[kind]["cpu"] = "100m".into();
            }
        }
        pools.push(pool);
    }
    let names: Vec<String> = pools
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str().map(String::from))
        .collect();
    assert_eq!(names, ["video-transcode", "video-upload"]);
    for pool in &pools {
        k.apply(&ns.name, &pool.to_string());
    }
    // minReplicas 1: one worker each, before any job.
    for name in &names {
        ready_workers(k, &ns.name, name, 1);
    }

    // 250 jobs on each queue: past 100 waiting per worker, both pools grow.
    let transcode: Vec<String> = (0..250).map(|i| format!("t-{i}")).collect();
    let upload: Vec<String> = (0..250).map(|i| format!("u-{i}")).collect();
    redis.push("video:transcode", &transcode, 200);
    redis.push("video:upload", &upload, 3000);
    let mut peak: BTreeMap<&str, i64> = BTreeMap::new();
    eventually(Duration::from_secs(180), "every job done", |last| {
        for name in &names {
            let d = k.get(&["deployment", "-n", &ns.name, name])?;
            let replicas = d["spec"]["replicas"].as_i64().unwrap_or(0);
            let entry = peak.entry(name.as_str()).or_default();
            *entry = (*entry).max(replicas);
        }
        let done = redis.done().len();
        *last = format!("{done} done, peak sizes {peak:?}");
        (done >= transcode.len() + upload.len()).then_some(())
    });
    for name in &names {
        assert!(peak[name.as_str()] >= 2, "{name} never grew: {peak:?}");
    }
    let all: Vec<String> = transcode.iter().chain(&upload).cloned().collect();
    let done = redis.done();
    assert!(all.iter().all(|id| done.contains_key(id)), "every job ran");
    for queue in ["video:transcode", "video:upload"] {
        assert_eq!(redis.cli(&["LLEN", &format!("{queue}:dead")]).trim(), "0");
    }
    eprintln!("  peak workers {peak:?}");
}

/// The Ready operator Pods.
fn operator_pods(k: &Cluster) -> Vec<String> {
    k.get(&[
        "pods",
        "-n",
        OPERATOR_NAMESPACE,
        "-l",
        "app.kubernetes.io/name=workerpool-operator",
    ])
    .map(|pods| ready_pods(&pods))
    .unwrap_or_default()
}

fn lease_holder(k: &Cluster) -> Option<String> {
    let lease = k.get(&["lease", "-n", OPERATOR_NAMESPACE, RELEASE])?;
    lease["spec"]["holderIdentity"].as_str().map(String::from)
}

fn a_schedule_fires_once_per_fire_time_and_wakes_its_pool_from_zero(e2e: &E2e) {
    let k = &e2e.cluster;
    let ns = Namespace::create(k, "e2e-schedule");
    let redis = Redis::start(k, &ns.name);
    let pool = Pool::new("tick", &redis).schedule(json!({
        "name": "every-two-seconds",
        "schedule": "@every 2s",
        "concurrencyPolicy": "Allow",
        "job": {"task": "e2e", "data": {"ms": 100}},
    }));
    k.apply(&ns.name, &pool.manifest());
    // Nothing is pushed: the operator's fires are the only jobs, and a
    // worker comes for them although the pool rests at zero.
    let prefix = format!("{}/tick/every-two-seconds/", ns.name);
    let done = eventually(Duration::from_secs(120), "three fires run", |last| {
        let done = redis.done();
        *last = format!("{done:?}");
        (done.len() >= 3).then_some(done)
    });
    for (id, workers) in &done {
        let fired_at: u64 = id
            .strip_prefix(&prefix)
            .and_then(|ms| ms.parse().ok())
            .unwrap_or_else(|| panic!("{id} is not a fire of the schedule"));
        assert_eq!(
            fired_at % 2000,
            0,
            "{id}: fires fall on the schedule's times"
        );
        assert_eq!(workers.len(), 1, "{id} ran more than once: {workers:?}");
    }
    let wp = eventually(Duration::from_secs(30), "the schedule's status", |last| {
        let wp = k.get(&["wp", "-n", &ns.name, "tick"])?;
        *last = wp["status"].to_string();
        let schedule = &wp["status"]["schedules"][0];
        (schedule["lastFireTime"].is_string() && schedule["nextFireTime"].is_string()).then_some(wp)
    });
    assert_eq!(
        condition(&wp, "SchedulesValid"),
        Some("True"),
        "{}",
        wp["status"]
    );
}

fn a_restarted_operator_does_not_shrink_a_busy_pool(e2e: &E2e) {
    let k = &e2e.cluster;
    let ns = Namespace::create(k, "e2e-restart");
    let redis = Redis::start(k, &ns.name);
    let pool = Pool::new("mail", &redis).max(3).per_replica(1);
    k.apply(&ns.name, &pool.manifest());
    eventually(Duration::from_secs(30), "the pool's Deployment", |_| {
        k.get(&["deployment", "-n", &ns.name, "mail"])
    });
    // Three long jobs keep three workers busy.
    let ids: Vec<String> = (0..3).map(|i| format!("job-{i}")).collect();
    redis.push("mail", &ids, 45_000);
    ready_workers(k, &ns.name, "mail", 3);
    eventually(Duration::from_secs(30), "three jobs in flight", |last| {
        let holding = redis.holding("mail");
        *last = format!("{holding:?}");
        (holding.values().map(Vec::len).sum::<usize>() == 3).then_some(())
    });

    // A new operator starts with no memory of the pool: it must read the
    // queue before it decides, and three jobs in flight need three workers.
    let old = operator_pods(k);
    for pod in &old {
        k.kubectl(&[
            "delete",
            "pod",
            "-n",
            OPERATOR_NAMESPACE,
            pod,
            "--wait=false",
        ]);
    }
    let watched = Instant::now();
    let mut new_leader_seen = None;
    while watched.elapsed() < Duration::from_secs(25) {
        let d = k
            .get(&["deployment", "-n", &ns.name, "mail"])
            .expect("the Deployment");
        assert_eq!(
            d["spec"]["replicas"], 3,
            "the pool shrank while busy: {}",
            d["spec"]
        );
        if new_leader_seen.is_none()
            && let Some(holder) = lease_holder(k)
            && !old.contains(&holder)
            && operator_pods(k).contains(&holder)
        {
            new_leader_seen = Some(watched.elapsed());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let took = new_leader_seen.expect("a new operator took the Lease within 25 s");
    eprintln!("  new operator leading after {took:.1?}; the pool stayed at 3");
    // ... and it does reconcile: the status is fresh again.
    eventually(
        Duration::from_secs(30),
        "status from the new operator",
        |last| {
            let wp = k.get(&["wp", "-n", &ns.name, "mail"])?;
            *last = wp["status"].to_string();
            (wp["status"]["inFlight"] == 3 && wp["status"]["desiredReplicas"] == 3).then_some(())
        },
    );
}

fn with_two_operators_one_leads_and_the_other_takes_over_when_it_goes(e2e: &E2e) {
    let k = &e2e.cluster;
    let upgrade = |replicas: &str| {
        k.helm(&[
            "upgrade",
            RELEASE,
            "charts/workerpool-operator",
            "--namespace",
            OPERATOR_NAMESPACE,
            "--reuse-values",
            "--set",
            &format!("replicaCount={replicas}"),
        ])
        .unwrap_or_else(|e| panic!("{e}"));
    };
    upgrade("2");
    let pods = eventually(Duration::from_secs(90), "two Ready operators", |last| {
        let pods = operator_pods(k);
        *last = format!("{pods:?}");
        (pods.len() == 2).then_some(pods)
    });
    let leader = eventually(Duration::from_secs(60), "a leader among them", |last| {
        let holder = lease_holder(k)?;
        *last = holder.clone();
        pods.contains(&holder).then_some(holder)
    });
    let standby = pods
        .iter()
        .find(|p| **p != leader)
        .expect("a standby")
        .clone();

    let ns = Namespace::create(k, "e2e-leader");
    let redis = Redis::start(k, &ns.name);
    let pool = Pool::new("mail", &redis).max(2).per_replica(5);
    k.apply(&ns.name, &pool.manifest());
    queue_reachable(k, &ns.name, "mail", Duration::from_secs(30));
    // Only the leader reconciles: the standby has no reconcile counted.
    let standby_metrics = pod_metrics(k, &standby);
    assert!(
        !standby_metrics.contains("workerpool_operator_reconciles_total{"),
        "the standby reconciled: {standby_metrics}"
    );
    assert!(pod_metrics(k, &leader).contains("workerpool_operator_reconciles_total{"));

    // The leader goes and releases the Lease on its way out; another
    // operator (the standby, or the Pod that replaces the leader) takes it
    // well within the Lease's 30 s, and the pool keeps scaling.
    let t = Instant::now();
    k.kubectl(&[
        "delete",
        "pod",
        "-n",
        OPERATOR_NAMESPACE,
        &leader,
        "--wait=false",
    ]);
    let successor = eventually(
        Duration::from_secs(30),
        "another operator to lead",
        |last| {
            let holder = lease_holder(k)?;
            *last = holder.clone();
            (holder != leader && operator_pods(k).contains(&holder)).then_some(holder)
        },
    );
    let took = t.elapsed();
    let ids: Vec<String> = (0..10).map(|i| format!("job-{i}")).collect();
    redis.push("mail", &ids, 1000);
    // The successor wakes the pool and the jobs run. Whether both workers
    // are ever Ready at once is a matter of timing (one Pod may finish the
    // ten jobs before the second starts), so the scenario asks for the
    // jobs and for the successor's own count of the scale-up.
    with_operator_logs(k, || every_job_ran_once(&redis, "mail", &ids));
    let metrics = pod_metrics(k, &successor);
    let scaled_up = metrics.lines().any(|l| {
        l.starts_with("workerpool_pool_scale_events_total{")
            && l.contains(r#"direction="up""#)
            && l.contains(r#"namespace="e2e-leader""#)
            && l.contains(r#"pool="mail""#)
            && !l.ends_with(" 0")
    });
    assert!(
        scaled_up,
        "the successor did not scale the pool up: {metrics}"
    );
    // One pool polled every second is looked at about once a second, not
    // in a loop on its own status writes.
    let reconciles = |metrics: &str| -> f64 {
        metrics
            .lines()
            .filter(|l| l.starts_with("workerpool_operator_reconciles_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let before = reconciles(&metrics);
    std::thread::sleep(Duration::from_secs(10));
    let looks = reconciles(&pod_metrics(k, &successor)) - before;
    assert!(
        looks <= 40.0,
        "{looks} reconciles in 10 s for one pool polled every second"
    );
    eprintln!("  {successor} took over from {leader} after {took:.1?}; {looks} looks in 10 s");
    drop(ns);
    upgrade("1");
    eventually(Duration::from_secs(90), "one operator again", |last| {
        let pods = operator_pods(k);
        *last = format!("{pods:?}");
        let holder = lease_holder(k)?;
        (pods.len() == 1 && pods.contains(&holder)).then_some(())
    });
}

/// Runs `check`; should it panic, prints the operator Pods' logs first.
fn with_operator_logs<T>(k: &Cluster, check: impl FnOnce() -> T) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(check)) {
        Ok(v) => v,
        Err(panic) => {
            for pod in operator_pods(k) {
                let logs = k
                    .try_kubectl(&["logs", "-n", OPERATOR_NAMESPACE, &pod, "--tail=300"])
                    .unwrap_or_else(|e| e);
                eprintln!("--- logs of {pod} ---\n{logs}");
            }
            std::panic::resume_unwind(panic)
        }
    }
}

/// One operator Pod's /metrics, through the API server's Pod proxy.
fn pod_metrics(k: &Cluster, pod: &str) -> String {
    let path = format!("/api/v1/namespaces/{OPERATOR_NAMESPACE}/pods/{pod}:8080/proxy/metrics");
    eventually(Duration::from_secs(30), "a Pod's /metrics", |last| {
        k.try_kubectl(&["get", "--raw", &path])
            .map_err(|e| *last = e)
            .ok()
    })
}

/// A Pod named `name` of the base image (`container` gives its command and
/// probe), with a ClusterIP Service of the same name on `port`, applied in
/// `namespace`; returns once the Pod is Ready.
pub fn pod_with_service(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
    mut container: Value,
    port: u16,
) {
    container["name"] = name.into();
    container["image"] = redis_image().into();
    container["imagePullPolicy"] = "Never".into();
    container["ports"] = json!([{"containerPort": port}]);
    let manifest = json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "labels": {"app": name}},
                "spec": {"containers": [container], "terminationGracePeriodSeconds": 1},
            },
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": name},
                "spec": {"selector": {"app": name}, "ports": [{"port": port}]},
            },
        ],
    });
    cluster.apply(namespace, &manifest.to_string());
    eventually(
        Duration::from_secs(60),
        &format!("a Ready {name}"),
        |last| {
            let pod = cluster.get(&["pod", "-n", namespace, name])?;
            *last = pod["status"].to_string();
            is_ready(&pod).then_some(())
        },
    );
}

/// A Redis Pod and a ClusterIP Service in a namespace (no cluster DNS: the
/// pools use the ClusterIP).
pub struct Redis<'a> {
    cluster: &'a Cluster,
    namespace: String,
    pub ip: String,
}

impl<'a> Redis<'a> {
    pub fn start(cluster: &'a Cluster, namespace: &str) -> Redis<'a> {
        let container = json!({
            "command": ["redis-server", "--save", "", "--appendonly", "no",
                        "--protected-mode", "no", "--bind", "0.0.0.0"],
            "readinessProbe": {"exec": {"command": ["redis-cli", "ping"]}, "periodSeconds": 1},
        });
        pod_with_service(cluster, namespace, "redis", container, 6379);
        let ip = cluster.cluster_ip(namespace, "redis");
        Redis {
            cluster,
            namespace: namespace.into(),
            ip,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://{}:6379/0", self.ip)
    }

    /// `redis-cli ARGS` in the Redis Pod.
    pub fn cli(&self, args: &[&str]) -> String {
        let mut all = vec!["exec", "-n", &self.namespace, "redis", "--", "redis-cli"];
        all.extend_from_slice(args);
        self.cluster.kubectl(&all)
    }

    /// Pushes jobs with these ids, each taking `ms` in the test handler.
    pub fn push(&self, queue: &str, ids: &[String], ms: u64) {
        let jobs: Vec<String> = ids
            .iter()
            .map(|id| json!({"id": id, "task": "e2e", "data": {"ms": ms}}).to_string())
            .collect();
        let mut args = vec!["LPUSH", queue];
        args.extend(jobs.iter().map(String::as_str));
        self.cli(&args);
    }

    /// How many jobs of `queue` are anywhere (waiting, held by a worker,
    /// waiting to retry, scheduled or dead), read in one script so a job
    /// that moves between two places while the test reads is counted once.
    pub fn jobs_anywhere(&self, queue: &str) -> usize {
        const COUNT: &str = "local q = ARGV[1] \
            local n = redis.call('LLEN', q) + redis.call('ZCARD', q .. ':retry') \
            + redis.call('ZCARD', q .. ':scheduled') + redis.call('LLEN', q .. ':dead') \
            for _, key in ipairs(redis.call('KEYS', q .. ':processing:*')) do \
            n = n + redis.call('LLEN', key) end \
            return n";
        let reply = self.cli(&["EVAL", COUNT, "0", queue]);
        reply
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("a count of jobs ({e}): {reply:?}"))
    }

    /// The jobs each worker (Pod) holds in its processing list, by id.
    pub fn holding(&self, queue: &str) -> BTreeMap<String, Vec<String>> {
        let pattern = format!("{queue}:processing:*");
        let mut holding = BTreeMap::new();
        for key in self.cli(&["--scan", "--pattern", &pattern]).lines() {
            let Some(pod) = key
                .strip_prefix(&format!("{queue}:processing:"))
                .and_then(|instance| instance.rsplit_once('~'))
                .map(|(pod, _)| pod.to_string())
            else {
                continue;
            };
            let ids: Vec<String> = self
                .cli(&["LRANGE", key, "0", "-1"])
                .lines()
                .filter_map(|job| serde_json::from_str::<Value>(job).ok())
                .filter_map(|job| job["id"].as_str().map(String::from))
                .collect();
            if !ids.is_empty() {
                holding.insert(pod, ids);
            }
        }
        holding
    }

    /// The jobs the test handler completed: id -> the workers (Pods) that ran it.
    pub fn done(&self) -> BTreeMap<String, Vec<String>> {
        let mut done: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for line in self.cli(&["LRANGE", DONE_KEY, "0", "-1"]).lines() {
            if let Some((id, worker)) = line.split_once(' ') {
                done.entry(id.into()).or_default().push(worker.into());
            }
        }
        done
    }
}

/// Where the test handler records `<job id> <worker id>` for each job done.
const DONE_KEY: &str = "e2e:done";

/// The exec handler the test pools run (python3 from the worker image's
/// base): it sleeps `data.ms` (or calls the URL `data.call`), records the job
/// and the worker (and, for a job with `enqueued_at`, its wait and duration) on
/// Redis with a few lines of RESP, and answers ok.
const HANDLER: &str = r#"
import json, os, socket, sys, threading, time, urllib.request
def command(*args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a.encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out
redis = socket.create_connection((os.environ["E2E_REDIS"], 6379))
replies = redis.makefile("rb")
me = os.environ.get("WORKERPOOL_WORKER_ID", "?")
# A pool with children below its concurrency hands this process several
# jobs at once: each then runs on a thread and its answer names it.
share = int(os.environ.get("WORKERPOOL_JOBS_PER_CHILD", "1"))
lock = threading.Lock()
def run(job):
    started = time.time()
    data = job.get("data", {})
    if "call" in data:
        urllib.request.urlopen(data["call"], timeout=60).read()
    else:
        time.sleep(data.get("ms", 0) / 1000)
    with lock:
        redis.sendall(command("RPUSH", "e2e:done", job["id"] + " " + me))
        replies.readline()
        if "enqueued_at" in job:
            # The wait and the duration, in ms, for the replay harness.
            noted = "%d %d" % (started * 1000 - job["enqueued_at"], (time.time() - started) * 1000)
            redis.sendall(command("RPUSH", "e2e:waits", noted))
            replies.readline()
        answer = {"id": job["id"], "ok": True} if share > 1 else {"ok": True}
        print(json.dumps(answer), flush=True)
for line in sys.stdin:
    job = json.loads(line)
    if share == 1:
        run(job)
    elif "cancel" not in job:
        threading.Thread(target=run, args=(job,), daemon=True).start()
"#;

/// A WorkerPool of the test handler on a queue named after the pool.
#[derive(Clone)]
pub struct Pool {
    name: String,
    spec: Value,
}

impl Pool {
    pub fn new(name: &str, redis: &Redis) -> Pool {
        Pool::at(name, &redis.url(), &redis.ip)
    }
    /// A pool on the Redis at `url`, its handler recording on `recorder`
    /// (a Redis IP).
    pub fn at(name: &str, url: &str, recorder: &str) -> Pool {
        let spec = json!({
            "queue": {"redis": {"url": url, "key": name}},
            "template": {"spec": {"containers": [{
                "name": "worker",
                "image": worker_image(),
                "imagePullPolicy": "Never",
                "args": ["--", "python3", "-c", HANDLER],
                "env": [{"name": "E2E_REDIS", "value": recorder}],
            }]}},
            "worker": {"concurrency": 1, "maxAttempts": 3, "jobTimeoutSeconds": 60},
            "scaling": {
                "minReplicas": 0,
                "maxReplicas": 3,
                "pollIntervalSeconds": 1,
                "targetBacklogPerReplica": 10,
                "idleSecondsBeforeZero": 5,
                "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}},
            },
            "shutdown": {"gracePeriodSeconds": 10},
        });
        Pool {
            name: name.into(),
            spec,
        }
    }
    pub fn max(mut self, n: i64) -> Pool {
        self.spec["scaling"]["maxReplicas"] = n.into();
        self
    }
    pub fn per_replica(mut self, n: i64) -> Pool {
        self.spec["scaling"]["targetBacklogPerReplica"] = n.into();
        self
    }
    /// The Redis URL from a Secret's key instead of spec.queue.redis.url.
    pub fn url_from_secret(mut self, name: &str, key: &str) -> Pool {
        let redis = &mut self.spec["queue"]["redis"];
        if let Some(redis) = redis.as_object_mut() {
            redis.remove("url");
            redis.insert("urlSecretRef".into(), json!({"name": name, "key": key}));
        }
        self
    }
    /// A recurring schedule of the pool.
    pub fn schedule(mut self, schedule: Value) -> Pool {
        match self.spec["schedules"].as_array_mut() {
            Some(all) => all.push(schedule),
            None => self.spec["schedules"] = json!([schedule]),
        }
        self
    }
    /// A fixed size instead of scaling.
    pub fn manual(mut self, replicas: i64) -> Pool {
        if let Some(spec) = self.spec.as_object_mut() {
            spec.remove("scaling");
            spec.insert("replicas".into(), replicas.into());
        }
        self
    }
    pub fn grace(mut self, seconds: i64) -> Pool {
        self.spec["shutdown"]["gracePeriodSeconds"] = seconds.into();
        self
    }
    pub fn concurrency(mut self, n: i64) -> Pool {
        self.spec["worker"]["concurrency"] = n.into();
        self
    }
    /// Any other change to the spec.
    pub fn with(mut self, change: impl FnOnce(&mut Value)) -> Pool {
        change(&mut self.spec);
        self
    }
    pub fn manifest(&self) -> String {
        json!({
            "apiVersion": "workerpool.dev/v1alpha1",
            "kind": "WorkerPool",
            "metadata": {"name": self.name},
            "spec": self.spec,
        })
        .to_string()
    }
}

/// Waits for the pool's Deployment to be scaled to `replicas`.
pub fn deployment_at(k: &Cluster, namespace: &str, name: &str, replicas: i64, within: Duration) {
    eventually(within, &format!("the Deployment at {replicas}"), |last| {
        let d = k.get(&["deployment", "-n", namespace, name])?;
        *last = d["spec"].to_string();
        (d["spec"]["replicas"] == replicas).then_some(())
    });
}

/// Waits for the pool to have read its queue (`QueueReachable=True`); returns its status.
pub fn queue_reachable(k: &Cluster, namespace: &str, name: &str, within: Duration) -> Value {
    eventually(within, "QueueReachable", |last| {
        let wp = k.get(&["wp", "-n", namespace, name])?;
        *last = wp["status"].to_string();
        (condition(&wp, "QueueReachable") == Some("True")).then(|| wp["status"].clone())
    })
}

/// The status of a condition of an object (`True`, `False`, `Unknown`).
pub fn condition<'v>(object: &'v Value, type_: &str) -> Option<&'v str> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)?["status"]
        .as_str()
}

pub fn is_ready(pod: &Value) -> bool {
    pod["metadata"]["deletionTimestamp"].is_null() && condition(pod, "Ready") == Some("True")
}

/// Names of the Ready pods of a list.
pub fn ready_pods(pods: &Value) -> Vec<String> {
    pods["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter(|p| is_ready(p))
                .filter_map(|p| p["metadata"]["name"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// One line per pod: name, phase, Ready, container states; for failure messages.
pub fn summary_of_pods(pods: &Value) -> String {
    pods["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|p| {
                    format!(
                        "{} {} ready={:?} {}",
                        p["metadata"]["name"],
                        p["status"]["phase"],
                        condition(p, "Ready"),
                        p["status"]["containerStatuses"]
                    )
                })
                .collect::<Vec<_>>()
                .join("; ")
        })
        .unwrap_or_default()
}

/// The reasons of the Events about an object.
pub fn event_reasons(k: &Cluster, namespace: &str, name: &str) -> BTreeSet<String> {
    let selector = format!("involvedObject.name={name}");
    k.get(&["events", "-n", namespace, "--field-selector", &selector])
        .and_then(|list| {
            list["items"].as_array().map(|items| {
                items
                    .iter()
                    .filter_map(|e| e["reason"].as_str().map(String::from))
                    .collect()
            })
        })
        .unwrap_or_default()
}
