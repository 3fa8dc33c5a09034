//! One pass over a stamped payload: checks that it is a JSON object, as
//! the full parse would, and reads the fields the worker needs for every
//! job, without building the object.
//!
//! Every value goes through serde_json's `deserialize_any`, as it does when
//! a `Value` is parsed: the same numbers, strings, escapes and nesting
//! limit are accepted, so a payload that passes here also parses into a
//! `Value` later. Only the visitors differ: they keep nothing but the known
//! fields, and strings without escapes as slices of the text.

use std::fmt;

use serde::Deserializer;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::field;

/// A known field's value, as far as the worker reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Scalar<'a> {
    /// A string without escapes: a slice of the text.
    Str(&'a str),
    /// A string with escapes (its text is not its value).
    Escaped,
    /// A whole number of 0 or more.
    U64(u64),
    /// Anything else.
    Other,
}

impl Scalar<'_> {
    /// Whether the value is a string, with or without escapes.
    pub(super) fn is_string(self) -> bool {
        matches!(self, Scalar::Str(_) | Scalar::Escaped)
    }
}

/// The known fields of the object, each as its last occurrence (as a map
/// keeps it). `run_at` stops the pass: such a job is not run from its stamp.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Head<'a> {
    pub(super) task: Option<Scalar<'a>>,
    pub(super) id: Option<Scalar<'a>>,
    pub(super) attempt: Option<Scalar<'a>>,
    pub(super) enqueued_at: Option<Scalar<'a>>,
    pub(super) unique_key: Option<Scalar<'a>>,
    /// Whether `attempt` occurs more than once: the stamp counts the
    /// leading one and a map keeps the last, so such a job is not run
    /// from its stamp.
    pub(super) attempt_repeated: bool,
}

/// Reads `text`: `None` unless it is exactly one JSON object without a
/// `run_at` field.
pub(super) fn read(text: &str) -> Option<Head<'_>> {
    let mut de = serde_json::Deserializer::from_str(text);
    let head = de.deserialize_any(ObjectVisitor).ok()?;
    de.end().ok()?;
    Some(head)
}

/// A field name, decoded (an escaped name counts as what it spells).
enum Name {
    Task,
    Id,
    Attempt,
    EnqueuedAt,
    RunAt,
    UniqueKey,
    Other,
}

impl Name {
    fn of(name: &str) -> Self {
        match name {
            field::TASK => Name::Task,
            field::ID => Name::Id,
            field::ATTEMPT => Name::Attempt,
            field::ENQUEUED_AT => Name::EnqueuedAt,
            field::RUN_AT => Name::RunAt,
            field::UNIQUE_KEY => Name::UniqueKey,
            _ => Name::Other,
        }
    }
}

impl<'de> de::Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NameVisitor;
        impl Visitor<'_> for NameVisitor {
            type Value = Name;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_str<E: de::Error>(self, name: &str) -> Result<Name, E> {
                Ok(Name::of(name))
            }
        }
        deserializer.deserialize_str(NameVisitor)
    }
}

struct ObjectVisitor;

impl<'de> Visitor<'de> for ObjectVisitor {
    type Value = Head<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Head<'de>, A::Error> {
        let mut head = Head::default();
        while let Some(name) = map.next_key::<Name>()? {
            let slot = match name {
                Name::Task => &mut head.task,
                Name::Id => &mut head.id,
                Name::Attempt => {
                    head.attempt_repeated |= head.attempt.is_some();
                    &mut head.attempt
                }
                Name::EnqueuedAt => &mut head.enqueued_at,
                Name::UniqueKey => &mut head.unique_key,
                Name::RunAt => return Err(de::Error::custom("run_at")),
                Name::Other => {
                    map.next_value_seed(Skip)?;
                    continue;
                }
            };
            *slot = Some(map.next_value_seed(ScalarSeed)?);
        }
        Ok(head)
    }
}

/// Reads a known field's value.
struct ScalarSeed;

impl<'de> DeserializeSeed<'de> for ScalarSeed {
    type Value = Scalar<'de>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Scalar<'de>, D::Error> {
        deserializer.deserialize_any(ScalarVisitor)
    }
}

struct ScalarVisitor;

impl<'de> Visitor<'de> for ScalarVisitor {
    type Value = Scalar<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Scalar<'de>, E> {
        Ok(Scalar::Str(s))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Scalar<'de>, E> {
        Ok(Scalar::Escaped)
    }
    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Scalar<'de>, E> {
        Ok(Scalar::U64(n))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Scalar<'de>, E> {
        Ok(Scalar::Other)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Scalar<'de>, E> {
        Ok(Scalar::Other)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Scalar<'de>, E> {
        Ok(Scalar::Other)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Scalar<'de>, E> {
        Ok(Scalar::Other)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Scalar<'de>, A::Error> {
        Skip.visit_seq(seq).map(|_| Scalar::Other)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Scalar<'de>, A::Error> {
        Skip.visit_map(map).map(|_| Scalar::Other)
    }
}

/// Reads any value and keeps nothing of it. Unlike `IgnoredAny` on
/// serde_json, which skips over a value's text, this parses it the way a
/// `Value` parse does (numbers, escapes, nesting limit).
#[derive(Clone, Copy)]
struct Skip;

impl<'de> DeserializeSeed<'de> for Skip {
    type Value = IgnoredAny;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<IgnoredAny, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Skip {
    type Value = IgnoredAny;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<IgnoredAny, E> {
        Ok(IgnoredAny)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<IgnoredAny, E> {
        Ok(IgnoredAny)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<IgnoredAny, E> {
        Ok(IgnoredAny)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<IgnoredAny, E> {
        Ok(IgnoredAny)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<IgnoredAny, E> {
        Ok(IgnoredAny)
    }
    fn visit_unit<E: de::Error>(self) -> Result<IgnoredAny, E> {
        Ok(IgnoredAny)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<IgnoredAny, A::Error> {
        while seq.next_element_seed(self)?.is_some() {}
        Ok(IgnoredAny)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<IgnoredAny, A::Error> {
        while map.next_key_seed(self)?.is_some() {
            map.next_value_seed(self)?;
        }
        Ok(IgnoredAny)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn the_known_fields_are_read_as_their_last_occurrence_and_escapes_are_noticed() {
        let head = read(
            r#"{"attempt":2,"id":"a","task":"t\n","data":{"id":9,"x":[1,{"y":null}]},"attempt":3,"enqueued_at":-1,"unique_key":[5]}"#,
        )
        .expect("an object");
        assert_eq!(head.attempt, Some(Scalar::U64(3)));
        assert!(head.attempt_repeated);
        assert_eq!(head.id, Some(Scalar::Str("a")));
        assert_eq!(head.task, Some(Scalar::Escaped));
        assert_eq!(head.enqueued_at, Some(Scalar::Other));
        assert_eq!(head.unique_key, Some(Scalar::Other));
        let escaped_name = read(r#"{"\u0069d":"b"}"#).expect("an object");
        assert_eq!(escaped_name.id, Some(Scalar::Str("b")));
    }

    #[test]
    fn the_pass_accepts_exactly_what_a_value_parse_accepts_as_an_object() {
        let deep = format!("{{\"d\":{}{}}}", "[".repeat(200), "]".repeat(200));
        let cases = [
            r#"{}"#,
            r#" { "a" : 1 } "#,
            r#"{"a":1e400}"#,
            r#"{"a":18446744073709551616}"#,
            r#"{"a":"\ud800"}"#,
            r#"{"a":"\x"}"#,
            r#"{"a":[1,]}"#,
            r#"{"a":1}{"#,
            r#"{"a":01}"#,
            r#"{"a":tru}"#,
            r#"{"a":"ctl	"}"#,
            r#"{"id":"a","id":2}"#,
            "[1]",
            "\"s\"",
            deep.as_str(),
        ];
        for text in cases {
            let parsed = matches!(serde_json::from_str::<Value>(text), Ok(Value::Object(_)));
            assert_eq!(read(text).is_some(), parsed, "{text}");
        }
    }

    #[test]
    fn run_at_anywhere_at_the_top_stops_the_pass() {
        assert_eq!(read(r#"{"id":"a","run_at":1}"#), None);
        assert!(read(r#"{"data":{"run_at":1}}"#).is_some());
    }
}
