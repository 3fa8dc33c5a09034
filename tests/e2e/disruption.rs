//! Node disruption: busy workers marked for node autoscalers only while
//! their jobs run long, and a drain paced by the pool's
//! PodDisruptionBudget, each evicted worker stopping as a scaled-down one
//! does.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::E2e;
use crate::cluster::{Cluster, Namespace, eventually};
use crate::scenarios::{Pool, Redis, metrics, ready_workers};

pub const ALL: &[crate::Scenario] = &[
    (
        "busy_pods_carry_the_node_autoscalers_marks_only_while_their_jobs_run_long",
        busy_pods_carry_the_node_autoscalers_marks_only_while_their_jobs_run_long,
    ),
    (
        "a_drain_evicts_workers_one_at_a_time_under_the_pools_budget_and_loses_no_job",
        a_drain_evicts_workers_one_at_a_time_under_the_pools_budget_and_loses_no_job,
    ),
];

const DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";
const SAFE_TO_EVICT: &str = "cluster-autoscaler.kubernetes.io/safe-to-evict";

/// Each pod's autoscaler marks, as the API server has them.
fn marks(
    k: &Cluster,
    namespace: &str,
    pool: &str,
) -> Vec<(String, Option<String>, Option<String>)> {
    let selector = format!("workerpool.dev/pool={pool}");
    let pods = k
        .get(&["pods", "-n", namespace, "-l", &selector])
        .unwrap_or_default();
    pods["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|p| {
            let a = &p["metadata"]["annotations"];
            (
                p["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                a[DO_NOT_DISRUPT].as_str().map(String::from),
                a[SAFE_TO_EVICT].as_str().map(String::from),
            )
        })
        .collect()
}

/// The operator's count of mark patches for a pool, by change.
fn patches(k: &Cluster, namespace: &str, pool: &str, change: &str) -> u64 {
    let text = metrics(k);
    let needle = format!(
        "workerpool_pool_protection_patches_total{{change=\"{change}\",namespace=\"{namespace}\",pool=\"{pool}\"}} "
    );
    text.lines()
        .find_map(|l| l.strip_prefix(&needle))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

fn busy_pods_carry_the_node_autoscalers_marks_only_while_their_jobs_run_long(e2e: &E2e) {
    let k = &e2e.cluster;
    let ns = Namespace::create(k, "e2e-protect");
    let redis = Redis::start(k, &ns.name);
    let pool = Pool::new("long", &redis).with(|spec| {
        spec["scaling"]["minReplicas"] = 2.into();
        spec["scaling"]["maxReplicas"] = 2.into();
        spec["disruption"] = json!({"protectBusyPods": true, "protectAfterSeconds": 5});
    });
    k.apply(&ns.name, &pool.manifest());
    ready_workers(k, &ns.name, "long", 2);
    assert!(
        marks(k, &ns.name, "long")
            .iter()
            .all(|(_, d, s)| d.is_none() && s.is_none()),
        "idle workers carry no marks"
    );

    // One 18 s job: its pod is marked once it has run 5 s; the other is not.
    redis.push("long", &["long-1".to_string()], 18_000);
    let holder = eventually(Duration::from_secs(30), "the job held", |last| {
        let holding = redis.holding("long");
        *last = format!("{holding:?}");
        holding.keys().next().cloned()
    });
    let started = Instant::now();
    let marked = eventually(Duration::from_secs(30), "the busy pod marked", |last| {
        let m = marks(k, &ns.name, "long");
        *last = format!("{m:?}");
        m.iter().any(|(_, d, _)| d.is_some()).then_some(m)
    });
    let waited = started.elapsed();
    for (pod, d, s) in &marked {
        if *pod == holder {
            assert_eq!(
                (d.as_deref(), s.as_deref()),
                (Some("true"), Some("false")),
                "{marked:?}"
            );
        } else {
            assert_eq!(
                (d, s),
                (&None, &None),
                "only the busy pod is marked: {marked:?}"
            );
        }
    }
    eprintln!(
        "e2e: the busy pod was marked {waited:.1?} after its job was seen held (protectAfterSeconds 5)"
    );
    let wp = k.get(&["wp", "-n", &ns.name, "long"]).expect("the pool");
    assert_eq!(wp["status"]["protectedPods"], 1, "{}", wp["status"]);

    // Done, then idle for 5 s: the marks go, and the status says so.
    eventually(
        Duration::from_secs(60),
        "the marks removed once idle",
        |last| {
            let m = marks(k, &ns.name, "long");
            let wp = k.get(&["wp", "-n", &ns.name, "long"])?;
            *last = format!("{m:?} {}", wp["status"]);
            (m.iter().all(|(_, d, s)| d.is_none() && s.is_none())
                && wp["status"]["protectedPods"] == 0)
                .then_some(())
        },
    );
    assert!(redis.done().contains_key("long-1"), "the job finished");
    let before = (
        patches(k, &ns.name, "long", "protect"),
        patches(k, &ns.name, "long", "release"),
    );
    assert_eq!(before, (1, 1), "one patch to mark, one to unmark");

    // Half a minute of 200 ms jobs on both workers (six times the 5 s a pod is
    // marked after, were its jobs one long one): no job runs 5 s, no patch.
    let ids: Vec<String> = (0..300).map(|n| format!("short-{n}")).collect();
    redis.push("long", &ids, 200);
    let minute = Instant::now();
    eventually(Duration::from_secs(90), "the short jobs done", |last| {
        let done = redis.done().len();
        *last = format!("{done} done");
        (done > 300).then_some(())
    });
    let busy_for = minute.elapsed();
    let after = (
        patches(k, &ns.name, "long", "protect"),
        patches(k, &ns.name, "long", "release"),
    );
    eprintln!(
        "e2e: {busy_for:.0?} of 200 ms jobs on 2 workers: {} mark patches",
        after.0 + after.1 - 2
    );
    assert!(
        busy_for >= Duration::from_secs(25),
        "the short jobs kept both workers busy for most of half a minute: {busy_for:?}"
    );
    assert_eq!(after, before, "short jobs never mark their pods");
}

/// Uncordons the node however the scenario ends.
struct Cordoned<'a> {
    cluster: &'a Cluster,
    node: String,
}

impl Drop for Cordoned<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.cluster.try_kubectl(&["uncordon", &self.node]) {
            eprintln!("e2e: cannot uncordon {}: {e}", self.node);
        }
    }
}

fn a_drain_evicts_workers_one_at_a_time_under_the_pools_budget_and_loses_no_job(e2e: &E2e) {
    let k = &e2e.cluster;
    let ns = Namespace::create(k, "e2e-drain");
    let redis = Redis::start(k, &ns.name);
    // Budgets that could block a drain forever are refused by the API server.
    for (disruption, min, message) in [
        (
            json!({"maxUnavailable": 0}),
            0,
            "maxUnavailable must be at least 1",
        ),
        (
            json!({"maxUnavailable": "0%"}),
            0,
            "maxUnavailable must be at least 1",
        ),
        (
            json!({"minAvailable": 2}),
            2,
            "minAvailable must be below the fewest workers",
        ),
    ] {
        let refused = Pool::new("refused", &redis).with(|spec| {
            spec["scaling"]["minReplicas"] = min.into();
            spec["disruption"] = disruption.clone();
        });
        let error = k
            .kubectl_with_input(
                &["apply", "--server-side", "-n", &ns.name, "-f", "-"],
                Some(&refused.manifest()),
            )
            .expect_err("refused at apply");
        assert!(error.contains(message), "{disruption}: {error}");
    }
    let pool = Pool::new("drain", &redis).grace(10).with(|spec| {
        spec["scaling"]["minReplicas"] = 3.into();
        spec["scaling"]["maxReplicas"] = 3.into();
        spec["disruption"] = json!({"maxUnavailable": 1});
    });
    k.apply(&ns.name, &pool.manifest());
    let workers = ready_workers(k, &ns.name, "drain", 3);
    let budget = eventually(
        Duration::from_secs(30),
        "the pool's budget allowing one eviction",
        |last| {
            let pdb = k.get(&["pdb", "-n", &ns.name, "drain"])?;
            *last = pdb.to_string();
            (pdb["status"]["disruptionsAllowed"] == 1).then_some(pdb)
        },
    );
    assert_eq!(
        budget["metadata"]["ownerReferences"][0]["kind"],
        "WorkerPool"
    );
    let wp = k.get(&["wp", "-n", &ns.name, "drain"]).expect("the pool");
    assert_eq!(wp["status"]["disruptionBudget"], "drain");

    // Work for every worker: 3 s jobs, more than the drain will take.
    let ids: Vec<String> = (0..40).map(|n| format!("d-{n}")).collect();
    redis.push("drain", &ids, 3_000);
    eventually(Duration::from_secs(30), "every worker busy", |last| {
        let holding = redis.holding("drain");
        *last = format!("{holding:?}");
        (holding.len() == 3).then_some(())
    });

    // The eviction API takes one worker and refuses a second at once.
    let evict = |pod: &str| {
        let body = json!({"apiVersion": "policy/v1", "kind": "Eviction",
                          "metadata": {"name": pod, "namespace": ns.name}});
        k.kubectl_with_input(
            &[
                "create",
                "--raw",
                &format!("/api/v1/namespaces/{}/pods/{pod}/eviction", ns.name),
                "-f",
                "-",
            ],
            Some(&body.to_string()),
        )
    };
    evict(&workers[0]).unwrap_or_else(|e| panic!("the first eviction: {e}"));
    let refused = evict(&workers[1]).expect_err("a second eviction while the first worker is out");
    assert!(
        refused.contains("disruption budget"),
        "refused for the budget: {refused}"
    );
    // The evicted worker stops as a scaled-down one does: within its grace.
    let gone = Instant::now();
    eventually(Duration::from_secs(20), "the evicted worker gone", |last| {
        let pod = k.get(&["pod", "-n", &ns.name, &workers[0]]);
        *last = pod.map(|p| p["status"].to_string()).unwrap_or_default();
        last.is_empty().then_some(())
    });
    eprintln!(
        "e2e: the evicted worker was gone {:.1?} after its eviction",
        gone.elapsed()
    );
    ready_workers(k, &ns.name, "drain", 3);

    // A drain of the node, of this pool's pods only (the cluster has one
    // node, shared with the suite): the budget lets one worker go, and its
    // replacement cannot be scheduled on the cordoned node, so the drain
    // waits for it until its timeout, as docs/disruption.md says.
    let node = k
        .kubectl(&["get", "nodes", "-o", "jsonpath={.items[0].metadata.name}"])
        .trim()
        .to_string();
    let _uncordon = Cordoned {
        cluster: k,
        node: node.clone(),
    };
    let drained = k.try_kubectl(&[
        "drain",
        &node,
        "--pod-selector=workerpool.dev/pool=drain",
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--timeout=30s",
    ]);
    let message = drained.expect_err("the drain waits on the budget and times out");
    assert!(
        message.contains("global timeout reached") || message.contains("timed out"),
        "{message}"
    );
    let pods = k
        .get(&["pods", "-n", &ns.name, "-l", "workerpool.dev/pool=drain"])
        .expect("pods");
    let phases: Vec<(String, Value)> = pods["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|p| {
            (
                p["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                p["status"]["phase"].clone(),
            )
        })
        .collect();
    let pending = phases.iter().filter(|(_, p)| p == "Pending").count();
    let running = phases.iter().filter(|(_, p)| p == "Running").count();
    assert_eq!(
        (running, pending),
        (2, 1),
        "one worker drained, its replacement unschedulable: {phases:?}"
    );

    drop(_uncordon);
    // Every job done, none lost, none left to the reaper.
    eventually(Duration::from_secs(120), "every job done", |last| {
        let done = redis.done();
        *last = format!(
            "{} done, {} anywhere",
            done.len(),
            redis.jobs_anywhere("drain")
        );
        (ids.iter().all(|id| done.contains_key(id)) && redis.jobs_anywhere("drain") == 0)
            .then_some(())
    });
    let recovered = redis.cli(&["GET", "drain:stats:recovered"]);
    assert!(
        recovered.trim().is_empty() || recovered.trim() == "0",
        "evicted workers gave their jobs back themselves, none was recovered from a lost worker: {recovered:?}"
    );
}
