//! Each rule with exact numbers, and the worked examples of the Kubernetes HPA
//! documentation: <https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/>.

use std::time::Duration;

use k8s_openapi::api::autoscaling::v2::{
    HPAScalingPolicy, HPAScalingRules, HorizontalPodAutoscalerBehavior,
};

use super::*;

fn at(seconds: u64) -> Duration {
    Duration::from_secs(seconds)
}

fn obs(backlog: u64, in_flight: u64, current: i32) -> Observation {
    Observation {
        backlog,
        in_flight,
        current_replicas: current,
        ready_replicas: current,
        ..Observation::default()
    }
}

/// Only the backlog target, no windows or policies: the raw rules show through.
fn plain() -> ScalingSpec {
    ScalingSpec {
        target_drain_seconds: None,
        behavior: Some(HorizontalPodAutoscalerBehavior {
            scale_up: Some(rules(0, None, vec![])),
            scale_down: Some(rules(0, None, vec![])),
        }),
        ..ScalingSpec::default()
    }
}

fn rules(window: i32, select: Option<&str>, policies: Vec<HPAScalingPolicy>) -> HPAScalingRules {
    HPAScalingRules {
        stabilization_window_seconds: Some(window),
        select_policy: select.map(str::to_string),
        policies: Some(policies),
        tolerance: None,
    }
}

fn pods(value: i32, period_seconds: i32) -> HPAScalingPolicy {
    HPAScalingPolicy {
        type_: "Pods".into(),
        value,
        period_seconds,
    }
}

fn percent(value: i32, period_seconds: i32) -> HPAScalingPolicy {
    HPAScalingPolicy {
        type_: "Percent".into(),
        value,
        period_seconds,
    }
}

#[test]
fn backlog_target_counts_waiting_and_running_jobs() {
    let decision = Engine::new().tick(&plain(), &obs(42, 8, 4), at(0));
    // ceil((42 + 8) / 5)
    assert_eq!(decision.desired, 10);
    assert_eq!(decision.reason.rule, Rule::BacklogTarget);
    assert_eq!(decision.reason.limit, None);
}

#[test]
fn scales_to_max_when_backlog_exceeds_capacity() {
    let decision = Engine::new().tick(&plain(), &obs(10_000, 0, 4), at(0));
    assert_eq!(decision.desired, 100);
    assert_eq!(decision.recommendation, 2000);
    assert_eq!(decision.reason.limit, Some(Limit::MaxReplicas));
    assert_eq!(decision.reason.code(), "MaxReplicas");
}

#[test]
fn holds_the_count_within_the_tolerance() {
    // 52 / (5 × 10) = 1.04, within 0.1 of 1: the HPA leaves the count alone.
    let decision = Engine::new().tick(&plain(), &obs(52, 0, 10), at(0));
    assert_eq!(decision.desired, 10);
    assert_eq!(decision.reason.rule, Rule::WithinTolerance);
    // 56 / 50 = 1.12 is outside it.
    assert_eq!(
        Engine::new().tick(&plain(), &obs(56, 0, 10), at(0)).desired,
        12
    );
}

#[test]
fn a_written_tolerance_replaces_the_default_per_direction() {
    let mut spec = plain();
    if let Some(behavior) = spec.behavior.as_mut()
        && let Some(up) = behavior.scale_up.as_mut()
    {
        up.tolerance = Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity(
            "20m".into(),
        ));
    }
    // 52 / 50 = 1.04 is outside a 2 % scale-up tolerance.
    assert_eq!(
        Engine::new().tick(&spec, &obs(52, 0, 10), at(0)).desired,
        11
    );
    // 46 / 50 = 0.92 is still inside the default 10 % scale-down tolerance.
    assert_eq!(
        Engine::new().tick(&spec, &obs(46, 0, 10), at(0)).desired,
        10
    );
}

/// Feeds two saturated samples: 4 ready replicas completing 1 job/s each, backlog steady
/// at 100, so arrivals are 4 jobs/s.
fn engine_with_measured_throughput(spec: &ScalingSpec) -> Engine {
    let mut engine = Engine::new();
    let mut o = obs(100, 4, 4);
    engine.tick(spec, &o, at(0));
    o.processed_total = 40;
    let mut held = spec.clone();
    held.target_drain_seconds = None;
    engine.tick(&held, &o, at(10));
    engine
}

#[test]
fn the_backlog_target_counts_at_least_a_workers_slots_per_worker() {
    // 8 jobs running on one worker of 8 slots, none waiting: the default target of 5
    // would ask for ceil(8 / 5) = 2 workers, one of them for jobs the first already runs.
    let spec = plain();
    let mut engine = Engine::new();
    engine.set_workers(Workers::new(None, 8));
    let decision = engine.tick(&spec, &obs(0, 8, 1), at(0));
    assert_eq!(decision.proposals.backlog, 1, "{decision:?}");
    // 9 jobs are more than one worker runs at once.
    let decision =
        Engine::new()
            .with_workers(Workers::new(None, 8))
            .tick(&spec, &obs(1, 8, 1), at(0));
    assert_eq!(decision.proposals.backlog, 2, "{decision:?}");
    // A target above the concurrency is kept as written.
    let roomy = ScalingSpec {
        target_backlog_per_replica: 20,
        ..plain()
    };
    let decision =
        Engine::new()
            .with_workers(Workers::new(None, 8))
            .tick(&roomy, &obs(30, 8, 1), at(0));
    assert_eq!(decision.proposals.backlog, 2, "ceil(38 / 20)");
}

#[test]
fn a_poll_with_nothing_waiting_running_or_completed_sizes_no_pods_for_arrivals() {
    let spec = ScalingSpec {
        target_backlog_per_replica: 1000,
        target_drain_seconds: Some(60),
        ..plain()
    };
    // 4 jobs/s measured; then the queue is drained and the workers idle.
    let mut engine = engine_with_measured_throughput(&spec);
    assert_eq!(engine.rates().arrival_rate(), Some(4.0));
    let quiet = Observation {
        processed_total: 40,
        ..obs(0, 0, 4)
    };
    let decision = engine.tick(&spec, &quiet, at(20));
    assert_eq!(decision.proposals.drain, Some(0), "{decision:?}");
    assert_eq!(decision.reason.rule, Rule::AwaitingIdle);
    assert_eq!(decision.desired, 1);
    // One job completed since the last poll: arrivals are still coming.
    let mut engine = engine_with_measured_throughput(&spec);
    let busy = Observation {
        processed_total: 41,
        ..obs(0, 0, 4)
    };
    let decision = engine.tick(&spec, &busy, at(20));
    assert_eq!(decision.proposals.drain, Some(4), "{decision:?}");
}

#[test]
fn drain_target_sizes_for_arrivals_plus_clearing_the_backlog() {
    let spec = ScalingSpec {
        target_backlog_per_replica: 1000,
        target_drain_seconds: Some(60),
        ..plain()
    };
    let mut engine = engine_with_measured_throughput(&spec);
    assert_eq!(engine.rates().arrival_rate(), Some(4.0));
    assert_eq!(engine.rates().per_replica_throughput(), Some(1.0));
    let decision = engine.tick(
        &spec,
        &Observation {
            processed_total: 80,
            ..obs(100, 4, 4)
        },
        at(20),
    );
    // ceil((4 + 100 / 60) / 1) = ceil(5.67)
    assert_eq!(decision.proposals.drain, Some(6));
    assert_eq!(decision.desired, 6);
    assert_eq!(decision.reason.rule, Rule::DrainTarget);
}

/// One ready pod of 4 slots that completes 8 jobs/s (jobs of 0.5 s), a measured
/// start-up of 20 s and no arrivals besides the backlog: the state after a first spike.
fn engine_with_one_warm_pod(spec: &ScalingSpec) -> Engine {
    let mut engine = Engine::new();
    engine.set_workers(Workers::new(None, 4));
    engine.applied(at(0), 0, 1);
    let saturated = |backlog, processed| Observation {
        processed_total: processed,
        ..obs(backlog, 4, 1)
    };
    // Ready 20 s after the scale-up; then 40 jobs done in 5 s with jobs waiting throughout.
    engine.tick(spec, &saturated(80, 0), at(20));
    engine.tick(spec, &saturated(40, 40), at(25));
    assert_eq!(engine.startup().seconds(), Some(20.0));
    assert_eq!(engine.rates().per_replica_throughput(), Some(8.0));
    assert_eq!(engine.rates().sustained_arrival_rate(), Some(0.0));
    engine
}

#[test]
fn a_spike_the_ready_pods_clear_before_a_new_pod_is_ready_starts_no_pod() {
    let spec = plain();
    // 100 jobs: the warm pod clears them in 13 s, before a pod started now is ready.
    let mut engine = engine_with_one_warm_pod(&spec);
    let decision = engine.tick(&spec, &obs(100, 4, 1), at(30));
    assert_eq!(decision.proposals.backlog, 0, "instead of ceil(104 / 5)");
    assert_eq!(decision.desired, 1);
    // 400 jobs: 160 are done when a new pod is ready; the 244 left are 122 slot-seconds
    // of work, and a new pod is worth starting per 4 slots × 20 s = 80 of them: the warm
    // pod and ceil(1.5) new ones, not ceil(244 / 5) = 49 pods that would each spend 20 s
    // starting for 2.5 s of work.
    let mut engine = engine_with_one_warm_pod(&spec);
    let decision = engine.tick(&spec, &obs(400, 4, 1), at(30));
    assert_eq!(decision.proposals.backlog, 3);
    assert_eq!(decision.desired, 3);
    assert_eq!(decision.reason.rule, Rule::BacklogTarget);
    // A spike ten times larger is worth ten times the new pods: the same rule, not a cap.
    let mut engine = engine_with_one_warm_pod(&spec);
    let decision = engine.tick(&spec, &obs(4_000, 4, 1), at(30));
    // (4004 - 160) × 0.5 / 80 = 24.03 new pods.
    assert_eq!(decision.proposals.backlog, 26);
}

#[test]
fn without_a_measured_start_up_every_pod_the_backlog_target_asks_for_is_started() {
    let spec = plain();
    let mut engine = Engine::new();
    engine.set_workers(Workers::new(None, 4));
    let decision = engine.tick(&spec, &obs(400, 4, 1), at(30));
    assert_eq!(decision.proposals.backlog, 81, "ceil(404 / 5)");
}

#[test]
fn pods_still_starting_do_not_count_as_capacity() {
    let spec = plain();
    let mut engine = engine_with_one_warm_pod(&spec);
    // Three pods, none ready: nothing is drained before a new pod would be ready, so
    // the 100 jobs still ask for a pod; three ready ones would clear them first.
    let starting = Observation {
        ready_replicas: 0,
        ..obs(100, 0, 3)
    };
    assert_eq!(
        engine
            .clone()
            .tick(&spec, &starting, at(30))
            .proposals
            .backlog,
        1
    );
    let ready = obs(100, 0, 3);
    assert_eq!(engine.tick(&spec, &ready, at(30)).proposals.backlog, 0);
}

#[test]
fn the_whole_backlog_counts_until_the_start_up_time_is_measured() {
    let spec = ScalingSpec {
        target_drain_seconds: None,
        ..plain()
    };
    let mut engine = engine_with_measured_throughput(&spec);
    assert_eq!(engine.startup().seconds(), None);
    let decision = engine.tick(&spec, &obs(100, 4, 4), at(20));
    assert_eq!(decision.proposals.backlog, 21, "ceil(104 / 5)");
}

#[test]
fn drain_target_waits_until_throughput_is_known() {
    let spec = ScalingSpec {
        target_backlog_per_replica: 1000,
        target_drain_seconds: Some(60),
        ..plain()
    };
    let decision = Engine::new().tick(&spec, &obs(100, 4, 4), at(0));
    assert_eq!(decision.proposals.drain, None);
    assert_eq!(decision.reason.rule, Rule::BacklogTarget);
}

#[test]
fn wait_target_uses_the_hpa_value_form_on_ready_replicas() {
    let spec = ScalingSpec {
        target_backlog_per_replica: 1000,
        target_wait_seconds: Some(30),
        ..plain()
    };
    let o = Observation {
        oldest_job_age_seconds: Some(90.0),
        ready_replicas: 3,
        ..obs(10, 4, 4)
    };
    let decision = Engine::new().tick(&spec, &o, at(0));
    // ceil(3 ready × 90 s / 30 s)
    assert_eq!(decision.proposals.wait, Some(9));
    assert_eq!(decision.desired, 9);
    assert_eq!(decision.reason.rule, Rule::WaitTarget);
}

#[test]
fn wait_target_estimates_the_age_from_backlog_and_throughput_without_timestamps() {
    let spec = ScalingSpec {
        target_backlog_per_replica: 1000,
        target_wait_seconds: Some(10),
        ..plain()
    };
    let mut engine = Engine::new();
    engine.tick(&spec, &obs(60, 2, 2), at(0));
    // 20 completed in 10 s: 2 jobs/s, so 60 waiting jobs are about 30 s old.
    let decision = engine.tick(
        &spec,
        &Observation {
            processed_total: 20,
            ..obs(60, 2, 2)
        },
        at(10),
    );
    assert_eq!(
        decision.proposals.wait, None,
        "rates are used from the next tick on"
    );
    let decision = engine.tick(
        &spec,
        &Observation {
            processed_total: 40,
            ..obs(60, 2, 2)
        },
        at(20),
    );
    // ceil(2 ready × 30 s / 10 s)
    assert_eq!(decision.proposals.wait, Some(6));
    assert_eq!(decision.desired, 6);
}

#[test]
fn the_largest_target_wins() {
    let spec = ScalingSpec {
        target_backlog_per_replica: 10,
        target_wait_seconds: Some(30),
        ..plain()
    };
    let o = Observation {
        oldest_job_age_seconds: Some(60.0),
        ..obs(95, 5, 4)
    };
    let decision = Engine::new().tick(&spec, &o, at(0));
    assert_eq!(decision.proposals.backlog, 10);
    assert_eq!(decision.proposals.wait, Some(8));
    assert_eq!(decision.desired, 10);
    assert_eq!(decision.reason.rule, Rule::BacklogTarget);
}

#[test]
fn wakes_from_zero_straight_to_the_computed_size() {
    // The HPA default would allow 4 pods in the first 15 s; KEDA would go to 1 first.
    let spec = ScalingSpec {
        behavior: None,
        ..plain()
    };
    // The queue's jobs have been timed before (the duration kept in Redis).
    let timed = Observation {
        job_seconds: Some(1.0),
        ..obs(200, 0, 0)
    };
    let decision = Engine::new().tick(&spec, &timed, at(0));
    assert_eq!(decision.desired, 40);
    assert_eq!(decision.reason.rule, Rule::Activation);
    assert_eq!(decision.reason.limit, None);
}

#[test]
fn a_wake_before_any_job_was_timed_starts_the_square_root_then_what_is_worth_starting() {
    let spec = ScalingSpec {
        behavior: None,
        ..plain()
    };
    // 200 jobs, a target of 5: 40 pods if each job took as long as the target assumes,
    // one if they are short. Nothing tells which yet: ⌈√40⌉ = 7.
    let mut engine = Engine::new();
    engine.set_workers(Workers::new(None, 4));
    let woke = engine.tick(&spec, &obs(200, 0, 0), at(0));
    assert_eq!(woke.desired, 7, "{woke:?}");
    assert_eq!(woke.recommendation, 7);
    assert_eq!(woke.reason.rule, Rule::Activation);
    assert_eq!(woke.reason.limit, Some(Limit::UnknownJobDuration));
    assert_eq!(woke.reason.code(), "UnknownJobDuration");
    assert!(
        woke.reason.message().contains("square root"),
        "{}",
        woke.reason
    );
    engine.applied(at(0), 0, 7);
    // While those start, the backlog grows, but nothing more is known: no pods are
    // added to the ones still starting.
    let starting = Observation {
        ready_replicas: 0,
        ..obs(260, 0, 7)
    };
    assert_eq!(engine.tick(&spec, &starting, at(5)).desired, 7);
    assert_eq!(engine.tick(&spec, &starting, at(10)).desired, 7);
    // Ready after 15 s, and the workers have timed their first jobs: 2 s each. The 260
    // jobs are 520 slot-seconds of work, 130 s for one pod of 4 slots; a new pod
    // ready 15 s from now is worth starting for every 15 s of that work not yet
    // covered, so the pool grows, by no more than the work's 520 / (4 × 15) ≈ 9 new pods.
    let ready = Observation {
        job_seconds: Some(2.0),
        in_flight: 28,
        ..obs(232, 0, 7)
    };
    let grown = engine.tick(&spec, &ready, at(15));
    assert!(grown.desired > 7, "{grown:?}");
    assert!(grown.desired <= 7 + 9, "{grown:?}");
    assert_eq!(grown.reason.limit, None, "{grown:?}");
    // A queue whose jobs were timed is sized in one step, and the limit does not show.
    let mut known = Engine::new();
    let timed = Observation {
        job_seconds: Some(2.0),
        ..obs(200, 0, 0)
    };
    let woke = known.tick(&spec, &timed, at(0));
    assert_eq!((woke.desired, woke.reason.limit), (40, None));
}

#[test]
fn stays_at_zero_below_the_activation_backlog() {
    let spec = ScalingSpec {
        activation_backlog: 10,
        ..plain()
    };
    let decision = Engine::new().tick(&spec, &obs(9, 0, 0), at(0));
    assert_eq!(decision.desired, 0);
    assert_eq!(decision.reason.rule, Rule::BelowActivation);
    assert_eq!(Engine::new().tick(&spec, &obs(10, 0, 0), at(0)).desired, 2);
}

#[test]
fn due_retries_count_towards_activation_once() {
    let spec = plain();
    let decision = Engine::new().tick(
        &spec,
        &Observation {
            due: 1,
            ..obs(1, 0, 0)
        },
        at(0),
    );
    assert_eq!(decision.desired, 1);
}

/// A queue with `due` due retries and `waiting` jobs in its list, as the
/// snapshot reads it.
fn observed(waiting: u64, due: u64) -> Observation {
    let snapshot = workerpool_queue::snapshot::Snapshot {
        server_time_ms: 1_000,
        queues: vec![workerpool_queue::snapshot::QueueFigures {
            name: "q".into(),
            waiting,
            retries_due: due,
            retries: due,
            ..Default::default()
        }],
    };
    Observation::from_counts(&snapshot.counts(), 0, 0)
}

#[test]
fn a_due_retry_counts_once_towards_activation_through_the_snapshot() {
    let spec = ScalingSpec {
        activation_backlog: 2,
        ..plain()
    };
    // One due retry is one job: below an activation backlog of two.
    let one = Engine::new().tick(&spec, &observed(0, 1), at(0));
    assert_eq!((one.desired, one.reason.rule), (0, Rule::BelowActivation));
    for (waiting, due) in [(0, 2), (1, 1), (2, 0)] {
        let two = Engine::new().tick(&spec, &observed(waiting, due), at(0));
        assert_eq!(two.desired, 1, "{waiting} waiting, {due} due");
        assert_eq!(two.reason.rule, Rule::Activation);
    }
}

#[test]
fn goes_to_zero_only_after_idle_seconds_before_zero() {
    let spec = ScalingSpec {
        idle_seconds_before_zero: Some(300),
        ..plain()
    };
    let mut engine = Engine::new();
    let first = engine.tick(&spec, &obs(0, 0, 3), at(1000));
    assert_eq!(first.desired, 1);
    assert_eq!(first.reason.rule, Rule::AwaitingIdle);
    assert_eq!(engine.tick(&spec, &obs(0, 0, 1), at(1299)).desired, 1);
    let last = engine.tick(&spec, &obs(0, 0, 1), at(1300));
    assert_eq!(last.desired, 0);
    assert_eq!(last.reason.rule, Rule::IdleToZero);
}

/// Ticks an idle pool of one every 5 s from `from` until it goes to zero (or `until`),
/// and returns when it did. Seven jobs were completed before, none since.
fn idle_until_zero(engine: &mut Engine, spec: &ScalingSpec, from: u64, until: u64) -> Option<u64> {
    (from..=until).step_by(5).find(|&t| {
        let o = Observation {
            processed_total: 7,
            ..obs(0, 0, 1)
        };
        engine.tick(spec, &o, at(t)).desired == 0
    })
}

#[test]
fn left_out_the_idle_hold_is_one_start_up_until_work_is_seen_to_come_back_within_300_s() {
    let spec = ScalingSpec {
        idle_seconds_before_zero: None,
        ..plain()
    };
    let busy = |t: u64, engine: &mut Engine| {
        let o = Observation {
            processed_total: 7,
            ..obs(0, 1, 1)
        };
        engine.tick(&spec, &o, at(t));
    };
    // No pod start-up timed yet: the full 300 s.
    let engine = Engine::new();
    assert_eq!(
        engine.idle_hold(&spec),
        IdleHold {
            seconds: 300,
            basis: HoldBasis::StartupUnknown
        }
    );
    // Woken at 0, ready after 20 s, busy until 30: with no earlier idle spell the last
    // worker is kept one start-up (20 s) and no longer.
    let mut engine = Engine::new();
    engine.applied(at(0), 0, 1);
    busy(20, &mut engine);
    busy(30, &mut engine);
    assert_eq!(engine.startup().seconds(), Some(20.0));
    let zero = idle_until_zero(&mut engine, &spec, 35, 1000);
    assert_eq!(zero, Some(55), "idle from 35, kept 20 s");
    // Work came back 120 s after the pool went idle (a pod ready 20 s after the wake):
    // within 300 s, but once is not yet a pattern, and the hold stays one start-up.
    engine.applied(at(135), 0, 1);
    busy(155, &mut engine);
    assert_eq!(engine.startup().seconds(), Some(20.0));
    assert_eq!(engine.idle_hold(&spec).basis, HoldBasis::Startup);
    assert_eq!(idle_until_zero(&mut engine, &spec, 160, 2000), Some(180));
    // A second time: the next idle spell keeps the worker 300 s.
    engine.applied(at(260), 0, 1);
    busy(280, &mut engine);
    let hold = engine.idle_hold(&spec);
    assert_eq!((hold.seconds, hold.basis), (300, HoldBasis::WorkReturns));
    assert_eq!(idle_until_zero(&mut engine, &spec, 285, 2000), Some(585));
    // Then work comes back only after an hour, three times: most of the spells remembered
    // outlast 300 s, and the hold is one start-up again.
    let mut t = 585;
    for _ in 0..3 {
        t += 3600;
        engine.applied(at(t), 0, 1);
        busy(t + 20, &mut engine);
        let zero = idle_until_zero(&mut engine, &spec, t + 25, t + 1000).expect("to zero");
        t = zero;
    }
    let hold = engine.idle_hold(&spec);
    assert_eq!((hold.seconds, hold.basis), (20, HoldBasis::Startup));
    let message = engine
        .tick(&spec, &obs(0, 0, 1), at(t + 1))
        .reason
        .message();
    assert!(message.contains("20 s (one pod start-up"), "{message}");
    // A written idleSecondsBeforeZero is kept as written, whatever was learned.
    let written = ScalingSpec {
        idle_seconds_before_zero: Some(120),
        ..plain()
    };
    assert_eq!(engine.idle_hold(&written).seconds, 120);
}

#[test]
fn jobs_completed_between_two_polls_are_work_for_the_idle_countdown() {
    let spec = ScalingSpec {
        idle_seconds_before_zero: Some(30),
        ..plain()
    };
    let mut engine = Engine::new();
    // No poll sees a job waiting or running, but one completes between every two polls.
    for (i, t) in (0..=100).step_by(10).enumerate() {
        let o = Observation {
            processed_total: i as u64,
            ..obs(0, 0, 1)
        };
        assert_eq!(engine.tick(&spec, &o, at(t)).desired, 1, "at {t}");
    }
    // They stop: 30 s after the first poll that saw nothing new, the pool goes to zero.
    let quiet = Observation {
        processed_total: 10,
        ..obs(0, 0, 1)
    };
    assert_eq!(engine.tick(&spec, &quiet, at(110)).desired, 1);
    assert_eq!(engine.tick(&spec, &quiet, at(135)).desired, 1);
    assert_eq!(engine.tick(&spec, &quiet, at(140)).desired, 0);
}

#[test]
fn any_pending_work_restarts_the_idle_countdown() {
    let spec = ScalingSpec {
        idle_seconds_before_zero: Some(300),
        ..plain()
    };
    let mut engine = Engine::new();
    engine.tick(&spec, &obs(0, 0, 1), at(0));
    engine.tick(
        &spec,
        &Observation {
            due: 1,
            ..obs(1, 0, 1)
        },
        at(200),
    );
    engine.tick(&spec, &obs(0, 1, 1), at(250));
    assert_eq!(engine.tick(&spec, &obs(0, 0, 1), at(400)).desired, 1);
    // Idle since 400, after the last in-flight job.
    assert_eq!(engine.tick(&spec, &obs(0, 0, 1), at(699)).desired, 1);
    assert_eq!(engine.tick(&spec, &obs(0, 0, 1), at(700)).desired, 0);
}

#[test]
fn keeps_min_replicas_when_idle() {
    let spec = ScalingSpec {
        min_replicas: 2,
        idle_seconds_before_zero: Some(0),
        ..plain()
    };
    let decision = Engine::new().tick(&spec, &obs(0, 0, 5), at(0));
    assert_eq!(decision.desired, 2);
    assert_eq!(decision.reason.limit, Some(Limit::MinReplicas));
}

#[test]
fn holds_the_count_while_the_queue_cannot_be_read_then_falls_back() {
    let spec = ScalingSpec {
        fallback: Some(FallbackSpec {
            failure_threshold: 3,
            replicas: 2,
        }),
        ..plain()
    };
    let mut engine = Engine::new();
    let first = engine.tick_failed(&spec, 7);
    assert_eq!(
        (
            first.desired,
            first.reason.rule,
            first.reason.consecutive_failures
        ),
        (7, Rule::MetricsUnavailable, 1)
    );
    assert_eq!(engine.tick_failed(&spec, 7).desired, 7);
    let third = engine.tick_failed(&spec, 7);
    assert_eq!(
        (third.desired, third.reason.rule, third.reason.code()),
        (2, Rule::Fallback, "Fallback")
    );
    assert!(
        third.reason.message().contains("3 times"),
        "{}",
        third.reason.message()
    );
    // One good read resets the count.
    engine.tick(&spec, &obs(10, 0, 2), at(15));
    assert_eq!(engine.tick_failed(&spec, 2).reason.consecutive_failures, 1);
}

#[test]
fn an_unreadable_queue_still_holds_the_pool_within_its_bounds() {
    // A new pool with minReplicas 1 starts a worker before its queue is ever read.
    let floor = ScalingSpec {
        min_replicas: 1,
        ..plain()
    };
    let decision = Engine::new().tick_failed(&floor, 0);
    assert_eq!(
        (decision.desired, decision.reason.limit),
        (1, Some(Limit::MinReplicas))
    );
    assert!(
        decision.reason.message().contains("raised to minReplicas"),
        "{}",
        decision.reason.message()
    );
    // maxReplicas lowered together with a bad URL: the pool shrinks to it.
    let ceiling = ScalingSpec {
        max_replicas: 1,
        ..plain()
    };
    let decision = Engine::new().tick_failed(&ceiling, 3);
    assert_eq!(
        (decision.desired, decision.reason.limit),
        (1, Some(Limit::MaxReplicas))
    );
    // Within the bounds the count is kept, with no limit named.
    let decision = Engine::new().tick_failed(&plain(), 3);
    assert_eq!((decision.desired, decision.reason.limit), (3, None));
}

#[test]
fn without_fallback_the_count_is_held_indefinitely() {
    let mut engine = Engine::new();
    for _ in 0..10 {
        assert_eq!(engine.tick_failed(&plain(), 4).desired, 4);
    }
}

// "if the current metric value is 200m, and the desired value is 100m, the number of
// replicas will be doubled, since 200.0 / 100.0 == 2.0. If the current value is instead
// 50m, you'll halve the number of replicas" (Algorithm details).
#[test]
fn hpa_doc_doubling_and_halving_with_a_value_metric() {
    let spec = ScalingSpec {
        target_backlog_per_replica: 1000,
        target_wait_seconds: Some(100),
        ..plain()
    };
    let doubled = Engine::new().tick(
        &spec,
        &Observation {
            oldest_job_age_seconds: Some(200.0),
            ..obs(1, 0, 4)
        },
        at(0),
    );
    assert_eq!(doubled.desired, 8);
    let halved = Engine::new().tick(
        &spec,
        &Observation {
            oldest_job_age_seconds: Some(50.0),
            ..obs(1, 0, 4)
        },
        at(0),
    );
    assert_eq!(halved.desired, 2);
}

// The default scale-up behavior: "scaleUp: policies: Percent 100 per 15 s, Pods 4 per 15 s,
// selectPolicy: Max" (Default Behavior). From 1 replica the Pods policy allows 5; from 10
// the Percent policy allows 20.
#[test]
fn hpa_doc_default_scale_up_is_four_pods_or_double_per_fifteen_seconds() {
    let spec = ScalingSpec {
        behavior: Some(HorizontalPodAutoscalerBehavior {
            scale_up: Some(rules(0, Some("Max"), vec![percent(100, 15), pods(4, 15)])),
            scale_down: Some(rules(0, None, vec![])),
        }),
        ..plain()
    };
    let mut engine = Engine::new();
    let steps: Vec<i32> = [(1, 0), (5, 15), (10, 30), (20, 45), (40, 60), (80, 75)]
        .into_iter()
        .map(|(current, t)| engine.tick(&spec, &obs(10_000, 0, current), at(t)).desired)
        .collect();
    assert_eq!(steps, [5, 10, 20, 40, 80, 100]);
    let limited = engine.tick(&spec, &obs(10_000, 0, 1), at(200));
    assert_eq!(limited.reason.limit, Some(Limit::ScaleUpLimit));
}

/// Ticks and applies the decision, as the actuators do when the change succeeds.
fn tick_applied(
    engine: &mut Engine,
    spec: &ScalingSpec,
    o: &Observation,
    now: Duration,
) -> Decision {
    let decision = engine.tick(spec, o, now);
    if decision.desired != o.current_replicas {
        engine.applied(now, o.current_replicas, decision.desired);
    }
    decision
}

#[test]
fn a_policy_counts_the_changes_already_made_within_its_period() {
    let spec = ScalingSpec {
        behavior: Some(HorizontalPodAutoscalerBehavior {
            scale_up: Some(rules(0, None, vec![pods(4, 60)])),
            scale_down: Some(rules(0, None, vec![])),
        }),
        ..plain()
    };
    let mut engine = Engine::new();
    assert_eq!(
        tick_applied(&mut engine, &spec, &obs(1000, 0, 2), at(0)).desired,
        6
    );
    // Within the same 60 s the 4 pods are used up.
    assert_eq!(
        tick_applied(&mut engine, &spec, &obs(1000, 0, 6), at(30)).desired,
        6
    );
    // A period later the policy allows 4 more.
    assert_eq!(
        tick_applied(&mut engine, &spec, &obs(1000, 0, 6), at(60)).desired,
        10
    );
}

#[test]
fn a_decision_that_was_not_applied_is_no_scale_event() {
    let spec = ScalingSpec {
        behavior: Some(HorizontalPodAutoscalerBehavior {
            scale_up: Some(rules(0, None, vec![pods(4, 60)])),
            scale_down: Some(rules(0, None, vec![])),
        }),
        ..plain()
    };
    let mut engine = Engine::new();
    // Decided, but the apply failed: the workload is still at 2.
    assert_eq!(engine.tick(&spec, &obs(1000, 0, 2), at(0)).desired, 6);
    // The next poll may still add the policy's 4 pods.
    assert_eq!(
        tick_applied(&mut engine, &spec, &obs(1000, 0, 2), at(5)).desired,
        6
    );
    // That one was applied: nothing more within the period.
    assert_eq!(engine.tick(&spec, &obs(1000, 0, 6), at(10)).desired, 6);
}

// The scale-down example of "Scaling Policies": Pods 4 per 60 s and Percent 10 per 60 s,
// selectPolicy Max. "if there are 80 replicas and the target has to be scaled down to 10
// replicas then during the first step 8 replicas will be reduced. In the next iteration
// when the number of replicas is 72, 10% of the pods is 7.2 but the number is rounded up
// to 8 ... When the number of replicas falls below 40 the first policy (Pods) is applied
// and 4 replicas will be reduced at a time."
#[test]
fn hpa_doc_scale_down_policies_remove_ten_percent_or_four_pods_per_minute() {
    let spec = ScalingSpec {
        behavior: Some(HorizontalPodAutoscalerBehavior {
            scale_up: Some(rules(0, None, vec![])),
            scale_down: Some(rules(0, None, vec![pods(4, 60), percent(10, 60)])),
        }),
        ..plain()
    };
    let mut engine = Engine::new();
    let mut current = 80;
    let mut seen = vec![];
    for minute in 0..12 {
        // 50 jobs with 5 per replica: the target is 10 replicas.
        current = engine
            .tick(&spec, &obs(50, 0, current), at(minute * 60))
            .desired;
        seen.push(current);
    }
    assert_eq!(seen, [72, 64, 57, 51, 45, 40, 36, 32, 28, 24, 20, 16]);
    assert_eq!(
        engine.tick(&spec, &obs(50, 0, 16), at(720)).reason.limit,
        Some(Limit::ScaleDownLimit)
    );
}

// "To ensure that no more than 5 Pods are removed per minute, you can add a second
// scale-down policy with a fixed size of 5, and set selectPolicy to minimum."
#[test]
fn hpa_doc_select_policy_min_takes_the_smallest_change() {
    let spec = ScalingSpec {
        behavior: Some(HorizontalPodAutoscalerBehavior {
            scale_up: Some(rules(0, None, vec![])),
            scale_down: Some(rules(0, Some("Min"), vec![percent(10, 60), pods(5, 60)])),
        }),
        ..plain()
    };
    // From 80: 10 % would remove 8, 5 pods removes 5; Min keeps the smaller change.
    assert_eq!(Engine::new().tick(&spec, &obs(0, 5, 80), at(0)).desired, 75);
    // From 20: 10 % removes 2, fewer than 5.
    assert_eq!(Engine::new().tick(&spec, &obs(0, 5, 20), at(0)).desired, 18);
}

// "selectPolicy: Disabled" for scaleDown: "the autoscaler never scales the target down".
#[test]
fn hpa_doc_disabled_scale_down_never_shrinks() {
    let spec = ScalingSpec {
        behavior: Some(HorizontalPodAutoscalerBehavior {
            scale_up: None,
            scale_down: Some(HPAScalingRules {
                select_policy: Some("Disabled".into()),
                ..HPAScalingRules::default()
            }),
        }),
        ..plain()
    };
    let mut engine = Engine::new();
    for minute in 0..20 {
        let decision = engine.tick(&spec, &obs(5, 0, 10), at(minute * 60));
        assert_eq!(decision.desired, 10);
    }
    assert_eq!(engine.tick(&spec, &obs(500, 0, 10), at(2000)).desired, 100);
}

// The default scale-down stabilization: "the highest recommendation for the last 300sec is
// used" (HPAScalingRules.stabilizationWindowSeconds), and "Stabilization window" section.
#[test]
fn hpa_doc_scale_down_stabilization_uses_the_highest_recent_recommendation() {
    let spec = ScalingSpec {
        behavior: Some(HorizontalPodAutoscalerBehavior {
            scale_up: None,
            scale_down: Some(HPAScalingRules {
                stabilization_window_seconds: Some(300),
                ..HPAScalingRules::default()
            }),
        }),
        ..plain()
    };
    let mut engine = Engine::new();
    assert_eq!(engine.tick(&spec, &obs(50, 0, 10), at(0)).desired, 10);
    let held = engine.tick(&spec, &obs(30, 0, 10), at(100));
    assert_eq!((held.desired, held.recommendation), (10, 6));
    assert_eq!(held.reason.limit, Some(Limit::ScaleDownStabilized));
    assert_eq!(engine.tick(&spec, &obs(20, 0, 10), at(200)).desired, 10);
    // The 10 from t=0 has left the window; 6 (t=100) is now the highest.
    assert_eq!(engine.tick(&spec, &obs(10, 0, 10), at(300)).desired, 6);
    assert_eq!(engine.tick(&spec, &obs(10, 0, 6), at(400)).desired, 4);
    assert_eq!(engine.tick(&spec, &obs(10, 0, 4), at(500)).desired, 2);
}

#[test]
fn scale_up_stabilization_uses_the_lowest_recent_recommendation() {
    let spec = ScalingSpec {
        behavior: Some(HorizontalPodAutoscalerBehavior {
            scale_up: Some(rules(60, None, vec![])),
            scale_down: Some(rules(0, None, vec![])),
        }),
        ..plain()
    };
    let mut engine = Engine::new();
    assert_eq!(engine.tick(&spec, &obs(10, 0, 2), at(0)).desired, 2);
    let held = engine.tick(&spec, &obs(100, 0, 2), at(30));
    assert_eq!(
        (held.desired, held.reason.limit),
        (2, Some(Limit::ScaleUpStabilized))
    );
    assert_eq!(engine.tick(&spec, &obs(100, 0, 2), at(60)).desired, 20);
}

/// A pool of 6 workers of `slots` slots that a backlog sized at 20 s, its pods timed
/// at 20 s to start; then nothing waits and `running` jobs run at every poll. When does
/// it first shrink?
fn first_shrink_with(slots: i32, running: u64) -> Option<u64> {
    let spec = ScalingSpec {
        target_drain_seconds: None,
        ..ScalingSpec::default()
    };
    let mut engine = Engine::new();
    engine.set_workers(Workers::new(None, slots));
    engine.applied(at(0), 0, 6);
    let busy = engine.tick(&spec, &obs(100, 0, 6), at(20));
    assert_eq!((busy.desired, engine.startup().seconds()), (6, Some(20.0)));
    (25..=120).step_by(5).find(|&t| {
        let o = Observation {
            processed_total: t,
            ..obs(0, running, 6)
        };
        engine.tick(&spec, &o, at(t)).desired < 6
    })
}

#[test]
fn idle_pods_go_after_one_start_up_and_busy_ones_keep_the_default_window() {
    // The targets want one pod. Nothing running: the five above it are idle and go one
    // start-up (20 s) after the last higher recommendation.
    assert_eq!(first_shrink_with(1, 0), Some(40));
    // Four jobs running on one-slot pods: more than the pod kept holds. The pods are
    // busy, not idle, and the full 60 s window stands.
    assert_eq!(first_shrink_with(1, 4), Some(80));
    // On 8-slot pods, 4 running jobs fit on the one kept with room for their noise
    // (4 + √4 ≤ 8): the surplus is idle.
    assert_eq!(first_shrink_with(8, 4), Some(40));
    // 7 fit, but without that room (7 + √7 > 8): a moment's more jobs would need a
    // second pod, so the window stands.
    assert_eq!(first_shrink_with(8, 7), Some(80));
}

#[test]
fn a_fresh_engine_does_not_scale_down_inside_the_default_window() {
    let spec = ScalingSpec {
        target_drain_seconds: None,
        ..ScalingSpec::default()
    };
    let mut engine = Engine::new();
    let decision = engine.tick(&spec, &obs(5, 0, 10), at(0));
    assert_eq!(
        (decision.desired, decision.reason.limit),
        (10, Some(Limit::ScaleDownStabilized))
    );
    assert_eq!(engine.tick(&spec, &obs(5, 0, 10), at(59)).desired, 10);
    assert_eq!(engine.tick(&spec, &obs(5, 0, 10), at(60)).desired, 1);
}

#[test]
fn a_count_above_max_goes_to_max_at_once() {
    let spec = ScalingSpec {
        max_replicas: 10,
        ..ScalingSpec::default()
    };
    let decision = Engine::new().tick(&spec, &obs(500, 0, 30), at(0));
    assert_eq!(
        (decision.desired, decision.reason.limit),
        (10, Some(Limit::MaxReplicas))
    );
}

#[test]
fn spec_defaults_fill_an_empty_object() {
    let spec: ScalingSpec = serde_json::from_str("{}").expect("an empty spec is valid");
    assert_eq!(spec, ScalingSpec::default());
    assert_eq!(spec.target_drain_seconds, Some(60));
    let off: ScalingSpec =
        serde_json::from_str(r#"{"targetDrainSeconds": null}"#).expect("null is valid");
    assert_eq!(off.target_drain_seconds, None);
}

#[test]
fn spec_reads_an_hpa_behavior_as_users_write_it() {
    let spec: ScalingSpec = serde_json::from_value(serde_json::json!({
        "minReplicas": 1,
        "maxReplicas": 20,
        "targetBacklogPerReplica": 100,
        "behavior": {
            "scaleDown": {
                "stabilizationWindowSeconds": 120,
                "policies": [{"type": "Pods", "value": 4, "periodSeconds": 60}],
                "selectPolicy": "Min"
            }
        },
        "fallback": {"replicas": 2}
    }))
    .expect("valid spec");
    let behavior = spec.resolved_behavior();
    assert_eq!(behavior.down.window, 120.0);
    assert_eq!(behavior.down.select, Select::Min);
    assert_eq!(
        behavior.down.policies,
        vec![Policy::Pods {
            value: 4,
            period: 60.0
        }]
    );
    // Left out: the engine's scale-up defaults.
    assert_eq!(behavior.up, Behavior::engine_defaults().up);
    assert_eq!(
        spec.fallback,
        Some(FallbackSpec {
            failure_threshold: 3,
            replicas: 2
        })
    );
    assert!(spec.problems().is_empty(), "{:?}", spec.problems());
}

#[test]
fn spec_problems_say_what_to_fix() {
    let spec = ScalingSpec {
        min_replicas: 5,
        max_replicas: 2,
        target_backlog_per_replica: 0,
        behavior: Some(HorizontalPodAutoscalerBehavior {
            scale_up: Some(rules(
                0,
                Some("Fastest"),
                vec![HPAScalingPolicy {
                    type_: "pods".into(),
                    value: 1,
                    period_seconds: 15,
                }],
            )),
            scale_down: None,
        }),
        ..ScalingSpec::default()
    };
    let problems = spec.problems().join("\n");
    for expected in [
        "minReplicas (5) must not exceed maxReplicas (2)",
        "targetBacklogPerReplica",
        "Fastest",
        "\"pods\"",
    ] {
        assert!(
            problems.contains(expected),
            "{expected} missing from {problems}"
        );
    }
}

#[test]
fn spec_schema_is_camel_case_with_documented_defaults() {
    let schema =
        serde_json::to_value(schemars::schema_for!(ScalingSpec)).expect("schema serializes");
    let properties = &schema["properties"];
    assert_eq!(properties["targetBacklogPerReplica"]["default"], 5);
    // Left out, the operator chooses the hold (up to 300 s): no default to fill in.
    assert!(properties["idleSecondsBeforeZero"].get("default").is_none());
    assert!(
        properties["idleSecondsBeforeZero"]["description"]
            .as_str()
            .is_some_and(|d| d.contains("300 s"))
    );
    assert!(properties["behavior"].is_object());
    assert!(
        properties["maxReplicas"]["description"]
            .as_str()
            .is_some_and(|d| d.contains("KEDA"))
    );
}

#[test]
fn reasons_serialize_to_stable_codes() {
    let reason = Reason {
        rule: Rule::DrainTarget,
        limit: Some(Limit::ScaleDownStabilized),
        consecutive_failures: 0,
        rate_cap: None,
        idle_hold: None,
    };
    assert_eq!(
        serde_json::to_value(reason).expect("serializes"),
        serde_json::json!({"rule": "DrainTarget", "limit": "ScaleDownStabilized", "consecutiveFailures": 0})
    );
    assert_eq!(reason.code(), "ScaleDownStabilized");
    assert_eq!(
        reason.to_string(),
        "ScaleDownStabilized: sized by the drain target, held by a higher recommendation within the scale-down stabilization window"
    );
}

// "If ... the new ratio reverses the scale direction ... the controller doesn't take any
// scaling action" (Algorithm details): a wait above target with pods still starting must
// not propose fewer replicas.
#[test]
fn wait_target_never_proposes_shrinking_while_jobs_wait_too_long() {
    let spec = ScalingSpec {
        target_backlog_per_replica: 1000,
        target_wait_seconds: Some(30),
        ..plain()
    };
    let o = Observation {
        oldest_job_age_seconds: Some(60.0),
        ready_replicas: 1,
        ..obs(10, 0, 8)
    };
    let decision = Engine::new().tick(&spec, &o, at(0));
    assert_eq!(decision.proposals.wait, Some(8));
    assert_eq!(decision.desired, 8);
}

#[test]
fn one_decision_path_covers_a_read_queue_an_unreadable_one_and_manual_replicas() {
    let mut engine = Engine::new();
    let spec = plain();
    let read = decide(
        &mut engine,
        Some(&spec),
        None,
        Some(&obs(12, 0, 1)),
        1,
        at(0),
    );
    assert_eq!((read.desired, read.code()), (3, "BacklogTarget"));
    let unreadable = decide(&mut engine, Some(&spec), None, None, 3, at(5));
    assert_eq!(
        (unreadable.desired, unreadable.code()),
        (3, "MetricsUnavailable")
    );
    let manual = decide(&mut engine, None, Some(4), Some(&obs(500, 0, 1)), 1, at(10));
    assert_eq!((manual.desired, manual.code()), (4, MANUAL_REPLICAS));
    assert_eq!(manual.message(), "spec.replicas fixes the pool at 4");
    assert!(manual.decision.is_none());
}

/// [`engine_with_measured_throughput`] (jobs take 1 s) for workers of 2
/// jobs at once on a queue limited to 20 jobs/s: 20 jobs run at once at
/// the limit, so the cap is ceil((20 + √20) / 2) + 1 = 14.
fn rate_limited_engine(spec: &ScalingSpec) -> Engine {
    let mut engine = engine_with_measured_throughput(spec);
    engine.set_workers(Workers::new(Some("20/s"), 2));
    assert_eq!(engine.rates().job_seconds(), Some(1.0));
    engine
}

#[test]
fn the_rate_limit_caps_workers_at_those_it_keeps_busy_plus_one() {
    for (limit, concurrency, job_seconds, cap) in [
        (Some("20/s"), 2, 1.0, Some(14)),
        (Some("600/1m"), 1, 3.0, Some(37)),
        (Some("20/s"), 4, 0.1, Some(2)),
        (Some("1/h"), 8, 60.0, Some(2)),
        (None, 2, 1.0, None),
        (Some("not a limit"), 2, 1.0, None),
    ] {
        let workers = Workers::new(limit, concurrency);
        assert_eq!(workers.busy_at_limit(job_seconds, None), cap, "{limit:?}");
    }
}

#[test]
fn the_rate_cap_leaves_out_the_headroom_that_jobs_of_one_length_do_not_need() {
    // 5 jobs/s of 400 ms: two run at once. Jobs of a fixed length started
    // at the limit's even spacing never make a third, so the cap is those
    // two plus one; jobs of nearly one length make a third now and then
    // (the next start comes before the oldest has ended), plus one;
    // exponential jobs (spread = mean) vary by √(J/√2), and jobs whose
    // spread is unknown keep the whole √J.
    let workers = Workers::new(Some("5/s"), 1);
    assert_eq!(workers.busy_at_limit(0.4, Some(0.0)), Some(3));
    assert_eq!(workers.busy_at_limit(0.4, Some(0.01)), Some(4));
    assert_eq!(workers.busy_at_limit(0.4, Some(0.4)), Some(5));
    assert_eq!(workers.busy_at_limit(0.4, None), Some(5));
    // A spread above the mean's √2 adds no more than the unknown one.
    assert_eq!(workers.busy_at_limit(0.4, Some(4.0)), Some(5));
    // 20 jobs/s of 1 s: 25 workers for exponential jobs (26 with the
    // spread unknown), and 21 for jobs of one length.
    let workers = Workers::new(Some("20/s"), 1);
    assert_eq!(workers.busy_at_limit(1.0, Some(1.0)), Some(25));
    assert_eq!(workers.busy_at_limit(1.0, None), Some(26));
    assert_eq!(workers.busy_at_limit(1.0, Some(0.0)), Some(21));
}

#[test]
fn a_rate_limited_pool_of_short_even_jobs_wakes_at_the_workers_the_limit_keeps_busy() {
    let spec = plain();
    let mut engine = Engine::new();
    engine.set_workers(Workers::new(Some("5/s"), 1));
    let decision = engine.tick(
        &spec,
        &Observation {
            job_seconds: Some(0.4),
            job_seconds_deviation: Some(0.0),
            ..obs(1_000, 0, 0)
        },
        at(0),
    );
    assert_eq!(decision.desired, 3, "{decision:?}");
    assert_eq!(
        decision.reason.rate_cap.map(|cap| cap.workers),
        Some(3),
        "{decision:?}"
    );
}

proptest::proptest! {
    #[test]
    fn a_measured_spread_never_raises_the_rate_cap_above_the_unknown_one(
        count in 1u32..2_000,
        concurrency in 1i32..64,
        job_seconds in 0.001f64..600.0,
        deviation in 0.0f64..2_000.0,
    ) {
        let workers = Workers::new(Some(&format!("{count}/s")), concurrency);
        let known = workers.busy_at_limit(job_seconds, Some(deviation)).expect("a limit");
        let unknown = workers.busy_at_limit(job_seconds, None).expect("a limit");
        let mean_busy = f64::from(count) * job_seconds / f64::from(concurrency);
        proptest::prop_assert!(known <= unknown, "{known} > {unknown}");
        // Never below the workers the mean keeps busy, plus one.
        proptest::prop_assert!(f64::from(known) >= (mean_busy - 1e-9).ceil() + 1.0);
    }
}

#[test]
fn a_rate_limited_queue_never_gets_more_workers_than_the_limit_keeps_busy() {
    let spec = plain();
    let mut engine = rate_limited_engine(&spec);
    let decision = engine.tick(
        &spec,
        &Observation {
            processed_total: 80,
            ..obs(10_000, 4, 4)
        },
        at(20),
    );
    // The backlog target asks for ceil(10004 / 5) = 2001.
    assert_eq!(decision.proposals.backlog, 2001);
    assert_eq!(decision.desired, 14);
    assert_eq!(decision.recommendation, 14);
    assert_eq!(decision.reason.limit, Some(Limit::RateLimit));
    assert_eq!(decision.reason.code(), "RateLimit");
    assert_eq!(
        decision.reason.message(),
        "sized by the backlog target, capped: the queue's rate limit 20/s keeps at most 14 workers busy"
    );

    // The same queue without a limit goes to maxReplicas.
    let mut unlimited = engine_with_measured_throughput(&spec);
    let decision = unlimited.tick(
        &spec,
        &Observation {
            processed_total: 80,
            ..obs(10_000, 4, 4)
        },
        at(20),
    );
    assert_eq!(
        (decision.desired, decision.reason.limit),
        (100, Some(Limit::MaxReplicas))
    );
}

#[test]
fn a_rate_limit_below_what_the_targets_ask_leaves_smaller_proposals_alone() {
    let spec = plain();
    let mut engine = rate_limited_engine(&spec);
    let decision = engine.tick(
        &spec,
        &Observation {
            processed_total: 80,
            ..obs(20, 4, 4)
        },
        at(20),
    );
    // ceil(24 / 5) = 5 workers, under the cap of 14.
    assert_eq!((decision.desired, decision.reason.limit), (5, None));
    assert_eq!(decision.reason.rate_cap, None);
}

#[test]
fn min_replicas_wins_over_the_rate_limit_cap() {
    let spec = ScalingSpec {
        min_replicas: 15,
        ..plain()
    };
    let mut engine = rate_limited_engine(&spec);
    let decision = engine.tick(
        &spec,
        &Observation {
            processed_total: 80,
            ..obs(10_000, 4, 15)
        },
        at(20),
    );
    assert_eq!(decision.desired, 15);
    assert_eq!(decision.reason.limit, Some(Limit::MinReplicas));
}

#[test]
fn without_a_measured_job_duration_the_rate_limit_does_not_cap() {
    let spec = plain();
    let mut engine = Engine::new();
    engine.set_workers(Workers::new(Some("20/s"), 2));
    let decision = engine.tick(&spec, &obs(10_000, 0, 4), at(0));
    assert_eq!(
        (decision.desired, decision.reason.limit),
        (100, Some(Limit::MaxReplicas))
    );
}

#[test]
fn a_pool_waking_from_zero_wakes_no_larger_than_the_rate_limit_keeps_busy() {
    let spec = plain();
    let mut engine = rate_limited_engine(&spec);
    let decision = engine.tick(&spec, &obs(5_000, 0, 0), at(20));
    assert_eq!(decision.reason.rule, Rule::Activation);
    assert_eq!(decision.desired, 14);
    assert_eq!(decision.reason.limit, Some(Limit::RateLimit));
    let verdict = decide(
        engine.with_workers(Workers::new(Some("20/s"), 2)),
        Some(&spec),
        None,
        Some(&obs(5_000, 0, 0)),
        0,
        at(25),
    );
    assert_eq!((verdict.desired, verdict.code()), (14, "RateLimit"));
}

/// The queue of a rate-limited pool that has run jobs before: 100 jobs
/// waiting, jobs of 400 ms as the workers measured them (kept in Redis), a
/// limit of 5/s and one job per worker. 5/s × 0.4 s keeps J = 2 jobs
/// running: the cap is ceil(2 + √2) + 1 = 5.
fn rate_limited_wake(current: i32) -> Observation {
    let snapshot = workerpool_queue::snapshot::Snapshot {
        server_time_ms: 1_000,
        queues: vec![workerpool_queue::snapshot::QueueFigures {
            name: "q".into(),
            waiting: 100,
            processed_total: 500,
            job_duration_us: Some(400_000),
            ..Default::default()
        }],
    };
    Observation::from_counts(&snapshot.counts(), current, current)
}

#[test]
fn a_fresh_engine_wakes_a_rate_limited_pool_at_its_cap_from_the_duration_kept_in_redis() {
    let spec = ScalingSpec {
        max_replicas: 8,
        ..ScalingSpec::default()
    };
    let observation = rate_limited_wake(0);
    assert_eq!(observation.job_seconds, Some(0.4));
    // An engine that knows nothing of the queue (a new operator, a leader change).
    let mut engine = Engine::new();
    engine.set_workers(Workers::new(Some("5/s"), 1));
    let decision = engine.tick(&spec, &observation, at(0));
    assert_eq!(decision.reason.rule, Rule::Activation);
    assert_eq!(decision.desired, 5, "{decision:?}");
    assert_eq!(decision.reason.limit, Some(Limit::RateLimit));
    assert_eq!(
        decision.reason.rate_cap.map(|cap| cap.workers),
        Some(5),
        "{decision:?}"
    );
    // Without the kept duration the first wake has nothing to size the cap on, nor
    // the work: it starts the square root of the 20 pods the backlog asks for.
    let mut blind = Engine::new();
    blind.set_workers(Workers::new(Some("5/s"), 1));
    let unknown = Observation {
        job_seconds: None,
        ..observation
    };
    let decision = blind.tick(&spec, &unknown, at(0));
    assert_eq!(
        (decision.desired, decision.reason.limit),
        (5, Some(Limit::UnknownJobDuration))
    );
}

#[test]
fn the_scale_down_window_does_not_hold_a_rate_limited_pool_above_its_cap() {
    // The default behavior: a 300 s scale-down window.
    let spec = ScalingSpec {
        max_replicas: 8,
        ..ScalingSpec::default()
    };
    let blind = |o: Observation| Observation {
        job_seconds: None,
        ..o
    };
    for limited in [true, false] {
        let mut engine = Engine::new();
        engine.set_workers(Workers::new(limited.then_some("5/s"), 1));
        // Woken before any duration was known, on a backlog whose square-root wake
        // (√(400 / 5) ≈ 9) still reaches the whole range.
        let deep = Observation {
            backlog: 400,
            ..blind(rate_limited_wake(0))
        };
        let woke = engine.tick(&spec, &deep, at(0));
        assert_eq!(woke.desired, 8);
        engine.applied(at(0), 0, 8);
        // The next poll knows the duration: 5 workers are all the limit keeps busy,
        // and the window's memory of 8 does not hold the other 3.
        let next = engine.tick(&spec, &rate_limited_wake(8), at(15));
        if limited {
            assert_eq!(next.desired, 5, "{next:?}");
            assert_eq!(next.reason.limit, Some(Limit::RateLimit), "{next:?}");
        } else {
            // Without a limit the backlog target asks for all 8 (100 / 5 = 20).
            assert_eq!(next.desired, 8, "{next:?}");
        }
        // Later, the backlog falls to a few jobs: the window holds the pool at its
        // earlier recommendations (5 capped, or 8), as the HPA's does.
        let quiet = Observation {
            backlog: 3,
            ..rate_limited_wake(next.desired)
        };
        let later = engine.tick(&spec, &quiet, at(30));
        assert_eq!(later.desired, next.desired, "{later:?}");
        assert_eq!(later.reason.limit, Some(Limit::ScaleDownStabilized));
    }
}

#[test]
fn a_lightly_loaded_pool_is_sized_on_what_its_slots_complete_not_on_the_arrivals() {
    // One job a second, 250 ms each, one slot per pod, two pods: an eighth of each. A
    // job waits at most a poll, so the intervals look saturated (a job waiting at both
    // ends) and the measured throughput reads the arrival rate, 1/s: the drain target
    // (1/s of arrivals plus the backlog's share) then asks for the 2 pods the pool
    // already has, and would forever. The slots' own rate at the workers' measured
    // duration is 4 jobs a second.
    let spec = ScalingSpec::default();
    let run = |job_seconds: Option<f64>| {
        let mut engine = Engine::new();
        engine.set_workers(Workers::new(None, 1));
        let mut last = None;
        for poll in 0..40u64 {
            let o = Observation {
                processed_total: poll * 5,
                job_seconds,
                ..obs(1, 1, 2)
            };
            let decision = engine.tick(&spec, &o, at(poll * 5));
            last = Some(decision);
        }
        last.unwrap_or_else(|| unreachable!("forty polls"))
    };
    let measured_only = run(None);
    let throughput = measured_only
        .per_replica_throughput
        .unwrap_or_else(|| panic!("measured: {measured_only:?}"));
    assert!((throughput - 1.0).abs() < 0.05, "{measured_only:?}");
    assert_eq!(measured_only.proposals.drain, Some(2), "{measured_only:?}");
    assert_eq!(measured_only.desired, 2, "{measured_only:?}");
    let timed = run(Some(0.25));
    let throughput = timed.per_replica_throughput.unwrap_or_default();
    assert!((throughput - 4.0).abs() < 1e-9, "{timed:?}");
    assert_eq!(timed.proposals.drain, Some(1), "{timed:?}");
    assert_eq!(timed.desired, 1, "{timed:?}");
}

#[test]
fn before_any_job_ends_ready_pods_grow_the_pool_only_as_their_jobs_prove_long() {
    let spec = ScalingSpec {
        behavior: None,
        target_drain_seconds: None,
        ..plain()
    };
    let mut engine = Engine::new();
    engine.set_workers(Workers::new(None, 1));
    // 200 jobs and nothing timed: √40 pods.
    let woke = engine.tick(&spec, &obs(200, 0, 0), at(0));
    assert_eq!(woke.desired, 7);
    engine.applied(at(0), 0, 7);
    // Ready after 20 s; the jobs started and none has ended yet.
    let running = |backlog: u64| Observation {
        in_flight: 7,
        ..obs(backlog, 7, 7)
    };
    let first = engine.tick(&spec, &running(193), at(20));
    assert_eq!(
        first.desired, 7,
        "nothing is known to take any time: {first:?}"
    );
    // 10 s later the jobs have run at least 10 s each: 200 × 10 s of work is
    // 100 new pods' worth of a 20 s start-up, more than the backlog target's 40.
    let later = engine.tick(&spec, &running(193), at(30));
    assert!(later.desired > 7, "{later:?}");
    assert_eq!(later.desired, 40, "{later:?}");
    // A tenth of a second after they were ready, the jobs are proven to take only
    // that long: 200 × 0.1 s / 20 s is one pod more.
    let mut short = Engine::new();
    short.set_workers(Workers::new(None, 1));
    short.tick(&spec, &obs(200, 0, 0), at(0));
    short.applied(at(0), 0, 7);
    short.tick(&spec, &running(193), at(20));
    let soon = short.tick(&spec, &running(193), Duration::from_millis(20_100));
    assert_eq!(soon.desired, 7 + 1, "{soon:?}");
}
