use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use proptest::prelude::*;
use serde_json::{Value, json};
use workerpool_queue::snapshot::WorkerActivity;

use super::*;
use crate::crd::DisruptionSpec;

fn on(after: i32) -> DisruptionSpec {
    DisruptionSpec {
        protect_busy_pods: true,
        protect_after_seconds: after,
        ..DisruptionSpec::default()
    }
}

fn pod(name: &str, annotations: &[(&str, &str)]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            annotations: (!annotations.is_empty()).then(|| {
                annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            }),
            ..ObjectMeta::default()
        },
        ..Pod::default()
    }
}

fn marked(name: &str) -> Pod {
    pod(
        name,
        &[
            (PROTECTED_SINCE, "2026-01-01T00:00:00Z"),
            (DO_NOT_DISRUPT, "true"),
            (SAFE_TO_EVICT, "false"),
        ],
    )
}

fn busy(ms: u64) -> WorkerActivity {
    WorkerActivity {
        in_flight: 1,
        busy_ms: Some(ms),
        idle_ms: None,
    }
}

fn idle(ms: u64) -> WorkerActivity {
    WorkerActivity {
        in_flight: 0,
        busy_ms: None,
        idle_ms: Some(ms),
    }
}

fn now() -> Timestamp {
    "2026-12-04T12:00:00Z".parse().expect("time")
}

fn decide(
    spec: Option<&DisruptionSpec>,
    pods: &[Pod],
    activity: &[(&str, WorkerActivity)],
) -> Protection {
    let activity: BTreeMap<String, WorkerActivity> =
        activity.iter().map(|(k, a)| (k.to_string(), *a)).collect();
    protection(spec, None, pods, &activity, now())
}

fn changes(p: &Protection) -> Vec<(&str, &Change)> {
    p.changes
        .iter()
        .map(|c| (c.pod.as_str(), &c.change))
        .collect()
}

#[test]
fn a_pod_is_protected_once_its_job_has_run_protect_after_seconds_with_both_autoscalers_marks() {
    let spec = on(60);
    let pods = [pod("young", &[]), pod("long", &[]), pod("idle", &[])];
    let p = decide(
        Some(&spec),
        &pods,
        &[
            ("young", busy(59_999)),
            ("long", busy(60_000)),
            ("idle", idle(600_000)),
        ],
    );
    assert_eq!(changes(&p), vec![("long", &Change::Protect)]);
    assert_eq!(p.protected, 1);
    assert_eq!(
        p.changes[0].patch,
        json!({"metadata": {"annotations": {
            PROTECTED_SINCE: "2026-12-04T12:00:00Z",
            DO_NOT_DISRUPT: "true",
            SAFE_TO_EVICT: "false",
        }}})
    );
}

#[test]
fn a_protected_pod_keeps_its_marks_until_its_worker_has_been_idle_as_long() {
    let spec = on(60);
    let pods = [
        marked("busy"),
        marked("resting"),
        marked("idle"),
        marked("gone"),
    ];
    let p = decide(
        Some(&spec),
        &pods,
        &[
            // A new short job on a protected pod: still protected.
            ("busy", busy(10)),
            ("resting", idle(59_000)),
            ("idle", idle(60_000)),
        ],
    );
    assert_eq!(
        changes(&p),
        vec![("idle", &Change::Release), ("gone", &Change::Release)]
    );
    assert_eq!(p.protected, 2);
    assert_eq!(
        p.changes[0].patch,
        json!({"metadata": {"annotations": {
            PROTECTED_SINCE: Value::Null,
            DO_NOT_DISRUPT: Value::Null,
            SAFE_TO_EVICT: Value::Null,
        }}})
    );
}

#[test]
fn with_protection_off_only_the_operators_marks_are_removed() {
    let pods = [
        marked("ours"),
        // Marked by a user, not by the operator: left alone.
        pod("theirs", &[(DO_NOT_DISRUPT, "true")]),
        pod("plain", &[]),
    ];
    let activity = [("ours", busy(600_000)), ("theirs", busy(600_000))];
    for spec in [None, Some(DisruptionSpec::default())] {
        let p = decide(spec.as_ref(), &pods, &activity);
        assert_eq!(changes(&p), vec![("ours", &Change::Release)]);
        assert_eq!(p.protected, 0);
    }
}

#[test]
fn the_templates_own_marks_are_never_removed_nor_written_again() {
    let template = BTreeMap::from([(DO_NOT_DISRUPT.to_string(), "true".to_string())]);
    let activity = BTreeMap::from([
        ("a".to_string(), busy(120_000)),
        ("b".to_string(), idle(120_000)),
    ]);
    let p = protection(
        Some(&on(60)),
        Some(&template),
        &[pod("a", &[(DO_NOT_DISRUPT, "true")]), marked("b")],
        &activity,
        now(),
    );
    let annotations = |i: usize| p.changes[i].patch["metadata"]["annotations"].clone();
    assert_eq!(
        changes(&p),
        vec![("a", &Change::Protect), ("b", &Change::Release)]
    );
    assert!(
        annotations(0).get(DO_NOT_DISRUPT).is_none(),
        "{}",
        annotations(0)
    );
    assert_eq!(annotations(0)[SAFE_TO_EVICT], "false");
    assert!(
        annotations(1).get(DO_NOT_DISRUPT).is_none(),
        "{}",
        annotations(1)
    );
    assert_eq!(annotations(1)[SAFE_TO_EVICT], Value::Null);
}

#[test]
fn a_pod_being_deleted_is_not_patched() {
    let mut going = marked("going");
    going.metadata.deletion_timestamp = Some(Time(now()));
    let p = decide(Some(&on(60)), &[going], &[]);
    assert!(p.changes.is_empty());
    assert_eq!(p.protected, 1);
}

/// One worker's day: jobs of random lengths with random gaps, looked at
/// every `poll` seconds, the decisions applied to the pod between looks.
fn day(jobs: &[(u64, u64)], poll: u64, after: i32) -> (u32, bool, Vec<(u64, bool)>) {
    // (start, end) of each job in ms.
    let mut spans = Vec::new();
    let mut t = 0;
    for (gap, length) in jobs {
        t += gap;
        spans.push((t, t + length));
        t += length;
    }
    let end = t + 10 * 60_000;
    let spec = on(after);
    let mut pod = pod("w", &[]);
    let mut patches = 0;
    let mut seen = Vec::new();
    let mut ever = false;
    let mut at = 0;
    while at <= end {
        let running = spans.iter().find(|(s, e)| *s <= at && at < *e);
        let activity = match running {
            Some((s, _)) => busy(at - s),
            None => {
                let last_end = spans
                    .iter()
                    .filter(|(_, e)| *e <= at)
                    .map(|(_, e)| *e)
                    .max()
                    .unwrap_or(0);
                idle(at - last_end)
            }
        };
        let p = protection(
            Some(&spec),
            None,
            std::slice::from_ref(&pod),
            &BTreeMap::from([("w".to_string(), activity)]),
            now(),
        );
        for c in &p.changes {
            patches += 1;
            let mut annotations = pod.metadata.annotations.clone().unwrap_or_default();
            for (k, v) in c.patch["metadata"]["annotations"]
                .as_object()
                .expect("annotations")
            {
                match v.as_str() {
                    Some(v) => annotations.insert(k.clone(), v.to_string()),
                    None => annotations.remove(k),
                };
            }
            pod.metadata.annotations = Some(annotations);
        }
        ever |= is_protected(&pod);
        seen.push((at, is_protected(&pod)));
        at += poll * 1000;
    }
    (patches, ever, seen)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// The marks change at most twice per 2 × protectAfterSeconds, plus
    /// one release at the end; jobs shorter than protectAfterSeconds never
    /// mark the pod; a job that runs protectAfterSeconds and a poll longer
    /// always does; the marks are off at the end of the day.
    #[test]
    fn marks_follow_long_jobs_and_their_writes_are_bounded(
        jobs in prop::collection::vec((0u64..200_000, 100u64..300_000), 1..30),
        poll in 1u64..60,
        after in 0i32..180,
    ) {
        let (patches, ever, seen) = day(&jobs, poll, after);
        let after_ms = u64::try_from(after).unwrap_or(0) * 1000;
        let span: u64 = jobs.iter().map(|(g, l)| g + l).sum();
        let cycle = (2 * after_ms).max(poll * 1000);
        let bound = 2 * (span / cycle + 1) as u32 + 1;
        prop_assert!(patches <= bound, "{patches} patches over {span} ms, bound {bound}");
        if jobs.iter().all(|(_, l)| *l < after_ms) {
            prop_assert!(!ever, "no job ran {after} s, yet the pod was marked");
        }
        if jobs.iter().any(|(_, l)| *l >= after_ms + poll * 1000) {
            prop_assert!(ever, "a job ran {after} s and a poll longer, yet the pod was never marked");
        }
        prop_assert_eq!(seen.last().map(|(_, p)| *p), Some(false), "marks left at the end of the day");
    }
}

#[test]
fn a_budget_is_owned_by_the_pool_selects_its_pods_and_lets_unready_pods_go() {
    let pool = crate::deployment::tests::pool(json!({
        "queue": {"redis": {"url": "redis://r:6379", "key": "mail"}},
        "template": {"spec": {"containers": [{"name": "worker", "image": "w"}]}},
        "scaling": {"minReplicas": 0, "maxReplicas": 5},
        "disruption": {"maxUnavailable": 1},
    }));
    let pdb = budget(&pool).expect("a budget");
    assert_eq!(pdb.metadata.name.as_deref(), Some("mail"));
    assert_eq!(pdb.metadata.namespace.as_deref(), Some("jobs"));
    let owner = &pdb.metadata.owner_references.as_ref().expect("owner")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("WorkerPool", "u-1")
    );
    let spec = pdb.spec.as_ref().expect("spec");
    assert_eq!(spec.max_unavailable, Some(IntOrString::Int(1)));
    assert_eq!(spec.min_available, None);
    assert_eq!(
        spec.unhealthy_pod_eviction_policy.as_deref(),
        Some("AlwaysAllow")
    );
    assert_eq!(
        spec.selector.as_ref().and_then(|s| s.match_labels.clone()),
        Some(BTreeMap::from([(
            "workerpool.dev/pool".to_string(),
            "mail".to_string()
        )]))
    );
    assert!(budget_holds(&pdb, &pdb.clone()));
    let mut other = pdb.clone();
    other.spec.as_mut().expect("spec").max_unavailable = Some(IntOrString::String("50%".into()));
    assert!(!budget_holds(&pdb, &other));
}

#[test]
fn no_budget_without_a_bound_and_min_available_as_written() {
    let with = |disruption: Value| {
        crate::deployment::tests::pool(json!({
            "queue": {"redis": {"url": "redis://r:6379", "key": "mail"}},
            "template": {"spec": {"containers": [{"name": "worker", "image": "w"}]}},
            "replicas": 3,
            "disruption": disruption,
        }))
    };
    assert!(budget(&with(json!({"protectBusyPods": true}))).is_none());
    let pdb = budget(&with(json!({"minAvailable": 2}))).expect("a budget");
    let spec = pdb.spec.expect("spec");
    assert_eq!(
        (spec.min_available, spec.max_unavailable),
        (Some(IntOrString::Int(2)), None)
    );
}
