//! Pod Security and the failures a pool shows: worker Pods that a namespace
//! enforcing the `restricted` standard admits, and why workers do not run
//! (refused Pods, an image that cannot be pulled, a quota) on the pool
//! itself, where `kubectl get wp` and `kubectl describe wp` look.

use std::time::Duration;

use serde_json::Value;

use crate::E2e;
use crate::cluster::{Cluster, Namespace, eventually};
use crate::scenarios::{Pool, Redis, event_reasons, ready_pods, summary_of_pods};

pub const ALL: &[crate::Scenario] = &[
    (
        "a_restricted_namespace_admits_a_pools_workers_and_shows_why_a_privileged_one_is_refused",
        a_restricted_namespace_admits_a_pools_workers_and_shows_why_a_privileged_one_is_refused,
    ),
    (
        "an_image_that_cannot_be_pulled_and_a_quota_that_forbids_pods_show_on_the_pool",
        an_image_that_cannot_be_pulled_and_a_quota_that_forbids_pods_show_on_the_pool,
    ),
    (
        "kubectl_explain_shows_the_fields_docs_as_paragraphs",
        kubectl_explain_shows_the_fields_docs_as_paragraphs,
    ),
];

/// `kubectl explain` wraps descriptions itself: a description that kept its
/// source's line breaks shows sentences broken mid-line ("Defaults" / "to 1.").
fn kubectl_explain_shows_the_fields_docs_as_paragraphs(e2e: &E2e) {
    let k = &e2e.cluster;
    for field in [
        "wp.spec.scaling.activationBacklog",
        "wp.spec.scaling.targetDrainSeconds",
        "wp.spec.queue.redis.tls",
    ] {
        let text = k.kubectl(&["explain", field]);
        let description: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("DESCRIPTION:"))
            .skip(1)
            .take_while(|l| !l.starts_with("FIELDS:"))
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        assert!(!description.is_empty(), "{field}: {text}");
        // Every line but a paragraph's last is filled to kubectl's width.
        for pair in description.windows(2) {
            let ends_sentence = pair[0].ends_with('.') || pair[0].ends_with(':');
            assert!(
                pair[0].len() >= 50 || ends_sentence,
                "{field}: a sentence broken mid-line at {:?}:\n{text}",
                pair[0]
            );
        }
    }
}

/// A pool's manifest with `change` applied to its spec.
fn edited(pool: &Pool, change: impl FnOnce(&mut Value)) -> String {
    let mut manifest: Value = serde_json::from_str(&pool.manifest()).expect("manifest");
    change(&mut manifest["spec"]);
    manifest.to_string()
}

/// The pool's spec with one worker always running, polled every second.
fn one_warm_worker(spec: &mut Value) {
    spec["scaling"]["minReplicas"] = 1.into();
}

/// The pool's Ready condition once `wanted` says so.
fn ready_condition(
    k: &Cluster,
    namespace: &str,
    pool: &str,
    what: &str,
    wanted: impl Fn(&Value) -> bool,
) -> Value {
    eventually(Duration::from_secs(90), what, |last| {
        let wp = k.get(&["wp", "-n", namespace, pool])?;
        let ready = wp["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "Ready")?
            .clone();
        *last = ready.to_string();
        wanted(&ready).then_some(ready)
    })
}

fn a_restricted_namespace_admits_a_pools_workers_and_shows_why_a_privileged_one_is_refused(
    e2e: &E2e,
) {
    let k = &e2e.cluster;
    // Redis runs as root, so it lives next door.
    let beside = Namespace::create(k, "e2e-psa-redis");
    let redis = Redis::start(k, &beside.name);
    let ns = Namespace::create(k, "e2e-restricted");
    k.kubectl(&[
        "label",
        "namespace",
        &ns.name,
        "pod-security.kubernetes.io/enforce=restricted",
    ]);

    // A minimal pool: its workers are admitted, become Ready and run jobs.
    let pool = Pool::new("plain", &redis).manual(1);
    k.apply(&ns.name, &pool.manifest());
    eventually(Duration::from_secs(90), "a Ready worker", |last| {
        let pods = k.get(&["pods", "-n", &ns.name, "-l", "workerpool.dev/pool=plain"])?;
        *last = summary_of_pods(&pods);
        (ready_pods(&pods).len() == 1).then_some(())
    });
    let ids: Vec<String> = (0..3).map(|i| format!("psa-{i}")).collect();
    redis.push("plain", &ids, 10);
    eventually(Duration::from_secs(60), "the jobs done", |last| {
        let done = redis.done();
        *last = format!("{done:?}");
        ids.iter().all(|id| done.contains_key(id)).then_some(())
    });
    let ready = ready_condition(k, &ns.name, "plain", "Ready True", |c| {
        c["status"] == "True"
    });
    assert_eq!(ready["reason"], "WorkersReady", "{ready}");

    // A template that asks for privileged: the namespace refuses its Pods,
    // and the pool says so with the API server's message.
    let privileged = edited(&Pool::new("privileged", &redis), |spec| {
        one_warm_worker(spec);
        spec["template"]["spec"]["containers"][0]["securityContext"] =
            serde_json::json!({"privileged": true});
    });
    k.apply(&ns.name, &privileged);
    let refused = ready_condition(k, &ns.name, "privileged", "Ready False FailedCreate", |c| {
        c["status"] == "False" && c["reason"] == "FailedCreate"
    });
    let message = refused["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("violates PodSecurity") && message.contains("privileged"),
        "{refused}"
    );
    eventually(Duration::from_secs(30), "a FailedCreate event", |last| {
        let reasons = event_reasons(k, &ns.name, "privileged");
        *last = format!("{reasons:?}");
        reasons.contains("FailedCreate").then_some(())
    });
    let table = k.kubectl(&["get", "wp", "-n", &ns.name, "privileged"]);
    assert!(table.contains("FailedCreate"), "a column shows it: {table}");
    // The pool is read every second; the failure stays one event.
    std::thread::sleep(Duration::from_secs(8));
    let events = k.kubectl(&[
        "get",
        "events",
        "-n",
        &ns.name,
        "--field-selector",
        "involvedObject.kind=WorkerPool,involvedObject.name=privileged,reason=FailedCreate",
        "-o",
        "json",
    ]);
    let events: Value = serde_json::from_str(&events).expect("events");
    let count: i64 = events["items"]
        .as_array()
        .map(|all| {
            all.iter()
                .map(|e| {
                    e["count"]
                        .as_i64()
                        .or(e["series"]["count"].as_i64())
                        .unwrap_or(1)
                })
                .sum()
        })
        .unwrap_or(0);
    assert_eq!(count, 1, "one event, not one per poll: {events}");

    // Fixed in the template: the condition clears by itself.
    k.apply(
        &ns.name,
        &edited(&Pool::new("privileged", &redis), one_warm_worker),
    );
    let ready = ready_condition(k, &ns.name, "privileged", "Ready True again", |c| {
        c["status"] == "True"
    });
    assert_eq!(ready["reason"], "WorkersReady", "{ready}");
}

fn an_image_that_cannot_be_pulled_and_a_quota_that_forbids_pods_show_on_the_pool(e2e: &E2e) {
    let k = &e2e.cluster;
    let ns = Namespace::create(k, "e2e-failures");
    let redis = Redis::start(k, &ns.name);

    let missing = edited(&Pool::new("missing", &redis).manual(1), |spec| {
        let worker = &mut spec["template"]["spec"]["containers"][0];
        worker["image"] = "registry.invalid/workerpool/nope:1".into();
        worker["imagePullPolicy"] = "IfNotPresent".into();
    });
    k.apply(&ns.name, &missing);
    let pull = ready_condition(
        k,
        &ns.name,
        "missing",
        "Ready False with a pull failure",
        |c| {
            matches!(
                c["reason"].as_str(),
                Some("ErrImagePull" | "ImagePullBackOff")
            )
        },
    );
    let message = pull["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("container worker") && message.contains("registry.invalid"),
        "{pull}"
    );

    // No Pods allowed in the namespace: the quota's message.
    k.apply(
        &ns.name,
        r#"{"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-pods"}, "spec": {"hard": {"pods": "1"}}}"#,
    );
    // Redis already takes the one Pod allowed.
    k.apply(&ns.name, &Pool::new("quota", &redis).manual(1).manifest());
    let quota = ready_condition(k, &ns.name, "quota", "Ready False FailedCreate", |c| {
        c["reason"] == "FailedCreate"
    });
    assert!(
        quota["message"]
            .as_str()
            .unwrap_or_default()
            .contains("exceeded quota"),
        "{quota}"
    );
}
