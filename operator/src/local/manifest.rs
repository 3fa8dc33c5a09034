//! Reading a WorkerPool manifest for local mode with the checks a cluster
//! makes at `kubectl apply`: strict decoding (unknown fields are refused, as
//! kubectl's default `--validate=strict` does), the CRD schema's bounds, its
//! CEL rules with the API server's messages, then the engine's own checks.
//! Pure code: text in, a pool or one line naming the field out.

use std::fmt::Write as _;

use k8s_openapi::api::core::v1::Container;
use serde::Deserialize;
use serde_json::Value;

use crate::crd::WorkerPool;
use crate::deployment::BuildError;

/// The `apiVersion` a manifest must have.
pub const API_VERSION: &str = "workerpool.dev/v1alpha1";

/// Parses and validates the WorkerPool in a manifest: the only one, or the
/// one named `name` when the file holds several (other kinds of objects,
/// such as a Secret, are skipped). The error is one line that names the field
/// (several problems are joined with `; `).
pub fn parse(text: &str, name: Option<&str>) -> Result<WorkerPool, String> {
    let documents = serde_yaml_ng::Deserializer::from_str(text)
        .map(Value::deserialize)
        .collect::<Result<Vec<Value>, _>>()
        .map_err(|e| e.to_string())?;
    let is_pool = |d: &Value| d.get("kind").and_then(Value::as_str) == Some("WorkerPool");
    let pools: Vec<usize> = (0..documents.len())
        .filter(|i| is_pool(&documents[*i]))
        .filter(|i| {
            name.is_none_or(|n| documents[*i].pointer("/metadata/name") == Some(&Value::from(n)))
        })
        .collect();
    let index = match (pools.as_slice(), name) {
        ([only], _) => *only,
        ([], Some(n)) => return Err(format!("no WorkerPool named {n:?} in the file")),
        ([], None) => {
            let kinds: Vec<&str> = documents
                .iter()
                .filter_map(|d| d.get("kind").and_then(Value::as_str))
                .collect();
            return Err(format!(
                "kind must be WorkerPool (apiVersion {API_VERSION}); the file holds {}",
                if kinds.is_empty() {
                    "no Kubernetes object".to_string()
                } else {
                    kinds.join(", ")
                }
            ));
        }
        (_, _) => {
            let names: Vec<String> = pools
                .iter()
                .filter_map(|i| documents[*i].pointer("/metadata/name"))
                .map(ToString::to_string)
                .collect();
            return Err(format!(
                "the file holds {} WorkerPools ({}); choose one with --pool NAME",
                pools.len(),
                names.join(", ")
            ));
        }
    };
    let raw = &documents[index];
    let api_version = raw.get("apiVersion").and_then(Value::as_str);
    if api_version != Some(API_VERSION) {
        return Err(format!(
            "apiVersion must be {API_VERSION}, not {}",
            api_version.unwrap_or("(none)")
        ));
    }
    // Decoded from the YAML itself, not from `raw`, so that a type error
    // names the field path and the line.
    let document = serde_yaml_ng::Deserializer::from_str(text)
        .nth(index)
        .ok_or("the manifest changed while it was read")?;
    let pool = WorkerPool::deserialize(document).map_err(|e| e.to_string())?;

    let mut problems = Vec::new();
    if pool.metadata.name.as_deref().is_none_or(str::is_empty) {
        problems.push("metadata.name: Required value".to_string());
    }
    schema_problems(raw, &mut problems);
    if let Err(errors) = pool.validate_cel() {
        problems.extend(errors.iter().map(ToString::to_string));
    }
    // The CEL rule refuses the same names; this says whose key each is.
    problems.extend(
        pool.spec
            .queue
            .redis
            .queue_keys()
            .iter()
            .filter_map(|q| workerpool_queue::keys::check_name(q.name()).err())
            .map(|p| format!("spec.queue.redis: {p}")),
    );
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
    let crd = crate::crd::crd();
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
        match parse(text, None) {
            Ok(_) => String::new(),
            Err(e) => e,
        }
    }

    #[test]
    fn a_valid_manifest_parses_with_the_cluster_defaults() {
        let pool = parse(VALID, None).expect("valid");
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
                "key: mail}",
                "key: mail, tls: {insecureSkipVerify: true}}",
                "spec.queue.redis.tls needs a TLS URL",
            ),
            (
                "key: mail}",
                "key: mail, mode: Cluster}",
                "spec.queue.redis.mode is Cluster: queue names need a hash tag",
            ),
            (
                "key: mail}",
                "keys: ['{mail}:high', 'mail:low'], mode: Cluster}",
                "spec.queue.redis.mode is Cluster: queue names need a hash tag",
            ),
            (
                "key: mail}",
                "key: mail, mode: Sharded}",
                "spec.queue.redis.mode",
            ),
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
            (
                "concurrency: 2",
                "concurrency: 2, children: 3",
                "spec.worker.children must be at most spec.worker.concurrency",
            ),
            (
                "concurrency: 2",
                "children: 2",
                "spec.worker.children must be at most spec.worker.concurrency",
            ),
            (
                "concurrency: 2",
                "concurrency: 2, children: 0",
                "spec.worker.children",
            ),
            (
                "concurrency: 2",
                "concurrency: 2, keepOutcomesSeconds: 0",
                "spec.worker.keepOutcomesSeconds in body should be greater than or equal to 1",
            ),
            (
                "concurrency: 2",
                "concurrency: 2, keepOutcomesSeconds: 604801",
                "spec.worker.keepOutcomesSeconds in body should be less than or equal to 604800",
            ),
        ] {
            assert!(VALID.contains(from), "{from}");
            let message = error(&VALID.replace(from, to));
            assert!(message.contains(named), "{to}: {message:?}");
            assert!(!message.contains('\n'), "one line: {message:?}");
        }
    }

    #[test]
    fn children_up_to_the_concurrency_parse() {
        for (to, children) in [
            ("concurrency: 2, children: 1", Some(1)),
            ("concurrency: 2, children: 2", Some(2)),
            ("concurrency: 2", None),
        ] {
            let pool = parse(&VALID.replace("concurrency: 2", to), None).expect(to);
            assert_eq!(pool.spec.worker.children, children, "{to}");
        }
    }

    #[test]
    fn hash_tagged_queues_pass_the_cluster_rule() {
        for to in [
            "key: '{mail}', mode: Cluster}",
            "keys: ['{mail}:high', '{mail}:low'], mode: Cluster}",
            "key: mail, mode: Standalone}",
        ] {
            let pool = parse(&VALID.replace("key: mail}", to), None);
            assert!(pool.is_ok(), "{to}: {pool:?}");
        }
    }

    #[test]
    fn a_file_with_other_objects_or_several_pools_gives_the_one_asked_for() {
        let secret = "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\n";
        let with_secret = format!("{secret}---{VALID}");
        assert!(parse(&with_secret, None).is_ok());
        let two = format!(
            "{with_secret}---{}",
            VALID.replace("name: mail}", "name: jobs}")
        );
        let error = parse(&two, None).err().unwrap_or_default();
        assert!(
            error.contains("2 WorkerPools") && error.contains("--pool"),
            "{error}"
        );
        let jobs = parse(&two, Some("jobs")).expect("the pool named jobs");
        assert_eq!(jobs.metadata.name.as_deref(), Some("jobs"));
        let error = parse(&two, Some("other")).err().unwrap_or_default();
        assert!(error.contains("no WorkerPool named \"other\""), "{error}");
        let error = parse(
            &two.replace("maxReplicas: 4", "maxReplicas: x"),
            Some("jobs"),
        )
        .err()
        .unwrap_or_default();
        assert!(error.contains("spec.scaling.maxReplicas"), "{error}");
        assert!(
            parse(secret, None)
                .err()
                .unwrap_or_default()
                .contains("Secret")
        );
    }

    #[test]
    fn with_two_containers_the_worker_is_the_one_named_worker() {
        let two = VALID.replace(
            "      - name: worker",
            "      - name: sidecar\n        image: example/sidecar:1\n      - name: worker",
        );
        let pool = parse(&two, None).expect("valid");
        assert_eq!(
            worker_container(&pool).map(|c| c.name.as_str()),
            Some("worker")
        );
    }
}
