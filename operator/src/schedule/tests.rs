use serde_json::json;

use super::*;

fn spec(value: Value) -> ScheduleSpec {
    serde_json::from_value(value).expect("a well-typed schedule")
}

fn schedule(expression: &str, zone: Option<&str>) -> Schedule {
    let mut value = json!({"name": "nightly", "schedule": expression});
    if let Some(zone) = zone {
        value["timeZone"] = json!(zone);
    }
    Schedule::parse(&spec(value), 0, &["mail".into()]).expect("a valid schedule")
}

fn at(text: &str) -> Timestamp {
    text.parse().expect("an RFC 3339 instant")
}

/// The next `n` fires after `from`, as UTC instants.
fn fires(s: &Schedule, from: &str, n: usize) -> Vec<String> {
    let mut t = at(from);
    let mut out = Vec::new();
    for _ in 0..n {
        t = s.next_after(t).expect("a next fire");
        out.push(t.to_string());
    }
    out
}

#[test]
fn a_cron_expression_fires_on_the_wall_clock_of_its_time_zone() {
    let utc = schedule("30 2 * * *", None);
    assert_eq!(
        fires(&utc, "2026-06-01T00:00:00Z", 2),
        ["2026-06-01T02:30:00Z", "2026-06-02T02:30:00Z"]
    );
    // Berlin is UTC+2 in summer.
    let berlin = schedule("30 2 * * *", Some("Europe/Berlin"));
    assert_eq!(
        fires(&berlin, "2026-06-01T00:00:00Z", 2),
        ["2026-06-01T00:30:00Z", "2026-06-02T00:30:00Z"]
    );
    let weekdays = schedule("0 9 * * MON-FRI", Some("America/New_York"));
    assert_eq!(
        fires(&weekdays, "2026-06-05T12:00:00Z", 2),
        ["2026-06-05T13:00:00Z", "2026-06-08T13:00:00Z"],
        "Friday 9:00 EDT, then Monday"
    );
}

#[test]
fn a_time_the_clocks_skip_fires_at_the_first_instant_after_the_gap() {
    // 2026-03-29 in Berlin: 2:00 CET becomes 3:00 CEST, so 2:30 does not
    // exist; the fire is at 3:00 CEST (01:00 UTC), and the day after is
    // back at 2:30.
    let berlin = schedule("30 2 * * *", Some("Europe/Berlin"));
    assert_eq!(
        fires(&berlin, "2026-03-28T00:00:00Z", 3),
        [
            "2026-03-28T01:30:00Z",
            "2026-03-29T01:00:00Z",
            "2026-03-30T00:30:00Z"
        ]
    );
    // The latest fire at 3:10 CEST that day is the one at 3:00.
    assert_eq!(
        berlin.latest_until(at("2026-03-29T01:10:00Z")),
        Some(at("2026-03-29T01:00:00Z"))
    );
    // New York: 2026-03-08, 2:00 EST becomes 3:00 EDT.
    let new_york = schedule("30 2 * * *", Some("America/New_York"));
    assert_eq!(
        fires(&new_york, "2026-03-08T00:00:00Z", 2),
        ["2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"]
    );
}

#[test]
fn a_time_the_clocks_repeat_fires_once_the_first_time() {
    // 2026-10-25 in Berlin: 3:00 CEST becomes 2:00 CET, so 2:30 happens at
    // 00:30 and at 01:30 UTC; the fire is at the first only.
    let berlin = schedule("30 2 * * *", Some("Europe/Berlin"));
    assert_eq!(
        fires(&berlin, "2026-10-24T12:00:00Z", 2),
        ["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"]
    );
    assert_eq!(
        berlin.latest_until(at("2026-10-25T01:45:00Z")),
        Some(at("2026-10-25T00:30:00Z")),
        "the second 2:30 is no fire"
    );
}

#[test]
fn an_hourly_expression_fires_every_real_hour_across_both_changes() {
    let hourly = schedule("0 * * * *", Some("Europe/Berlin"));
    // Autumn: 2:00 happens twice, both are hours of their own.
    assert_eq!(
        fires(&hourly, "2026-10-24T23:30:00Z", 4),
        [
            "2026-10-25T00:00:00Z",
            "2026-10-25T01:00:00Z",
            "2026-10-25T02:00:00Z",
            "2026-10-25T03:00:00Z"
        ]
    );
    // Spring: 2:00 does not exist, and the hour after 1:00 is 3:00.
    assert_eq!(
        fires(&hourly, "2026-03-28T23:30:00Z", 3),
        [
            "2026-03-29T00:00:00Z",
            "2026-03-29T01:00:00Z",
            "2026-03-29T02:00:00Z"
        ]
    );
}

#[test]
fn nicknames_and_every_fire_as_documented() {
    let daily = schedule("@daily", None);
    let midnight = schedule("@midnight", None);
    assert_eq!(
        fires(&daily, "2026-06-01T10:00:00Z", 1),
        ["2026-06-02T00:00:00Z"]
    );
    assert_eq!(
        fires(&midnight, "2026-06-01T10:00:00Z", 1),
        fires(&daily, "2026-06-01T10:00:00Z", 1)
    );
    assert_eq!(
        fires(&schedule("@hourly", None), "2026-06-01T10:20:00Z", 1),
        ["2026-06-01T11:00:00Z"]
    );
    // @every: every multiple of the duration since the epoch, whatever the
    // time zone and whoever asks.
    let every = schedule("@every 30s", Some("Europe/Berlin"));
    assert_eq!(
        fires(&every, "2026-06-01T10:00:10.500Z", 3),
        [
            "2026-06-01T10:00:30Z",
            "2026-06-01T10:01:00Z",
            "2026-06-01T10:01:30Z"
        ]
    );
    assert_eq!(
        every.latest_until(at("2026-06-01T10:00:59.999Z")),
        Some(at("2026-06-01T10:00:30Z"))
    );
    assert_eq!(
        every.latest_until(at("2026-06-01T10:01:00Z")),
        Some(at("2026-06-01T10:01:00Z")),
        "a fire at the very instant counts"
    );
    let minutes = schedule("@every 5m", None);
    assert_eq!(
        fires(&minutes, "2026-06-01T10:01:00Z", 1),
        ["2026-06-01T10:05:00Z"]
    );
}

#[test]
fn a_new_schedule_waits_for_its_next_fire_rather_than_run_an_earlier_one() {
    let s = schedule("30 2 * * *", None);
    assert_eq!(
        s.step(None, at("2026-06-01T10:00:00Z")),
        Step::Wait {
            next: Some(at("2026-06-02T02:30:00Z"))
        }
    );
    // The fire waited for is still ahead.
    assert_eq!(
        s.step(Some(at("2026-06-02T02:30:00Z")), at("2026-06-01T10:00:00Z")),
        Step::Wait {
            next: Some(at("2026-06-02T02:30:00Z"))
        }
    );
}

#[test]
fn a_due_fire_runs_and_names_the_next() {
    let s = schedule("30 2 * * *", None);
    assert_eq!(
        s.step(Some(at("2026-06-02T02:30:00Z")), at("2026-06-02T02:30:04Z")),
        Step::Fire {
            at: at("2026-06-02T02:30:00Z"),
            next: Some(at("2026-06-03T02:30:00Z")),
            earlier_missed: false,
        }
    );
}

#[test]
fn of_fires_missed_while_down_only_the_latest_runs_and_only_within_the_deadline() {
    let s = schedule("30 2 * * *", None);
    let pending = Some(at("2026-06-02T02:30:00Z"));
    let now = at("2026-06-05T10:00:00Z");
    assert_eq!(
        s.step(pending, now),
        Step::Fire {
            at: at("2026-06-05T02:30:00Z"),
            next: Some(at("2026-06-06T02:30:00Z")),
            earlier_missed: true,
        }
    );
    let strict = Schedule {
        deadline: Some(Duration::from_secs(600)),
        ..s.clone()
    };
    assert_eq!(
        strict.step(pending, now),
        Step::Missed {
            at: at("2026-06-05T02:30:00Z"),
            late: Duration::from_secs(7 * 3600 + 1800),
            next: Some(at("2026-06-06T02:30:00Z")),
        }
    );
    // Within the deadline it runs.
    assert!(matches!(
        strict.step(pending, at("2026-06-05T02:39:00Z")),
        Step::Fire {
            earlier_missed: true,
            ..
        }
    ));
    // A deadline of 0 still runs a fire seen at its very instant.
    let zero = Schedule {
        deadline: Some(Duration::ZERO),
        ..s.clone()
    };
    assert!(matches!(
        zero.step(pending, at("2026-06-02T02:30:00Z")),
        Step::Fire { .. }
    ));
}

#[test]
fn a_suspended_schedule_waits_for_nothing() {
    let s = Schedule {
        suspend: true,
        ..schedule("@every 1s", None)
    };
    assert_eq!(
        s.step(Some(at("2026-06-01T10:00:00Z")), at("2026-06-01T10:00:05Z")),
        Step::Suspended
    );
}

#[test]
fn a_fire_has_the_same_id_in_every_process_and_forbid_gives_it_the_schedule_key() {
    let s = Schedule::parse(
        &spec(json!({"name": "nightly", "schedule": "30 2 * * *",
            "job": {"id": "mine", "task": "report", "data": {"kind": "nightly"}}})),
        0,
        &["mail".into()],
    )
    .expect("valid");
    let fire = at("2026-01-01T02:30:00Z");
    let now = at("2026-01-01T02:30:01Z");
    assert_eq!(
        s.job_id("jobs", "mail", fire),
        "jobs/mail/nightly/1767234600000"
    );
    assert_eq!(
        Value::Object(s.payload("jobs", "mail", fire, now)),
        json!({"id": "jobs/mail/nightly/1767234600000", "task": "report",
               "data": {"kind": "nightly"}, "schedule": "nightly",
               "enqueued_at": 1767234601000u64,
               "unique_key": "schedule:jobs/mail/nightly", "unique_for": 86400})
    );
    let allow = Schedule::parse(
        &spec(
            json!({"name": "ping", "schedule": "@every 1s", "concurrencyPolicy": "Allow",
            "job": {"task": "ping", "unique_key": "own", "unique_for": 5}}),
        ),
        0,
        &["mail".into()],
    )
    .expect("valid");
    assert_eq!(
        Value::Object(allow.payload("jobs", "mail", fire, now)),
        json!({"id": "jobs/mail/ping/1767234600000", "task": "ping", "unique_key": "own",
               "unique_for": 5, "schedule": "ping", "enqueued_at": 1767234601000u64}),
        "Allow keeps the job's own unique key"
    );
    let held = Schedule::parse(
        &spec(json!({"name": "n", "schedule": "@hourly", "job": {"unique_for": 60}})),
        0,
        &["mail".into()],
    )
    .expect("valid");
    assert_eq!(
        held.payload("jobs", "mail", fire, now)["unique_for"],
        json!(60)
    );
}

#[test]
fn the_queue_is_the_first_of_the_pool_unless_the_schedule_names_another() {
    let queues = ["high".to_string(), "low".to_string()];
    let first = Schedule::parse(
        &spec(json!({"name": "a", "schedule": "@hourly"})),
        0,
        &queues,
    );
    assert_eq!(first.map(|s| s.queue), Ok("high".to_string()));
    let low = Schedule::parse(
        &spec(json!({"name": "a", "schedule": "@hourly", "queue": "low"})),
        0,
        &queues,
    );
    assert_eq!(low.map(|s| s.queue), Ok("low".to_string()));
}

#[test]
fn a_bad_schedule_is_refused_with_a_line_that_names_it_and_says_what_to_fix() {
    let queues = ["mail".to_string()];
    for (value, message) in [
        (
            json!({"name": "n", "schedule": "61 * * * *"}),
            "spec.schedules[0] (n): schedule \"61 * * * *\" cannot be used",
        ),
        (
            json!({"name": "n", "schedule": "0 * * * * *"}),
            "a cron expression has 5 fields",
        ),
        (
            json!({"name": "n", "schedule": "@fortnightly"}),
            "use @hourly, @daily",
        ),
        (
            json!({"name": "n", "schedule": "@every 500ms"}),
            "@every needs whole seconds, at least 1s",
        ),
        (
            json!({"name": "n", "schedule": "@every soon"}),
            "@every needs a duration such as 30s",
        ),
        (
            json!({"name": "n", "schedule": "0 0 30 2 *"}),
            "it never fires",
        ),
        (
            json!({"name": "n", "schedule": "@daily", "timeZone": "Mars/Olympus"}),
            "spec.schedules[0] (n): timeZone \"Mars/Olympus\" is not an IANA time zone",
        ),
        (
            json!({"name": "n", "schedule": "@daily", "queue": "other"}),
            "queue \"other\" is not one of the pool's queues (mail)",
        ),
        (
            json!({"name": "n", "schedule": "@daily", "concurrencyPolicy": "Allow",
                   "job": {"unique_key": ""}}),
            "spec.schedules[0] (n): job: \"unique_key\" must be a non-empty string",
        ),
        (
            json!({"name": "n", "schedule": "@daily", "job": {"unique_for": -1}}),
            "job.unique_for must be a whole number of seconds above 0",
        ),
    ] {
        match Schedule::parse(&spec(value.clone()), 0, &queues) {
            Ok(_) => panic!("{value}: accepted"),
            Err(e) => assert!(e.contains(message), "{value}: {e}"),
        }
    }
}

#[test]
fn a_pool_refuses_schedule_names_that_are_not_dns_labels_or_not_unique() {
    let pool: WorkerPool = serde_json::from_value(json!({
        "apiVersion": "workerpool.dev/v1alpha1", "kind": "WorkerPool",
        "metadata": {"name": "mail"},
        "spec": {
            "queue": {"redis": {"url": "redis://r", "key": "mail"}},
            "template": {"spec": {"containers": [{"name": "worker", "image": "w"}]}},
            "replicas": 1,
            "schedules": [
                {"name": "ok", "schedule": "@hourly"},
                {"name": "Not_A_Label", "schedule": "@hourly"},
                {"name": "ok", "schedule": "@daily"},
            ],
        },
    }))
    .expect("a well-typed pool");
    let problems = parse_all(&pool).expect_err("refused");
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems[0].starts_with("spec.schedules[1].name \"Not_A_Label\" must be a DNS label"),
        "{problems:?}"
    );
    assert!(
        problems[1].starts_with("spec.schedules[2] (ok): another schedule has this name"),
        "{problems:?}"
    );
}

#[test]
fn a_schedules_claims_are_in_use_on_the_queue_it_enqueues_on() {
    let specs: Vec<ScheduleSpec> = serde_json::from_value(serde_json::json!([
        {"name": "a", "schedule": "@hourly"},
        {"name": "b", "schedule": "@hourly", "queue": "low"},
        {"name": "c", "schedule": "not cron", "queue": "high"},
    ]))
    .expect("specs");
    let queues = ["high".to_string(), "low".to_string()];
    assert_eq!(names_on(&specs, &queues, "high"), ["a", "c"]);
    assert_eq!(names_on(&specs, &queues, "low"), ["b"]);
    assert!(names_on(&specs, &queues, "other").is_empty());
}
