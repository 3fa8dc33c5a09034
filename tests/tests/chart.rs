//! The Helm chart, `manifests/install.yaml` and `manifests/examples/`, checked
//! with the real `helm` binary against the Kubernetes API types (unknown
//! fields refused), the operator's RBAC rules and the WorkerPool CRD.
//!
//! `helm` is `$HELM`, else `target/tools/bin/helm` (what
//! `scripts/install-helm.sh` installs), else the one on `PATH`.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde::Deserialize;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use workerpool_operator::crd::WorkerPool;
use workerpool_operator::{deployment, rbac};
use workerpool_tests::{helm, read, root};

const CHART: &str = "charts/workerpool-operator";
const CHART_CRD: &str = "charts/workerpool-operator/crds/workerpools.workerpool.dev.yaml";
const NON_DEFAULT_VALUES: &str = "charts/workerpool-operator/ci/non-default-values.yaml";
const INSTALL_NAMESPACE: &str = "workerpool-system";
const REGENERATE: &str = "UPDATE_MANIFESTS=1 cargo test -p workerpool-tests --test chart";

/// Runs helm in the workspace root; Ok(stdout) or Err(stderr).
fn try_helm(args: &[&str]) -> Result<String, String> {
    let out = Command::new(helm())
        .args(args)
        .current_dir(root())
        .output()
        .expect("helm runs");
    let text = |bytes: Vec<u8>| String::from_utf8(bytes).expect("helm prints UTF-8");
    if out.status.success() {
        Ok(text(out.stdout))
    } else {
        Err(text(out.stderr))
    }
}

fn run_helm(args: &[&str]) -> String {
    try_helm(args).unwrap_or_else(|stderr| panic!("helm {}: {stderr}", args.join(" ")))
}

/// `helm template` of the chart: its objects, CRD first.
fn render(release: &str, namespace: &str, extra: &[&str]) -> Vec<Value> {
    let mut args = vec![
        "template",
        release,
        CHART,
        "--namespace",
        namespace,
        "--include-crds",
    ];
    args.extend_from_slice(extra);
    documents(&run_helm(&args))
}

/// Every non-empty YAML document of a stream, as JSON.
fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(yaml)
        .map(|doc| Value::deserialize(doc).expect("valid YAML"))
        .filter(|doc| !doc.is_null())
        .collect()
}

fn kind(doc: &Value) -> (&str, &str) {
    (
        doc["apiVersion"].as_str().unwrap_or_default(),
        doc["kind"].as_str().unwrap_or_default(),
    )
}

fn find<'a>(docs: &'a [Value], wanted: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| kind(d).1 == wanted).collect()
}

fn one<'a>(docs: &'a [Value], wanted: &str) -> &'a Value {
    match find(docs, wanted).as_slice() {
        [doc] => doc,
        found => panic!("expected one {wanted}, found {}", found.len()),
    }
}

/// Deserializes into the API type and refuses any field the type does not
/// know (the API server would drop it, or refuse it under strict field
/// validation): whatever does not survive a round trip is unknown.
fn strict<T: DeserializeOwned + Serialize>(doc: &Value) -> Result<T, String> {
    let typed: T = serde_json::from_value(doc.clone()).map_err(|e| e.to_string())?;
    let back = serde_json::to_value(&typed).map_err(|e| e.to_string())?;
    let mut lost = Vec::new();
    dropped(doc, &back, "", &mut lost);
    if lost.is_empty() {
        Ok(typed)
    } else {
        Err(format!("unknown or mistyped fields: {}", lost.join(", ")))
    }
}

fn dropped(original: &Value, back: &Value, path: &str, lost: &mut Vec<String>) {
    match (original, back) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, value) in a {
                let here = format!("{path}.{key}");
                match b.get(key) {
                    Some(other) => dropped(value, other, &here, lost),
                    None => lost.push(here),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                dropped(x, y, &format!("{path}[{i}]"), lost);
            }
        }
        (a, b) if a == b => {}
        (Value::Number(a), Value::Number(b)) if a.as_f64() == b.as_f64() => {}
        (a, b) => lost.push(format!("{path} ({a} became {b})")),
    }
}

/// Checks one object against the Kubernetes API schemas (and a WorkerPool
/// against the CRD as well); returns what is wrong with it.
fn check_object(doc: &Value) -> Result<(), String> {
    match kind(doc) {
        ("v1", "Namespace") => strict::<Namespace>(doc).map(drop),
        ("v1", "ServiceAccount") => strict::<ServiceAccount>(doc).map(drop),
        ("v1", "Service") => strict::<Service>(doc).map(drop),
        ("v1", "Secret") => strict::<Secret>(doc).map(drop),
        ("v1", "ConfigMap") => strict::<ConfigMap>(doc).map(drop),
        ("apps/v1", "Deployment") => strict::<Deployment>(doc).map(drop),
        ("apps/v1", "StatefulSet") => strict::<StatefulSet>(doc).map(drop),
        ("batch/v1", "Job") => strict::<Job>(doc).map(drop),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => strict::<ClusterRole>(doc).map(drop),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            strict::<ClusterRoleBinding>(doc).map(drop)
        }
        ("rbac.authorization.k8s.io/v1", "Role") => strict::<Role>(doc).map(drop),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => strict::<RoleBinding>(doc).map(drop),
        ("policy/v1", "PodDisruptionBudget") => strict::<PodDisruptionBudget>(doc).map(drop),
        ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => {
            strict::<CustomResourceDefinition>(doc).map(drop)
        }
        ("monitoring.coreos.com/v1", "ServiceMonitor") => check_service_monitor(doc),
        ("monitoring.coreos.com/v1", "PodMonitor") => check_pod_monitor(doc),
        ("monitoring.coreos.com/v1", "PrometheusRule") => check_prometheus_rule(doc),
        ("workerpool.dev/v1alpha1", "WorkerPool") => check_worker_pool(doc),
        (api_version, kind) => Err(format!(
            "no schema to check {api_version} {kind} against: add it to check_object"
        )),
    }
}

/// The Prometheus Operator's types are not in k8s-openapi: the fields the
/// chart uses, checked by hand.
fn check_service_monitor(doc: &Value) -> Result<(), String> {
    let spec = doc["spec"].as_object().ok_or("no spec")?;
    let known: BTreeSet<&str> = ["selector", "namespaceSelector", "endpoints"].into();
    if let Some(unknown) = spec.keys().find(|k| !known.contains(k.as_str())) {
        return Err(format!("unexpected spec.{unknown}"));
    }
    let endpoints = doc["spec"]["endpoints"].as_array().ok_or("no endpoints")?;
    for endpoint in endpoints {
        for key in ["port", "path", "interval", "scrapeTimeout"] {
            if !endpoint[key].is_string() {
                return Err(format!("endpoint without a string {key}: {endpoint}"));
            }
        }
    }
    Ok(())
}

/// A PodMonitor, by hand like the ServiceMonitor.
fn check_pod_monitor(doc: &Value) -> Result<(), String> {
    let spec = doc["spec"].as_object().ok_or("no spec")?;
    let known: BTreeSet<&str> = ["selector", "namespaceSelector", "podMetricsEndpoints"].into();
    if let Some(unknown) = spec.keys().find(|k| !known.contains(k.as_str())) {
        return Err(format!("unexpected spec.{unknown}"));
    }
    let selector = doc["spec"]["namespaceSelector"]
        .as_object()
        .ok_or("no namespaceSelector")?;
    match (selector.get("any"), selector.get("matchNames")) {
        (Some(Value::Bool(true)), None) => {}
        (None, Some(Value::Array(names)))
            if !names.is_empty() && names.iter().all(Value::is_string) => {}
        _ => return Err(format!("namespaceSelector: {selector:?}")),
    }
    let endpoints = doc["spec"]["podMetricsEndpoints"]
        .as_array()
        .ok_or("no podMetricsEndpoints")?;
    let known: BTreeSet<&str> = ["port", "path", "interval", "scrapeTimeout", "relabelings"].into();
    for endpoint in endpoints {
        let endpoint = endpoint.as_object().ok_or("an endpoint is not an object")?;
        if let Some(unknown) = endpoint.keys().find(|k| !known.contains(k.as_str())) {
            return Err(format!("unexpected endpoint field {unknown}"));
        }
        for key in ["port", "path", "interval", "scrapeTimeout"] {
            if !endpoint.get(key).is_some_and(Value::is_string) {
                return Err(format!("endpoint without a string {key}"));
            }
        }
        for relabeling in endpoint
            .get("relabelings")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if !relabeling["sourceLabels"].is_array() || !relabeling["targetLabel"].is_string() {
                return Err(format!("relabeling: {relabeling}"));
            }
        }
    }
    Ok(())
}

/// A PrometheusRule: groups of alerts, each with an expression, a
/// duration, a severity and the annotations a person acts on. The
/// expressions themselves are checked by promtool (tests/tests/monitoring.rs).
fn check_prometheus_rule(doc: &Value) -> Result<(), String> {
    let spec = doc["spec"].as_object().ok_or("no spec")?;
    if let Some(unknown) = spec.keys().find(|k| k.as_str() != "groups") {
        return Err(format!("unexpected spec.{unknown}"));
    }
    let groups = doc["spec"]["groups"].as_array().ok_or("no groups")?;
    for group in groups {
        let name = group["name"].as_str().ok_or("a group without a name")?;
        for rule in group["rules"].as_array().ok_or("a group without rules")? {
            let rule = rule.as_object().ok_or("a rule is not an object")?;
            let known: BTreeSet<&str> = ["alert", "expr", "for", "labels", "annotations"].into();
            if let Some(unknown) = rule.keys().find(|k| !known.contains(k.as_str())) {
                return Err(format!("{name}: unexpected rule field {unknown}"));
            }
            let alert = rule
                .get("alert")
                .and_then(Value::as_str)
                .ok_or("no alert")?;
            for (field, value) in [
                ("expr", rule.get("expr")),
                ("for", rule.get("for")),
                (
                    "labels.severity",
                    rule.get("labels").map(|l| &l["severity"]),
                ),
                (
                    "annotations.summary",
                    rule.get("annotations").map(|a| &a["summary"]),
                ),
                (
                    "annotations.description",
                    rule.get("annotations").map(|a| &a["description"]),
                ),
            ] {
                if value.and_then(Value::as_str).is_none_or(str::is_empty) {
                    return Err(format!("{alert}: no string {field}"));
                }
            }
        }
    }
    Ok(())
}

/// A WorkerPool: the Rust type (unknown fields refused), the CRD's OpenAPI
/// schema, its CEL rules, the scaling settings' own checks, and the
/// operator's Deployment builder.
fn check_worker_pool(doc: &Value) -> Result<(), String> {
    let mut pool: WorkerPool = strict(doc)?;
    let mut errors = Vec::new();
    check_schema(&crd_schema(), doc, "", &mut errors);
    if !errors.is_empty() {
        return Err(format!("CRD schema: {}", errors.join("; ")));
    }
    pool.validate_cel().map_err(|e| format!("CEL rules: {e}"))?;
    if let Some(problem) = pool
        .spec
        .scaling
        .as_ref()
        .and_then(|s| s.problems().first().cloned())
    {
        return Err(format!("spec.scaling: {problem}"));
    }
    // What the API server fills in before the operator sees the pool.
    pool.metadata
        .namespace
        .get_or_insert_with(|| "default".into());
    pool.metadata.uid = Some("00000000-0000-0000-0000-000000000000".into());
    deployment::build(&pool, 1).map_err(|e| format!("the operator cannot run it: {e}"))?;
    Ok(())
}

/// The WorkerPool CRD's OpenAPI schema, as the code generates it.
fn crd_schema() -> Value {
    let crd: Value = serde_yaml_ng::from_str(&workerpool_operator::crd::crd_yaml())
        .expect("the generated CRD is YAML");
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

/// Validates a value against a structural schema as the API server does
/// for a custom resource, except that unknown fields, which it would
/// silently prune, are errors here.
fn check_schema(schema: &Value, value: &Value, path: &str, errors: &mut Vec<String>) {
    let at = if path.is_empty() { "." } else { path };
    if value.is_null() {
        if schema["nullable"] != json!(true) {
            errors.push(format!("{at}: null"));
        }
        return;
    }
    if schema["x-kubernetes-int-or-string"] == json!(true) {
        if !(value.is_i64() || value.is_u64() || value.is_string()) {
            errors.push(format!(
                "{at}: expected an integer or a string, got {value}"
            ));
        }
        return;
    }
    let expected = schema["type"].as_str().unwrap_or_default();
    match (expected, value) {
        ("object", Value::Object(map)) => {
            for key in schema["required"].as_array().into_iter().flatten() {
                if let Some(key) = key.as_str()
                    && !map.contains_key(key)
                {
                    errors.push(format!("{path}.{key}: required"));
                }
            }
            for (key, item) in map {
                // apiVersion, kind and metadata are the API server's own.
                if path.is_empty() && ["apiVersion", "kind", "metadata"].contains(&key.as_str()) {
                    continue;
                }
                let here = format!("{path}.{key}");
                if let Some(sub) = schema["properties"].get(key) {
                    check_schema(sub, item, &here, errors);
                } else if schema["additionalProperties"].is_object() {
                    check_schema(&schema["additionalProperties"], item, &here, errors);
                } else if schema["additionalProperties"] != json!(true)
                    && schema["x-kubernetes-preserve-unknown-fields"] != json!(true)
                {
                    errors.push(format!("{here}: unknown field"));
                }
            }
        }
        ("array", Value::Array(items)) => {
            if let Some(min) = schema["minItems"].as_u64()
                && (items.len() as u64) < min
            {
                errors.push(format!("{at}: fewer than {min} items"));
            }
            for (i, item) in items.iter().enumerate() {
                check_schema(&schema["items"], item, &format!("{path}[{i}]"), errors);
            }
        }
        ("string", Value::String(s)) => {
            if let Some(min) = schema["minLength"].as_u64()
                && (s.chars().count() as u64) < min
            {
                errors.push(format!("{at}: shorter than {min}"));
            }
            if let Some(options) = schema["enum"].as_array()
                && !options.contains(value)
            {
                errors.push(format!("{at}: {value} is not one of {options:?}"));
            }
        }
        ("integer", Value::Number(n)) if n.is_i64() || n.is_u64() => {
            if let (Some(min), Some(v)) = (schema["minimum"].as_f64(), n.as_f64())
                && v < min
            {
                errors.push(format!("{at}: {v} is below the minimum {min}"));
            }
            if let (Some(max), Some(v)) = (schema["maximum"].as_f64(), n.as_f64())
                && v > max
            {
                errors.push(format!("{at}: {v} is above the maximum {max}"));
            }
        }
        ("number", Value::Number(_)) | ("boolean", Value::Bool(_)) => {}
        ("", _) => {}
        (expected, value) => errors.push(format!("{at}: expected {expected}, got {value}")),
    }
}

/// Breaks a valid object in one way, for the tests of the checks themselves.
type Breaking = fn(&mut Value);

fn check_all(docs: &[Value], source: &str) {
    let problems: Vec<String> = docs
        .iter()
        .filter_map(|doc| {
            check_object(doc).err().map(|e| {
                let (_, kind) = kind(doc);
                let name = doc["metadata"]["name"].as_str().unwrap_or("?");
                format!("{source}: {kind} {name}: {e}")
            })
        })
        .collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

fn container(docs: &[Value]) -> &Value {
    &one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
}

fn args(docs: &[Value]) -> Vec<&str> {
    container(docs)["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .collect()
}

/// The operator's own ClusterRole (the chart also has roles for people).
fn operator_cluster_role(docs: &[Value]) -> &Value {
    let name = &one(docs, "Deployment")["metadata"]["name"];
    docs.iter()
        .find(|d| kind(d).1 == "ClusterRole" && &d["metadata"]["name"] == name)
        .expect("a ClusterRole named like the operator's Deployment")
}

fn chart_yaml() -> Value {
    serde_yaml_ng::from_str(&read(&format!("{CHART}/Chart.yaml"))).expect("Chart.yaml is YAML")
}

#[test]
fn helm_lint_strict_passes_with_default_and_non_default_values() {
    run_helm(&["lint", "--strict", CHART]);
    run_helm(&["lint", "--strict", CHART, "-f", NON_DEFAULT_VALUES]);
}

#[test]
fn every_object_rendered_with_default_values_is_a_valid_kubernetes_object() {
    let docs = render("workerpool-operator", INSTALL_NAMESPACE, &[]);
    check_all(&docs, "helm template (defaults)");
    let kinds: BTreeSet<&str> = docs.iter().map(|d| kind(d).1).collect();
    assert_eq!(
        kinds,
        BTreeSet::from([
            "CustomResourceDefinition",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "Service",
            "Deployment",
        ]),
        "the optional ServiceMonitor, PodMonitor, PrometheusRule, dashboard ConfigMap and PodDisruptionBudget are off by default"
    );
}

#[test]
fn every_object_rendered_with_non_default_values_is_a_valid_kubernetes_object() {
    let docs = render("wp", "ops", &["-f", NON_DEFAULT_VALUES]);
    check_all(&docs, "helm template (ci/non-default-values.yaml)");

    // Watching one namespace, the operator's rights are granted there only.
    assert!(find(&docs, "ClusterRoleBinding").is_empty());
    let bindings = find(&docs, "RoleBinding");
    let watch = bindings
        .iter()
        .find(|b| b["roleRef"]["kind"] == "ClusterRole")
        .expect("a RoleBinding to the ClusterRole");
    assert_eq!(watch["metadata"]["namespace"], "jobs");
    assert!(args(&docs).windows(2).any(|w| w == ["--namespace", "jobs"]));
    assert!(
        args(&docs)
            .windows(2)
            .any(|w| w == ["--lease-name", "wp-operator-leader"])
    );

    let deployment = one(&docs, "Deployment");
    assert_eq!(deployment["spec"]["replicas"], 3);
    assert_eq!(
        container(&docs)["image"],
        "ghcr.io/workerpool-dev/workerpool-operator@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
    );
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "wp-operator-sa");
    assert_eq!(pod["priorityClassName"], "system-cluster-critical");

    let pdb = one(&docs, "PodDisruptionBudget");
    assert_eq!(pdb["spec"]["minAvailable"], 2);
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"]
    );

    let service = one(&docs, "Service");
    let monitor = one(&docs, "ServiceMonitor");
    assert_eq!(monitor["metadata"]["labels"]["release"], "prometheus");
    assert_eq!(
        monitor["spec"]["endpoints"][0]["honorLabels"], true,
        "the pool metrics keep their own namespace label"
    );
    assert_eq!(
        monitor["spec"]["endpoints"][0]["port"],
        service["spec"]["ports"][0]["name"]
    );
    assert_eq!(service["spec"]["ports"][0]["port"], 9090);
    let service_labels = service["metadata"]["labels"].as_object().expect("labels");
    for (key, value) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("matchLabels")
    {
        assert_eq!(
            service_labels.get(key),
            Some(value),
            "ServiceMonitor selects the Service"
        );
    }
}

#[test]
fn the_chart_grants_exactly_the_rules_the_operator_needs() {
    for (values, release) in [
        (None, "workerpool-operator"),
        (Some(NON_DEFAULT_VALUES), "wp"),
    ] {
        let extra: Vec<&str> = values.map(|v| vec!["-f", v]).unwrap_or_default();
        let docs = render(release, INSTALL_NAMESPACE, &extra);
        let rules = |doc: &Value| -> Vec<PolicyRule> {
            serde_json::from_value(doc["rules"].clone()).expect("rules are PolicyRules")
        };
        let cluster_role = operator_cluster_role(&docs);
        let lease_role = one(&docs, "Role");
        assert_eq!(
            rules(cluster_role),
            rbac::policy_rules(rbac::CLUSTER_RULES),
            "the chart's ClusterRole must equal CLUSTER_RULES in operator/src/rbac.rs"
        );
        assert_eq!(
            rules(lease_role),
            rbac::policy_rules(rbac::LEASE_RULES),
            "the chart's leader-election Role must equal LEASE_RULES in operator/src/rbac.rs"
        );
        assert_eq!(lease_role["metadata"]["namespace"], INSTALL_NAMESPACE);

        // The same check the controller tests make of every request they see,
        // against the rules as rendered: the controller's requests...
        let granted = |doc: &Value| -> BTreeSet<(String, String, String)> {
            rules(doc)
                .into_iter()
                .flat_map(|rule| {
                    let groups = rule.api_groups.unwrap_or_default();
                    let resources = rule.resources.unwrap_or_default();
                    assert!(rule.resource_names.is_none() && rule.non_resource_urls.is_none());
                    let mut out = Vec::new();
                    for group in &groups {
                        for resource in &resources {
                            for verb in &rule.verbs {
                                assert!(group != "*" && resource != "*" && verb != "*");
                                out.push((group.clone(), resource.clone(), verb.clone()));
                            }
                        }
                    }
                    out
                })
                .collect()
        };
        let cluster = granted(cluster_role);
        const MERGE: &str = "application/merge-patch+json";
        for (method, path, query, content_type) in [
            ("GET", "/apis/workerpool.dev/v1alpha1/workerpools", "", ""),
            (
                "GET",
                "/apis/workerpool.dev/v1alpha1/workerpools",
                "watch=true",
                "",
            ),
            (
                "GET",
                "/apis/apps/v1/deployments",
                "labelSelector=app.kubernetes.io%2Fmanaged-by%3Dworkerpool-operator",
                "",
            ),
            ("GET", "/apis/apps/v1/deployments", "watch=true", ""),
            (
                "PATCH",
                "/apis/apps/v1/namespaces/jobs/deployments/mail",
                "fieldManager=workerpool-operator&force=true",
                rbac::APPLY_PATCH,
            ),
            (
                "GET",
                "/apis/apps/v1/namespaces/jobs/deployments/mail",
                "",
                "",
            ),
            (
                "PATCH",
                "/apis/workerpool.dev/v1alpha1/namespaces/jobs/workerpools/mail/status",
                "",
                MERGE,
            ),
            ("GET", "/api/v1/namespaces/jobs/secrets/redis", "", ""),
            (
                "GET",
                "/api/v1/namespaces/jobs/pods",
                "labelSelector=workerpool.dev%2Fpool%3Dmail",
                "",
            ),
            ("PATCH", "/api/v1/namespaces/jobs/pods/mail-1", "", MERGE),
            (
                "POST",
                "/apis/events.k8s.io/v1/namespaces/jobs/events",
                "",
                "",
            ),
            (
                "PATCH",
                "/apis/events.k8s.io/v1/namespaces/jobs/events/mail.1",
                "",
                MERGE,
            ),
        ] {
            for needed in
                rbac::needed(method, path, query, content_type).expect("a resource request")
            {
                assert!(
                    cluster.contains(&needed),
                    "the chart's ClusterRole does not allow {needed:?}"
                );
            }
        }
        // ... and leader election's.
        let lease = granted(lease_role);
        for (method, path) in [
            (
                "GET",
                "/apis/coordination.k8s.io/v1/namespaces/ns/leases/workerpool-operator",
            ),
            ("POST", "/apis/coordination.k8s.io/v1/namespaces/ns/leases"),
            (
                "PATCH",
                "/apis/coordination.k8s.io/v1/namespaces/ns/leases/workerpool-operator",
            ),
        ] {
            for needed in rbac::needed(method, path, "", "").expect("a resource request") {
                assert!(
                    lease.contains(&needed),
                    "the chart's Role does not allow {needed:?}"
                );
            }
        }

        // Both are bound to the service account the operator runs as.
        let account =
            one(&docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"].clone();
        assert_eq!(one(&docs, "ServiceAccount")["metadata"]["name"], account);
        let bindings: Vec<&Value> = find(&docs, "RoleBinding")
            .into_iter()
            .chain(find(&docs, "ClusterRoleBinding"))
            .collect();
        for role in [cluster_role, lease_role] {
            let binding = bindings
                .iter()
                .find(|b| {
                    b["roleRef"]["name"] == role["metadata"]["name"]
                        && b["roleRef"]["kind"] == role["kind"]
                })
                .unwrap_or_else(|| panic!("no binding for {}", role["metadata"]["name"]));
            assert_eq!(
                binding["subjects"],
                json!([{"kind": "ServiceAccount", "name": account, "namespace": INSTALL_NAMESPACE}])
            );
        }
    }
}

#[test]
fn the_rbac_names_with_default_values_are_those_of_manifests_rbac_yaml() {
    let docs = render("workerpool-operator", INSTALL_NAMESPACE, &[]);
    let generated = documents(&rbac::rbac_yaml());
    assert_eq!(
        operator_cluster_role(&docs)["metadata"]["name"],
        one(&generated, "ClusterRole")["metadata"]["name"]
    );
    assert_eq!(
        one(&docs, "Role")["metadata"]["name"],
        one(&generated, "Role")["metadata"]["name"]
    );
    // The operator's default Lease name.
    assert!(
        args(&docs)
            .windows(2)
            .any(|w| w == ["--lease-name", "workerpool-operator"])
    );
}

#[test]
fn people_with_the_built_in_roles_can_use_workerpools_and_nothing_more() {
    let docs = render("workerpool-operator", INSTALL_NAMESPACE, &[]);
    let aggregated: Vec<&Value> = find(&docs, "ClusterRole")
        .into_iter()
        .filter(|r| {
            r["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
        })
        .collect();
    assert_eq!(aggregated.len(), 2, "a view and an edit role");
    for role in &aggregated {
        for rule in role["rules"].as_array().expect("rules") {
            assert_eq!(rule["apiGroups"], json!(["workerpool.dev"]), "{role}");
        }
    }
    let view = aggregated
        .iter()
        .find(|r| r["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true")
        .expect("a role aggregated into view");
    for rule in view["rules"].as_array().expect("rules") {
        for verb in rule["verbs"].as_array().expect("verbs") {
            assert!(
                ["get", "list", "watch"].contains(&verb.as_str().unwrap_or_default()),
                "view may only read: {verb}"
            );
        }
    }

    let without = render(
        "workerpool-operator",
        INSTALL_NAMESPACE,
        &["--set", "rbac.aggregateToDefaultRoles=false"],
    );
    assert_eq!(
        find(&without, "ClusterRole").len(),
        1,
        "only the operator's"
    );
}

#[test]
fn the_operator_pod_is_locked_down_probed_and_leader_elected() {
    let docs = render("workerpool-operator", INSTALL_NAMESPACE, &[]);
    let deployment = one(&docs, "Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    let c = container(&docs);

    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let sc = &c["securityContext"];
    assert_eq!(sc["runAsNonRoot"], true);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");

    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["ports"][0]["name"], c["livenessProbe"]["httpGet"]["port"]);
    assert!(c["resources"]["requests"]["cpu"].is_string());
    assert!(c["resources"]["requests"]["memory"].is_string());
    assert!(c["resources"]["limits"]["memory"].is_string());

    // The image tag defaults to the chart's appVersion.
    let app_version = chart_yaml()["appVersion"]
        .as_str()
        .expect("appVersion")
        .to_owned();
    assert_eq!(
        c["image"],
        format!("ghcr.io/workerpool-dev/workerpool-operator:{app_version}")
    );

    // Leader election: the Lease's namespace and the replica's identity
    // come from the pod, so more replicas are safe.
    assert_eq!(args(&docs)[0], "run");
    assert!(!args(&docs).contains(&"--no-leader-election"));
    let env = c["env"].as_array().expect("env");
    for (name, field) in [
        ("POD_NAMESPACE", "metadata.namespace"),
        ("POD_NAME", "metadata.name"),
    ] {
        assert!(
            env.iter()
                .any(|e| e["name"] == name && e["valueFrom"]["fieldRef"]["fieldPath"] == field),
            "{name} from {field}"
        );
    }

    // The recommended labels on every object the chart creates.
    for doc in docs
        .iter()
        .filter(|d| kind(d).1 != "CustomResourceDefinition")
    {
        let labels = &doc["metadata"]["labels"];
        for key in [
            "app.kubernetes.io/name",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/version",
            "app.kubernetes.io/managed-by",
            "helm.sh/chart",
        ] {
            assert!(
                labels[key].is_string(),
                "{} {} lacks {key}",
                kind(doc).1,
                doc["metadata"]["name"]
            );
        }
    }
}

#[test]
fn one_replica_without_leader_election_stops_the_old_pod_first_and_more_are_refused() {
    let docs = render(
        "workerpool-operator",
        INSTALL_NAMESPACE,
        &["--set", "leaderElection.enabled=false"],
    );
    assert!(args(&docs).contains(&"--no-leader-election"));
    assert!(find(&docs, "Role").is_empty(), "no Lease, no Role for it");
    assert_eq!(
        one(&docs, "Deployment")["spec"]["strategy"]["type"],
        "Recreate"
    );

    let refused = try_helm(&[
        "template",
        "workerpool-operator",
        CHART,
        "--set",
        "replicaCount=2",
        "--set",
        "leaderElection.enabled=false",
    ])
    .expect_err("two replicas without leader election");
    assert!(
        refused.contains("needs leaderElection.enabled"),
        "{refused}"
    );
}

#[test]
fn values_outside_the_schema_are_refused() {
    for bad in [
        "replicaCount=-1",
        "image.pullPolicy=Sometimes",
        "unknownSetting=1",
        "watchNamespace=Not_A_Namespace",
        "prometheusRule.backlogAge.seconds=soon",
        "prometheusRule.deadLetters.threshold=-1",
        "prometheusRule.reconcileErrors.window=ten minutes",
        "prometheusRule.queueUnreachable.severity=",
        "prometheusRule.redisEvictedKeys.window=soon",
        "prometheusRule.workersLost.unknownSetting=1",
        "prometheusRule.tracesDropped.window=soon",
        "prometheusRule.poolUnreadable.for=soon",
        "prometheusRule.poolUnreadable.threshold=1",
        "podMonitor.interval=30",
        "podMonitor.namespaces[0]=Not_A_Namespace",
        "grafana.dashboard.enabled=yes",
        "grafana.dashboard.label=",
    ] {
        let err = try_helm(&["template", "x", CHART, "--set", bad])
            .expect_err("values.schema.json refuses it");
        assert!(err.contains("schema"), "{bad}: {err}");
    }
}

#[test]
fn notes_tell_the_next_step() {
    let out = run_helm(&[
        "install",
        "workerpool-operator",
        CHART,
        "--dry-run=client",
        "--namespace",
        INSTALL_NAMESPACE,
    ]);
    assert!(out.contains("NOTES:"), "{out}");
    assert!(out.contains("apply a WorkerPool"), "{out}");
    assert!(out.contains("manifests/examples/exec-pool.yaml"), "{out}");
}

#[test]
fn the_chart_crd_is_the_generated_crd() {
    let generated = workerpool_operator::crd::crd_yaml();
    if updating() {
        update_file(CHART_CRD, &generated);
    }
    assert!(
        read(CHART_CRD) == generated,
        "{CHART_CRD} is stale: run `{REGENERATE}`"
    );
    assert!(
        read("manifests/crd.yaml") == generated,
        "manifests/crd.yaml is stale: run `cargo run -p workerpool-operator -- crd > manifests/crd.yaml`"
    );
}

#[test]
fn the_chart_app_version_is_the_operator_version() {
    assert_eq!(chart_yaml()["appVersion"], env!("CARGO_PKG_VERSION"));
}

/// Whether this run regenerates the checked-in files (`UPDATE_MANIFESTS=1`).
fn updating() -> bool {
    std::env::var_os("UPDATE_MANIFESTS").is_some()
}

/// Writes a generated file unless it already holds `content` (two tests
/// may regenerate the same file, and helm may be reading it meanwhile).
fn update_file(relative: &str, content: &str) {
    let path = root().join(relative);
    if std::fs::read_to_string(&path).ok().as_deref() != Some(content) {
        std::fs::write(&path, content).unwrap_or_else(|e| panic!("cannot write {relative}: {e}"));
    }
}

/// `manifests/install.yaml`: the Namespace, then the chart rendered with its
/// defaults, CRD included.
fn install_yaml() -> String {
    let rendered = run_helm(&[
        "template",
        "workerpool-operator",
        CHART,
        "--namespace",
        INSTALL_NAMESPACE,
        "--include-crds",
    ]);
    format!(
        "# The workerpool operator for `kubectl apply -f`: its namespace, the WorkerPool\n\
         # CRD, RBAC and the operator, in namespace {INSTALL_NAMESPACE}.\n\
         # Generated from charts/workerpool-operator with default values; do not edit.\n\
         # Regenerate: {REGENERATE}\n\
         ---\n\
         apiVersion: v1\n\
         kind: Namespace\n\
         metadata:\n  \
           name: {INSTALL_NAMESPACE}\n  \
           labels:\n    \
             app.kubernetes.io/part-of: workerpool\n    \
             pod-security.kubernetes.io/enforce: restricted\n\
         {rendered}"
    )
}

#[test]
fn install_yaml_is_the_chart_rendered_with_defaults() {
    let path = root().join("manifests/install.yaml");
    if updating() {
        // The chart's CRD first, so one run regenerates both.
        update_file(CHART_CRD, &workerpool_operator::crd::crd_yaml());
        update_file("manifests/install.yaml", &install_yaml());
    }
    let fresh = install_yaml();
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == fresh,
        "manifests/install.yaml is stale: run `{REGENERATE}`"
    );
    let docs = documents(&on_disk);
    check_all(&docs, "manifests/install.yaml");
    assert_eq!(kind(&docs[0]), ("v1", "Namespace"));
    for doc in docs
        .iter()
        .filter(|d| d["metadata"]["namespace"].is_string())
    {
        assert_eq!(doc["metadata"]["namespace"], INSTALL_NAMESPACE);
    }
}

#[test]
fn every_example_manifest_is_valid() {
    let dir = root().join("manifests/examples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("manifests/examples exists")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
        .collect();
    files.sort();
    assert!(files.len() >= 4, "examples: {files:?}");
    for file in &files {
        let text = std::fs::read_to_string(file).expect("readable example");
        let docs = documents(&text);
        assert!(!docs.is_empty(), "{} has no objects", file.display());
        let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("?");
        check_all(&docs, &format!("manifests/examples/{name}"));
    }
}

#[test]
fn every_cel_rule_or_schema_mistake_in_a_pool_is_caught() {
    // The checker itself: each broken copy of a valid pool must be refused.
    let text = read("manifests/examples/exec-pool.yaml");
    let valid = documents(&text).remove(0);
    check_object(&valid).expect("the exec example is valid");
    let broken: [(&str, Breaking); 7] = [
        ("unknown field", |p| {
            p["spec"]["worker"]["concurency"] = json!(4)
        }),
        ("children above the concurrency", |p| {
            p["spec"]["worker"]["children"] = json!(5)
        }),
        ("below the minimum", |p| {
            p["spec"]["worker"]["concurrency"] = json!(0)
        }),
        // An i64 the pool reads, past the schema's bound.
        ("above the maximum", |p| {
            p["spec"]["worker"]["maxPayloadBytes"] = json!(536_870_913)
        }),
        ("replicas and scaling", |p| p["spec"]["replicas"] = json!(2)),
        ("unknown pod field", |p| {
            p["spec"]["template"]["spec"]["containers"][0]["imag"] = json!("x")
        }),
        ("wrong type", |p| {
            p["spec"]["scaling"]["maxReplicas"] = json!("ten")
        }),
    ];
    for (what, breaking) in broken {
        let mut pool = valid.clone();
        breaking(&mut pool);
        assert!(check_object(&pool).is_err(), "{what} was not caught");
    }
}

fn pool<'a>(docs: &'a [Value], name: &str) -> &'a Value {
    docs.iter()
        .find(|d| kind(d).1 == "WorkerPool" && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no WorkerPool {name}"))
}

#[test]
fn the_video_platform_sizes_its_two_pools_for_their_work() {
    let docs = documents(&read("manifests/examples/video-platform.yaml"));
    let transcode = pool(&docs, "video-transcode");
    let upload = pool(&docs, "video-upload");

    assert_eq!(transcode["spec"]["worker"]["concurrency"], 1);
    assert_eq!(upload["spec"]["worker"]["concurrency"], 50);
    assert_eq!(
        upload["spec"]["worker"]["children"], 1,
        "I/O-bound: the 50 slots in one async handler process"
    );
    assert!(
        transcode["spec"]["worker"].get("children").is_none(),
        "CPU-bound: one process per slot"
    );
    let cpu = &transcode["spec"]["template"]["spec"]["containers"][0]["resources"];
    assert!(cpu["requests"]["cpu"].is_string());
    assert_eq!(
        cpu["requests"]["cpu"], cpu["limits"]["cpu"],
        "CPU-bound: a guaranteed CPU share"
    );

    for p in [transcode, upload] {
        let worker = &p["spec"]["template"]["spec"]["containers"][0];
        for probe in ["readinessProbe", "livenessProbe"] {
            assert_eq!(worker[probe]["periodSeconds"], 5, "{probe} every 5 s");
            assert_eq!(worker[probe]["httpGet"]["port"], deployment::WORKER_PORT);
        }
        let grace = p["spec"]["shutdown"]["gracePeriodSeconds"]
            .as_i64()
            .expect("grace period");
        let grace = i32::try_from(grace).expect("a small grace period");
        assert_eq!(
            deployment::shutdown_deadline_ms(grace),
            30_000,
            "the current job gets 30 s on shutdown"
        );
        assert_eq!(p["spec"]["scaling"]["targetBacklogPerReplica"], 100);
    }
}

#[test]
fn a_misspelled_or_mistyped_field_in_a_kubernetes_object_is_caught() {
    let docs = render("workerpool-operator", INSTALL_NAMESPACE, &[]);
    let valid = one(&docs, "Deployment").clone();
    let broken: [(&str, Breaking); 3] = [
        ("misspelled", |d| {
            d["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = json!({})
        }),
        ("mistyped", |d| d["spec"]["replicas"] = json!("one")),
        ("misplaced", |d| {
            d["spec"]["serviceAccountName"] = json!("x")
        }),
    ];
    for (what, breaking) in broken {
        let mut deployment = valid.clone();
        breaking(&mut deployment);
        assert!(check_object(&deployment).is_err(), "{what} was not caught");
    }
}

#[test]
fn clusters_without_crd_validation_rules_are_refused() {
    // x-kubernetes-validations (CEL) is on by default from Kubernetes 1.25.
    run_helm(&["template", "x", CHART, "--kube-version", "1.25.0"]);
    let refused = try_helm(&["template", "x", CHART, "--kube-version", "1.24.17"])
        .expect_err("Kubernetes 1.24 is refused");
    assert!(refused.contains("kubeVersion"), "{refused}");
}

/// Every alert the chart's PrometheusRule defines.
const ALERTS: [&str; 11] = [
    "WorkerPoolBacklogTooOld",
    "WorkerPoolAtMaxReplicas",
    "WorkerPoolSaturated",
    "WorkerPoolQueueUnreachable",
    "WorkerPoolRedisMayEvictJobs",
    "WorkerPoolRedisEvictedKeys",
    "WorkerPoolUnreadable",
    "WorkerPoolDeadLettersGrowing",
    "WorkerPoolWorkersLost",
    "WorkerPoolTracesDropped",
    "WorkerPoolOperatorReconcileErrors",
];

fn alert_rules(docs: &[Value]) -> Vec<&Value> {
    one(docs, "PrometheusRule")["spec"]["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules"))
        .collect()
}

#[test]
fn the_monitoring_objects_render_only_when_enabled_and_are_valid() {
    let enabled = [
        "--set",
        "podMonitor.enabled=true",
        "--set",
        "prometheusRule.enabled=true",
        "--set",
        "grafana.dashboard.enabled=true",
    ];
    let docs = render("workerpool-operator", INSTALL_NAMESPACE, &enabled);
    check_all(&docs, "helm template (monitoring enabled)");
    for kind in ["PodMonitor", "PrometheusRule", "ConfigMap"] {
        let doc = one(&docs, kind);
        assert_eq!(doc["metadata"]["namespace"], INSTALL_NAMESPACE, "{kind}");
    }
    let defaults = render("workerpool-operator", INSTALL_NAMESPACE, &[]);
    for kind in [
        "PodMonitor",
        "PrometheusRule",
        "ConfigMap",
        "ServiceMonitor",
    ] {
        assert!(find(&defaults, kind).is_empty(), "{kind} is off by default");
    }
}

#[test]
fn the_dashboard_configmap_carries_the_sidecar_label_and_the_dashboard() {
    let docs = render(
        "workerpool-operator",
        INSTALL_NAMESPACE,
        &["--set", "grafana.dashboard.enabled=true"],
    );
    let map = one(&docs, "ConfigMap");
    assert_eq!(map["metadata"]["labels"]["grafana_dashboard"], "1");
    let shipped: Value = serde_json::from_str(
        map["data"]["workerpool.json"]
            .as_str()
            .expect("workerpool.json"),
    )
    .expect("the dashboard in the ConfigMap is JSON");
    let file: Value = serde_json::from_str(&read(&format!("{CHART}/dashboards/workerpool.json")))
        .expect("dashboards/workerpool.json is JSON");
    assert_eq!(shipped, file, "the ConfigMap holds the file as it is");
    assert_eq!(shipped["uid"], "workerpool");

    // The label the sidecar looks for, a folder annotation, extra labels,
    // another namespace.
    let docs = render(
        "wp",
        INSTALL_NAMESPACE,
        &[
            "--set",
            "grafana.dashboard.enabled=true",
            "--set",
            "grafana.dashboard.label=dashboards",
            "--set",
            "grafana.dashboard.labelValue=workerpool",
            "--set",
            "grafana.dashboard.namespace=monitoring",
            "--set",
            "grafana.dashboard.annotations.grafana_folder=Workers",
            "--set",
            "grafana.dashboard.labels.team=platform",
        ],
    );
    let map = one(&docs, "ConfigMap");
    let meta = &map["metadata"];
    assert_eq!(meta["namespace"], "monitoring");
    assert_eq!(meta["labels"]["dashboards"], "workerpool");
    assert_eq!(meta["labels"]["team"], "platform");
    assert!(meta["labels"].get("grafana_dashboard").is_none());
    assert_eq!(meta["annotations"]["grafana_folder"], "Workers");
}

#[test]
fn the_prometheus_rule_has_every_alert_with_what_to_do_and_its_thresholds() {
    let docs = render(
        "workerpool-operator",
        INSTALL_NAMESPACE,
        &["--set", "prometheusRule.enabled=true"],
    );
    let rules = alert_rules(&docs);
    let names: Vec<&str> = rules.iter().filter_map(|r| r["alert"].as_str()).collect();
    assert_eq!(names, ALERTS);
    let readme = read(&format!("{CHART}/README.md"));
    let app_version = chart_yaml()["appVersion"]
        .as_str()
        .expect("appVersion")
        .to_owned();
    for rule in &rules {
        let alert = rule["alert"].as_str().expect("alert");
        let annotations = &rule["annotations"];
        for text in [&annotations["summary"], &annotations["description"]] {
            let text = text.as_str().expect("annotation");
            assert!(text.contains("{{ $labels."), "{alert}: {text}");
        }
        // The runbook is the chart README's section on the alert, at the
        // chart's version.
        let url = annotations["runbook_url"].as_str().expect("runbook_url");
        assert_eq!(
            url,
            format!(
                "https://github.com/workerpool-dev/workerpool/blob/v{app_version}/charts/workerpool-operator/README.md#{}",
                alert.to_lowercase()
            )
        );
        assert!(
            readme.lines().any(|l| l == format!("#### {alert}")),
            "the chart README has no section on {alert}"
        );
        assert!(
            ["warning", "critical"].contains(&rule["labels"]["severity"].as_str().unwrap_or(""))
        );
    }
    let expr = |docs: &[Value], alert: &str| -> String {
        alert_rules(docs)
            .iter()
            .find(|r| r["alert"] == alert)
            .and_then(|r| r["expr"].as_str())
            .expect("the alert")
            .to_owned()
    };
    assert!(expr(&docs, "WorkerPoolBacklogTooOld").ends_with("> 600"));

    // Thresholds, durations, severities and labels come from the values.
    let docs = render(
        "workerpool-operator",
        INSTALL_NAMESPACE,
        &[
            "--set",
            "prometheusRule.enabled=true",
            "--set",
            "prometheusRule.backlogAge.seconds=900",
            "--set",
            "prometheusRule.backlogAge.for=20m",
            "--set",
            "prometheusRule.backlogAge.severity=critical",
            "--set",
            "prometheusRule.deadLetters.window=1h",
            "--set",
            "prometheusRule.alertLabels.team=platform",
            "--set",
            "prometheusRule.labels.release=prometheus",
            "--set",
            "prometheusRule.runbookBaseUrl=https://runbooks.example.com/wp",
        ],
    );
    let rules = alert_rules(&docs);
    let backlog = rules
        .iter()
        .find(|r| r["alert"] == "WorkerPoolBacklogTooOld")
        .expect("the alert");
    assert!(expr(&docs, "WorkerPoolBacklogTooOld").ends_with("> 900"));
    assert_eq!(backlog["for"], "20m");
    assert_eq!(backlog["labels"]["severity"], "critical");
    assert_eq!(
        backlog["annotations"]["runbook_url"],
        "https://runbooks.example.com/wp#workerpoolbacklogtooold"
    );
    assert!(expr(&docs, "WorkerPoolDeadLettersGrowing").contains("[1h]"));
    for rule in &rules {
        assert_eq!(rule["labels"]["team"], "platform", "{}", rule["alert"]);
    }
    assert_eq!(
        one(&docs, "PrometheusRule")["metadata"]["labels"]["release"],
        "prometheus"
    );
}

#[test]
fn the_pod_monitor_selects_the_workers_the_operator_runs_on_their_metrics_port() {
    let docs = render(
        "workerpool-operator",
        INSTALL_NAMESPACE,
        &["--set", "podMonitor.enabled=true"],
    );
    let monitor = one(&docs, "PodMonitor");
    let spec = &monitor["spec"];

    // The labels and the port name the operator gives a pool's pods.
    let text = read("manifests/examples/exec-pool.yaml");
    let mut pool: WorkerPool = serde_json::from_value(documents(&text).remove(0)).expect("a pool");
    pool.metadata.namespace = Some("jobs".into());
    pool.metadata.uid = Some("00000000-0000-0000-0000-000000000000".into());
    let built = deployment::build(&pool, 1).expect("a Deployment");
    let template = built.spec.expect("spec").template;
    let pod_labels = template
        .metadata
        .and_then(|m| m.labels)
        .expect("pod labels");
    for (key, value) in spec["selector"]["matchLabels"]
        .as_object()
        .expect("matchLabels")
    {
        assert_eq!(
            pod_labels.get(key).map(String::as_str),
            value.as_str(),
            "the worker pods carry {key}"
        );
    }
    for expression in spec["selector"]["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
    {
        assert_eq!(expression["operator"], "Exists");
        let key = expression["key"].as_str().expect("key");
        assert!(pod_labels.contains_key(key), "the worker pods carry {key}");
    }
    assert!(
        spec["selector"]["matchLabels"]
            .as_object()
            .expect("matchLabels")
            .contains_key("app.kubernetes.io/managed-by")
    );
    let port = template
        .spec
        .expect("pod spec")
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.container_port == deployment::WORKER_PORT)
        .and_then(|p| p.name.clone())
        .expect("a named metrics port");
    let endpoint = &spec["podMetricsEndpoints"][0];
    assert_eq!(endpoint["port"], port);
    assert_eq!(endpoint["path"], "/metrics");
    // The pool's name becomes the `pool` label of the workers' series, as
    // in the operator's.
    let pool_label = format!(
        "__meta_kubernetes_pod_label_{}",
        deployment::POOL_LABEL.replace(['.', '/', '-'], "_")
    );
    assert_eq!(
        endpoint["relabelings"][0],
        json!({"sourceLabels": [pool_label], "targetLabel": "pool"})
    );

    // Which namespaces: every one, the watched one, or those listed.
    assert_eq!(spec["namespaceSelector"], json!({"any": true}));
    let watched = render(
        "wp",
        INSTALL_NAMESPACE,
        &[
            "--set",
            "podMonitor.enabled=true",
            "--set",
            "watchNamespace=jobs",
        ],
    );
    assert_eq!(
        one(&watched, "PodMonitor")["spec"]["namespaceSelector"],
        json!({"matchNames": ["jobs"]})
    );
    let listed = render(
        "wp",
        INSTALL_NAMESPACE,
        &[
            "--set",
            "podMonitor.enabled=true",
            "--set",
            "watchNamespace=jobs",
            "--set",
            "podMonitor.namespaces={mail,video}",
        ],
    );
    assert_eq!(
        one(&listed, "PodMonitor")["spec"]["namespaceSelector"],
        json!({"matchNames": ["mail", "video"]})
    );
}
