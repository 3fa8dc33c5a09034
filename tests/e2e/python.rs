//! The Python client on the cluster: the mini project's worker image, built
//! as the client's README and the example's Dockerfile say
//! (`local/workerpool-python-example`, from `scripts/images.sh`), run by a
//! pool, with its jobs enqueued by the client itself from inside the cluster.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{Value, json};

use crate::E2e;
use crate::cluster::{Cluster, Namespace, eventually};
use crate::scenarios::{IMAGE_TAG, Pool, Redis, ready_workers};

pub const ALL: &[crate::Scenario] = &[
    (
        "a_python_handler_built_from_the_client_readme_runs_the_mini_project_on_the_cluster",
        a_python_handler_built_from_the_client_readme_runs_the_mini_project_on_the_cluster,
    ),
    (
        "with_children_1_one_python_process_runs_all_three_slots_of_the_mini_project",
        with_children_1_one_python_process_runs_all_three_slots_of_the_mini_project,
    ),
];

pub fn python_example_image() -> String {
    format!("local/workerpool-python-example:{IMAGE_TAG}")
}

/// Where the mini project's handlers note each job's start and end
/// (`MINI_RECORD`): the pod's `/tmp`, shared by the three handler processes.
const RECORD: &str = "/tmp/mini.jsonl";
const QUEUE: &str = "mini";

/// `kubectl exec` in the worker container of `pod`.
fn exec(k: &Cluster, namespace: &str, pod: &str, command: &[&str]) -> Result<String, String> {
    let mut args = vec!["exec", "-n", namespace, pod, "-c", "worker", "--"];
    args.extend_from_slice(command);
    k.try_kubectl(&args)
}

/// The handlers' notes so far (none before the first job).
fn records(k: &Cluster, namespace: &str, pod: &str) -> Vec<Value> {
    exec(k, namespace, pod, &["cat", RECORD])
        .unwrap_or_default()
        .lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("a record is JSON ({e}): {line}"))
        })
        .collect()
}

fn of<'a>(records: &'a [Value], event: &str) -> BTreeMap<String, &'a Value> {
    records
        .iter()
        .filter(|r| r["event"] == event)
        .map(|r| (r["id"].as_str().unwrap_or_default().to_string(), r))
        .collect()
}

fn at(record: &Value) -> f64 {
    record["at"].as_f64().expect("a record's time")
}

fn a_python_handler_built_from_the_client_readme_runs_the_mini_project_on_the_cluster(e2e: &E2e) {
    mini_project(e2e, "e2e-python", None);
}

/// `spec.worker.children: 1` reaches the worker, which starts one handler
/// process holding all three slots; the App runs its three `def` tasks at
/// once on its threads.
fn with_children_1_one_python_process_runs_all_three_slots_of_the_mini_project(e2e: &E2e) {
    mini_project(e2e, "e2e-python-one", Some(1));
}

fn mini_project(e2e: &E2e, namespace: &str, children: Option<i64>) {
    let k = &e2e.cluster;
    let ns = Namespace::create(k, namespace);
    let redis = Redis::start(k, &ns.name);
    let processes = children.unwrap_or(3);
    let handlers = usize::try_from(processes).unwrap_or(3);
    // Three slots, as the mini project runs; the image's own CMD
    // (`--handler exec -- python3 -m mini.worker`) starts the handler, so
    // the container has no args.
    let pool = Pool::new(QUEUE, &redis)
        .manual(1)
        .concurrency(3)
        .with(|spec| {
            if let Some(children) = children {
                spec["worker"]["children"] = children.into();
            }
            let container = &mut spec["template"]["spec"]["containers"][0];
            container["image"] = python_example_image().into();
            if let Some(c) = container.as_object_mut() {
                c.remove("args");
            }
            container["env"] = json!([{"name": "MINI_RECORD", "value": RECORD}]);
        });
    k.apply(&ns.name, &pool.manifest());
    let pod = ready_workers(k, &ns.name, QUEUE, 1).remove(0);
    // The handler processes are up before the jobs come, so slots, not
    // start-up, set the pace.
    eventually(
        Duration::from_secs(60),
        "the Python handlers ready",
        |last| {
            let logs = k
                .try_kubectl(&["logs", "-n", &ns.name, &pod, "-c", "worker"])
                .unwrap_or_else(|e| e);
            *last = logs
                .chars()
                .rev()
                .take(3000)
                .collect::<String>()
                .chars()
                .rev()
                .collect();
            (logs.matches("handler ready").count() >= handlers).then_some(())
        },
    );

    // The example's producer, in the pool's own image, with the pool's Redis.
    let url = redis.url();
    let printed = exec(
        k,
        &ns.name,
        &pod,
        &["python3", "-m", "mini.producer", &url, QUEUE],
    )
    .unwrap_or_else(|e| panic!("the producer failed: {e}"));
    let ids: Vec<String> = printed.lines().map(str::to_string).collect();
    assert_eq!(ids.len(), 6, "the producer prints six ids: {printed}");
    for id in &ids {
        assert!(
            id.len() == 32 && id.chars().all(|c| c.is_ascii_hexdigit()),
            "a job id is 32 hex digits: {id:?}"
        );
    }

    let seen = eventually(Duration::from_secs(60), "six jobs ended", |last| {
        let seen = records(k, &ns.name, &pod);
        *last = format!("{seen:?}");
        (of(&seen, "end").len() >= 6).then_some(seen)
    });
    let (starts, ends) = (of(&seen, "start"), of(&seen, "end"));
    // Each ran once: one start and one end per job, and nothing else.
    let wanted: BTreeSet<&str> = ids.iter().map(String::as_str).collect();
    assert_eq!(seen.len(), 12, "{seen:#?}");
    assert_eq!(
        starts.keys().map(String::as_str).collect::<BTreeSet<_>>(),
        wanted,
        "{seen:#?}"
    );
    assert_eq!(
        ends.keys().map(String::as_str).collect::<BTreeSet<_>>(),
        wanted,
        "{seen:#?}"
    );
    // Three slots: at most three at once, all three used, in as many
    // processes as the pool says.
    let overlap = ids
        .iter()
        .map(|i| {
            ids.iter()
                .filter(|j| at(starts[*j]) <= at(starts[i]) && at(starts[i]) < at(ends[*j]))
                .count()
        })
        .max()
        .unwrap_or(0);
    assert_eq!(overlap, 3, "three jobs at once at the most: {seen:#?}");
    let pids: BTreeSet<i64> = seen.iter().filter_map(|r| r["pid"].as_i64()).collect();
    assert_eq!(
        pids.len(),
        handlers,
        "{handlers} handler processes: {seen:#?}"
    );
    // FIFO: the first three enqueued all started before any of the last three.
    let first = ids[..3]
        .iter()
        .map(|i| at(starts[i]))
        .fold(f64::MIN, f64::max);
    let next = ids[3..]
        .iter()
        .map(|i| at(starts[i]))
        .fold(f64::MAX, f64::min);
    assert!(first < next, "the first three started first: {seen:#?}");
    let tasks: BTreeSet<&str> = starts.values().filter_map(|r| r["task"].as_str()).collect();
    assert_eq!(tasks, BTreeSet::from(["email", "report"]));
    let wall =
        seen.iter().map(at).fold(f64::MIN, f64::max) - seen.iter().map(at).fold(f64::MAX, f64::min);
    eprintln!("  six 500 ms jobs on three slots in {wall:.2} s (one slot: about 3 s)");
    // The queue counted them, and nothing failed or is left.
    let count = |args: &[&str]| redis.cli(args).trim().to_string();
    let processed = format!("{QUEUE}:stats:processed");
    eventually(Duration::from_secs(10), "six jobs counted", |last| {
        *last = count(&["GET", &processed]);
        (*last == "6").then_some(())
    });
    for key in [
        QUEUE.to_string(),
        format!("{QUEUE}:dead"),
        format!("{QUEUE}:retry"),
        format!("{QUEUE}:stats:failed"),
    ] {
        assert_eq!(count(&["EXISTS", &key]), "0", "{key} is not empty");
    }

    // An email to no address raises Permanent: dead-lettered at once, with
    // the handler's message.
    let enqueue_bad = "import sys\n\
        from workerpool_client import Client\n\
        with Client(sys.argv[1]) as client:\n\
        \x20   print(client.enqueue(sys.argv[2], 'email', {'seq': 6, 'to': 'nobody'}))\n";
    let bad = exec(
        k,
        &ns.name,
        &pod,
        &["python3", "-c", enqueue_bad, &url, QUEUE],
    )
    .unwrap_or_else(|e| panic!("the enqueue failed: {e}"))
    .trim()
    .to_string();
    let dead_key = format!("{QUEUE}:dead");
    let letter = eventually(Duration::from_secs(60), "a dead letter", |last| {
        let dead = count(&["LRANGE", &dead_key, "0", "-1"]);
        *last = dead.clone();
        (!dead.is_empty()).then_some(dead)
    });
    let letter: Value = serde_json::from_str(&letter)
        .unwrap_or_else(|e| panic!("one dead letter, JSON ({e}): {letter}"));
    assert_eq!(letter["reason"], "permanent", "{letter}");
    assert_eq!(letter["attempts"], 1, "no second attempt: {letter}");
    assert_eq!(letter["job"]["id"], bad.as_str(), "{letter}");
    assert!(
        letter["error"]
            .as_str()
            .unwrap_or_default()
            .contains("not an email address: 'nobody'"),
        "the dead letter has the handler's message: {letter}"
    );
    assert_eq!(count(&["GET", &format!("{QUEUE}:stats:dead")]), "1");
    assert_eq!(count(&["GET", &processed]), "6");
    let seen = records(k, &ns.name, &pod);
    assert!(
        of(&seen, "start").contains_key(&bad) && !of(&seen, "end").contains_key(&bad),
        "the bad email started and did not end: {seen:#?}"
    );
    eprintln!("  {bad} dead-lettered: {}", letter["error"]);
}
