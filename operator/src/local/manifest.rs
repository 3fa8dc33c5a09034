//! Reading a WorkerPool manifest for local mode with the checks a cluster
//! makes at `kubectl apply`: strict decoding (unknown fields are refused, as
//! kubectl's default `--validate=strict` does), the CRD schema's bounds, its
//! CEL rules with the API server's messages, then the engine's own checks.
//! Pure code: text in, a pool or one line naming the field out.

use std::fmt::Write as _;

use k8s_openapi::api::core::v1::Container;
use kube::core::crd::CustomResourceExt;
use serde_json::Value;

use crate::crd::WorkerPool;
use crate::deployment::BuildError;

/// The `apiVersion` a manifest must have.
pub const API_VERSION: &str = "workerpool.dev/v1alpha1";

/// Parses and validates a manifest. The error is one line that names the
/// field (several problems are joined with `; `).
pub fn parse(text: &str) -> Result<WorkerPool, String> {
    let raw: Value = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
    let api_version = raw.get("apiVersion").and_then(Value::as_str);
    let kind = raw.get("kind").and_then(Value::as_str);
    if kind != Some("WorkerPool") || api_version != Some(API_VERSION) {
        return Err(format!(
            "apiVersion and kind must be {API_VERSION} and WorkerPool, not {} and {}",
            api_version.unwrap_or("(none)"),
            kind.unwrap_or("(none)")
        ));
    }
    let pool: WorkerPool = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;

    let mut problems = Vec::new();
    if pool.metadata.name.as_deref().is_none_or(str::is_empty) {
        problems.push("metadata.name: Required value".to_string());
    }
    schema_problems(&raw, &mut problems);
    if let Err(errors) = pool.validate_cel() {
        problems.extend(errors.iter().map(ToString::to_string));
    }
    if let Some(scaling) = &pool.spec.scaling {
        problems.extend(
            scaling
                .problems()
                .into_iter()
                .map(|p| format!("spec.scaling.{p}")),
        );
    }
    if worker_container(&pool).is_none() {
        problems.push(BuildError::NoWorkerContainer.to_string());
    }
    problems.dedup();
    if problems.is_empty() {
        Ok(pool)
    } else {
        Err(problems.join("; "))
    }
}

/// The container that runs `workerpool-worker`: the one named `worker`, or
/// the only one (the rule the Deployment builder applies).
pub fn worker_container(pool: &WorkerPool) -> Option<&Container> {
    let containers = &pool.spec.template.spec.as_ref()?.containers;
    containers
        .iter()
        .find(|c| c.name == "worker")
        .or(match containers.as_slice() {
            [only] => Some(only),
            _ => None,
        })
}

/// Checks the manifest against the CRD's OpenAPI schema for what typed
/// decoding does not catch: unknown fields, numeric bounds, string and list
/// lengths, enums. Messages follow the API server's wording.
fn schema_problems(raw: &Value, problems: &mut Vec<String>) {
    let crd = WorkerPool::crd();
    let schema = crd
        .spec
        .versions
        .first()
        .and_then(|v| v.schema.as_ref())
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| serde_json::to_value(s).ok());
    let (Some(schema), Some(object)) = (schema, raw.as_object()) else {
        return;
    };
    // metadata is the API server's business (its schema is just `object`),
    // status is written by the operator.
    for key in ["spec"] {
        if let (Some(value), Some(sub)) = (object.get(key), schema["properties"].get(key)) {
            walk(value, sub, key, problems);
        }
    }
    let known = ["apiVersion", "kind", "metadata", "spec", "status"];
    for key in object.keys().filter(|k| !known.contains(&k.as_str())) {
        problems.push(format!("unknown field {key:?}"));
    }
}

fn walk(value: &Value, schema: &Value, path: &str, problems: &mut Vec<String>) {
    let invalid = |shown: String, why: String| format!("{path}: Invalid value: {shown}: {why}");
    match value {
        Value::Null => {}
        Value::Object(map) => {
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            let preserve = schema
                .get("x-kubernetes-preserve-unknown-fields")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            for (key, item) in map {
                let child = format!("{path}.{key}");
                match (properties.and_then(|p| p.get(key)), additional) {
                    (Some(sub), _) | (None, Some(sub)) => walk(item, sub, &child, problems),
                    (None, None) if properties.is_some() && !preserve => {
                        problems.push(format!("unknown field {child:?}"));
                    }
                    (None, None) => {}
                }
            }
        }
        Value::Array(items) => {
            if let Some(min) = schema.get("minItems").and_then(Value::as_u64)
                && (items.len() as u64) < min
            {
                problems.push(format!(
                    "{path}: Invalid value: {}: {path} in body should have at least {min} items",
                    items.len()
                ));
            }
            if let Some(sub) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    walk(item, sub, &format!("{path}[{i}]"), problems);
                }
            }
        }
        Value::Number(n) => {
            let Some(x) = n.as_f64() else { return };
            if let Some(min) = schema.get("minimum").and_then(Value::as_f64)
                && x < min
            {
                problems.push(invalid(
                    n.to_string(),
                    format!("{path} in body should be greater than or equal to {min}"),
                ));
            }
            if let Some(max) = schema.get("maximum").and_then(Value::as_f64)
                && x > max
            {
                problems.push(invalid(
                    n.to_string(),
                    format!("{path} in body should be less than or equal to {max}"),
                ));
            }
        }
        Value::String(s) => {
            let chars = s.chars().count() as u64;
            if let Some(min) = schema.get("minLength").and_then(Value::as_u64)
                && chars < min
            {
                problems.push(invalid(
                    format!("{s:?}"),
                    format!("{path} in body should be at least {min} chars long"),
                ));
            }
            if let Some(options) = schema.get("enum").and_then(Value::as_array)
                && !options.iter().any(|o| o.as_str() == Some(s))
            {
                let mut allowed = String::new();
                for (i, o) in options.iter().enumerate() {
                    let sep = if i == 0 { "" } else { ", " };
                    let _ = write!(allowed, "{sep}{o}");
                }
                problems.push(format!(
                    "{path}: Unsupported value: {s:?}: supported values: {allowed}"
                ));
            }
        }
        Value::Bool(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = r#"
apiVersion: workerpool.dev/v1alpha1
kind: WorkerPool
metadata: {name: mail}
spec:
  queue: {redis: {url: "redis://127.0.0.1:6379/0", key: mail}}
  template:
    spec:
      containers:
      - name: worker
        image: example/worker:1
        args: ["--", "sh", "-c", "cat"]
  worker: {concurrency: 2}
  scaling: {maxReplicas: 4}
"#;

    fn error(text: &str) -> String {
        match parse(text) {
            Ok(_) => String::new(),
            Err(e) => e,
        }
    }

    #[test]
    fn a_valid_manifest_parses_with_the_cluster_defaults() {
        let pool = parse(VALID).expect("valid");
        assert_eq!(pool.spec.worker.concurrency, 2);
        assert_eq!(pool.spec.worker.max_attempts, 5);
        assert_eq!(pool.spec.shutdown.grace_period_seconds, 30);
        let worker = worker_container(&pool).expect("a worker container");
        assert_eq!(worker.args.as_deref().map(<[String]>::len), Some(4));
    }

    #[test]
    fn each_invalid_manifest_is_refused_with_a_line_naming_the_field() {
        for (from, to, named) in [
            (
                "concurrency: 2",
                "concurrency: 0",
                "spec.worker.concurrency",
            ),
            (
                "maxReplicas: 4",
                "maxReplicas: lots",
                "spec.scaling.maxReplicas",
            ),
            ("maxReplicas: 4", "maxReplica: 4", "spec.scaling.maxReplica"),
            (
                "maxReplicas: 4",
                "minReplicas: 5, maxReplicas: 4",
                "spec.scaling.minReplicas must not exceed spec.scaling.maxReplicas",
            ),
            ("key: mail", "key: mail, keys: [a]", "spec.queue.redis.key"),
            (
                "        args:",
                "        arg:",
                "spec.template.spec.containers[0].arg",
            ),
            ("metadata: {name: mail}", "metadata: {}", "metadata.name"),
            (
                "      - name: worker",
                "      - name: sidecar\n        image: example/sidecar:1\n      - name: other",
                "spec.template.spec.containers",
            ),
            ("kind: WorkerPool", "kind: Deployment", "kind"),
        ] {
            assert!(VALID.contains(from), "{from}");
            let message = error(&VALID.replace(from, to));
            assert!(message.contains(named), "{to}: {message:?}");
            assert!(!message.contains('\n'), "one line: {message:?}");
        }
    }

    #[test]
    fn with_two_containers_the_worker_is_the_one_named_worker() {
        let two = VALID.replace(
            "      - name: worker",
            "      - name: sidecar\n        image: example/sidecar:1\n      - name: worker",
        );
        let pool = parse(&two).expect("valid");
        assert_eq!(
            worker_container(&pool).map(|c| c.name.as_str()),
            Some("worker")
        );
    }
}
