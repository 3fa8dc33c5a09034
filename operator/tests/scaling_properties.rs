//! Properties of the scaling engine over random specs and random tick sequences.

use std::time::Duration;

use k8s_openapi::api::autoscaling::v2::{
    HPAScalingPolicy, HPAScalingRules, HorizontalPodAutoscalerBehavior,
};
use proptest::prelude::*;
use workerpool_operator::scaling::{
    DEFAULT_IDLE_SECONDS_BEFORE_ZERO, Engine, FallbackSpec, Observation, Rule, ScalingSpec,
};

fn policy() -> impl Strategy<Value = HPAScalingPolicy> {
    (
        prop_oneof![Just("Pods"), Just("Percent")],
        1..200i32,
        1..600i32,
    )
        .prop_map(|(kind, value, period_seconds)| HPAScalingPolicy {
            type_: kind.into(),
            value,
            period_seconds,
        })
}

fn rules() -> impl Strategy<Value = Option<HPAScalingRules>> {
    proptest::option::of(
        (
            proptest::option::of(0..600i32),
            proptest::option::of(prop_oneof![Just("Max"), Just("Min"), Just("Disabled")]),
            proptest::option::of(proptest::collection::vec(policy(), 0..3)),
        )
            .prop_map(|(window, select, policies)| HPAScalingRules {
                stabilization_window_seconds: window,
                select_policy: select.map(str::to_string),
                policies,
                tolerance: None,
            }),
    )
}

fn spec() -> impl Strategy<Value = ScalingSpec> {
    (
        (0..4i32, 1..60i32, 1..50i32),
        (
            proptest::option::of(1..120i32),
            proptest::option::of(1..120i32),
        ),
        (1..5i32, proptest::option::of(0..400i32)),
        proptest::option::of((rules(), rules())),
        proptest::option::of((1..4i32, 0..10i32)),
    )
        .prop_map(
            |((min, span, target), (drain, wait), (activation, idle), behavior, fallback)| {
                ScalingSpec {
                    min_replicas: min,
                    max_replicas: min + span,
                    target_backlog_per_replica: target,
                    target_drain_seconds: drain,
                    target_wait_seconds: wait,
                    activation_backlog: activation,
                    idle_seconds_before_zero: idle,
                    behavior: behavior.map(|(scale_up, scale_down)| {
                        HorizontalPodAutoscalerBehavior {
                            scale_up,
                            scale_down,
                        }
                    }),
                    fallback: fallback.map(|(failure_threshold, replicas)| FallbackSpec {
                        failure_threshold,
                        replicas,
                    }),
                    ..ScalingSpec::default()
                }
            },
        )
}

#[derive(Clone, Debug)]
struct Step {
    dt: u64,
    failed: bool,
    backlog: u64,
    extra_backlog: u64,
    in_flight: u64,
    due_retries: u64,
    processed: u64,
    age: Option<f64>,
    ready_fraction: f64,
}

fn step() -> impl Strategy<Value = Step> {
    (
        (1..60u64, prop::bool::weighted(0.1)),
        (prop_oneof![Just(0u64), 0..20u64, 0..5000u64], 0..500u64),
        (
            prop_oneof![Just(0u64), 0..200u64],
            prop_oneof![4 => Just(0u64), 1 => 0..3u64],
        ),
        (
            0..500u64,
            proptest::option::of(0.0..600.0f64),
            // Often every pod ready, so that start-ups get timed.
            prop_oneof![Just(1.0f64), 0.0..=1.0f64],
        ),
    )
        .prop_map(
            |(
                (dt, failed),
                (backlog, extra_backlog),
                (in_flight, due_retries),
                (processed, age, ready_fraction),
            )| Step {
                dt,
                failed,
                backlog,
                extra_backlog,
                in_flight,
                due_retries,
                processed,
                age,
                ready_fraction,
            },
        )
}

/// Runs the steps, applying each decision (and telling the engine), and checks `check`
/// before every tick.
fn replay(
    spec: &ScalingSpec,
    start: i32,
    steps: &[Step],
    mut check: impl FnMut(&Engine, &Observation, Duration, &Step),
) {
    let mut engine = Engine::new();
    let mut current = start;
    let mut now = Duration::from_secs(1000);
    let mut processed = 0u64;
    for step in steps {
        now += Duration::from_secs(step.dt);
        processed += step.processed;
        let ready = (f64::from(current) * step.ready_fraction).floor() as i32;
        let observation = Observation {
            backlog: step.backlog,
            in_flight: if current > 0 { step.in_flight } else { 0 },
            // A part of the backlog, as the snapshot reads it.
            due: step.due_retries.min(step.backlog),
            oldest_job_age_seconds: step.age,
            processed_total: processed,
            current_replicas: current,
            ready_replicas: ready,
            job_seconds: None,
            job_seconds_deviation: None,
        };
        check(&engine, &observation, now, step);
        let desired = if step.failed {
            engine.tick_failed(spec, current).desired
        } else {
            engine.tick(spec, &observation, now).desired
        };
        // Applied, as the actuators record it.
        if desired != current {
            engine.applied(now, current, desired);
        }
        current = desired;
    }
}

/// A spec and a starting replica count within its bounds.
fn spec_and_start() -> impl Strategy<Value = (ScalingSpec, i32)> {
    spec().prop_flat_map(|s| {
        let start = s.min_replicas..=s.max_replicas;
        (Just(s), start)
    })
}

/// A spec and a starting replica count anywhere, within its bounds or not:
/// a pool whose bounds were just edited, or a Deployment scaled by hand.
fn spec_and_any_start() -> impl Strategy<Value = (ScalingSpec, i32)> {
    spec().prop_flat_map(|s| {
        let start = 0..=s.max_replicas.saturating_mul(2).saturating_add(3);
        (Just(s), start)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_result_is_always_within_min_and_max(
        (spec, start) in spec_and_any_start(),
        steps in proptest::collection::vec(step(), 1..40),
    ) {
        replay(&spec, start, &steps, |engine, observation, now, step| {
            let mut engine = engine.clone();
            let desired = if step.failed {
                engine.tick_failed(&spec, observation.current_replicas).desired
            } else {
                engine.tick(&spec, observation, now).desired
            };
            assert!(desired >= spec.min_replicas && desired <= spec.max_replicas, "{desired} outside [{}, {}]", spec.min_replicas, spec.max_replicas);
        });
    }

    #[test]
    fn never_zero_while_work_is_pending(
        (spec, start) in spec_and_start(),
        steps in proptest::collection::vec(step(), 1..40),
    ) {
        replay(&spec, start, &steps, |engine, observation, now, step| {
            if step.failed {
                return;
            }
            let waiting = observation.backlog;
            let pending = waiting > 0 || observation.in_flight > 0;
            let may_wake = observation.current_replicas > 0 || waiting >= spec.activation_backlog as u64;
            if pending && may_wake {
                let decision = engine.clone().tick(&spec, observation, now);
                assert!(decision.desired >= 1, "{decision:?} with {observation:?}");
            }
        });
    }

    #[test]
    fn goes_to_zero_only_after_the_idle_hold_with_nothing_pending_or_completed(
        (spec, start) in spec_and_start(),
        steps in proptest::collection::vec(step(), 1..40),
    ) {
        // The last poll that saw work: jobs waiting or running, or completed since the
        // poll before; the engine is then at least `idle_hold` past it when it goes to
        // zero, and the hold is idleSecondsBeforeZero as written, else at most 300 s.
        let mut last_work: Option<Duration> = None;
        let mut last_processed: Option<u64> = None;
        replay(&spec, start, &steps, |engine, observation, now, step| {
            if step.failed {
                return;
            }
            let completed = last_processed.is_some_and(|p| p != observation.processed_total);
            last_processed = Some(observation.processed_total);
            if observation.backlog > 0 || observation.in_flight > 0 || completed {
                last_work = Some(now);
            }
            let mut after = engine.clone();
            let decision = after.tick(&spec, observation, now);
            let hold = after.idle_hold(&spec);
            match spec.idle_seconds_before_zero {
                Some(written) => assert_eq!(hold.seconds, written),
                None => assert!((1..=DEFAULT_IDLE_SECONDS_BEFORE_ZERO).contains(&hold.seconds), "{hold:?}"),
            }
            if decision.reason.rule == Rule::IdleToZero && observation.current_replicas > 0 {
                assert_eq!(decision.desired, 0);
                assert!(spec.min_replicas == 0);
                if let Some(work) = last_work {
                    let idle = now.saturating_sub(work).as_secs_f64();
                    assert!(idle >= f64::from(hold.seconds), "to zero after {idle} s idle, hold {hold:?}");
                }
            }
        });
    }

    #[test]
    fn never_below_a_recent_higher_recommendation_inside_the_scale_down_window(
        (spec, start) in spec_and_start(),
        steps in proptest::collection::vec(step(), 1..40),
    ) {
        let written = spec
            .behavior
            .as_ref()
            .and_then(|b| b.scale_down.as_ref())
            .and_then(|rules| rules.stabilization_window_seconds)
            .is_some();
        replay(&spec, start, &steps, |engine, observation, now, step| {
            if step.failed {
                return;
            }
            // The window as documented: the one written, else the default, cut to the
            // measured start-up time (at least a poll) while nothing is waiting and the
            // running jobs with their noise (`r + √r`) fit on the largest target's pods
            // (one slot each: the engine here has the default workers). The start-up
            // time is the one known at this poll (pods ready now tell it).
            let mut after = engine.clone();
            let decision = after.tick(&spec, observation, now);
            let proposals = decision.proposals;
            let largest = proposals
                .backlog
                .max(proposals.drain.unwrap_or(0))
                .max(proposals.wait.unwrap_or(0))
                .max(1);
            let running = observation.in_flight as f64;
            let mut window = spec.resolved_behavior().down.window;
            if !written
                && observation.backlog == 0
                && running + running.sqrt() <= f64::from(largest)
                && let Some(startup) = after.startup().seconds()
            {
                window = window.min(startup.max(f64::from(spec.poll_interval_seconds.max(1))));
            }
            let window = Duration::from_secs_f64(window);
            let recent = engine.highest_recommendation_within(now, window);
            if decision.reason.rule == Rule::IdleToZero {
                return;
            }
            if let Some(recent) = recent {
                let floor = recent.min(observation.current_replicas).min(spec.max_replicas);
                assert!(decision.desired >= floor, "{decision:?} below {floor} (recent {recent}, current {})", observation.current_replicas);
            }
        });
    }

    #[test]
    fn monotone_in_backlog_when_nothing_else_changes(
        (spec, start) in spec_and_start(),
        steps in proptest::collection::vec(step(), 1..40),
    ) {
        replay(&spec, start, &steps, |engine, observation, now, step| {
            if step.failed {
                return;
            }
            let lower = engine.clone().tick(&spec, observation, now);
            let more = Observation { backlog: observation.backlog + step.extra_backlog, ..observation.clone() };
            let higher = engine.clone().tick(&spec, &more, now);
            assert!(lower.desired <= higher.desired, "{} jobs gave {lower:?}, {} gave {higher:?}", observation.backlog, more.backlog);
        });
    }
}
