//! Property tests over arbitrary bytes for the two parsers that read what
//! comes from outside the worker: the job envelope (`intake`) and a
//! handler's answer line (`parse_answer`). Neither may panic, and each
//! either accepts its input with the meaning it has or rejects it with a
//! reason, keeping what it rejects.

use proptest::prelude::*;
use serde_json::{Map, Value};
use workerpool_queue::job::{DeadReason, Intake, Stamp, intake, release_token, stamped};
use workerpool_worker::Outcome;
use workerpool_worker::handlers::exec_pool::parse_answer;

const NOW: u64 = 1_700_000_000_000;

/// Bytes that look like JSON often enough to reach the parser's depths.
fn jsonish() -> impl Strategy<Value = Vec<u8>> {
    let token = prop_oneof![
        Just(b"{".to_vec()),
        Just(b"}".to_vec()),
        Just(b"[".to_vec()),
        Just(b"]".to_vec()),
        Just(b":".to_vec()),
        Just(b",".to_vec()),
        Just(b"\"task\"".to_vec()),
        Just(b"\"attempt\"".to_vec()),
        Just(b"\"id\"".to_vec()),
        Just(b"\"run_at\"".to_vec()),
        Just(b"\"ok\"".to_vec()),
        Just(b"true".to_vec()),
        Just(b"false".to_vec()),
        Just(b"null".to_vec()),
        Just(b"1e400".to_vec()),
        Just(b"-1".to_vec()),
        Just(b"18446744073709551616".to_vec()),
        Just(b"\"\\ud800\"".to_vec()),
        Just(b"\xff".to_vec()),
        Just(b"\0".to_vec()),
        any::<u8>().prop_map(|b| vec![b]),
        "[a-z0-9 ]{0,4}".prop_map(String::into_bytes),
    ];
    proptest::collection::vec(token, 0..40).prop_map(|t| t.concat())
}

/// Arbitrary JSON values, nested a few levels.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        ".{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map("[a-z_]{1,8}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Checks what `intake` made of `raw`.
fn check_intake(raw: &[u8]) -> Result<(), TestCaseError> {
    match intake(raw, NOW, 5, "w~1") {
        Intake::Run { job, stamped } => {
            let text = std::str::from_utf8(raw).expect("only UTF-8 runs");
            let Ok(Value::Object(original)) = serde_json::from_str::<Value>(text) else {
                return Err(TestCaseError::fail("only JSON objects run"));
            };
            let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(&stamped) else {
                return Err(TestCaseError::fail("the stamped payload is an object"));
            };
            prop_assert_eq!(&fields, job.fields());
            prop_assert!(job.attempt() >= 1);
            prop_assert!(!job.id().is_empty());
            for (k, v) in &original {
                if k != "attempt" {
                    prop_assert_eq!(fields.get(k), Some(v), "field {} kept", k);
                }
            }
        }
        Intake::Schedule { run_at } => prop_assert!(run_at > NOW),
        Intake::Dead(letter) => {
            prop_assert!(matches!(
                letter.reason,
                DeadReason::Malformed | DeadReason::Lost
            ));
            prop_assert!(!letter.error.is_empty());
            // The envelope stores and reads back.
            let back: workerpool_queue::job::DeadLetter =
                serde_json::from_str(&letter.to_json()).expect("envelope is JSON");
            prop_assert_eq!(&back, &letter);
            // Nothing is lost: the payload comes back byte for byte, unless it
            // was read as an object (kept as that object).
            match letter.raw_payload() {
                Some(kept) => prop_assert_eq!(kept.as_slice(), raw),
                None => prop_assert!(letter.job.is_object()),
            }
        }
    }
    Ok(())
}

/// Objects written out field by field: known names (one escaped) with
/// values of any type, repeated names, strings with and without escapes.
fn object_text() -> impl Strategy<Value = String> {
    let name = prop_oneof![
        Just("attempt"),
        Just("id"),
        Just("task"),
        Just("enqueued_at"),
        Just("unique_key"),
        Just("run_at"),
        Just("data"),
        Just("\\u0069d"),
        Just("other"),
    ];
    let value = prop_oneof![
        json_value().prop_map(|v| v.to_string()),
        Just("1".to_string()),
        Just("\"a\"".to_string()),
        Just("\"a\\nb\"".to_string()),
        Just("1.0".to_string()),
        Just("-1".to_string()),
    ];
    proptest::collection::vec((name, value), 0..8).prop_map(|fields| {
        let fields: Vec<String> = fields
            .into_iter()
            .map(|(name, value)| format!("\"{name}\":{value}"))
            .collect();
        format!("{{{}}}", fields.join(","))
    })
}

/// How many times `attempt` is a name of the object in `text` (escaped
/// names decoded); `None` when `text` is not one object.
fn attempts_named(text: &str) -> Option<usize> {
    struct Count;
    impl<'de> serde::de::Visitor<'de> for Count {
        type Value = usize;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<usize, A::Error> {
            let mut n = 0;
            while let Some(name) = map.next_key::<String>()? {
                n += usize::from(name == "attempt");
                map.next_value::<serde::de::IgnoredAny>()?;
            }
            Ok(n)
        }
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let n = serde::Deserializer::deserialize_map(&mut de, Count).ok()?;
    de.end().ok()?;
    Some(n)
}

/// The job a stamp stands for, read the plain way: the whole object
/// parsed, then the known fields checked. `attempt` named twice never
/// stands: the stamp counts the first, a map keeps the last.
fn stamped_by_full_parse(text: &str, expected: u64) -> Option<Map<String, Value>> {
    let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(text) else {
        return None;
    };
    if attempts_named(text) != Some(1) {
        return None;
    }
    let string_or_absent = |name| fields.get(name).is_none_or(Value::is_string);
    let stands = string_or_absent("task")
        && fields.get("id").is_some_and(Value::is_string)
        && fields.get("attempt").and_then(Value::as_u64) == Some(expected)
        && fields.get("enqueued_at").is_some_and(Value::is_u64)
        && !fields.contains_key("run_at");
    stands.then_some(fields)
}

/// Checks `stamped` against the full parse, for a fresh stamp.
fn check_stamped(held: &[u8]) -> Result<(), TestCaseError> {
    let job = stamped(held, Stamp::Fresh(1));
    let Ok(text) = std::str::from_utf8(held) else {
        prop_assert!(job.is_none());
        return Ok(());
    };
    let Some(fields) = stamped_by_full_parse(text, 1) else {
        prop_assert!(job.is_none(), "{} must not stand", text);
        return Ok(());
    };
    let Some(job) = job else {
        return Err(TestCaseError::fail(format!("{text} must stand")));
    };
    prop_assert_eq!(job.fields(), &fields);
    prop_assert_eq!(Some(job.id()), fields["id"].as_str());
    prop_assert_eq!(job.task(), fields.get("task").and_then(Value::as_str));
    prop_assert_eq!(job.attempt(), 1);
    prop_assert_eq!(job.enqueued_at(), fields["enqueued_at"].as_u64());
    prop_assert_eq!(job.release_token(), release_token(&fields));
    let line = job.to_json();
    prop_assert!(!line.contains(['\n', '\r']));
    // The line a handler gets reads as the same object.
    prop_assert_eq!(
        serde_json::from_str::<Value>(&line).ok(),
        Some(Value::Object(fields))
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn a_stamp_stands_exactly_where_the_full_parse_says_it_does(
        text in object_text(),
        stamp_first in any::<bool>(),
        pretty in any::<bool>(),
    ) {
        let stamp = "\"attempt\":1,\"id\":\"0011\",\"enqueued_at\":5";
        let mut held = match (stamp_first, text.len() > 2) {
            (true, true) => format!("{{{stamp},{}", &text[1..]),
            (true, false) => format!("{{{stamp}}}"),
            (false, _) => text,
        };
        if pretty {
            held = held.replace(',', ",\n");
        }
        check_stamped(held.as_bytes())?;
    }

    #[test]
    fn a_stamp_on_any_jsonish_bytes_stands_only_as_the_full_parse_says(raw in jsonish()) {
        let mut held = b"{\"attempt\":1,\"id\":\"a\",\"enqueued_at\":5,".to_vec();
        held.extend_from_slice(&raw);
        check_stamped(&held)?;
        check_stamped(&raw)?;
    }

    #[test]
    fn intake_takes_any_bytes(raw in proptest::collection::vec(any::<u8>(), 0..300)) {
        check_intake(&raw)?;
    }

    #[test]
    fn intake_takes_any_jsonish_bytes(raw in jsonish()) {
        check_intake(&raw)?;
    }

    #[test]
    fn intake_runs_any_object_and_keeps_its_unknown_fields(
        fields in proptest::collection::btree_map("[a-z]{1,8}", json_value(), 0..8),
        data in json_value(),
    ) {
        let mut object: Map<String, Value> = fields
            .into_iter()
            .filter(|(k, _)| !matches!(k.as_str(), "task" | "id" | "attempt" | "enqueued_at" | "run_at" | "error"))
            .collect();
        object.insert("data".into(), data);
        let raw = Value::Object(object.clone()).to_string();
        let Intake::Run { job, .. } = intake(raw.as_bytes(), NOW, 5, "w~1") else {
            return Err(TestCaseError::fail(format!("{raw} must run")));
        };
        for (k, v) in &object {
            prop_assert_eq!(job.get(k), Some(v));
        }
    }

    #[test]
    fn an_answer_of_any_bytes_is_an_outcome_or_a_protocol_break(
        line in prop_oneof![proptest::collection::vec(any::<u8>(), 0..200), jsonish()],
    ) {
        match parse_answer(&line) {
            Ok(outcome) => {
                let text = std::str::from_utf8(&line).expect("only UTF-8 answers are read");
                let v: Value = serde_json::from_str(text.trim_end()).expect("only JSON answers are read");
                let ok = v.get("ok").and_then(Value::as_bool).expect("ok is a boolean");
                prop_assert_eq!(ok, outcome == Outcome::Done);
            }
            Err(e) => prop_assert!(e.starts_with("handler broke the protocol"), "{}", e),
        }
    }
}

#[test]
fn answers_that_are_not_utf8_are_protocol_breaks_that_show_the_bytes() {
    let e = parse_answer(b"\xff\xfe{\"ok\":true}\n").expect_err("not UTF-8");
    assert!(
        e.contains("not UTF-8 (invalid byte 0xff at offset 0)"),
        "{e}"
    );
    assert!(e.contains(r#"\xff\xfe{"ok":true}"#), "{e}");
    assert_eq!(parse_answer(b"{\"ok\":true}\r\n"), Ok(Outcome::Done));
    let long = vec![b'a'; workerpool_worker::handlers::exec_pool::MAX_ANSWER_BYTES + 1];
    assert!(
        parse_answer(&long)
            .expect_err("too long")
            .contains("without a newline")
    );
}

/// A fresh stamp before a producer's own `attempt`: the full parse and
/// `stamped` agree that it does not stand (the worker's intake decides).
#[test]
fn a_stamp_before_a_second_attempt_does_not_stand() {
    let held = br#"{"attempt":1,"id":"0011","enqueued_at":5,"attempt":1}"#;
    assert!(stamped(held, Stamp::Fresh(1)).is_none());
    check_stamped(held).expect("the full parse agrees");
}
