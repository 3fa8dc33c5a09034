//! Events on the pools, as `kubectl describe` shows them.
//!
//! kube's own recorder folds every event of one reason into one series and
//! keeps the first note: the steps 6→5, 5→3, 3→2, 2→0 of a scale-down
//! would show as `ScaledDown (x4)` with the note of the first. Here the
//! note is part of what makes two events the same, as in client-go's
//! recorder: an event repeated word for word (a Redis that stays
//! unreachable) becomes a series with a count, and each different step is
//! an event of its own, with its numbers and its reason.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use std::sync::Mutex;

pub use kube::runtime::events::EventType;

/// How long an event is remembered for a series: a repeat after this is a
/// new event (client-go's is 6 minutes too).
const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);

/// One event to publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// Normal or Warning.
    pub type_: EventType,
    /// CamelCase, e.g. `ScaledDown`.
    pub reason: String,
    /// What happened, for people.
    pub note: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    warning: bool,
    reason: String,
    note: String,
    kind: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    uid: Option<String>,
}

/// Publishes events through `events.k8s.io/v1`, a series for an exact
/// repeat and a new event for anything else.
pub struct Recorder {
    client: Client,
    controller: String,
    instance: String,
    seen: Mutex<HashMap<Key, (K8sEvent, Instant)>>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("controller", &self.controller)
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

impl Recorder {
    /// A recorder reporting as `controller` (and `instance`, the pod).
    pub fn new(client: Client, controller: &str, instance: Option<String>) -> Self {
        Self {
            client,
            controller: controller.into(),
            instance: instance.unwrap_or_else(|| controller.into()),
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Publishes `note` about the object `regarding`.
    pub async fn publish(
        &self,
        note: &Note,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let key = Key {
            warning: note.type_ == EventType::Warning,
            reason: note.reason.clone(),
            note: note.note.clone(),
            kind: regarding.kind.clone(),
            namespace: regarding.namespace.clone(),
            name: regarding.name.clone(),
            uid: regarding.uid.clone(),
        };
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        let events: Api<K8sEvent> = Api::namespaced(self.client.clone(), namespace);
        let now = k8s_openapi::jiff::Timestamp::now();
        // Not held across the request: pools publish at once.
        let earlier = {
            let mut seen = lock(&self.seen);
            seen.retain(|_, (_, at)| at.elapsed() < SERIES_WINDOW);
            seen.get(&key).map(|(event, _)| event.clone())
        };
        let event = match earlier {
            Some(mut event) => {
                let count = event.series.as_ref().map_or(2, |s| s.count + 1);
                event.series = Some(EventSeries {
                    count,
                    last_observed_time: MicroTime(now),
                });
                events
                    .patch(
                        &event.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&event),
                    )
                    .await?;
                event
            }
            None => {
                // The event as sent, not as stored: a series patch of it
                // carries no resourceVersion that could be stale.
                let event = self.event(note, regarding, now);
                events.create(&PostParams::default(), &event).await?;
                event
            }
        };
        lock(&self.seen).insert(key, (event, Instant::now()));
        Ok(())
    }

    fn event(
        &self,
        note: &Note,
        regarding: &ObjectReference,
        now: k8s_openapi::jiff::Timestamp,
    ) -> K8sEvent {
        K8sEvent {
            action: Some("Reconcile".into()),
            reason: Some(note.reason.clone()),
            note: Some(note.note.clone()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            metadata: ObjectMeta {
                namespace: regarding.namespace.clone(),
                name: Some(format!(
                    "{}.{:x}",
                    regarding.name.as_deref().unwrap_or(&self.controller),
                    now.as_nanosecond()
                )),
                ..ObjectMeta::default()
            },
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(
                match note.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .into(),
            ),
            ..K8sEvent::default()
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use http::{Request, Response, StatusCode};
    use kube::client::Body;
    use serde_json::{Value, json};

    use super::*;

    fn note(reason: &str, text: &str) -> Note {
        Note {
            type_: EventType::Normal,
            reason: reason.into(),
            note: text.into(),
        }
    }

    #[tokio::test]
    async fn each_step_is_an_event_of_its_own_and_an_exact_repeat_is_a_series() {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let recorder = Recorder::new(Client::new(service, "default"), "workerpool-operator", None);
        let regarding = ObjectReference {
            kind: Some("WorkerPool".into()),
            namespace: Some("jobs".into()),
            name: Some("mail".into()),
            uid: Some("u-1".into()),
            ..ObjectReference::default()
        };
        let server = tokio::spawn(async move {
            let mut seen = Vec::new();
            for _ in 0..4 {
                let (request, send) = handle.next_request().await.expect("a request");
                let method = request.method().to_string();
                let path = request.uri().path().to_string();
                let bytes = request.into_body().collect_bytes().await.expect("body");
                let body: Value = serde_json::from_slice(&bytes).expect("json");
                send.send_response(
                    Response::builder()
                        .status(StatusCode::OK)
                        .body(Body::from(bytes.to_vec()))
                        .expect("response"),
                );
                seen.push((method, path, body));
            }
            seen
        });
        for n in [
            note("ScaledDown", "scaled down from 6 to 5"),
            note("ScaledDown", "scaled down from 5 to 3"),
            note("ScaledDown", "scaled down from 5 to 3"),
            note(
                "ScaledDown",
                "scaled down from 3 to 0: idle; scaling to zero",
            ),
        ] {
            recorder.publish(&n, &regarding).await.expect("published");
        }
        let seen = server.await.expect("server");
        let shown: Vec<(&str, &str, Value)> = seen
            .iter()
            .map(|(m, p, b)| (m.as_str(), p.as_str(), b["note"].clone()))
            .collect();
        let events = "/apis/events.k8s.io/v1/namespaces/jobs/events";
        assert_eq!(shown[0], ("POST", events, json!("scaled down from 6 to 5")));
        assert_eq!(shown[1], ("POST", events, json!("scaled down from 5 to 3")));
        assert_eq!(shown[2].0, "PATCH", "an exact repeat joins its series");
        assert_eq!(seen[2].2["series"]["count"], json!(2));
        assert_eq!(seen[2].2["metadata"]["name"], seen[1].2["metadata"]["name"]);
        assert_eq!(
            shown[3],
            (
                "POST",
                events,
                json!("scaled down from 3 to 0: idle; scaling to zero")
            )
        );
        assert_eq!(
            seen[0].2["reportingController"],
            json!("workerpool-operator")
        );
        assert_eq!(seen[0].2["regarding"]["name"], json!("mail"));
    }
}
