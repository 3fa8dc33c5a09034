//! `workerpool-operator run` as a process, against a stand-in API server
//! written here: whatever state it is in (leading with pools it may not
//! list, leading with pools it lists, waiting for another replica's Lease,
//! without any API server), a stop signal ends it with exit 0 within a few
//! seconds, and a leader hands its Lease over on the way out. A Deployment's
//! operator Pod that ignored SIGTERM would be killed at the end of its grace
//! period with its Lease still held, so that no replica leads until it
//! expires.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use rustix::process::Signal;
use serde_json::{Value, json};
use workerpool_tests::{eventually, free_port};

const NAMESPACE: &str = "ops";
const LEASE: &str = "workerpool-operator";
const IDENTITY: &str = "operator-0";
/// How soon after a stop signal the operator must be gone.
const STOPS_WITHIN: Duration = Duration::from_secs(5);

/// What the stand-in API server answers for anything but the Lease.
#[derive(Clone, Copy, Debug)]
enum Pools {
    /// 403 Forbidden, as to a ServiceAccount without the ClusterRole.
    Forbidden,
    /// An empty list, and a watch that stays open with nothing to say.
    Listable,
}

/// The stand-in API server's state: the one Lease, and every request seen.
#[derive(Debug, Default)]
struct Cluster {
    lease: Option<Value>,
    requests: Vec<String>,
}

#[derive(Clone, Debug)]
struct FakeApi {
    pools: Pools,
    cluster: Arc<Mutex<Cluster>>,
}

impl FakeApi {
    fn cluster(&self) -> std::sync::MutexGuard<'_, Cluster> {
        self.cluster.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn saw(&self, path_start: &str) -> bool {
        self.cluster().requests.iter().any(|r| {
            r.split_once(' ')
                .is_some_and(|(_, p)| p.starts_with(path_start))
        })
    }

    fn lease_holder(&self) -> Option<String> {
        self.cluster()
            .lease
            .as_ref()
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_string))
    }
}

fn status(code: StatusCode, reason: &str, message: &str) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": message, "reason": reason,
            "code": code.as_u16(),
        })
        .to_string(),
    )
        .into_response()
}

fn object(code: StatusCode, value: &Value) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response()
}

/// The Lease as the API server keeps it: a create stores it, a patch (the
/// lease manager's server-side apply and strategic merges touch only
/// `spec`'s own fields) sets each field of the patch's `spec` and removes
/// those it gives as null.
fn lease(api: &FakeApi, method: &Method, path: &str, body: &Bytes) -> Response {
    let base = format!("/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases");
    let named = format!("{base}/{LEASE}");
    let sent: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let mut cluster = api.cluster();
    if *method == Method::GET && path == named {
        return match &cluster.lease {
            Some(lease) => object(StatusCode::OK, lease),
            None => status(StatusCode::NOT_FOUND, "NotFound", "leases not found"),
        };
    }
    if *method == Method::POST && path == base {
        let mut lease = sent;
        lease["metadata"]["namespace"] = json!(NAMESPACE);
        lease["metadata"]["resourceVersion"] = json!("1");
        cluster.lease = Some(lease.clone());
        return object(StatusCode::CREATED, &lease);
    }
    if *method != Method::PATCH || path != named {
        return status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "not served",
        );
    }
    let Some(lease) = cluster.lease.as_mut() else {
        return status(StatusCode::NOT_FOUND, "NotFound", "leases not found");
    };
    if !lease["spec"].is_object() {
        lease["spec"] = json!({});
    }
    if let (Some(fields), Some(spec)) = (sent["spec"].as_object(), lease["spec"].as_object_mut()) {
        for (field, value) in fields {
            if value.is_null() {
                spec.remove(field);
            } else {
                spec.insert(field.clone(), value.clone());
            }
        }
    }
    object(StatusCode::OK, lease)
}

async fn serve(State(api): State<FakeApi>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, 1 << 20)
        .await
        .unwrap_or_default();
    let path = parts.uri.path().to_string();
    let query = parts.uri.query().unwrap_or_default().to_string();
    api.cluster()
        .requests
        .push(format!("{} {path}?{query}", parts.method));
    if path.starts_with("/apis/coordination.k8s.io/") {
        return lease(&api, &parts.method, &path, &body);
    }
    match api.pools {
        Pools::Forbidden => status(
            StatusCode::FORBIDDEN,
            "Forbidden",
            &format!(
                "{path} is forbidden: User \"system:serviceaccount:{NAMESPACE}:workerpool-operator\" cannot list it"
            ),
        ),
        Pools::Listable if query.contains("watch=true") => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            Body::from_stream(futures::stream::pending::<Result<Bytes, std::io::Error>>()),
        )
            .into_response(),
        Pools::Listable => object(
            StatusCode::OK,
            &json!({
                "apiVersion": "v1", "kind": "List",
                "metadata": {"resourceVersion": "1"}, "items": [],
            }),
        ),
    }
}

/// Starts the stand-in API server on a free port, with `lease` as the
/// Lease it holds at first (none: the operator creates it).
async fn fake_api(pools: Pools, lease: Option<Value>) -> (FakeApi, SocketAddr) {
    let api = FakeApi {
        pools,
        cluster: Arc::new(Mutex::new(Cluster {
            lease,
            requests: Vec::new(),
        })),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the stand-in API server");
    let addr = listener.local_addr().expect("its address");
    let app = Router::new().fallback(serve).with_state(api.clone());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (api, addr)
}

/// The operator process; killed if a test ends while it still runs.
struct Operator {
    child: Child,
    port: u16,
    log: tempfile::NamedTempFile,
    _kubeconfig: tempfile::NamedTempFile,
}

impl Operator {
    /// `workerpool-operator run` with a kubeconfig naming `server`.
    fn start(server: &str, extra: &[&str]) -> Self {
        let mut kubeconfig = tempfile::NamedTempFile::new().expect("kubeconfig file");
        std::io::Write::write_all(
            &mut kubeconfig,
            format!(
                r#"apiVersion: v1
kind: Config
clusters: [{{name: stand-in, cluster: {{server: "{server}"}}}}]
users: [{{name: operator, user: {{token: not-a-secret}}}}]
contexts: [{{name: stand-in, context: {{cluster: stand-in, user: operator, namespace: {NAMESPACE}}}}}]
current-context: stand-in
"#
            )
            .as_bytes(),
        )
        .expect("write the kubeconfig");
        let log = tempfile::NamedTempFile::new().expect("log file");
        let port = free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_workerpool-operator"))
            .arg("run")
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--lease-namespace", NAMESPACE, "--identity", IDENTITY])
            .args(extra)
            .env("KUBECONFIG", kubeconfig.path())
            .env("RUST_LOG", "info")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("KUBERNETES_SERVICE_PORT")
            .env_remove("POD_NAMESPACE")
            .env_remove("POD_NAME")
            .env_remove("WORKERPOOL_OPERATOR_NAMESPACE")
            .env_remove("WORKERPOOL_OPERATOR_LISTEN")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log.reopen().expect("the log file again"))
            .spawn()
            .expect("start workerpool-operator run");
        Self {
            child,
            port,
            log,
            _kubeconfig: kubeconfig,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    /// Waits until `/healthz` answers, so that the process is up.
    async fn wait_healthy(&self) {
        let port = self.port;
        eventually(Duration::from_secs(30), "the operator's /healthz", || {
            let up = workerpool_tests::http_get(port, "/healthz").is_some_and(|(s, _)| s == 200);
            async move { up.then_some(()) }
        })
        .await;
    }

    /// Sends `signal` and waits for the process to exit: its status, or a
    /// failure naming what it logged when it outlives [`STOPS_WITHIN`].
    async fn stop(&mut self, signal: Signal) -> std::process::ExitStatus {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).expect("a pid");
        rustix::process::kill_process(pid, signal).expect("signal the operator");
        let deadline = Instant::now() + STOPS_WITHIN;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for the operator") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "{signal:?}: still running {STOPS_WITHIN:?} later; its log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn exits_0(status: std::process::ExitStatus, operator: &Operator, what: &str) {
    assert!(
        status.success(),
        "{what}: exit 0, not {status:?}; its log:\n{}",
        operator.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_may_not_list_workerpools_exits_0_on_each_stop_signal_and_hands_its_lease_over()
 {
    for signal in [Signal::TERM, Signal::INT, Signal::HUP, Signal::QUIT] {
        let (api, addr) = fake_api(Pools::Forbidden, None).await;
        let mut operator = Operator::start(&format!("http://{addr}"), &[]);
        eventually(
            Duration::from_secs(30),
            "the leader's refused list of WorkerPools",
            || {
                let tried = api.lease_holder().as_deref() == Some(IDENTITY)
                    && api.saw("/apis/workerpool.dev/");
                async move { tried.then_some(()) }
            },
        )
        .await;
        // A few of the watcher's retries, each refused.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let status = operator.stop(signal).await;
        exits_0(status, &operator, &format!("{signal:?}"));
        assert_eq!(
            api.lease_holder(),
            None,
            "{signal:?}: the Lease is released; log:\n{}",
            operator.log()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_lists_its_workerpools_exits_0_on_sigterm_and_hands_its_lease_over() {
    let (api, addr) = fake_api(Pools::Listable, None).await;
    let mut operator = Operator::start(&format!("http://{addr}"), &[]);
    eventually(
        Duration::from_secs(30),
        "the leader's watch of WorkerPools",
        || {
            let watching = api.lease_holder().as_deref() == Some(IDENTITY)
                && api
                    .cluster()
                    .requests
                    .iter()
                    .any(|r| r.contains("/apis/workerpool.dev/") && r.contains("watch=true"));
            async move { watching.then_some(()) }
        },
    )
    .await;
    let status = operator.stop(Signal::TERM).await;
    exits_0(status, &operator, "SIGTERM");
    assert_eq!(api.lease_holder(), None, "log:\n{}", operator.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_waiting_for_another_replicas_lease_exits_0_on_sigterm() {
    let now = jiff::Timestamp::now();
    let held = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": LEASE, "namespace": NAMESPACE, "resourceVersion": "1"},
        "spec": {
            "holderIdentity": "operator-1",
            "acquireTime": now.to_string(), "renewTime": now.to_string(),
            "leaseDurationSeconds": 3600,
        },
    });
    let (api, addr) = fake_api(Pools::Forbidden, Some(held)).await;
    let mut operator = Operator::start(&format!("http://{addr}"), &[]);
    operator.wait_healthy().await;
    let port = operator.port;
    eventually(Duration::from_secs(30), "a ready standby", || {
        let ready = workerpool_tests::http_get(port, "/readyz").is_some_and(|(s, _)| s == 200);
        async move { ready.then_some(()) }
    })
    .await;
    let status = operator.stop(Signal::TERM).await;
    exits_0(status, &operator, "SIGTERM");
    assert!(
        !api.saw("/apis/workerpool.dev/"),
        "a standby does not list the pools"
    );
    assert_eq!(api.lease_holder().as_deref(), Some("operator-1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_whose_api_server_refuses_connections_exits_0_on_sigterm() {
    // Nothing listens there: every list is refused by the network.
    let closed = free_port();
    let mut operator = Operator::start(
        &format!("http://127.0.0.1:{closed}"),
        &["--no-leader-election"],
    );
    operator.wait_healthy().await;
    let port = operator.port;
    eventually(Duration::from_secs(30), "the controller started", || {
        let ready = workerpool_tests::http_get(port, "/readyz").is_some_and(|(s, _)| s == 200);
        async move { ready.then_some(()) }
    })
    .await;
    // A few of the watcher's retries, each refused.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let status = operator.stop(Signal::TERM).await;
    exits_0(status, &operator, "SIGTERM");
    assert!(operator.log().contains("stopping"), "{}", operator.log());
}
