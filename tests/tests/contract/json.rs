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
