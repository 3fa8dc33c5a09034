//! The stamp in its two halves agrees: `lua/stamp.lua`, run by the fetch
//! script on a real `redis-server`, and its Rust side (`job/stamp.rs`),
//! over generated payloads. For every payload the Rust side recovers the
//! pushed bytes exactly from the stamped ones and the reply code, the code
//! says what the script did to the bytes, and a stamp the worker lets
//! stand is the job its own intake would run.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{Map, Value};
use workerpool_queue::job::{Intake, Stamp, intake, stamped, unstamped};
use workerpool_queue::keys::QueueKeys;
use workerpool_queue::ops;
use workerpool_tests::TestRedis;

const INSTANCE: &str = "w~1";
const MAX_ATTEMPTS: u32 = 5;

/// Text with what JSON must escape and what it need not: quotes,
/// backslashes, controls, accents, scripts written right to left, emoji.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9_-]{0,12}",
        "[\"\\\\\u{0}-\u{1f}a-zé日本\u{202e}😀]{0,8}",
        any::<String>(),
    ]
}

/// A nested value, with `id`, `attempt` and `enqueued_at` sometimes inside
/// it, where they are not the job's own.
fn nested() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec(
                (
                    prop_oneof![
                        Just("id".to_string()),
                        Just("attempt".to_string()),
                        Just("enqueued_at".to_string()),
                        text(),
                    ],
                    inner
                ),
                0..4
            )
            .prop_map(|pairs| Value::Object(pairs.into_iter().collect())),
        ]
    })
}

/// One payload as a producer may push it.
#[derive(Debug, Clone)]
struct Pushed {
    /// A leading `"attempt":N` (a retry, a job a reaper returned).
    leading_attempt: Option<u64>,
    /// An `attempt` that is not the first field.
    later_attempt: Option<u64>,
    id: Option<String>,
    enqueued_at: Option<u64>,
    task: Option<String>,
    data: Option<Value>,
    run_at: Option<u64>,
    /// The id and enqueued_at last, as workerpool's producers write them.
    producer_tail: bool,
    /// Spaces around the separators.
    spaced: bool,
}

fn pushed() -> impl Strategy<Value = Pushed> {
    (
        prop::option::weighted(0.3, 0u64..8),
        prop::option::weighted(0.1, 0u64..8),
        prop::option::weighted(0.5, prop_oneof!["[0-9a-f]{32}", text()]),
        prop::option::weighted(0.5, 0u64..2_000_000_000_000),
        prop::option::weighted(0.8, text()),
        prop::option::weighted(0.7, nested()),
        prop::option::weighted(0.1, 0u64..2_000_000_000_000),
        any::<bool>(),
        prop::bool::weighted(0.2),
    )
        .prop_map(
            |(
                leading_attempt,
                later_attempt,
                id,
                enqueued_at,
                task,
                data,
                run_at,
                tail,
                spaced,
            )| {
                Pushed {
                    leading_attempt,
                    later_attempt,
                    id,
                    enqueued_at,
                    task,
                    data,
                    run_at,
                    producer_tail: tail,
                    spaced,
                }
            },
        )
}

impl Pushed {
    /// The payload's bytes, fields in the order a producer would write them.
    fn bytes(&self) -> Vec<u8> {
        let json = |v: &Value| serde_json::to_string(v).unwrap_or_default();
        let mut fields: Vec<(&str, String)> = Vec::new();
        if let Some(n) = self.leading_attempt {
            fields.push(("attempt", n.to_string()));
        }
        let id = self.id.as_ref().map(|id| json(&Value::from(id.as_str())));
        let enqueued_at = self.enqueued_at.map(|t| t.to_string());
        if !self.producer_tail {
            fields.extend(id.clone().map(|id| ("id", id)));
            fields.extend(enqueued_at.clone().map(|t| ("enqueued_at", t)));
        }
        if let Some(task) = &self.task {
            fields.push(("task", json(&Value::from(task.as_str()))));
        }
        if let Some(data) = &self.data {
            fields.push(("data", json(data)));
        }
        if let Some(n) = self.later_attempt {
            fields.push(("attempt", n.to_string()));
        }
        if let Some(t) = self.run_at {
            fields.push(("run_at", t.to_string()));
        }
        if self.producer_tail {
            fields.extend(id.map(|id| ("id", id)));
            fields.extend(enqueued_at.map(|t| ("enqueued_at", t)));
        }
        let (colon, comma) = if self.spaced {
            (": ", " , ")
        } else {
            (":", ",")
        };
        let inner: Vec<String> = fields
            .iter()
            .map(|(name, value)| format!("\"{name}\"{colon}{value}"))
            .collect();
        let open = if self.spaced && inner.is_empty() {
            "{ "
        } else {
            "{"
        };
        format!("{open}{}}}", inner.join(comma)).into_bytes()
    }
}

/// The fields of a job that the stamp may have filled in itself.
fn without_stamped_fields(fields: &Map<String, Value>) -> Map<String, Value> {
    let mut rest = fields.clone();
    for name in ["id", "enqueued_at", "attempt"] {
        rest.remove(name);
    }
    rest
}

/// Checks what the script made of `payload` against the Rust side.
fn check(payload: &[u8], held: &[u8], stamp: Stamp, now_ms: u64) -> Result<(), TestCaseError> {
    let shown = String::from_utf8_lossy(payload);
    prop_assert_eq!(Stamp::from_reply(stamp.code()), stamp);
    // The pushed bytes come back exactly.
    prop_assert_eq!(unstamped(held, stamp), payload, "pushed {}", shown);
    match stamp {
        Stamp::Untouched => prop_assert_eq!(held, payload),
        Stamp::Fresh(n) => {
            prop_assert_eq!(held.len(), payload.len() + n, "pushed {}", shown);
            prop_assert!(held.starts_with(b"{\"attempt\":1"), "pushed {}", shown);
            prop_assert_eq!(&held[1 + n..], &payload[1..]);
        }
        Stamp::Counted => {
            let digits: String = payload
                .strip_prefix(b"{\"attempt\":".as_slice())
                .unwrap_or_default()
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .map(|&b| char::from(b))
                .collect();
            let n: Option<u64> = digits.parse().ok();
            prop_assert!(n.is_some(), "counted without a leading attempt: {}", shown);
            let n = n.unwrap_or_default();
            let prefix = format!("{{\"attempt\":{n},");
            prop_assert!(payload.starts_with(prefix.as_bytes()), "pushed {}", shown);
            let mut expected = format!("{{\"attempt\":{},", n + 1).into_bytes();
            expected.extend_from_slice(&payload[prefix.len()..]);
            prop_assert_eq!(held, expected.as_slice());
        }
    }
    // A stamp that stands is the job the worker's own intake runs.
    let Some(job) = stamped(held, stamp) else {
        return Ok(());
    };
    let Intake::Run { job: expected, .. } = intake(payload, now_ms, MAX_ATTEMPTS, INSTANCE) else {
        return Err(TestCaseError::fail(format!(
            "the stamp stands where intake does not run the job: {shown}"
        )));
    };
    prop_assert_eq!(job.attempt(), expected.attempt(), "pushed {}", shown);
    prop_assert_eq!(job.task(), expected.task());
    prop_assert_eq!(
        without_stamped_fields(job.fields()),
        without_stamped_fields(expected.fields()),
        "pushed {}",
        shown
    );
    let own: Option<Map<String, Value>> = serde_json::from_slice(payload).ok();
    if let Some(id) = own.as_ref().and_then(|f| f.get("id")) {
        prop_assert_eq!(Some(job.id()), id.as_str(), "the producer's id is kept");
    } else {
        prop_assert_eq!(job.id().len(), 32, "a fresh id");
    }
    if let Some(t) = own.as_ref().and_then(|f| f.get("enqueued_at")) {
        prop_assert_eq!(job.enqueued_at(), t.as_u64(), "the producer's time is kept");
    }
    Ok(())
}

#[test]
fn the_stamp_script_and_its_rust_side_agree_on_generated_payloads() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let redis = TestRedis::start();
    let c = rt.block_on(redis.conn());
    let q = QueueKeys::new("stamp");
    let queues = [q.clone()];
    let mut runner = TestRunner::new(Config {
        cases: 512,
        failure_persistence: None,
        ..Config::default()
    });
    let stamps = std::cell::RefCell::new([0usize; 3]);
    runner
        .run(&pushed(), |p| {
            let payload = p.bytes();
            let mut c = c.clone();
            let (held, stamp, now_ms) = rt.block_on(async {
                let _: () = redis::cmd("DEL")
                    .arg(q.processing(INSTANCE))
                    .query_async(&mut c)
                    .await
                    .expect("DEL");
                let _: () = redis::cmd("LPUSH")
                    .arg(q.waiting())
                    .arg(&payload)
                    .query_async(&mut c)
                    .await
                    .expect("LPUSH");
                let (secs, micros): (u64, u64) =
                    redis::cmd("TIME").query_async(&mut c).await.expect("TIME");
                let taken = ops::fetch(&mut c, &queues, INSTANCE, 1, MAX_ATTEMPTS, None)
                    .await
                    .expect("fetch");
                assert_eq!(taken.jobs.len(), 1, "one job taken");
                let f = &taken.jobs[0];
                (f.payload.clone(), f.stamp, secs * 1000 + micros / 1000)
            });
            stamps.borrow_mut()[match stamp {
                Stamp::Untouched => 0,
                Stamp::Fresh(_) => 1,
                Stamp::Counted => 2,
            }] += 1;
            check(&payload, &held, stamp, now_ms)
        })
        .unwrap_or_else(|e| panic!("{e}"));
    // Every path of the script was taken.
    let stamps = stamps.into_inner();
    assert!(
        stamps.iter().all(|&n| n > 0),
        "untouched, fresh, counted: {stamps:?}"
    );
}
