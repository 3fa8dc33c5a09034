//! Reconcile against a mocked API server (tower-test), the kube-rs way:
//! each scenario asserts every request's method, path and body in order and
//! answers as the API server would. Queue readings come from a real
//! redis-server.

use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use kube::client::Body;
use redis::AsyncCommands;
use serde_json::{Value, json};
use tower_test::mock::{Handle, SendResponse};
use workerpool_tests::TestRedis;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::Client;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use workerpool_queue::connection::{Endpoint, Tls};
use workerpool_queue::keys::QueueKeys;
use workerpool_queue::memory::Memory;
use workerpool_queue::snapshot::{self, QueueFigures, Snapshot, WorkerFigures};

use super::endpoint::unreachable_problem;
use super::fires::Fires;
use super::memory::PoolMemory;
use super::observe::{Failing, Observed, Replicas};
use super::plan::{Clock, Plan, plan};
use super::status::{shown_rate, status_patch, status_write, transitions};
use super::{
    Context, DELETION_COST, Error, POOL_UNREADABLE, QueueProblem, error_policy, reconcile,
    reconcile_watched, retry_delay,
};
use crate::crd::{WorkerPool, WorkerPoolStatus};
use crate::deployment;
use crate::metrics::Metrics;
use crate::rbac;
use crate::scaling::Verdict;
use crate::watched::Watched;

struct ApiServer {
    handle: Handle<Request<Body>, Response<Body>>,
}

impl ApiServer {
    /// Takes the next request, asserting its method and path; returns its
    /// JSON body (Null when empty) and the responder.
    async fn expect(&mut self, method: &str, path: &str) -> (Value, SendResponse<Response<Body>>) {
        let next = tokio::time::timeout(Duration::from_secs(10), self.handle.next_request()).await;
        let (request, send) = next
            .unwrap_or_else(|_| panic!("timed out waiting for {method} {path}"))
            .expect("the client is alive");
        assert_eq!(
            (request.method().as_str(), request.uri().path()),
            (method, path),
            "unexpected request {}",
            request.uri()
        );
        let content_type = request
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let needed = rbac::needed(
            method,
            path,
            request.uri().query().unwrap_or_default(),
            &content_type,
        )
        .expect("a resource request");
        for permission in &needed {
            assert!(
                rbac::allows(rbac::CLUSTER_RULES, permission),
                "RBAC does not allow {permission:?} for {method} {path} ({content_type})"
            );
        }
        if method == "PATCH" && path.contains("/deployments/") {
            let query = request.uri().query().unwrap_or_default();
            assert!(
                query.contains("fieldManager=workerpool-operator") && query.contains("force=true"),
                "{query}"
            );
        }
        let bytes = request.into_body().collect_bytes().await.expect("body");
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).expect("json body")
        };
        (body, send)
    }

    /// Takes the next request as [`ApiServer::expect`] does and answers it
    /// with `status` and what `answer` makes of its body; returns the body.
    async fn exchange(
        &mut self,
        method: &str,
        path: &str,
        status: StatusCode,
        answer: impl FnOnce(&Value) -> Value,
    ) -> Value {
        let (body, send) = self.expect(method, path).await;
        reply(send, status, &answer(&body));
        body
    }

    /// A GET of `path`, answered with `object` (`None`: not found).
    async fn get(&mut self, path: &str, object: Option<Value>) {
        let (_, send) = self.expect("GET", path).await;
        match object {
            Some(object) => reply(send, StatusCode::OK, &object),
            None => not_found(send),
        }
    }

    /// The Deployment applied, and taken as sent; returns what was sent.
    async fn apply(&mut self) -> Value {
        self.exchange("PATCH", DEPLOYMENT, StatusCode::OK, Value::clone)
            .await
    }

    /// An event recorded; returns it.
    async fn event(&mut self) -> Value {
        self.exchange("POST", EVENTS, StatusCode::CREATED, Value::clone)
            .await
    }

    /// The status written; returns the patch.
    async fn status(&mut self) -> Value {
        self.exchange("PATCH", STATUS, StatusCode::OK, pool_object)
            .await
    }

    /// The conversation of most reconciles: the Deployment read (`None`:
    /// not found) and applied, `events` events recorded, the status
    /// written. Returns what was sent.
    async fn round(&mut self, existing: Option<Value>, events: usize) -> Round {
        self.get(DEPLOYMENT, existing).await;
        let applied = self.apply().await;
        let mut recorded = Vec::new();
        for _ in 0..events {
            recorded.push(self.event().await);
        }
        let status = self.status().await;
        Round {
            applied,
            events: recorded,
            status,
        }
    }

    /// Awaits the reconcile, then asserts that it asked nothing more.
    async fn finish(
        self,
        task: tokio::task::JoinHandle<Result<Action, Error>>,
    ) -> Result<Action, Error> {
        let result = task.await.expect("task");
        self.done().await;
        result
    }

    async fn done(mut self) {
        let extra =
            tokio::time::timeout(Duration::from_millis(200), self.handle.next_request()).await;
        if let Ok(Some((request, _))) = extra {
            panic!(
                "unexpected extra request {} {}",
                request.method(),
                request.uri()
            );
        }
    }
}

/// What one reconcile sent in a [`ApiServer::round`].
struct Round {
    applied: Value,
    events: Vec<Value>,
    status: Value,
}

fn reply(send: SendResponse<Response<Body>>, status: StatusCode, body: &Value) {
    let bytes = serde_json::to_vec(body).expect("json");
    send.send_response(
        Response::builder()
            .status(status)
            .body(Body::from(bytes))
            .expect("response"),
    );
}

fn not_found(send: SendResponse<Response<Body>>) {
    reply(
        send,
        StatusCode::NOT_FOUND,
        &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"}),
    );
}

fn forbidden() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403, "message": "forbidden"})
}

fn pool(spec: Value) -> WorkerPool {
    serde_json::from_value(json!({
        "apiVersion": "workerpool.dev/v1alpha1",
        "kind": "WorkerPool",
        "metadata": {"name": "mail", "namespace": "jobs", "uid": "u-1", "generation": 2},
        "spec": spec,
    }))
    .expect("pool")
}

/// What the API server answers a status patch with: the pool.
fn pool_object(patch: &Value) -> Value {
    json!({
        "apiVersion": "workerpool.dev/v1alpha1", "kind": "WorkerPool",
        "metadata": {"name": "mail", "namespace": "jobs", "uid": "u-1"},
        "spec": {"queue": {"redis": {"url": "redis://r", "key": "mail"}}, "template": template(), "replicas": 1},
        "status": patch["status"],
    })
}

/// The spec of a pool of `replicas` workers on the queue `mail` at `url`.
fn fixed(url: &str, replicas: i32) -> Value {
    json!({"queue": {"redis": {"url": url, "key": "mail"}}, "template": template(), "replicas": replicas})
}

fn template() -> Value {
    json!({"spec": {"containers": [{"name": "worker", "image": "example/worker:1"}]}})
}

/// The pool's own owner reference, as the operator writes it.
fn owned_by_pool() -> Value {
    json!([{"apiVersion": "workerpool.dev/v1alpha1", "kind": "WorkerPool", "name": "mail", "uid": "u-1", "controller": true}])
}

fn existing_deployment(replicas: i32, ready: i32) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "mail", "namespace": "jobs", "ownerReferences": owned_by_pool()},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"workerpool.dev/pool": "mail"}}, "template": template()},
        "status": {"replicas": replicas, "readyReplicas": ready},
    })
}

fn start(
    pool: WorkerPool,
) -> (
    tokio::task::JoinHandle<Result<Action, Error>>,
    ApiServer,
    Arc<Context>,
) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let ctx = Arc::new(Context::new(client, Metrics::new(), Some("test".into())));
    let task = tokio::spawn(reconcile(Arc::new(pool), ctx.clone()));
    (task, ApiServer { handle }, ctx)
}

const DEPLOYMENT: &str = "/apis/apps/v1/namespaces/jobs/deployments/mail";
const STATUS: &str = "/apis/workerpool.dev/v1alpha1/namespaces/jobs/workerpools/mail/status";
const PODS: &str = "/api/v1/namespaces/jobs/pods";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/jobs/events";

fn condition<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["status"]["conditions"]
        .as_array()
        .expect("conditions")
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {status}"))
}

/// The condition `type_` of a planned status.
fn planned_condition<'a>(status: &'a WorkerPoolStatus, type_: &str) -> &'a Condition {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {:?}", status.conditions))
}

async fn push(redis: &TestRedis, queue: &str, n: usize) {
    let mut c = redis.conn().await;
    for i in 0..n {
        let _: () = c
            .lpush(queue, json!({"data": {"n": i}}).to_string())
            .await
            .expect("lpush");
    }
}

#[tokio::test]
async fn a_restarted_operator_sizes_new_pods_with_the_start_up_time_kept_in_status() {
    // 400 jobs of 0.5 s (the workers' mean, kept in Redis) for one ready
    // worker of 4 slots. The status says pods took 20 s to start, as the
    // operator before this one measured.
    let redis = TestRedis::start();
    push(&redis, "mail", 400).await;
    let mut c = redis.conn().await;
    let _: () = c.set("mail:stats:duration", "500.000").await.expect("set");
    let mut p = pool(json!({
        "queue": {"redis": {"url": redis.url(), "key": "mail"}},
        "template": template(),
        "worker": {"concurrency": 4},
        "scaling": {"maxReplicas": 100, "targetBacklogPerReplica": 5},
    }));
    p.status = Some(WorkerPoolStatus {
        pod_startup_seconds: Some(20.0),
        ..Default::default()
    });
    let (task, mut api, _ctx) = start(p);
    let Round {
        applied, status, ..
    } = api.round(Some(existing_deployment(1, 1)), 1).await;
    // The pods worth starting, from the first decision: the ready one plus
    // 400 × 0.5 s / (4 slots × 20 s) = 2.5 new ones, not ceil(400 / 5) = 80
    // (what a fresh engine that had not timed a start-up would start).
    assert_eq!(applied["spec"]["replicas"], json!(4), "{status}");
    assert_eq!(status["status"]["podStartupSeconds"], json!(20.0));
    task.await.expect("task").expect("reconcile");
    api.done().await;
}

#[tokio::test]
async fn a_new_pool_gets_exactly_its_built_deployment_and_a_status() {
    let redis = TestRedis::start();
    let p = pool(fixed(&redis.url(), 2));
    let expected = serde_json::to_value(deployment::build(&p, 2).expect("build")).expect("json");
    let (task, mut api, _) = start(p);

    let Round {
        applied, status, ..
    } = api.round(None, 0).await;
    assert_eq!(applied, expected);
    assert_eq!(status["status"]["desiredReplicas"], json!(2));
    assert_eq!(
        status["status"]["selector"],
        json!("workerpool.dev/pool=mail")
    );
    assert_eq!(status["status"]["observedGeneration"], json!(2));
    assert_eq!(
        condition(&status, "QueueReachable")["status"],
        json!("True")
    );
    assert_eq!(
        condition(&status, "ScalingActive")["reason"],
        json!("ManualReplicas")
    );

    let action = task.await.expect("task").expect("reconcile");
    assert_eq!(action, Action::requeue(Duration::from_secs(30)));
    api.done().await;
}

#[tokio::test]
async fn a_look_reads_the_watched_deployment_unless_it_is_older_than_its_own_last_apply() {
    let redis = TestRedis::start();
    let p = Arc::new(pool(fixed(&redis.url(), 2)));
    let (store, mut writer) = kube::runtime::reflector::store::<Deployment>();
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let ctx = Arc::new(
        Context::new(Client::new(service, "default"), Metrics::new(), None).with_deployments(store),
    );
    let mut api = ApiServer { handle };
    let mut watch_sees = |mut deployment: Value, generation: i64| {
        deployment["metadata"]["generation"] = json!(generation);
        let deployment = serde_json::from_value(deployment).expect("a deployment");
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(deployment));
    };
    watch_sees(existing_deployment(2, 2), 4);

    // The watch has it: no GET. Never applied by this operator, it is applied.
    let task = tokio::spawn(reconcile(p.clone(), ctx.clone()));
    let applied = api
        .exchange("PATCH", DEPLOYMENT, StatusCode::OK, |sent| {
            let mut live = sent.clone();
            live["metadata"]["generation"] = json!(5);
            live["status"] = json!({"replicas": 2, "readyReplicas": 2});
            live
        })
        .await;
    api.status().await;
    task.await.expect("task").expect("reconcile");

    // The watch still shows generation 4, older than the apply's 5: the API
    // server is asked, and what it says (5, as applied) needs no apply.
    let mut live = applied.clone();
    live["metadata"]["generation"] = json!(5);
    live["status"] = json!({"replicas": 2, "readyReplicas": 2});
    let task = tokio::spawn(reconcile(p.clone(), ctx.clone()));
    api.get(DEPLOYMENT, Some(live.clone())).await;
    api.status().await;
    task.await.expect("task").expect("reconcile");

    // The watch caught up: nothing is read from the API server or applied.
    watch_sees(live, 5);
    let task = tokio::spawn(reconcile(p.clone(), ctx.clone()));
    api.status().await;
    api.finish(task).await.expect("reconcile");
}

#[tokio::test]
async fn a_backlog_scales_the_pool_up_with_an_event_and_the_reason_in_status() {
    let redis = TestRedis::start();
    push(&redis, "mail", 12).await;
    let p = pool(json!({
        "queue": {"redis": {"url": redis.url(), "key": "mail"}},
        "template": template(),
        "scaling": {"maxReplicas": 10, "targetBacklogPerReplica": 5, "pollIntervalSeconds": 7},
    }));
    let (task, mut api, ctx) = start(p);

    let Round {
        applied,
        events,
        status,
    } = api.round(Some(existing_deployment(1, 1)), 1).await;
    let event = &events[0];
    assert_eq!(applied["spec"]["replicas"], json!(3), "ceil(12 / 5)");
    assert_eq!(
        (event["type"].clone(), event["reason"].clone()),
        (json!("Normal"), json!("ScaledUp"))
    );
    assert!(
        event["note"]
            .as_str()
            .expect("note")
            .starts_with("scaled up from 1 to 3"),
        "{event}"
    );
    assert_eq!(event["regarding"]["name"], json!("mail"));
    let s = &status["status"];
    assert_eq!(
        (
            s["backlog"].clone(),
            s["desiredReplicas"].clone(),
            s["reason"].clone()
        ),
        (json!(12), json!(3), json!("BacklogTarget"))
    );
    assert_eq!(condition(&status, "ScalingActive")["status"], json!("True"));
    assert!(s["lastScaleTime"].is_string());

    assert_eq!(
        task.await.expect("task").expect("reconcile"),
        Action::requeue(Duration::from_secs(7))
    );
    api.done().await;
    let metrics = ctx.metrics.render();
    for line in [
        r#"workerpool_pool_desired_replicas{namespace="jobs",pool="mail"} 3"#,
        r#"workerpool_pool_ready_replicas{namespace="jobs",pool="mail"} 1"#,
        r#"workerpool_pool_max_replicas{namespace="jobs",pool="mail"} 10"#,
        r#"workerpool_pool_queue_up{namespace="jobs",pool="mail"} 1"#,
        r#"workerpool_pool_scale_events_total{direction="up",namespace="jobs",pool="mail"} 1"#,
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "no {line} in\n{metrics}"
        );
    }
    let remembered = |ctx: &Context| {
        ctx.pool("jobs/mail", |m| {
            (m.applied.is_some(), m.status_written.is_some())
        })
    };
    assert_eq!(remembered(&ctx), (true, true));
    ctx.forget("jobs/mail");
    assert!(!ctx.metrics.render().contains(r#"pool="mail""#));
    assert_eq!(remembered(&ctx), (false, false), "the pool's memory goes");
}

#[tokio::test]
async fn before_a_scale_down_idle_pods_are_marked_cheapest_to_delete() {
    let redis = TestRedis::start();
    worker_on(&redis, "mail-a~1", 2, &[]).await;
    // mail-c's worker is lost (its details expired): the reaper returns its
    // jobs, so its pod is as cheap to delete as an idle one.
    let mut c = redis.conn().await;
    let (secs, _): (u64, u64) = redis::cmd("TIME").query_async(&mut c).await.expect("time");
    let _: () = c
        .zadd("mail:workers", "mail-c~1", secs * 1000)
        .await
        .expect("zadd");
    let _: () = c
        .lpush("mail:processing:mail-c~1", "j3")
        .await
        .expect("lpush");
    let p = pool(json!({
        "queue": {"redis": {"url": redis.url(), "key": "mail"}},
        "template": template(),
        "scaling": {"minReplicas": 1, "targetBacklogPerReplica": 5,
                    "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}}},
    }));
    let (task, mut api, _) = start(p);

    api.get(DEPLOYMENT, Some(existing_deployment(3, 3))).await;
    let pod = |name: &str, cost: Option<&str>| {
        let annotations = cost.map_or(json!({}), |c| json!({DELETION_COST: c}));
        json!({"metadata": {"name": name, "namespace": "jobs", "annotations": annotations}})
    };
    api.get(
        PODS,
        Some(
            json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": [pod("mail-a", None), pod("mail-b", Some("0")), pod("mail-c", Some("5"))]}),
        ),
    )
    .await;
    for (name, cost) in [("mail-a", "2"), ("mail-c", "0")] {
        let path = format!("{PODS}/{name}");
        let patch = api
            .exchange("PATCH", &path, StatusCode::OK, |_| pod(name, Some(cost)))
            .await;
        assert_eq!(
            patch,
            json!({"metadata": {"annotations": {DELETION_COST: cost}}})
        );
    }
    let applied = api.apply().await;
    assert_eq!(applied["spec"]["replicas"], json!(1));
    let event = api.event().await;
    assert_eq!(event["reason"], json!("ScaledDown"));
    let status = api.status().await;
    // Every job in a processing list, the lost worker's too until the reaper
    // returns it.
    assert_eq!(status["status"]["inFlight"], json!(3));
    api.finish(task).await.expect("reconcile");
}

#[tokio::test]
async fn a_missing_secret_shows_in_conditions_and_an_event_and_the_fallback_applies() {
    let p = pool(json!({
        "queue": {"redis": {"urlSecretRef": {"name": "redis-url", "key": "url"}, "key": "mail"}},
        "template": template(),
        "scaling": {"fallback": {"failureThreshold": 1, "replicas": 2}},
    }));
    let (task, mut api, _) = start(p);

    api.get(DEPLOYMENT, None).await;
    api.get("/api/v1/namespaces/jobs/secrets/redis-url", None)
        .await;
    let applied = api.apply().await;
    assert_eq!(
        applied["spec"]["replicas"],
        json!(2),
        "fallback.replicas after failureThreshold"
    );
    let env = &applied["spec"]["template"]["spec"]["containers"][0]["env"][0];
    assert_eq!(env["valueFrom"]["secretKeyRef"]["name"], json!("redis-url"));
    let event = api.event().await;
    assert_eq!(
        (event["type"].clone(), event["reason"].clone()),
        (json!("Warning"), json!("SecretNotFound"))
    );
    let status = api.status().await;
    let queue = condition(&status, "QueueReachable");
    assert_eq!(
        (queue["status"].clone(), queue["reason"].clone()),
        (json!("False"), json!("SecretNotFound"))
    );
    assert!(
        queue["message"]
            .as_str()
            .expect("message")
            .contains("\"redis-url\"")
    );
    assert_eq!(
        condition(&status, "ScalingActive")["reason"],
        json!("Fallback")
    );
    assert!(
        task.await.expect("task").is_ok(),
        "the controller keeps running"
    );
    api.done().await;
}

/// A Secret in the pool's namespace with one key, as the API server
/// returns it (the value base64-encoded).
fn secret_with(name: &str, key: &str, value: &str) -> Value {
    let secret = k8s_openapi::api::core::v1::Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some("jobs".into()),
            ..Default::default()
        },
        data: Some(
            [(
                key.to_string(),
                k8s_openapi::ByteString(value.as_bytes().to_vec()),
            )]
            .into(),
        ),
        ..Default::default()
    };
    let mut object = serde_json::to_value(secret).expect("a Secret serializes");
    object["apiVersion"] = json!("v1");
    object["kind"] = json!("Secret");
    object
}

#[tokio::test]
async fn a_secret_key_that_is_not_a_redis_url_is_never_echoed_in_status_or_events() {
    // The key named may hold any secret at all: here a ServiceAccount
    // token, which a user of the pool alone must not read through it.
    let token = "eyJhbGciOiJSUzI1NiIsImtpZCI6IiJ9.c2VjcmV0LXRva2Vu.sig";
    for (tls, value) in [
        (false, token.to_string()),
        (true, token.to_string()),
        (true, format!("redis://:{token}@redis:6379")),
    ] {
        let mut redis = json!({"urlSecretRef": {"name": "sa", "key": "token"}, "key": "mail"});
        if tls {
            redis["tls"] = json!({});
        }
        let p = pool(json!({
            "queue": {"redis": redis},
            "template": template(),
            "scaling": {"fallback": {"failureThreshold": 1, "replicas": 2}},
        }));
        let (task, mut api, _) = start(p);
        api.get(DEPLOYMENT, None).await;
        api.get(
            "/api/v1/namespaces/jobs/secrets/sa",
            Some(secret_with("sa", "token", &value)),
        )
        .await;
        api.apply().await;
        let event = api.event().await;
        let status = api.status().await;
        let queue = condition(&status, "QueueReachable");
        assert_eq!(queue["reason"], json!("InvalidRedisURL"), "{value}");
        let message = queue["message"].as_str().expect("message");
        assert!(message.contains("Secret \"sa\""), "{message}");
        for shown in [event.to_string(), status.to_string()] {
            assert!(
                !shown.contains("c2VjcmV0LXRva2Vu"),
                "the Secret's value leaked: {shown}"
            );
        }
        assert!(task.await.expect("task").is_ok());
        api.done().await;
    }
}

#[tokio::test]
async fn a_bad_redis_url_shows_in_conditions_and_the_pool_keeps_its_size() {
    let p = pool(json!({
        "queue": {"redis": {"url": "http://not-redis", "key": "mail"}},
        "template": template(),
        "scaling": {},
    }));
    let (task, mut api, ctx) = start(p);
    let Round {
        applied,
        events,
        status,
    } = api.round(Some(existing_deployment(4, 4)), 1).await;
    let event = &events[0];
    assert_eq!(
        applied["spec"]["replicas"],
        json!(4),
        "metrics unavailable: hold"
    );
    assert_eq!(event["reason"], json!("InvalidRedisURL"));
    assert_eq!(
        condition(&status, "QueueReachable")["reason"],
        json!("InvalidRedisURL")
    );
    assert_eq!(
        condition(&status, "ScalingActive")["reason"],
        json!("MetricsUnavailable")
    );
    api.finish(task).await.expect("reconcile");
    let metrics = ctx.metrics.render();
    for line in [
        r#"workerpool_pool_queue_up{namespace="jobs",pool="mail"} 0"#,
        r#"workerpool_pool_desired_replicas{namespace="jobs",pool="mail"} 4"#,
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "no {line} in\n{metrics}"
        );
    }
}

#[tokio::test]
async fn a_failed_apply_is_an_error_named_for_the_operation() {
    let redis = TestRedis::start();
    let p = pool(fixed(&redis.url(), 1));
    let (task, mut api, ctx) = start(p);
    api.get(DEPLOYMENT, None).await;
    api.exchange("PATCH", DEPLOYMENT, StatusCode::FORBIDDEN, |_| forbidden())
        .await;
    // The pool says why, in an event and its Ready condition.
    let event = api.event().await;
    assert_eq!(event["reason"], json!("DeploymentRefused"));
    let status = api.status().await;
    assert_eq!(
        condition(&status, "Ready")["reason"],
        json!("DeploymentRefused")
    );
    let err = task.await.expect("task").expect_err("apply failed");
    assert_eq!(err.label(), "apply_deployment");
    // Failed reconciles of a pool back off: 5 s, 10 s, 20 s ... up to 5 minutes.
    let p = Arc::new(pool(fixed("redis://r", 1)));
    let delays: Vec<Action> = (0..3)
        .map(|_| error_policy(p.clone(), &err, ctx.clone()))
        .collect();
    let secs = |s| Action::requeue(Duration::from_secs(s));
    assert_eq!(delays, [secs(5), secs(10), secs(20)]);
    assert_eq!(retry_delay(30), Duration::from_secs(300));
    api.done().await;
    assert!(
        ctx.metrics
            .render()
            .contains(r#"workerpool_operator_reconciles_total{result="apply_deployment"} 1"#)
    );
}

#[tokio::test]
async fn a_refused_apply_does_not_count_against_the_scale_up_policy() {
    let redis = TestRedis::start();
    push(&redis, "mail", 50).await;
    // 50 jobs at 5 per replica ask for 10; the policy allows 2 more pods per 10 minutes.
    let p = || {
        pool(json!({
            "queue": {"redis": {"url": redis.url(), "key": "mail"}},
            "template": template(),
            "scaling": {"maxReplicas": 20, "targetBacklogPerReplica": 5,
                        "behavior": {"scaleUp": {"policies": [{"type": "Pods", "value": 2, "periodSeconds": 600}]}}},
        }))
    };
    let (task, mut api, ctx) = start(p());
    api.get(DEPLOYMENT, Some(existing_deployment(1, 1))).await;
    let applied = api
        .exchange("PATCH", DEPLOYMENT, StatusCode::FORBIDDEN, |_| forbidden())
        .await;
    assert_eq!(applied["spec"]["replicas"], json!(3), "1 + 2 pods");
    api.event().await;
    let status = api.status().await;
    assert_eq!(
        status["status"]["lastScaleTime"],
        Value::Null,
        "no scale happened"
    );
    let err = task.await.expect("task").expect_err("apply refused");
    assert_eq!(err.label(), "apply_deployment");

    // The next poll, same engine: the refused scale-up changed nothing, so the
    // policy still allows its 2 pods.
    let task = tokio::spawn(reconcile(Arc::new(p()), ctx.clone()));
    api.get(DEPLOYMENT, Some(existing_deployment(1, 1))).await;
    let applied = api
        .exchange("PATCH", DEPLOYMENT, StatusCode::OK, |sent| {
            let mut live = sent.clone();
            live["metadata"]["generation"] = json!(2);
            live
        })
        .await;
    assert_eq!(
        applied["spec"]["replicas"],
        json!(3),
        "a refused apply is no scale event"
    );
    let event = api.event().await;
    assert_eq!(event["reason"], json!("ScaledUp"));
    api.status().await;
    task.await.expect("task").expect("reconcile");

    // This one was applied: the period's 2 pods are used up. The
    // Deployment is as applied (the same generation, its labels and owner
    // kept), so it is not sent again.
    let sent = applied.clone();
    let at = |generation| {
        let mut d = existing_deployment(3, 3);
        d["metadata"] = sent["metadata"].clone();
        d["metadata"]["generation"] = json!(generation);
        d
    };
    let task = tokio::spawn(reconcile(Arc::new(p()), ctx.clone()));
    api.get(DEPLOYMENT, Some(at(2))).await;
    let status = api.status().await;
    assert_eq!(status["status"]["reason"], json!("ScaleUpLimit"));
    task.await.expect("task").expect("reconcile");

    // Someone edited it (a new generation): applied again.
    let task = tokio::spawn(reconcile(Arc::new(p()), ctx.clone()));
    api.get(DEPLOYMENT, Some(at(3))).await;
    let applied = api
        .exchange("PATCH", DEPLOYMENT, StatusCode::OK, |_| at(3))
        .await;
    assert_eq!(applied["spec"]["replicas"], json!(3));
    let status = api.status().await;
    assert_eq!(status["status"]["reason"], json!("ScaleUpLimit"));
    task.await.expect("task").expect("reconcile");

    // Someone changed its pool label (the generation stays): applied
    // again, the label back.
    let task = tokio::spawn(reconcile(Arc::new(p()), ctx.clone()));
    let mut relabelled = at(3);
    relabelled["metadata"]["labels"]["workerpool.dev/pool"] = json!("other");
    api.get(DEPLOYMENT, Some(relabelled)).await;
    let applied = api
        .exchange("PATCH", DEPLOYMENT, StatusCode::OK, |_| at(3))
        .await;
    assert_eq!(
        applied["metadata"]["labels"]["workerpool.dev/pool"],
        json!("mail")
    );
    api.status().await;
    api.finish(task).await.expect("reconcile");
}

#[tokio::test]
async fn pods_the_api_server_refuses_show_in_ready_with_its_message_and_one_event() {
    let redis = TestRedis::start();
    let spec = fixed(&redis.url(), 1);
    let refused = || {
        let mut d = existing_deployment(1, 0);
        d["status"]["conditions"] = json!([{"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
            "message": "pods \"mail-x\" is forbidden: violates PodSecurity \"restricted:latest\": privileged (container \"worker\" must not set securityContext.privileged=true)"}]);
        d
    };
    let empty_pods = json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": []});
    let (task, mut api, _) = start(pool(spec.clone()));
    api.get(DEPLOYMENT, Some(refused())).await;
    api.get(PODS, Some(empty_pods.clone())).await;
    api.apply().await;
    let event = api.event().await;
    assert_eq!(
        (event["type"].clone(), event["reason"].clone()),
        (json!("Warning"), json!("FailedCreate"))
    );
    assert!(
        event["note"]
            .as_str()
            .expect("note")
            .contains("violates PodSecurity")
    );
    let status = api.status().await;
    let ready = condition(&status, "Ready").clone();
    assert_eq!(
        (ready["status"].clone(), ready["reason"].clone()),
        (json!("False"), json!("FailedCreate"))
    );
    let message = ready["message"].as_str().expect("message");
    assert!(
        message.starts_with("0 of 1 workers ready: pods \"mail-x\" is forbidden"),
        "{message}"
    );
    api.finish(task).await.expect("reconcile");

    // The next poll finds the same failure: no second event, and the
    // status, unchanged, is not written again.
    let mut again = pool(spec);
    again.status = serde_json::from_value(status["status"].clone()).expect("status");
    let (task, mut api, _) = start(again);
    api.get(DEPLOYMENT, Some(refused())).await;
    api.get(PODS, Some(empty_pods)).await;
    api.apply().await;
    api.finish(task).await.expect("reconcile");

    // Fixed: the condition clears by itself.
    let mut fixed = pool(fixed(&redis.url(), 1));
    fixed.status = serde_json::from_value(status["status"].clone()).expect("status");
    let (task, mut api, _) = start(fixed);
    let Round { status, .. } = api.round(Some(existing_deployment(1, 1)), 0).await;
    assert_eq!(condition(&status, "Ready")["reason"], json!("WorkersReady"));
    api.finish(task).await.expect("reconcile");
}

/// What a reconcile observed, without an API server or Redis.
fn observed(deployment: Option<Value>, reading_ok: bool) -> Observed {
    let existing: Option<Deployment> =
        deployment.map(|d| serde_json::from_value(d).expect("deployment"));
    let spec = existing.as_ref().and_then(|d| d.spec.as_ref());
    let status = existing.as_ref().and_then(|d| d.status.as_ref());
    Observed {
        replicas: Replicas {
            desired: 0,
            replicas: status.and_then(|s| s.replicas).unwrap_or(0),
            ready: status.and_then(|s| s.ready_replicas).unwrap_or(0),
            current: spec.and_then(|s| s.replicas).unwrap_or(0),
        },
        pods: Some(Vec::new()),
        budget: None,
        foreign: None,
        reading: if reading_ok {
            Ok(Snapshot {
                server_time_ms: 0,
                queues: Vec::new(),
            })
        } else {
            Err(QueueProblem {
                reason: "RedisUnreachable",
                message: "cannot read the queue: refused".into(),
            })
        },
        existing,
        memory: None,
        failing: None,
    }
}

/// The plan for what a reconcile `seen`, with `announced` the workload
/// problem last announced.
fn plan_for(
    p: &WorkerPool,
    seen: &Observed,
    verdict: &Verdict,
    announced: Option<&str>,
) -> Result<Plan, Error> {
    let memory = PoolMemory {
        announced: announced.map(str::to_string),
        ..PoolMemory::default()
    };
    plan(p, seen, &Fires::default(), verdict, &memory, clock(100))
}

/// The clocks at `secs` into the operator's run.
fn clock(secs: u64) -> Clock {
    Clock {
        now: Duration::from_secs(secs),
        wall: jiff::Timestamp::from_second(1_800_000_000 + secs as i64).expect("a time"),
    }
}

fn manual(n: i32) -> Verdict {
    Verdict {
        desired: n,
        decision: None,
    }
}

#[test]
fn a_planned_scale_down_marks_idle_pods_first_and_says_why_in_one_event() {
    let p = pool(fixed("redis://r", 1));
    let plan = plan_for(
        &p,
        &observed(Some(existing_deployment(3, 3)), true),
        &manual(1),
        None,
    )
    .expect("plan");
    assert!(plan.mark_idle);
    assert_eq!(
        plan.deployment.spec.as_ref().and_then(|s| s.replicas),
        Some(1)
    );
    let events: Vec<(&str, &str)> = plan
        .events
        .iter()
        .map(|(_, reason, note)| (reason.as_str(), note.as_str()))
        .collect();
    assert_eq!(
        events,
        [(
            "ScaledDown",
            "scaled down from 3 to 1: spec.replicas fixes the pool at 1"
        )]
    );
    assert_eq!(plan.status.desired_replicas, 1);
    // Without a reading of the queue nobody knows which pods are idle.
    let blind = plan_of_unreadable(&p);
    assert!(!blind.mark_idle);
    assert_eq!(
        blind.events.last().map(|e| e.1.as_str()),
        Some("RedisUnreachable")
    );
}

#[test]
fn the_plan_decides_from_the_pools_memory_and_its_clock_which_writes_to_skip() {
    let mut p = pool(fixed("redis://r", 1));
    let first = |p: &WorkerPool, seen: &Observed, memory: &PoolMemory, at: u64| {
        plan(p, seen, &Fires::default(), &manual(1), memory, clock(at)).expect("plan")
    };
    let fresh = first(
        &p,
        &observed(Some(existing_deployment(1, 1)), true),
        &PoolMemory::default(),
        100,
    );
    assert!(fresh.send_deployment, "never applied");
    assert!(fresh.write_status, "a first status");
    assert_eq!(fresh.decided_at, Duration::from_secs(100));
    assert!(
        fresh
            .status
            .conditions
            .iter()
            .all(|c| c.last_transition_time == Time(clock(100).wall)),
        "the wall clock passed in: {:?}",
        fresh.status.conditions
    );
    // Applied as planned (generation 4) and the status written: the next
    // look sends neither again.
    let mut live = serde_json::to_value(&fresh.deployment).expect("json");
    live["metadata"]["generation"] = json!(4);
    live["status"] = json!({"replicas": 1, "readyReplicas": 1});
    p.status = Some(fresh.status.clone());
    let memory = PoolMemory {
        applied: fresh.fingerprint.map(|sent| (sent, Some(4))),
        status_written: Some(Duration::from_secs(100)),
        ..PoolMemory::default()
    };
    let again = first(&p, &observed(Some(live.clone()), true), &memory, 110);
    assert!(!again.send_deployment, "unchanged since applied");
    assert!(!again.write_status, "unchanged since written");
    // Edited by someone else (a new generation): sent again.
    live["metadata"]["generation"] = json!(5);
    let edited = first(&p, &observed(Some(live.clone()), true), &memory, 110);
    assert!(edited.send_deployment);
    // Forgotten (a restarted operator): sent again.
    let forgot = first(&p, &observed(Some(live), true), &PoolMemory::default(), 110);
    assert!(forgot.send_deployment);
}

fn plan_of_unreadable(p: &WorkerPool) -> Plan {
    plan_for(
        p,
        &observed(Some(existing_deployment(3, 3)), false),
        &manual(1),
        None,
    )
    .expect("plan")
}

#[test]
fn a_workload_failure_is_announced_once_and_remembered() {
    let p = pool(fixed("redis://r", 1));
    let mut refused = existing_deployment(1, 0);
    refused["status"]["conditions"] = json!([{"type": "ReplicaFailure", "status": "True",
        "reason": "FailedCreate", "message": "exceeded quota: no-pods"}]);
    let seen = observed(Some(refused), true);
    let first = plan_for(&p, &seen, &manual(1), None).expect("plan");
    assert_eq!(
        first
            .events
            .iter()
            .map(|e| e.1.as_str())
            .collect::<Vec<_>>(),
        ["FailedCreate"]
    );
    assert_eq!(first.announced.as_deref(), Some("FailedCreate"));
    let ready = planned_condition(&first.status, "Ready");
    assert_eq!(
        (ready.reason.as_str(), ready.message.as_str()),
        (
            "FailedCreate",
            "0 of 1 workers ready: exceeded quota: no-pods"
        )
    );
    let again = plan_for(&p, &seen, &manual(1), Some("FailedCreate")).expect("plan");
    assert!(again.events.is_empty(), "{:?}", again.events);
    let healthy = plan_for(
        &p,
        &observed(Some(existing_deployment(1, 1)), true),
        &manual(1),
        Some("FailedCreate"),
    )
    .expect("plan");
    assert_eq!(healthy.announced, None, "forgotten once it clears");
}

#[test]
fn a_worker_whose_handler_cannot_run_shows_in_ready_with_its_words_and_one_event() {
    let p = pool(fixed("redis://r", 2));
    let worker = |instance: &str, problem: Option<&str>, beat: u64| WorkerFigures {
        instance: instance.into(),
        last_beat_ms: beat,
        in_flight: 0,
        dead_after_ms: Some(30_000),
        rate_limit: None,
        handler_problem: problem.map(str::to_string),
        oldest_job_ms: None,
        idle_ms: None,
    };
    let why = "the handler exited before its first answer 3 times in a row \
               (exit status: 2); its stderr: python3: can't open file '/app/handler.py'";
    let mut seen = observed(Some(existing_deployment(2, 1)), true);
    seen.reading = Ok(Snapshot {
        server_time_ms: 100_000,
        queues: vec![QueueFigures {
            name: "mail".into(),
            workers: vec![
                worker("mail-7d9-abcde~1", Some(why), 99_000),
                worker("mail-7d9-fghij~1", None, 99_000),
                // Lost long ago: what it said no longer counts.
                worker("mail-7d9-old~1", Some("stale"), 1_000),
            ],
            ..QueueFigures::default()
        }],
    });
    let planned = plan_for(&p, &seen, &manual(2), None).expect("plan");
    let ready = planned_condition(&planned.status, "Ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "HandlerFailing")
    );
    assert_eq!(
        ready.message,
        format!("1 of 2 workers ready: worker mail-7d9-abcde: {why}")
    );
    let warnings: Vec<&str> = planned
        .events
        .iter()
        .filter(|(t, _, _)| *t == EventType::Warning)
        .map(|(_, r, _)| r.as_str())
        .collect();
    assert_eq!(warnings, ["HandlerFailing"]);
    assert_eq!(planned.announced.as_deref(), Some("HandlerFailing"));
    // Said once: no second event while it lasts.
    let again = plan_for(&p, &seen, &manual(2), Some("HandlerFailing")).expect("plan");
    assert!(again.events.is_empty(), "{:?}", again.events);
    // Even with every pod counted ready, a worker that says its handler
    // cannot run is the pool's problem.
    seen.replicas.ready = 2;
    let counted = plan_for(&p, &seen, &manual(2), Some("HandlerFailing")).expect("plan");
    assert!(
        counted
            .status
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.reason == "HandlerFailing")
    );
    // The handler runs again: Ready is the workers' again.
    if let Ok(s) = &mut seen.reading {
        s.queues[0].workers[0].handler_problem = None;
    }
    let healthy = plan_for(&p, &seen, &manual(2), Some("HandlerFailing")).expect("plan");
    assert_eq!(healthy.announced, None);
    assert!(
        healthy
            .status
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.reason == "WorkersReady")
    );
}

#[tokio::test]
async fn a_command_the_acl_refuses_is_permission_denied_naming_it_not_unreachable() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("clock-only")
        .arg("on")
        .arg(">pw")
        .arg("~*")
        .arg("-@all")
        .arg("+time")
        .query_async(&mut c)
        .await
        .expect("acl setuser");
    let url = format!("redis://clock-only:pw@127.0.0.1:{}", redis.port());
    let endpoint = Endpoint::new(url, Tls::default()).expect("valid url");
    let mut conn = endpoint
        .connect(Duration::from_secs(3), Duration::from_secs(5))
        .await
        .expect("connect");
    let error = snapshot::read(&mut conn, &[QueueKeys::new("mail")])
        .await
        .expect_err("ZRANGE is refused");
    let problem = unreachable_problem(&endpoint, &error);
    assert_eq!(problem.reason, "RedisPermissionDenied");
    assert!(
        problem.message.contains("may not run ZRANGE") && problem.message.contains("+zrange"),
        "{}",
        problem.message
    );
    assert!(!problem.message.contains(":pw@"), "{}", problem.message);
}

#[tokio::test]
async fn a_password_in_the_url_reaches_no_status_event_or_metric() {
    const PASSWORD: &str = "s3cr3t-Pa55";
    const SENTINEL_PASSWORD: &str = "s3nt1nel-Pa55";
    let port = workerpool_tests::free_port();
    for url in [
        format!("redis://admin:{PASSWORD}@127.0.0.1:{port}/0"),
        format!(
            "redis+sentinel://admin:{PASSWORD}@127.0.0.1:{port}/mymaster?sentinel_password={SENTINEL_PASSWORD}"
        ),
    ] {
        let p = pool(json!({
            "queue": {"redis": {"url": url, "key": "mail"}},
            "template": template(),
            "scaling": {},
        }));
        let (task, mut api, ctx) = start(p);
        let Round { status, events, .. } = api.round(Some(existing_deployment(1, 1)), 1).await;
        let event = &events[0];
        assert_eq!(event["reason"], json!("RedisUnreachable"));
        api.finish(task).await.expect("reconcile");
        for (what, text) in [
            ("event", event.to_string()),
            ("status", status.to_string()),
            ("metrics", ctx.metrics.render()),
        ] {
            assert!(
                !text.contains(PASSWORD) && !text.contains(SENTINEL_PASSWORD),
                "{what}: {text}"
            );
        }
    }
}

#[tokio::test]
async fn a_pool_behind_redis_sentinel_reads_its_queue_on_the_primary_the_sentinels_name() {
    let setup = workerpool_tests::TestRedisSentinel::start(1);
    let mut c = setup.primary().await;
    for i in 0..7 {
        let _: () = c
            .lpush("mail", json!({"data": {"n": i}}).to_string())
            .await
            .expect("lpush");
    }
    let p = pool(fixed(&setup.url(), 1));
    let (task, mut api, _) = start(p);
    let Round { status, .. } = api.round(Some(existing_deployment(1, 1)), 0).await;
    assert_eq!(
        condition(&status, "QueueReachable")["status"],
        json!("True"),
        "{status}"
    );
    assert_eq!(status["status"]["backlog"], json!(7), "{status}");
    api.finish(task).await.expect("reconcile");
}

#[tokio::test]
async fn on_a_redis_cluster_queue_names_without_one_slot_show_how_to_name_them() {
    let cluster = workerpool_tests::TestRedisCluster::start(3, 0);
    let url = cluster.url(cluster.primary_not_owning(workerpool_queue::keys::slot("{mail}")));
    let p = pool(json!({
        "queue": {"redis": {"url": url, "keys": ["mail:high", "mail:low"]}},
        "template": template(),
        "scaling": {},
    }));
    let (task, mut api, _) = start(p);
    let Round {
        applied,
        events,
        status,
    } = api.round(Some(existing_deployment(2, 2)), 1).await;
    let event = &events[0];
    assert_eq!(applied["spec"]["replicas"], json!(2), "unreadable: hold");
    assert_eq!(event["reason"], json!("QueueNamesSpanSlots"));
    let queue = condition(&status, "QueueReachable");
    assert_eq!(queue["status"], json!("False"));
    assert_eq!(queue["reason"], json!("QueueNamesSpanSlots"));
    let message = queue["message"].as_str().expect("message");
    assert!(
        message.contains("queue mail:high, mail:low has no hash tag")
            && message.contains("{mail}:high, {mail}:low"),
        "{message}"
    );
    api.finish(task).await.expect("reconcile");

    // Named with one hash tag, the same pool reads its queues through a
    // node that does not own their slot.
    let mut c = cluster.conn().await;
    for i in 0..30 {
        let _: () = c
            .lpush("{mail}:low", json!({"data": {"n": i}}).to_string())
            .await
            .expect("lpush");
    }
    let p = pool(json!({
        "queue": {"redis": {"url": url, "keys": ["{mail}:high", "{mail}:low"]}},
        "template": template(),
        "scaling": {"targetBacklogPerReplica": 10, "maxReplicas": 10},
    }));
    let (task, mut api, _) = start(p);
    let Round {
        applied, status, ..
    } = api.round(Some(existing_deployment(1, 1)), 1).await;
    assert_eq!(
        applied["spec"]["replicas"],
        json!(3),
        "30 waiting at 10 each"
    );
    assert_eq!(
        condition(&status, "QueueReachable")["status"],
        json!("True")
    );
    assert_eq!(status["status"]["backlog"], json!(30), "{status}");
    api.finish(task).await.expect("reconcile");
}

#[tokio::test]
async fn a_due_schedule_enqueues_its_fire_and_a_bad_one_is_named_in_a_condition_and_an_event() {
    let redis = TestRedis::start();
    let mut p = pool(json!({
        "queue": {"redis": {"url": redis.url(), "key": "mail"}},
        "template": template(),
        "replicas": 1,
        "schedules": [
            {"name": "tick", "schedule": "@every 10s", "job": {"task": "tick"}},
            {"name": "bad", "schedule": "@hourly", "timeZone": "Mars/Olympus"},
        ],
    }));
    // The fire the last reconcile waited for has come, and the next one is
    // seconds away (a busy machine may take a while to the reconcile).
    let mut now = k8s_openapi::jiff::Timestamp::now();
    if now.as_second() % 10 >= 7 {
        tokio::time::sleep(Duration::from_secs(3)).await;
        now = k8s_openapi::jiff::Timestamp::now();
    }
    let due = k8s_openapi::jiff::Timestamp::from_second(now.as_second() - now.as_second() % 10)
        .expect("a second");
    p.status = Some(WorkerPoolStatus {
        schedules: Some(vec![crate::crd::ScheduleStatus {
            name: "tick".into(),
            next_fire_time: Some(Time(due)),
            ..Default::default()
        }]),
        ..Default::default()
    });
    // Claims of a schedule this pool had before its spec changed, and of
    // another pool's.
    let mut c = redis.conn().await;
    for (schedule, at) in [("jobs/mail/gone", 5), ("jobs/mailer/gone", 6)] {
        let _: () = c.hset("mail:fires", schedule, at).await.expect("hset");
    }
    let (task, mut api, _) = start(p);

    let Round { status, events, .. } = api.round(Some(existing_deployment(1, 1)), 1).await;
    let event = &events[0];
    assert_eq!(
        (event["type"].clone(), event["reason"].clone()),
        (json!("Warning"), json!("InvalidSchedule"))
    );
    let note = event["note"].as_str().expect("note");
    assert!(
        note.contains(
            "spec.schedules[1] (bad): timeZone \"Mars/Olympus\" is not an IANA time zone"
        ),
        "{note}"
    );
    let valid = condition(&status, "SchedulesValid");
    assert_eq!(
        (valid["status"].clone(), valid["reason"].clone()),
        (json!("False"), json!("InvalidSchedule"))
    );
    let schedules = &status["status"]["schedules"];
    let shown = |t: k8s_openapi::jiff::Timestamp| serde_json::to_value(Time(t)).expect("time");
    assert_eq!(schedules[0]["name"], json!("tick"));
    assert_eq!(schedules[0]["lastFireTime"], shown(due), "{schedules}");
    let next = schedules[0]["nextFireTime"].as_str().expect("next");
    assert!(
        next > shown(due).as_str().unwrap_or_default(),
        "{schedules}"
    );
    assert_eq!(schedules[1], json!({"name": "bad"}));
    // The fire went into the queue before it was read.
    assert_eq!(status["status"]["backlog"], json!(1));

    // Woken for the next fire (ten seconds after this one), not a poll
    // later.
    let action = task.await.expect("task").expect("reconcile");
    let until_next = (due.as_millisecond() + 10_000
        - k8s_openapi::jiff::Timestamp::now().as_millisecond()) as u64;
    assert!(
        (until_next.saturating_sub(100)..=until_next + 1_500)
            .any(|ms| action == Action::requeue(Duration::from_millis(ms))),
        "{action:?}, the next fire in {until_next} ms"
    );
    api.done().await;
    let mut claims: Vec<String> = c.hkeys("mail:fires").await.expect("hkeys");
    claims.sort();
    assert_eq!(claims, ["jobs/mail/tick", "jobs/mailer/gone"]);
    let jobs: Vec<String> = c.lrange("mail", 0, -1).await.expect("lrange");
    let job: Value = serde_json::from_str(&jobs[0]).expect("json");
    assert_eq!(
        job["id"],
        json!(format!("jobs/mail/tick/{}", due.as_millisecond()))
    );
    assert_eq!(
        (job["schedule"].clone(), job["unique_key"].clone()),
        (json!("tick"), json!("schedule:jobs/mail/tick"))
    );
}

#[test]
fn status_rates_keep_three_digits_and_a_long_idle_pool_shows_none() {
    assert_eq!(shown_rate(12.3456), 12.3);
    assert_eq!(shown_rate(0.012345), 0.0123);
    assert_eq!(shown_rate(1234.5), 1230.0);
    assert_eq!(shown_rate(0.0004), 0.0);
    assert_eq!(shown_rate(f64::NAN), 0.0);
    // A decaying rate settles: later looks show the same status.
    let settled: Vec<f64> = (0..5)
        .map(|i| shown_rate(0.0009 * 0.8f64.powi(i)))
        .collect();
    assert!(settled.iter().all(|r| *r == 0.0), "{settled:?}");
}

#[test]
fn a_status_whose_rates_alone_moved_is_written_at_most_every_thirty_seconds() {
    let old = WorkerPoolStatus {
        backlog: 40,
        arrival_rate: Some(12.5),
        throughput: Some(3.1),
        ..Default::default()
    };
    let s = Duration::from_secs;
    let decayed = WorkerPoolStatus {
        arrival_rate: Some(9.8),
        ..old.clone()
    };
    assert!(status_write(None, &old, None, s(100)), "a first status");
    assert!(!status_write(Some(&old), &old, None, s(100)), "unchanged");
    assert!(!status_write(Some(&old), &decayed, Some(s(80)), s(100)));
    assert!(status_write(Some(&old), &decayed, Some(s(70)), s(100)));
    assert!(
        status_write(Some(&old), &decayed, None, s(100)),
        "not written since this operator started"
    );
    let gone = WorkerPoolStatus {
        throughput: None,
        ..old.clone()
    };
    assert!(!status_write(Some(&old), &gone, Some(s(99)), s(100)));
    // Anything else is written at once.
    let busier = WorkerPoolStatus {
        backlog: 41,
        ..decayed.clone()
    };
    assert!(status_write(Some(&old), &busier, Some(s(99)), s(100)));
}

#[tokio::test]
async fn a_pool_whose_redis_cannot_be_read_holds_min_replicas_and_says_so_in_its_status_column() {
    // A port nothing listens on: refused at once.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!(
        "redis://:secret@{}/0",
        closed.local_addr().expect("address")
    );
    drop(closed);
    let p = pool(json!({
        "queue": {"redis": {"url": url, "key": "mail"}},
        "template": template(),
        "scaling": {"minReplicas": 1, "maxReplicas": 5},
    }));
    let (task, mut api, _) = start(p);
    let Round {
        applied,
        events,
        status,
    } = api.round(None, 1).await;
    let event = &events[0];
    assert_eq!(
        applied["spec"]["replicas"],
        json!(1),
        "minReplicas holds while the queue cannot be read"
    );
    assert_eq!(event["reason"], json!("RedisUnreachable"));
    let ready = condition(&status, "Ready");
    assert_eq!(
        (ready["status"].clone(), ready["reason"].clone()),
        (json!("False"), json!("RedisUnreachable")),
        "the Status column shows the outage, not WorkersReady"
    );
    let message = ready["message"].as_str().expect("message");
    assert!(
        message
            .starts_with("0 of 1 workers ready; cannot read the queue at redis://:***@127.0.0.1:"),
        "{message}"
    );
    assert!(!status.to_string().contains("secret"), "{status}");
    assert_eq!(status["status"]["desiredReplicas"], json!(1));
    assert_eq!(
        condition(&status, "ScalingLimited")["reason"],
        json!("MinReplicas")
    );
    api.finish(task).await.expect("reconcile");
}

#[tokio::test]
async fn a_drained_queue_clears_the_oldest_jobs_age_from_the_status() {
    let redis = TestRedis::start();
    let mut p = pool(fixed(&redis.url(), 1));
    p.status = Some(WorkerPoolStatus {
        backlog: 3,
        oldest_job_age_seconds: Some(5.912),
        ..WorkerPoolStatus::default()
    });
    let (task, mut api, _) = start(p);
    let Round { status, .. } = api.round(Some(existing_deployment(1, 1)), 0).await;
    assert_eq!(status["status"]["backlog"], json!(0));
    assert!(
        status["status"]
            .as_object()
            .is_some_and(|s| s.get("oldestJobAgeSeconds") == Some(&Value::Null)),
        "sent as null, which a merge patch removes: {status}"
    );
    api.finish(task).await.expect("reconcile");
}

#[test]
fn every_optional_status_field_left_out_is_removed_by_the_patch() {
    let time = Time(k8s_openapi::jiff::Timestamp::now());
    let full = WorkerPoolStatus {
        reason: Some("BacklogTarget".into()),
        oldest_job_age_seconds: Some(5.9),
        arrival_rate: Some(2.0),
        throughput: Some(1.0),
        last_scale_time: Some(time),
        observed_generation: Some(3),
        schedules: Some(vec![]),
        ..WorkerPoolStatus::default()
    };
    let empty = WorkerPoolStatus::default();
    let patch = status_patch(Some(&full), &empty);
    let sent = patch["status"].as_object().expect("object");
    let before = serde_json::to_value(&full).expect("json");
    let before = before.as_object().expect("object");
    let after = serde_json::to_value(&empty).expect("json");
    let after = after.as_object().expect("object");
    let left_out: Vec<&String> = before.keys().filter(|k| !after.contains_key(*k)).collect();
    assert_eq!(left_out.len(), 7, "every optional field: {left_out:?}");
    for key in left_out {
        assert_eq!(sent.get(key), Some(&Value::Null), "{key}");
    }
    // Fields that are set are sent as they are; a first status has no nulls.
    assert_eq!(
        status_patch(Some(&empty), &full)["status"]["reason"],
        json!("BacklogTarget")
    );
    assert!(!status_patch(None, &empty).to_string().contains("null"));
}

#[test]
fn a_failed_read_is_logged_once_as_it_starts_and_once_as_it_clears() {
    // The conditions are what was said: the same problem twice says nothing new.
    let with = |status: &str, reason: &str| WorkerPoolStatus {
        conditions: vec![Condition {
            type_: "QueueReachable".into(),
            status: status.into(),
            reason: reason.into(),
            message: "m".into(),
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
            observed_generation: None,
        }],
        ..WorkerPoolStatus::default()
    };
    let (up, down) = (with("True", "QueueRead"), with("False", "RedisUnreachable"));
    assert_eq!(
        transitions(Some(&up), &down),
        vec![("QueueReachable".to_string(), true)]
    );
    assert_eq!(transitions(Some(&down), &down), vec![]);
    assert_eq!(
        transitions(Some(&down), &up),
        vec![("QueueReachable".to_string(), false)]
    );
    assert_eq!(transitions(Some(&up), &up), vec![]);
    assert_eq!(transitions(None, &up), vec![]);
}

#[tokio::test]
async fn an_evicting_redis_shows_as_queue_safe_false_with_one_warning_and_a_gauge() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("allkeys-lru")
        .query_async(&mut c)
        .await
        .expect("config set");
    let spec = fixed(&redis.url(), 1);
    let (task, mut api, ctx) = start(pool(spec.clone()));
    let Round { events, status, .. } = api.round(Some(existing_deployment(1, 1)), 1).await;
    let event = &events[0];
    assert_eq!(event["reason"], json!("EvictionPolicy"));
    assert_eq!(event["type"], json!("Warning"));
    let note = event["note"].as_str().expect("note");
    assert!(
        note.contains("allkeys-lru") && note.contains("noeviction"),
        "{note}"
    );
    let safe = condition(&status, "QueueSafe").clone();
    assert_eq!(
        (safe["status"].clone(), safe["reason"].clone()),
        (json!("False"), json!("EvictionPolicy"))
    );
    api.finish(task).await.expect("reconcile");
    assert!(
        ctx.metrics
            .render()
            .contains(r#"workerpool_pool_queue_safe{namespace="jobs",pool="mail"} 0"#)
    );

    // The next look, with the condition written: no second event.
    let mut seen = pool(spec);
    seen.status = Some(serde_json::from_value(status["status"].clone()).expect("status"));
    let (task, mut api, _) = start(seen);
    api.get(DEPLOYMENT, Some(existing_deployment(1, 1))).await;
    api.apply().await;
    // No event, and the status already says it all: nothing more is sent.
    api.finish(task).await.expect("reconcile");
}

#[test]
fn keys_evicted_since_the_last_look_are_a_warning_event_and_noeviction_none() {
    let p = pool(fixed("redis://r", 1));
    let memory =
        |policy: &str| Memory::parse(&format!("maxmemory_policy:{policy}\nmaxmemory:100\n"));
    let verdict = manual(1);
    let mut seen = observed(Some(existing_deployment(1, 1)), true);
    seen.memory = Some((memory("volatile-lru"), 12));
    let events = plan_for(&p, &seen, &verdict, None).expect("plan").events;
    let reasons: Vec<&str> = events.iter().map(|(_, r, _)| r.as_str()).collect();
    assert_eq!(reasons, ["VolatileEviction", "KeysEvicted"]);
    assert!(events[1].2.contains("evicted 12 keys"), "{}", events[1].2);
    seen.memory = Some((memory("noeviction"), 0));
    let planned = plan_for(&p, &seen, &verdict, None).expect("plan");
    assert!(planned.events.is_empty(), "{:?}", planned.events);
    let safe = planned_condition(&planned.status, "QueueSafe");
    assert_eq!(
        (safe.status.as_str(), safe.reason.as_str()),
        ("True", "NoEviction")
    );
}

#[test]
fn jobs_dead_lettered_lately_show_in_ready_and_jobs_failing_with_one_event() {
    let mut p = pool(fixed("redis://r", 1));
    let mut seen = observed(Some(existing_deployment(1, 1)), true);
    seen.failing = Some(Failing {
        count: 3,
        latest: "exhausted: handler process exited during the job (exit status: 2)".into(),
    });
    let planned = plan_for(&p, &seen, &manual(1), None).expect("plan");
    let failing: Vec<_> = planned
        .events
        .iter()
        .filter(|(_, reason, _)| reason == "JobsFailing")
        .collect();
    assert_eq!(failing.len(), 1, "{:?}", planned.events);
    assert!(
        failing[0].2.contains("3 jobs dead-lettered") && failing[0].2.contains("exit status: 2")
    );
    let find = |status: &WorkerPoolStatus, type_: &str| {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
            .map(|c| (c.status.clone(), c.reason.clone()))
    };
    assert_eq!(
        find(&planned.status, "JobsFailing"),
        Some(("True".into(), "DeadLettered".into()))
    );
    assert_eq!(
        find(&planned.status, "Ready"),
        Some(("False".into(), "JobsFailing".into())),
        "the Status column shows it"
    );
    // Already said: no second event while it lasts.
    p.status = Some(planned.status.clone());
    let again = plan_for(&p, &seen, &manual(1), None).expect("plan");
    assert!(again.events.iter().all(|(_, r, _)| r != "JobsFailing"));
    // Over: the condition clears and Ready is the workers' again.
    seen.failing = None;
    let over = plan_for(&p, &seen, &manual(1), None).expect("plan");
    assert_eq!(
        find(&over.status, "JobsFailing"),
        Some(("False".into(), "NoDeadLetters".into()))
    );
    assert_eq!(
        find(&over.status, "Ready"),
        Some(("True".into(), "WorkersReady".into()))
    );
    assert_eq!(
        transitions(Some(&planned.status), &over.status),
        vec![
            ("JobsFailing".to_string(), false),
            ("Ready".to_string(), false)
        ]
    );
}

#[tokio::test]
async fn a_rise_of_dead_letters_since_the_last_look_is_failing_with_the_newest_error() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let (ctx, endpoint, _api) = context_on(&redis);
    let q = QueueKeys::new("mail");
    let letter = |error: &str| {
        json!({"reason": "exhausted", "error": error, "attempts": 5, "died_at": 1, "worker": "w", "job": {"id": "j"}}).to_string()
    };
    // Dead letters from before the operator looked are not news.
    let _: () = c.lpush(q.dead(), letter("old")).await.expect("lpush");
    let _: () = c.incr(q.stats_dead(), 1).await.expect("incr");
    assert_eq!(failing_now(&ctx, &endpoint, &q).await, None);
    assert_eq!(failing_now(&ctx, &endpoint, &q).await, None);
    let _: () = c
        .lpush(q.dead(), letter("boom\r\nFAKE"))
        .await
        .expect("lpush");
    let _: () = c.incr(q.stats_dead(), 2).await.expect("incr");
    let failing = failing_now(&ctx, &endpoint, &q).await.expect("failing");
    assert_eq!(failing.count, 2);
    assert!(
        failing.latest.starts_with("exhausted: boom"),
        "{}",
        failing.latest
    );
    assert!(
        !failing.latest.contains('\n'),
        "escaped: {}",
        failing.latest
    );
    // It lasts while no more die, within the window.
    assert_eq!(
        failing_now(&ctx, &endpoint, &q).await.map(|f| f.count),
        Some(2)
    );
}

#[tokio::test]
async fn jobs_that_died_lately_before_the_first_look_are_failing_on_it() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let (ctx, endpoint, _api) = context_on(&redis);
    let q = QueueKeys::new("mail");
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut c).await.expect("TIME");
    let now_ms = secs * 1000 + micros / 1000;
    let letter = |error: &str, died_at: u64| {
        json!({"reason": "exhausted", "error": error, "attempts": 1, "died_at": died_at, "worker": "w", "job": {"id": "j"}}).to_string()
    };
    // An hour ago, then two in the last minute (a new pool whose handler
    // crashed before the operator looked, or a restarted operator).
    for (error, died_at) in [
        ("ancient", now_ms - 3_600_000),
        ("first", now_ms - 60_000),
        ("boom", now_ms - 1_000),
    ] {
        let _: () = c
            .lpush(q.dead(), letter(error, died_at))
            .await
            .expect("lpush");
    }
    let _: () = c.incr(q.stats_dead(), 3).await.expect("incr");
    let failing = failing_now(&ctx, &endpoint, &q)
        .await
        .expect("failing on the first look");
    assert_eq!(failing.count, 2);
    assert!(
        failing.latest.starts_with("exhausted: boom"),
        "{}",
        failing.latest
    );
    // Remembered on the next look, without a rise.
    assert_eq!(
        failing_now(&ctx, &endpoint, &q).await.map(|f| f.count),
        Some(2)
    );
}

/// A context whose API server is never asked (the mock's handle, kept
/// alive by the caller), and the endpoint of `redis`.
fn context_on(redis: &TestRedis) -> (Context, Endpoint, Handle<Request<Body>, Response<Body>>) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let ctx = Context::new(Client::new(service, "default"), Metrics::new(), None);
    let endpoint = Endpoint::new(redis.url(), Tls::default()).expect("url");
    (ctx, endpoint, handle)
}

/// The pool's failing jobs as the next look sees them.
async fn failing_now(ctx: &Context, endpoint: &Endpoint, q: &QueueKeys) -> Option<Failing> {
    let mut conn = ctx.redis_conn(endpoint).await.expect("conn");
    let snap = snapshot::read(&mut conn, std::slice::from_ref(q))
        .await
        .expect("snapshot");
    ctx.failing("jobs/mail", endpoint, &snap).await
}

const BUDGET: &str = "/apis/policy/v1/namespaces/jobs/poddisruptionbudgets/mail";

/// A worker `instance` registered on queue `mail` at the Redis clock, with
/// its heartbeat's activity fields, holding `held` jobs.
async fn worker_on(redis: &TestRedis, instance: &str, held: usize, fields: &[(&str, &str)]) {
    let mut c = redis.conn().await;
    let (secs, _): (u64, u64) = redis::cmd("TIME").query_async(&mut c).await.expect("time");
    let _: () = c
        .zadd("mail:workers", instance, secs * 1000)
        .await
        .expect("zadd");
    let details = format!("mail:worker:{instance}");
    let _: () = c
        .hset(&details, "dead_after_ms", 30_000)
        .await
        .expect("hset");
    for (k, v) in fields {
        let _: () = c.hset(&details, *k, *v).await.expect("hset");
    }
    for n in 0..held {
        let _: () = c
            .lpush(format!("mail:processing:{instance}"), n)
            .await
            .expect("lpush");
    }
}

fn pod_list(pods: &[Value]) -> Value {
    json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": pods})
}

fn pod_named(name: &str, annotations: Value) -> Value {
    json!({"metadata": {"name": name, "namespace": "jobs", "annotations": annotations}})
}

#[tokio::test]
async fn a_busy_pod_is_marked_an_idle_one_unmarked_and_the_budget_applied_owned_by_the_pool() {
    use crate::disruption::{DO_NOT_DISRUPT, PROTECTED_SINCE, SAFE_TO_EVICT};
    let redis = TestRedis::start();
    // mail-a has run its job for 45 s; mail-b, marked earlier, has been idle 2 minutes.
    worker_on(
        &redis,
        "mail-a~1",
        1,
        &[("oldest_job_ms", "45000"), ("idle_ms", "")],
    )
    .await;
    worker_on(
        &redis,
        "mail-b~1",
        0,
        &[("oldest_job_ms", ""), ("idle_ms", "120000")],
    )
    .await;
    let mut spec = fixed(&redis.url(), 2);
    spec["disruption"] =
        json!({"protectBusyPods": true, "protectAfterSeconds": 30, "maxUnavailable": 1});
    let (task, mut api, ctx) = start(pool(spec));

    api.get(DEPLOYMENT, Some(existing_deployment(2, 2))).await;
    let marks = json!({PROTECTED_SINCE: "2026-12-01T00:00:00Z", DO_NOT_DISRUPT: "true", SAFE_TO_EVICT: "false"});
    api.get(
        PODS,
        Some(pod_list(&[
            pod_named("mail-a", json!({})),
            pod_named("mail-b", marks),
        ])),
    )
    .await;
    api.get(BUDGET, None).await;
    api.apply().await;
    let protect = api
        .exchange("PATCH", &format!("{PODS}/mail-a"), StatusCode::OK, |_| {
            pod_named("mail-a", json!({}))
        })
        .await;
    let set = &protect["metadata"]["annotations"];
    assert_eq!(
        (&set[DO_NOT_DISRUPT], &set[SAFE_TO_EVICT]),
        (&json!("true"), &json!("false"))
    );
    assert!(set[PROTECTED_SINCE].is_string(), "{protect}");
    let release = api
        .exchange("PATCH", &format!("{PODS}/mail-b"), StatusCode::OK, |_| {
            pod_named("mail-b", json!({}))
        })
        .await;
    assert_eq!(
        release,
        json!({"metadata": {"annotations": {PROTECTED_SINCE: null, DO_NOT_DISRUPT: null, SAFE_TO_EVICT: null}}})
    );
    let (budget, send) = api.expect("PATCH", BUDGET).await;
    reply(send, StatusCode::OK, &budget);
    assert_eq!(budget["kind"], json!("PodDisruptionBudget"));
    assert_eq!(budget["spec"]["maxUnavailable"], json!(1));
    assert_eq!(
        budget["spec"]["unhealthyPodEvictionPolicy"],
        json!("AlwaysAllow")
    );
    assert_eq!(
        budget["metadata"]["ownerReferences"][0]["uid"],
        json!("u-1")
    );
    let status = api.status().await;
    assert_eq!(status["status"]["protectedPods"], json!(1));
    assert_eq!(status["status"]["disruptionBudget"], json!("mail"));
    api.finish(task).await.expect("reconcile");
    let text = ctx.metrics.render();
    for line in [
        r#"workerpool_pool_protected_pods{namespace="jobs",pool="mail"} 1"#,
        r#"workerpool_pool_protection_patches_total{change="protect",namespace="jobs",pool="mail"} 1"#,
        r#"workerpool_pool_protection_patches_total{change="release",namespace="jobs",pool="mail"} 1"#,
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }
}

#[tokio::test]
async fn with_disruption_removed_the_marks_left_and_the_pools_own_budget_are_removed() {
    use crate::disruption::{DO_NOT_DISRUPT, PROTECTED_SINCE, SAFE_TO_EVICT};
    let redis = TestRedis::start();
    worker_on(
        &redis,
        "mail-a~1",
        1,
        &[("oldest_job_ms", "600000"), ("idle_ms", "")],
    )
    .await;
    let mut p = pool(fixed(&redis.url(), 1));
    p.status = Some(WorkerPoolStatus {
        protected_pods: Some(1),
        disruption_budget: Some("mail".into()),
        ..WorkerPoolStatus::default()
    });
    let (task, mut api, _) = start(p);

    api.get(DEPLOYMENT, Some(existing_deployment(1, 1))).await;
    let marks = json!({PROTECTED_SINCE: "2026-12-01T00:00:00Z", DO_NOT_DISRUPT: "true", SAFE_TO_EVICT: "false"});
    api.get(PODS, Some(pod_list(&[pod_named("mail-a", marks)])))
        .await;
    api.get(
        BUDGET,
        Some(json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                    "metadata": {"name": "mail", "namespace": "jobs",
                                 "ownerReferences": [{"apiVersion": "workerpool.dev/v1alpha1", "kind": "WorkerPool", "name": "mail", "uid": "u-1", "controller": true}]},
                    "spec": {"maxUnavailable": 1}})),
    )
    .await;
    api.apply().await;
    // Busy, but protection is off: released.
    let release = api
        .exchange("PATCH", &format!("{PODS}/mail-a"), StatusCode::OK, |_| {
            pod_named("mail-a", json!({}))
        })
        .await;
    assert_eq!(
        release["metadata"]["annotations"][DO_NOT_DISRUPT],
        Value::Null
    );
    api.exchange(
        "DELETE",
        BUDGET,
        StatusCode::OK,
        |_| json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
    )
    .await;
    let status = api.status().await;
    assert_eq!(status["status"]["protectedPods"], Value::Null);
    assert_eq!(status["status"]["disruptionBudget"], Value::Null);
    api.finish(task).await.expect("reconcile");
}

/// A Deployment of the pool's name made by someone else (`owners`: its
/// owner references), running `replicas` pods.
fn foreign_deployment(owners: Value, replicas: i32) -> Value {
    let mut d = existing_deployment(replicas, replicas);
    d["metadata"]["ownerReferences"] = owners;
    d
}

#[tokio::test]
async fn a_deployment_of_the_pools_name_that_is_not_its_own_is_left_alone_and_said_so() {
    let redis = TestRedis::start();
    push(&redis, "mail", 10).await;
    for owners in [
        Value::Null,
        json!([{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "u-9", "controller": true}]),
    ] {
        let (task, mut api, _) = start(pool(fixed(&redis.url(), 2)));
        api.get(DEPLOYMENT, Some(foreign_deployment(owners.clone(), 3)))
            .await;
        // No apply: the next request is the event.
        let event = api.event().await;
        assert_eq!(event["reason"], json!("DeploymentNotOwned"));
        assert_eq!(event["type"], json!("Warning"));
        let status = api.status().await;
        let ready = condition(&status, "Ready");
        assert_eq!(ready["status"], json!("False"));
        assert_eq!(ready["reason"], json!("DeploymentNotOwned"));
        let message = ready["message"].as_str().expect("message");
        assert!(
            message.contains("Deployment mail exists and is not this pool's"),
            "{message}"
        );
        if owners.is_null() {
            assert!(message.contains("it has no controller"), "{message}");
        } else {
            assert!(
                message.contains("its controller is StatefulSet db"),
                "{message}"
            );
        }
        // Its pods are not the pool's workers.
        assert_eq!(status["status"]["replicas"], json!(0));
        assert_eq!(status["status"]["readyReplicas"], json!(0));
        assert_eq!(status["status"]["lastScaleTime"], Value::Null);
        api.finish(task).await.expect("reconcile");
    }
}

#[tokio::test]
async fn a_budget_of_the_pools_name_that_is_not_its_own_is_left_alone_and_said_so() {
    let redis = TestRedis::start();
    let mut spec = fixed(&redis.url(), 1);
    spec["disruption"] = json!({"maxUnavailable": 1});
    let (task, mut api, _) = start(pool(spec));
    api.get(DEPLOYMENT, Some(existing_deployment(1, 1))).await;
    api.get(
        BUDGET,
        Some(
            json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                    "metadata": {"name": "mail", "namespace": "jobs"},
                    "spec": {"minAvailable": 3}}),
        ),
    )
    .await;
    api.apply().await;
    // No PATCH of the budget.
    let event = api.event().await;
    assert_eq!(event["reason"], json!("DisruptionBudgetNotOwned"));
    let status = api.status().await;
    assert_eq!(
        condition(&status, "Ready")["reason"],
        json!("DisruptionBudgetNotOwned")
    );
    assert_eq!(status["status"]["disruptionBudget"], Value::Null);
    api.finish(task).await.expect("reconcile");
}

#[tokio::test]
async fn a_deployment_the_api_server_refuses_shows_its_message_on_the_pool_once_then_clears() {
    let redis = TestRedis::start();
    let p = || pool(fixed(&redis.url(), 1));
    let invalid = |_: &Value| {
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Invalid", "code": 422,
               "message": "Deployment.apps \"mail\" is invalid: spec.selector: Invalid value: field is immutable"})
    };
    let (task, mut api, ctx) = start(p());
    api.get(DEPLOYMENT, Some(existing_deployment(1, 1))).await;
    api.exchange(
        "PATCH",
        DEPLOYMENT,
        StatusCode::UNPROCESSABLE_ENTITY,
        invalid,
    )
    .await;
    let event = api.event().await;
    assert_eq!(event["reason"], json!("DeploymentRefused"));
    let status = api.status().await;
    let ready = condition(&status, "Ready");
    assert_eq!(ready["status"], json!("False"));
    let message = ready["message"].as_str().expect("message");
    assert!(
        message.contains("the API server refused Deployment jobs/mail (422 Invalid)"),
        "{message}"
    );
    assert!(message.contains("field is immutable"), "{message}");
    let err = task.await.expect("task").expect_err("refused");
    assert_eq!(err.label(), "apply_deployment");

    // Refused again: the pool says so already, so no second event.
    let mut refused = p();
    refused.status = serde_json::from_value(status["status"].clone()).expect("status");
    let task = tokio::spawn(reconcile(Arc::new(refused.clone()), ctx.clone()));
    api.get(DEPLOYMENT, Some(existing_deployment(1, 1))).await;
    api.exchange(
        "PATCH",
        DEPLOYMENT,
        StatusCode::UNPROCESSABLE_ENTITY,
        invalid,
    )
    .await;
    api.status().await;
    let _ = task.await.expect("task").expect_err("refused");

    // Taken: Ready clears.
    let task = tokio::spawn(reconcile(Arc::new(refused), ctx.clone()));
    api.get(DEPLOYMENT, Some(existing_deployment(1, 1))).await;
    api.apply().await;
    let status = api.status().await;
    assert_eq!(condition(&status, "Ready")["reason"], json!("WorkersReady"));
    api.finish(task).await.expect("reconcile");
}

/// A stored WorkerPool object named `name` in `jobs`, as the API server
/// lists it.
fn stored(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "workerpool.dev/v1alpha1", "kind": "WorkerPool",
        "metadata": {"name": name, "namespace": "jobs", "uid": format!("u-{name}"),
                     "resourceVersion": "7", "generation": 2},
        "spec": spec,
    })
}

/// A pool whose `maxReplicas` is past an int32, with its Redis password
/// written inline, as an unbounded CRD let it be stored.
fn too_big() -> Value {
    stored(
        "big",
        json!({"queue": {"redis": {"url": "redis://app:s3cret@redis:6379/0", "key": "big"}},
               "template": template(), "scaling": {"maxReplicas": 2147483648u64}}),
    )
}

const POOLS: &str = "/apis/workerpool.dev/v1alpha1/namespaces/jobs/workerpools";

/// Everything logged while `f` runs, through the operator's own filter.
async fn logged<T>(f: impl std::future::Future<Output = T>) -> (T, String) {
    #[derive(Clone, Default)]
    struct Buffer(Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(crate::run::log_filter(Some("debug")))
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let guard = tracing::subscriber::set_default(subscriber);
    let out = f.await;
    drop(guard);
    let text =
        String::from_utf8_lossy(&buffer.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned();
    (out, text)
}

#[tokio::test]
async fn a_list_with_one_unreadable_pool_still_reconciles_the_good_one() {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, reflector, watcher};

    let redis = TestRedis::start();
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let ctx = Arc::new(Context::new(
        client.clone(),
        Metrics::new(),
        Some("test".into()),
    ));
    let mut api = ApiServer { handle };

    // The controller's list of pools, as run() makes it: the unreadable
    // pool first, then a good one.
    let (store, writer) = reflector::store();
    let pools: kube::Api<Watched> = kube::Api::namespaced(client, "jobs");
    let mut events = watcher(pools, watcher::Config::default())
        .reflect(writer)
        .boxed();
    let listing = tokio::spawn(async move {
        let mut seen = Vec::new();
        loop {
            match events
                .next()
                .await
                .expect("an event")
                .expect("no watch error")
            {
                watcher::Event::InitApply(object) => seen.push(Arc::new(object)),
                watcher::Event::InitDone => return seen,
                _ => {}
            }
        }
    });
    let good = stored("mail", fixed(&redis.url(), 2));
    let (_, send) = api.expect("GET", POOLS).await;
    reply(
        send,
        StatusCode::OK,
        &json!({"apiVersion": "workerpool.dev/v1alpha1", "kind": "WorkerPoolList",
                "metadata": {"resourceVersion": "9"}, "items": [too_big(), good]}),
    );
    let seen = listing.await.expect("listing");
    assert_eq!(store.state().len(), 2, "both objects are in the store");
    let keys: Vec<String> = seen.iter().map(|o| o.key()).collect();
    assert_eq!(keys, ["jobs/big", "jobs/mail"]);

    // The unreadable pool is reported on itself and its Deployment is never
    // touched; the good one gets its Deployment and status.
    let task = tokio::spawn(reconcile_watched(seen[0].clone(), ctx.clone()));
    let event = api
        .exchange("POST", EVENTS, StatusCode::CREATED, Value::clone)
        .await;
    let patch = api
        .exchange(
            "PATCH",
            "/apis/workerpool.dev/v1alpha1/namespaces/jobs/workerpools/big/status",
            StatusCode::OK,
            |_| too_big(),
        )
        .await;
    assert_eq!(
        task.await.expect("task").expect("reported"),
        Action::await_change()
    );
    assert_eq!(event["reason"], json!(POOL_UNREADABLE));
    assert_eq!(event["type"], json!("Warning"));
    assert_eq!(event["regarding"]["name"], json!("big"));
    let ready = condition(&patch, "Ready");
    assert_eq!(ready["status"], json!("False"));
    assert_eq!(ready["reason"], json!(POOL_UNREADABLE));
    assert_eq!(ready["observedGeneration"], json!(2));
    let message = ready["message"].as_str().expect("message");
    assert!(
        message.contains(
            "spec.scaling.maxReplicas: invalid value: integer `2147483648`, expected i32"
        ),
        "{message}"
    );
    assert!(
        message.contains("kubectl edit workerpool big -n jobs"),
        "{message}"
    );

    let task = tokio::spawn(reconcile_watched(seen[1].clone(), ctx.clone()));
    let Round {
        applied, status, ..
    } = api.round(None, 0).await;
    assert_eq!(applied["spec"]["replicas"], json!(2));
    assert_eq!(status["status"]["desiredReplicas"], json!(2));
    task.await.expect("task").expect("reconcile");
    api.done().await;

    let metrics = ctx.metrics.render();
    assert!(
        metrics.contains(r#"workerpool_pool_unreadable{namespace="jobs",pool="big"} 1"#),
        "{metrics}"
    );
    assert!(
        !metrics.contains(r#"workerpool_pool_unreadable{namespace="jobs",pool="mail"}"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn an_unreadable_pool_keeps_its_other_conditions_and_is_announced_once() {
    let mut object = too_big();
    object["status"] = json!({"conditions": [
        {"type": "QueueReachable", "status": "True", "reason": "Connected", "message": "ok",
         "lastTransitionTime": "2026-01-01T00:00:00Z"},
        {"type": "Ready", "status": "True", "reason": "WorkersReady", "message": "2 of 2",
         "lastTransitionTime": "2026-01-01T00:00:00Z"},
    ]});
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let ctx = Arc::new(Context::new(
        Client::new(service, "default"),
        Metrics::new(),
        Some("test".into()),
    ));
    let mut api = ApiServer { handle };
    let task = tokio::spawn(reconcile_watched(
        Arc::new(Watched::read(object.clone())),
        ctx.clone(),
    ));
    api.event().await;
    let patch = api
        .exchange(
            "PATCH",
            "/apis/workerpool.dev/v1alpha1/namespaces/jobs/workerpools/big/status",
            StatusCode::OK,
            |_| too_big(),
        )
        .await;
    task.await.expect("task").expect("reported");
    let conditions = patch["status"]["conditions"]
        .as_array()
        .expect("conditions");
    assert_eq!(conditions.len(), 2, "{patch}");
    assert_eq!(
        condition(&patch, "QueueReachable")["reason"],
        json!("Connected")
    );
    assert_eq!(condition(&patch, "Ready")["reason"], json!(POOL_UNREADABLE));

    // As stored after that patch, the object says it already: a restarted
    // operator neither announces nor writes it again.
    object["status"]["conditions"] = patch["status"]["conditions"].clone();
    let task = tokio::spawn(reconcile_watched(
        Arc::new(Watched::read(object)),
        ctx.clone(),
    ));
    assert_eq!(
        task.await.expect("task").expect("reported"),
        Action::await_change()
    );
    api.done().await;
}

#[tokio::test]
async fn a_list_that_does_not_read_is_logged_without_the_passwords_in_it() {
    let list = json!({"apiVersion": "workerpool.dev/v1alpha1", "kind": "WorkerPoolList",
                      "metadata": {"resourceVersion": "9"}, "items": [too_big()]});
    // As the typed pool the list fails, and kube-client logs the response
    // it could not read, whole; the operator's log filter leaves that out.
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let pools: kube::Api<WorkerPool> =
        kube::Api::namespaced(Client::new(service, "default"), "jobs");
    let mut api = ApiServer { handle };
    let server = async {
        let (_, send) = api.expect("GET", POOLS).await;
        reply(send, StatusCode::OK, &list);
    };
    let params = kube::api::ListParams::default();
    let ((listed, ()), log) = logged(async { futures::join!(pools.list(&params), server) }).await;
    let error = listed.expect_err("a pool past an int32 does not read");
    assert!(error.to_string().contains("2147483648"), "{error}");
    assert!(!log.contains("s3cret"), "{log}");

    // As watched objects the list reads, and the one that does not is
    // reported by namespace, name and field, without its password.
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let ctx = Arc::new(Context::new(
        client.clone(),
        Metrics::new(),
        Some("test".into()),
    ));
    let pools: kube::Api<Watched> = kube::Api::namespaced(client, "jobs");
    let mut api = ApiServer { handle };
    let server = async {
        let (_, send) = api.expect("GET", POOLS).await;
        reply(send, StatusCode::OK, &list);
        api.event().await;
        api.exchange(
            "PATCH",
            "/apis/workerpool.dev/v1alpha1/namespaces/jobs/workerpools/big/status",
            StatusCode::OK,
            |_| too_big(),
        )
        .await;
    };
    let work = async {
        let listed = pools
            .list(&kube::api::ListParams::default())
            .await
            .expect("the list reads");
        for object in listed.items {
            reconcile_watched(Arc::new(object), ctx.clone())
                .await
                .expect("reported");
        }
    };
    let (_, log) = logged(async { futures::join!(work, server) }).await;
    assert!(
        log.contains("cannot read this WorkerPool; it is skipped until it is fixed")
            && log.contains("pool=jobs/big")
            && log.contains("spec.scaling.maxReplicas"),
        "{log}"
    );
    assert!(!log.contains("s3cret"), "{log}");
    api.done().await;
}

/// The engine's verdict for a scaled pool of `desired` pods, held at a knee
/// of `knee` pods when one is given.
fn saturated_verdict(desired: i32, knee: Option<i32>) -> Verdict {
    use crate::scaling::{Decision, Limit, Reason, Rule, Saturation};
    Verdict {
        desired,
        decision: Some(Decision {
            desired,
            reason: Reason {
                rule: Rule::BacklogTarget,
                limit: knee.map(|_| Limit::Saturated),
                consecutive_failures: 0,
                rate_cap: None,
                idle_hold: None,
            },
            recommendation: desired,
            proposals: Default::default(),
            arrival_rate: None,
            per_replica_throughput: None,
            pod_startup_seconds: None,
            saturation: knee.map(|knee| Saturation {
                knee,
                rate: 180.0,
                measured_at: knee + 4,
                marginal: 0.004,
                confirmed_at: 0.0,
                climbing: false,
            }),
        }),
    }
}

#[test]
fn a_pool_held_at_its_knee_says_saturated_once_and_says_when_it_is_no_longer() {
    let mut p = pool(fixed("redis://r", 1));
    let seen = observed(Some(existing_deployment(12, 12)), true);
    let plan = plan_for(&p, &seen, &saturated_verdict(12, Some(12)), None).expect("plan");
    let saturated = planned_condition(&plan.status, "Saturated");
    assert_eq!(
        (saturated.status.as_str(), saturated.reason.as_str()),
        ("True", "AtKnee")
    );
    assert!(
        saturated
            .message
            .starts_with("completions flat at ~180 jobs/s above 12 pods (0.4 % more per pod added"),
        "{}",
        saturated.message
    );
    let reasons = |plan: &Plan| -> Vec<String> {
        plan.events
            .iter()
            .map(|(_, reason, _)| reason.clone())
            .collect()
    };
    assert!(
        reasons(&plan).contains(&"Saturated".to_string()),
        "{:?}",
        plan.events
    );
    assert_eq!(plan.saturation.map(|s| s.knee), Some(12));
    // Still at the knee on the next look: no second event.
    p.status = Some(plan.status.clone());
    let again = plan_for(&p, &seen, &saturated_verdict(12, Some(12)), None).expect("plan");
    assert!(
        !reasons(&again).contains(&"Saturated".to_string()),
        "{:?}",
        again.events
    );
    // No knee any more: the condition turns and one event says so.
    p.status = Some(again.status.clone());
    let free = plan_for(&p, &seen, &saturated_verdict(14, None), None).expect("plan");
    let condition = planned_condition(&free.status, "Saturated");
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        ("False", "NoKnee")
    );
    assert!(
        reasons(&free).contains(&"SaturationEnded".to_string()),
        "{:?}",
        free.events
    );
    assert_eq!(free.saturation, None);
    // A pool of fixed size has no Saturated condition and no event.
    p.status = Some(again.status);
    let fixed = plan_for(&p, &seen, &manual(3), None).expect("plan");
    assert!(
        fixed
            .status
            .conditions
            .iter()
            .all(|c| c.type_ != "Saturated")
    );
    assert!(!reasons(&fixed).contains(&"SaturationEnded".to_string()));
}
