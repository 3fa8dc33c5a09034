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
    // It owns one Deployment per pool, applied server-side: a PATCH, which
    // the API server also authorizes as a create while the Deployment does
    // not exist yet.
    (
        "apps",
        "deployments",
        &["get", "list", "watch", "create", "patch"],
    ),
    // It reads the Secret named by spec.queue.redis.urlSecretRef.
    ("", "secrets", &["get"]),
    // It sets pod-deletion-cost on a pool's pods before a scale-down, and
    // marks busy pods as not to be disrupted (spec.disruption).
    ("", "pods", &["list", "patch"]),
    // It keeps a PodDisruptionBudget per pool that asks for one, applied
    // server-side, and deletes it when the pool no longer does.
    (
        "policy",
        "poddisruptionbudgets",
        &["get", "create", "patch", "delete"],
    ),
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

/// A permission: API group, resource (with its subresource), verb.
pub type Permission = (String, String, String);

/// The content type of a server-side apply request.
pub const APPLY_PATCH: &str = "application/apply-patch+yaml";

/// The permissions an API request needs, for the tests that check the
/// controller's calls against the rules; `None` when it is not a request for
/// a resource.
///
/// A server-side apply (a PATCH with the apply content type) of an object
/// that does not exist yet creates it, and the API server then authorizes a
/// `create` as well as the `patch` (k8s.io/apiserver, `handlers/patch.go`;
/// without it the apply is a 403 with an empty reason). So an apply needs
/// both, except on a subresource, which a patch never creates.
pub fn needed(
    method: &str,
    path: &str,
    query: &str,
    content_type: &str,
) -> Option<Vec<Permission>> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (group, rest) = match parts.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    let (resource, named, subresource) = match rest {
        ["namespaces", _, resource] => (resource.to_string(), false, false),
        ["namespaces", _, resource, _name] => (resource.to_string(), true, false),
        ["namespaces", _, resource, _name, sub] => (format!("{resource}/{sub}"), true, true),
        [resource] => (resource.to_string(), false, false),
        _ => return None,
    };
    let verbs: &[&str] = match (method, named) {
        ("GET", true) => &["get"],
        ("GET", false) if query.contains("watch=true") => &["watch"],
        ("GET", false) => &["list"],
        ("POST", _) => &["create"],
        ("PATCH", _) if content_type.starts_with(APPLY_PATCH) && !subresource => {
            &["patch", "create"]
        }
        ("PATCH", _) => &["patch"],
        ("PUT", _) => &["update"],
        ("DELETE", _) => &["delete"],
        _ => return None,
    };
    Some(
        verbs
            .iter()
            .map(|verb| (group.to_string(), resource.clone(), verb.to_string()))
            .collect(),
    )
}

/// Whether `rules` grant the permission.
pub fn allows(rules: &[Rule], (group, resource, verb): &Permission) -> bool {
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
        let n = |m, p, q, c| {
            needed(m, p, q, c).map(|all| {
                all.into_iter()
                    .map(|(g, r, v)| format!("{g}/{r}:{v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
        };
        assert_eq!(
            n("GET", "/apis/apps/v1/namespaces/a/deployments/x", "", ""),
            Some("apps/deployments:get".into())
        );
        assert_eq!(
            n("GET", "/api/v1/namespaces/a/pods", "labelSelector=x", ""),
            Some("/pods:list".into())
        );
        assert_eq!(
            n(
                "PATCH",
                "/apis/workerpool.dev/v1alpha1/namespaces/a/workerpools/x/status",
                "",
                "application/merge-patch+json"
            ),
            Some("workerpool.dev/workerpools/status:patch".into())
        );
        assert_eq!(
            n(
                "GET",
                "/apis/workerpool.dev/v1alpha1/workerpools",
                "watch=true",
                ""
            ),
            Some("workerpool.dev/workerpools:watch".into())
        );
        assert_eq!(
            n("POST", "/apis/events.k8s.io/v1/namespaces/a/events", "", ""),
            Some("events.k8s.io/events:create".into())
        );
        assert_eq!(
            n(
                "PATCH",
                "/api/v1/namespaces/a/pods/x",
                "",
                "application/merge-patch+json"
            ),
            Some("/pods:patch".into())
        );
    }

    #[test]
    fn a_server_side_apply_needs_create_as_well_as_patch() {
        let verbs = |path| {
            needed("PATCH", path, "fieldManager=m&force=true", APPLY_PATCH)
                .unwrap_or_default()
                .into_iter()
                .map(|(_, _, verb)| verb)
                .collect::<Vec<_>>()
        };
        // The object may not exist yet: the apply creates it.
        assert_eq!(
            verbs("/apis/apps/v1/namespaces/a/deployments/x"),
            ["patch", "create"]
        );
        // A subresource is never created by a patch.
        assert_eq!(
            verbs("/apis/workerpool.dev/v1alpha1/namespaces/a/workerpools/x/status"),
            ["patch"]
        );
    }

    #[test]
    fn the_cluster_rules_allow_creating_the_deployments_the_operator_applies() {
        let apply = needed(
            "PATCH",
            "/apis/apps/v1/namespaces/jobs/deployments/mail",
            "fieldManager=workerpool-operator&force=true",
            APPLY_PATCH,
        )
        .unwrap_or_default();
        for permission in &apply {
            assert!(
                allows(CLUSTER_RULES, permission),
                "the ClusterRole does not allow {permission:?}"
            );
        }
    }
}
