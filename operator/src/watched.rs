//! A WorkerPool as the controller lists and watches it: the pool, or, for
//! an object that does not read as one, its metadata and why.
//!
//! kube's watcher reads each page of a list into one type: a single object
//! that does not read (a number past what its field holds, stored before
//! the schema bounded it, or written through an older CRD) fails the whole
//! list, so that no pool in any namespace is reconciled, and every retry
//! fails the same way. [`Watched`] reads any object: one that is not a
//! WorkerPool this operator understands is kept by its metadata, skipped
//! and reported on itself, and every other pool goes on.

use std::borrow::Cow;
use std::sync::Arc;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::crd::WorkerPool;

/// One object of the WorkerPools' list or watch.
#[derive(Clone, Debug)]
pub enum Watched {
    /// A pool, as its type reads it.
    Pool(Arc<WorkerPool>),
    /// An object that does not read as a WorkerPool.
    Unreadable(Arc<Unreadable>),
}

/// A WorkerPool object that does not read: what is needed to report on it.
#[derive(Clone, Debug, PartialEq)]
pub struct Unreadable {
    /// Its metadata.
    pub metadata: ObjectMeta,
    /// The field that does not read and why, as
    /// `spec.scaling.maxReplicas: invalid value: integer `2147483648`,
    /// expected i32`, with the password of any URL in it hidden.
    pub error: String,
    /// Its status conditions as stored, so that the condition written about
    /// the problem leaves the others as they are.
    pub conditions: Vec<Value>,
}

impl Watched {
    /// Reads one object of the list or watch; never fails.
    pub fn read(mut object: Value) -> Self {
        let error = match serde_path_to_error::deserialize::<_, WorkerPool>(&object) {
            Ok(pool) => return Watched::Pool(Arc::new(pool)),
            Err(e) => e,
        };
        let conditions = match object.pointer("/status/conditions") {
            Some(Value::Array(conditions)) => conditions.clone(),
            _ => Vec::new(),
        };
        let in_status = matches!(
            error.path().iter().next(),
            Some(serde_path_to_error::Segment::Map { key }) if key == "status"
        );
        let error = hide_passwords(&format!("{}: {}", error.path(), error.inner()));
        // The status is this operator's own output, which the next
        // reconcile writes anew: one it cannot read (an older version's)
        // does not keep a good spec from being reconciled.
        if in_status && let Some(fields) = object.as_object_mut() {
            fields.remove("status");
            if let Ok(pool) = WorkerPool::deserialize(&object) {
                tracing::warn!(
                    pool = %key(pool.meta()),
                    error = %error,
                    "the pool's status does not read; reconciling it as if it had none"
                );
                return Watched::Pool(Arc::new(pool));
            }
        }
        Watched::Unreadable(Arc::new(Unreadable {
            metadata: metadata(&object),
            error,
            conditions,
        }))
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        key(self.meta())
    }
}

fn key(meta: &ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    )
}

/// The object's metadata; when even that does not read (the API server
/// would not store such an object), what the watch and the report need of
/// it.
fn metadata(object: &Value) -> ObjectMeta {
    let metadata = object.get("metadata").unwrap_or(&Value::Null);
    ObjectMeta::deserialize(metadata).unwrap_or_else(|_| {
        let text = |name: &str| metadata.get(name).and_then(Value::as_str).map(String::from);
        ObjectMeta {
            name: text("name"),
            namespace: text("namespace"),
            uid: text("uid"),
            resource_version: text("resourceVersion"),
            generation: metadata.get("generation").and_then(Value::as_i64),
            ..ObjectMeta::default()
        }
    })
}

/// `text` with the password of every URL in it hidden, as
/// `redis://user:***@host`: a field's error may quote its value, and a
/// Redis URL may be written inline.
pub fn hide_passwords(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        // After the last character that is no part of a scheme, which may
        // be any character of the text (a field's value is quoted whole).
        let scheme_start = rest[..at]
            .char_indices()
            .rev()
            .find(|&(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
            .map_or(0, |(i, c)| i + c.len_utf8());
        let end = rest[at + 3..]
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '`' | ','))
            .map_or(rest.len(), |i| at + 3 + i);
        out.push_str(&rest[..scheme_start]);
        out.push_str(&workerpool_queue::connection::redact(
            &rest[scheme_start..end],
        ));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

impl<'de> Deserialize<'de> for Watched {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Value::deserialize(deserializer).map(Watched::read)
    }
}

impl Resource for Watched {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        WorkerPool::kind(dt)
    }

    fn group(dt: &()) -> Cow<'_, str> {
        WorkerPool::group(dt)
    }

    fn version(dt: &()) -> Cow<'_, str> {
        WorkerPool::version(dt)
    }

    fn plural(dt: &()) -> Cow<'_, str> {
        WorkerPool::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        match self {
            Watched::Pool(pool) => pool.meta(),
            Watched::Unreadable(object) => &object.metadata,
        }
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Watched::Pool(pool) => Arc::make_mut(pool).meta_mut(),
            Watched::Unreadable(object) => &mut Arc::make_mut(object).metadata,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::ResourceExt;
    use kube::core::ObjectList;
    use serde_json::json;

    fn object(name: &str, spec: Value) -> Value {
        json!({
            "apiVersion": "workerpool.dev/v1alpha1", "kind": "WorkerPool",
            "metadata": {"name": name, "namespace": "jobs", "uid": format!("u-{name}"),
                         "resourceVersion": "7", "generation": 3},
            "spec": spec,
        })
    }

    fn spec(scaling: Value) -> Value {
        json!({
            "queue": {"redis": {"url": "redis://app:s3cret@redis:6379/0", "key": "mail"}},
            "template": {"spec": {"containers": [{"name": "worker", "image": "w"}]}},
            "scaling": scaling,
        })
    }

    fn list(items: Vec<Value>) -> String {
        json!({"apiVersion": "workerpool.dev/v1alpha1", "kind": "WorkerPoolList",
               "metadata": {"resourceVersion": "9"}, "items": items})
        .to_string()
    }

    #[test]
    fn a_list_with_one_unreadable_pool_reads_every_other_pool() {
        let text = list(vec![
            object("big", spec(json!({"maxReplicas": 2147483648u64}))),
            object("mail", spec(json!({"maxReplicas": 10}))),
        ]);
        // As the typed pool, the whole list fails: no pool at all.
        assert!(serde_json::from_str::<ObjectList<WorkerPool>>(&text).is_err());

        let listed: ObjectList<Watched> = serde_json::from_str(&text).expect("a list");
        let [big, mail] = listed.items.as_slice() else {
            panic!("two objects");
        };
        let Watched::Unreadable(big) = big else {
            panic!("the pool past an int32 is unreadable");
        };
        assert_eq!(
            big.error,
            "spec.scaling.maxReplicas: invalid value: integer `2147483648`, expected i32"
        );
        assert_eq!(
            (big.metadata.name.as_deref(), big.metadata.generation),
            (Some("big"), Some(3))
        );
        let Watched::Pool(mail) = mail else {
            panic!("the good pool reads");
        };
        assert_eq!(mail.spec.scaling.as_ref().map(|s| s.max_replicas), Some(10));
    }

    #[test]
    fn an_unreadable_pool_keeps_its_name_uid_and_version_for_the_watch() {
        let watched = Watched::read(object("big", spec(json!({"minReplicas": "two"}))));
        assert!(matches!(watched, Watched::Unreadable(_)));
        assert_eq!(watched.key(), "jobs/big");
        assert_eq!(watched.uid().as_deref(), Some("u-big"));
        assert_eq!(watched.resource_version().as_deref(), Some("7"));
        assert_eq!(
            watched.object_ref(&()).api_version.as_deref(),
            Some("workerpool.dev/v1alpha1")
        );
    }

    #[test]
    fn a_status_that_does_not_read_is_dropped_and_the_pool_reconciled() {
        let mut stored = object("mail", spec(json!({"maxReplicas": 10})));
        stored["status"] = json!({"replicas": 4294967296u64, "selector": "x"});
        let Watched::Pool(pool) = Watched::read(stored) else {
            panic!("a good spec reads without its status");
        };
        assert_eq!(pool.status, None);
    }

    #[test]
    fn the_error_of_an_unreadable_pool_shows_no_password() {
        let watched = Watched::read(object(
            "typo",
            json!({
                "queue": {"redis": {"url": "redis://app:s3cret@redis:6379/0", "key": "mail"}},
                "template": {"spec": {"containers": [{"name": "worker", "image": "w"}]}},
                "replicas": "rediss://app:s3cret@redis:6380/0?sentinel_password=an0ther",
            }),
        ));
        let Watched::Unreadable(typo) = watched else {
            panic!("a URL is no replica count");
        };
        assert!(
            typo.error
                .starts_with("spec.replicas: invalid type: string"),
            "{}",
            typo.error
        );
        assert!(
            typo.error.contains("rediss://app:***@redis:6380"),
            "{}",
            typo.error
        );
        assert!(!typo.error.contains("s3cret"), "{}", typo.error);
        assert!(!typo.error.contains("an0ther"), "{}", typo.error);
    }

    #[test]
    fn passwords_are_hidden_wherever_urls_stand_in_a_text() {
        assert_eq!(
            hide_passwords(
                "a `redis://u:p@h:1/0`, \"rediss+sentinel://:p@s1,s2/m\" and http://h/x"
            ),
            "a `redis://u:***@h:1/0`, \"rediss+sentinel://:***@s1,s2/m\" and http://h/x"
        );
        assert_eq!(hide_passwords("no url here"), "no url here");
        assert_eq!(
            hide_passwords("é://u:p@h, ünï redis://u:p@h and ://"),
            "é://u:***@h, ünï redis://u:***@h and ://"
        );
    }
}
