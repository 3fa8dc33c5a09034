//! JSON compared as values, saying where two differ.

use std::collections::HashSet;

use serde_json::Value;

/// Where `got` differs from `want` as JSON values (numbers by value, objects
/// whatever their key order), or None.
pub(crate) fn difference(want: &Value, got: &Value, path: &str) -> Option<String> {
    let show = |v: &Value| {
        let s = v.to_string();
        if s.len() > 120 {
            let start: String = s.chars().take(100).collect();
            format!("{start}… ({} bytes)", s.len())
        } else {
            s
        }
    };
    let differs = || {
        Some(format!(
            "at {path}: {} instead of {}",
            show(got),
            show(want)
        ))
    };
    match (want, got) {
        (Value::Number(a), Value::Number(b)) => {
            let same = match (a.as_i64(), b.as_i64(), a.as_u64(), b.as_u64()) {
                (Some(x), Some(y), _, _) => x == y,
                (_, _, Some(x), Some(y)) => x == y,
                _ => a.as_f64() == b.as_f64(),
            };
            if same { None } else { differs() }
        }
        (Value::Array(a), Value::Array(b)) => {
            if a.len() != b.len() {
                return Some(format!(
                    "at {path}: {} items instead of {}",
                    b.len(),
                    a.len()
                ));
            }
            a.iter()
                .zip(b)
                .enumerate()
                .find_map(|(i, (x, y))| difference(x, y, &format!("{path}[{i}]")))
        }
        (Value::Object(a), Value::Object(b)) => {
            let (ka, kb): (HashSet<&String>, HashSet<&String>) =
                (a.keys().collect(), b.keys().collect());
            if ka != kb {
                return Some(format!(
                    "at {path}: keys {:?} instead of {:?}",
                    b.keys().collect::<Vec<_>>(),
                    a.keys().collect::<Vec<_>>()
                ));
            }
            a.iter()
                .find_map(|(k, x)| difference(x, &b[k], &format!("{path}.{k}")))
        }
        (a, b) if a == b => None,
        _ => differs(),
    }
}

/// The matchers an expectation may use in place of a value: an object with
/// one of these keys alone (contract/README.md, "Outcomes").
const MATCHERS: [&str; 3] = ["present", "contains", "one_of"];

/// The matcher `want` is, if it is one: `(name, argument)`.
fn matcher(want: &Value) -> Option<(&str, &Value)> {
    let object = want.as_object()?;
    let (name, arg) = object.iter().next()?;
    (object.len() == 1 && MATCHERS.contains(&name.as_str())).then_some((name.as_str(), arg))
}

/// Whether `want` (a value or a matcher) is well formed.
pub(crate) fn check_matcher(want: &Value) -> Result<(), String> {
    match matcher(want) {
        Some(("present", arg)) if !arg.is_boolean() => {
            Err("\"present\" takes true or false".into())
        }
        Some(("contains", arg)) if !arg.is_string() => Err("\"contains\" takes a string".into()),
        Some(("one_of", arg)) if !arg.is_array() => {
            Err("\"one_of\" takes an array of values".into())
        }
        _ => Ok(()),
    }
}

/// Where `got` (null when absent) fails `want`, or None: `want` is a value
/// (compared as [`difference`] does) or a matcher: `{"present": bool}`
/// (not null / null), `{"contains": text}` (a string containing it),
/// `{"one_of": [values]}` (equal to one of them).
pub(crate) fn mismatch(want: &Value, got: &Value, path: &str) -> Option<String> {
    match matcher(want) {
        Some(("present", Value::Bool(present))) => (got.is_null() == *present).then(|| {
            if *present {
                format!("{path} is absent, it must be present")
            } else {
                format!("{path} is {got}, it must be absent")
            }
        }),
        Some(("contains", Value::String(text))) => {
            (!got.as_str().is_some_and(|s| s.contains(text.as_str())))
                .then(|| format!("{path} is {got}, it must be a string containing {text:?}"))
        }
        Some(("one_of", Value::Array(values))) => values
            .iter()
            .all(|v| difference(v, got, path).is_some())
            .then(|| {
                format!(
                    "{path} is {got}, it must be one of {}",
                    Value::from(values.clone())
                )
            }),
        _ => difference(want, got, path),
    }
}
