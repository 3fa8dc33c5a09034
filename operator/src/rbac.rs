//! The permissions the operator needs: exactly the API calls it makes.
//! The chart and `manifests/rbac.yaml` are generated from or checked
//! against this list; the controller tests check every call they see
//! against it.

use k8s_openapi::api::rbac::v1::PolicyRule;

/// One rule: API group, resource, verbs.
pub type Rule = (&'static str, &'static str, &'static [&'static str]);

/// Cluster-wide rules (the ClusterRole).
pub const CLUSTER_RULES: &[Rule] = &[
    // The controller watches pools and writes their status.
    ("workerpool.dev", "workerpools", &["get", "list", "watch"]),
    ("workerpool.dev", "workerpools/status", &["patch"]),
    // It owns one Deployment per pool, applied server-side (a PATCH).
    ("apps", "deployments", &["get", "list", "watch", "patch"]),
    // It reads the Secret named by spec.queue.redis.urlSecretRef.
    ("", "secrets", &["get"]),
    // It sets pod-deletion-cost on a pool's pods before a scale-down.
    ("", "pods", &["list", "patch"]),
    // It records events on pools.
    ("events.k8s.io", "events", &["create", "patch"]),
];

/// Rules in the operator's own namespace (the leader-election Role).
pub const LEASE_RULES: &[Rule] = &[("coordination.k8s.io", "leases", &["get", "create", "patch"])];

/// The rules as Kubernetes PolicyRules.
pub fn policy_rules(rules: &[Rule]) -> Vec<PolicyRule> {
    rules
        .iter()
        .map(|(group, resource, verbs)| PolicyRule {
            api_groups: Some(vec![group.to_string()]),
            resources: Some(vec![resource.to_string()]),
            verbs: verbs.iter().map(|v| v.to_string()).collect(),
            ..PolicyRule::default()
        })
        .collect()
}

/// The ClusterRole and the leader-election Role, as YAML documents, as
/// `workerpool-operator rbac` prints them and `manifests/rbac.yaml` holds them.
pub fn rbac_yaml() -> String {
    use k8s_openapi::api::rbac::v1::{ClusterRole, Role};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    let meta = |name: &str| ObjectMeta {
        name: Some(name.into()),
        ..ObjectMeta::default()
    };
    let cluster = ClusterRole {
        metadata: meta("workerpool-operator"),
        rules: Some(policy_rules(CLUSTER_RULES)),
        aggregation_rule: None,
    };
    let lease = Role {
        metadata: meta("workerpool-operator-leader-election"),
        rules: Some(policy_rules(LEASE_RULES)),
    };
    let mut out = String::new();
    for doc in [
        serde_yaml_ng::to_string(&cluster).expect("a ClusterRole serializes"),
        serde_yaml_ng::to_string(&lease).expect("a Role serializes"),
    ] {
        out.push_str("---\n");
        out.push_str(&doc);
    }
    out
}

/// The (group, resource, verb) an API request needs, for the tests that
/// check the controller's calls against the rules.
pub fn needed(method: &str, path: &str, query: &str) -> Option<(String, String, String)> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (group, rest) = match parts.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    let (resource, named) = match rest {
        ["namespaces", _, resource] => (resource.to_string(), false),
        ["namespaces", _, resource, _name] => (resource.to_string(), true),
        ["namespaces", _, resource, _name, sub] => (format!("{resource}/{sub}"), true),
        [resource] => (resource.to_string(), false),
        _ => return None,
    };
    let verb = match (method, named) {
        ("GET", true) => "get",
        ("GET", false) if query.contains("watch=true") => "watch",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PATCH", _) => "patch",
        ("PUT", _) => "update",
        ("DELETE", _) => "delete",
        _ => return None,
    };
    Some((group.to_string(), resource, verb.to_string()))
}

/// Whether `rules` grant the permission.
pub fn allows(rules: &[Rule], (group, resource, verb): &(String, String, String)) -> bool {
    rules
        .iter()
        .any(|(g, r, verbs)| g == group && r == resource && verbs.contains(&verb.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checked_in_rbac_matches_the_code() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../manifests/rbac.yaml");
        if std::env::var_os("UPDATE_MANIFESTS").is_some() {
            std::fs::write(path, rbac_yaml()).expect("write manifests/rbac.yaml");
            return;
        }
        let on_disk = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            on_disk == rbac_yaml(),
            "manifests/rbac.yaml is stale: run `cargo run -p workerpool-operator -- rbac > manifests/rbac.yaml`"
        );
    }

    #[test]
    fn requests_map_to_the_permissions_they_need() {
        let n = |m, p, q| needed(m, p, q).map(|(g, r, v)| format!("{g}/{r}:{v}"));
        assert_eq!(
            n("GET", "/apis/apps/v1/namespaces/a/deployments/x", ""),
            Some("apps/deployments:get".into())
        );
        assert_eq!(
            n("GET", "/api/v1/namespaces/a/pods", "labelSelector=x"),
            Some("/pods:list".into())
        );
        assert_eq!(
            n(
                "PATCH",
                "/apis/workerpool.dev/v1alpha1/namespaces/a/workerpools/x/status",
                ""
            ),
            Some("workerpool.dev/workerpools/status:patch".into())
        );
        assert_eq!(
            n(
                "GET",
                "/apis/workerpool.dev/v1alpha1/workerpools",
                "watch=true"
            ),
            Some("workerpool.dev/workerpools:watch".into())
        );
        assert_eq!(
            n("POST", "/apis/events.k8s.io/v1/namespaces/a/events", ""),
            Some("events.k8s.io/events:create".into())
        );
    }
}
