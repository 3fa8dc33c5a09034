//! `workerpool-operator run`: the controller in a cluster, behind leader
//! election, with `/healthz`, `/readyz` and `/metrics`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use futures::{FutureExt as _, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use kube::runtime::{Controller, WatchStreamExt, predicates, reflector, watcher};
use kube::{Api, Client, ResourceExt as _};

use crate::controller::{self, Context};
use crate::metrics::Metrics;
use crate::watched::Watched;

/// Settings of `workerpool-operator run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Address for /healthz, /readyz and /metrics.
    #[arg(
        long,
        env = "WORKERPOOL_OPERATOR_LISTEN",
        default_value = "0.0.0.0:8080"
    )]
    pub listen: SocketAddr,
    /// Watch WorkerPools in this namespace only (default: all namespaces).
    #[arg(long, env = "WORKERPOOL_OPERATOR_NAMESPACE")]
    pub namespace: Option<String>,
    /// Run without leader election (only when exactly one operator runs).
    #[arg(long)]
    pub no_leader_election: bool,
    /// Name of the coordination.k8s.io Lease used for leader election.
    #[arg(long, default_value = "workerpool-operator")]
    pub lease_name: String,
    /// Namespace of the Lease (default: the pod's namespace, from POD_NAMESPACE).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,
    /// This replica's identity in the Lease (default: the pod name, from POD_NAME).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// The web dashboard (off unless --dashboard is given).
    #[command(flatten)]
    pub dashboard: crate::local::dashboard::ClusterDashboardArgs,
}

#[derive(Clone)]
struct Probe {
    ready: Arc<AtomicBool>,
    watch: WatchHealth,
    metrics: Metrics,
}

/// How long the WorkerPools' list and watch may keep failing before
/// `/readyz` says so: a dropped watch, or a list the API server times out
/// once, recovers within a few steps of the watcher's backoff; a list it
/// refuses (RBAC, a CRD not installed) does not, and no pool is looked at.
const WATCH_FAILING_FOR: Duration = Duration::from_secs(60);

/// Whether the WorkerPools can be listed and watched: since when the
/// attempts fail without a break, and the last error.
#[derive(Clone, Debug, Default)]
struct WatchHealth(Arc<Mutex<Option<(Instant, String)>>>);

impl WatchHealth {
    /// Takes in one item of the watch: an object or the end of a list ends
    /// a failure, an error starts one or goes on with it. `Init` ends
    /// nothing: the watcher sends it before each attempt to list, the ones
    /// that fail too.
    fn saw<K>(&self, item: &Result<watcher::Event<K>, watcher::Error>) {
        let mut failing = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match (item, failing.as_mut()) {
            (Ok(watcher::Event::Init), _) => {}
            (Ok(_), _) => *failing = None,
            (Err(e), Some((_, last))) => *last = e.to_string(),
            (Err(e), None) => *failing = Some((Instant::now(), e.to_string())),
        }
    }

    /// What `/readyz` says at `now` when the watch has failed for
    /// [`WATCH_FAILING_FOR`] or longer.
    fn problem(&self, now: Instant) -> Option<String> {
        let failing = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (since, error) = failing.as_ref()?;
        let failed_for = now.saturating_duration_since(*since);
        (failed_for >= WATCH_FAILING_FOR).then(|| {
            format!(
                "cannot list or watch WorkerPools for {} s: {error}\n",
                failed_for.as_secs()
            )
        })
    }
}

/// The operator's HTTP endpoints. `/readyz` is 200 once this replica is
/// leading and its controller runs, or is a healthy standby; 503 while its
/// WorkerPools cannot be listed or watched (one pool that does not read is
/// no failure of the watch: it is skipped and reported on itself).
fn app(probe: Probe) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(|State(p): State<Probe>| async move {
                if !p.ready.load(Ordering::Relaxed) {
                    return (StatusCode::SERVICE_UNAVAILABLE, "starting\n".to_string());
                }
                match p.watch.problem(Instant::now()) {
                    Some(problem) => (StatusCode::SERVICE_UNAVAILABLE, problem),
                    None => (StatusCode::OK, "ok\n".to_string()),
                }
            }),
        )
        .route(
            "/metrics",
            get(|State(p): State<Probe>| async move {
                (
                    [(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)],
                    p.metrics.render(),
                )
                    .into_response()
            }),
        )
        .with_state(probe)
}

/// The operator's log filter: `RUST_LOG` (`info` when unset or unreadable),
/// with kube-client's own warnings about a response it cannot read left
/// out whatever it asks. kube-client logs such a response whole (a list of
/// WorkerPools, Redis URLs and their passwords included); the error itself
/// reaches the code that made the request, which logs it without the body.
pub fn log_filter(rust_log: Option<&str>) -> tracing_subscriber::EnvFilter {
    let filter = rust_log
        .and_then(|directives| tracing_subscriber::EnvFilter::try_new(directives).ok())
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new("info"));
    match "kube_client::client=error".parse() {
        Ok(quiet) => filter.add_directive(quiet),
        Err(_) => filter,
    }
}

/// How long the reconciles running at a stop signal get to finish before
/// the operator exits anyway: well within a Pod's default grace period of
/// 30 s, with room left for handing the Lease over.
const DRAIN_FOR: Duration = Duration::from_secs(10);

/// How long handing the Lease over may take on the way out (an API server
/// that does not answer must not keep the process).
const RELEASE_FOR: Duration = Duration::from_secs(5);

/// Runs the operator until SIGTERM (or SIGINT, SIGHUP, SIGQUIT: see
/// [`workerpool_settings::stop_signal`]), then exits with `Ok` in whatever
/// state it is: starting, standing by for the Lease, or leading, with its
/// pools listed or not. Fails when leadership is lost (the pod restarts and
/// campaigns again, the usual controller practice).
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    // Installed before anything that may wait (an API server slow to
    // answer, a standby waiting for the Lease): a signal in any phase must
    // end the process with 0, not by its default action.
    let stop = workerpool_settings::stop_signal().shared();
    let client = Client::try_default()
        .await
        .context("no Kubernetes configuration (in-cluster or kubeconfig)")?;
    let metrics = Metrics::new();
    let ready = Arc::new(AtomicBool::new(false));
    let watch = WatchHealth::default();
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on --listen {}", args.listen))?;
    let probe = Probe {
        ready: ready.clone(),
        watch: watch.clone(),
        metrics: metrics.clone(),
    };
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app(probe)).await {
            tracing::error!(error = %e, "http server failed");
        }
    });
    let dashboard = args
        .dashboard
        .spawn(client.clone(), args.namespace.as_deref());
    let Some(dashboard) = unless_stopped(&stop, dashboard).await else {
        return Ok(());
    };
    dashboard?;

    let identity = args
        .identity
        .clone()
        .unwrap_or_else(workerpool_queue::keys::host_name);
    let mut leadership = None;
    if !args.no_leader_election {
        let manager =
            kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &args.lease_name)
                .with_namespace(&args.lease_namespace)
                .with_identity(&identity)
                .build();
        let Some(manager) = unless_stopped(&stop, manager).await else {
            return Ok(());
        };
        let manager = manager.context("cannot set up leader election")?;
        let (mut rx, task) = manager.watch().await;
        ready.store(true, Ordering::Relaxed);
        tracing::info!(lease = %args.lease_name, identity = %identity, "waiting for leadership");
        let campaign = async {
            while !*rx.borrow_and_update() {
                rx.changed().await?;
            }
            Ok::<(), tokio::sync::watch::error::RecvError>(())
        };
        let led = unless_stopped(&stop, campaign).await;
        match led {
            None => {
                hand_over(rx, task, false).await;
                return Ok(());
            }
            Some(led) => led.context("leader election stopped")?,
        }
        tracing::info!("leading");
        leadership = Some((rx, task));
    }

    // Watched, not WorkerPool: one object that does not read must not fail
    // the list of all (see crate::watched).
    let (pools, deployments): (Api<Watched>, Api<Deployment>) = match &args.namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    // The pools' Deployments, kept by the watch that also triggers a look
    // when one changes: a look reads its pool's from here, not from the API
    // server (a GET per pool per poll interval: 200 a second at 1,000
    // pools). The watch sees only the operator's (its label); a look that
    // finds none there asks the API server, which also shows a Deployment
    // of the pool's name that is someone else's.
    let (deployment_store, deployment_writer) = reflector::store();
    let (label, value) = crate::deployment::MANAGED_BY;
    let deployments = watcher(
        deployments,
        watcher::Config::default().labels(&format!("{label}={value}")),
    )
    .default_backoff()
    // A look needs a Deployment's metadata, replica count and status: the
    // rest (its managed fields, the pod template) is not kept.
    .modify(|d| {
        d.managed_fields_mut().clear();
        if let Some(spec) = d.spec.as_mut() {
            spec.template = Default::default();
        }
    })
    .reflect(deployment_writer)
    .touched_objects();
    let ctx =
        Arc::new(Context::new(client, metrics, Some(identity)).with_deployments(deployment_store));
    ready.store(true, Ordering::Relaxed);
    // A pool is looked at again every pollIntervalSeconds (the requeue),
    // when its spec changes, and when its Deployment changes; not when its
    // status does. The status is this controller's own output and moves on
    // every look (rates, ages), so a trigger on it would start the next
    // look at once, and again after that: a loop of back-to-back reconciles
    // and status writes for as long as the pool lives.
    let (store, writer) = reflector::store();
    let listed = store.clone();
    let pools = watcher(pools, watcher::Config::default())
        .default_backoff()
        .inspect(move |item| watch.saw(item))
        .reflect(writer)
        .applied_objects()
        .predicate_filter(predicates::generation, Default::default());
    let shutdown = stop.clone();
    let controller = Controller::for_stream(pools, store)
        .owns_stream(deployments)
        // The four signals every workerpool process stops on, where
        // `shutdown_on_signal` knows only SIGINT and SIGTERM.
        .graceful_shutdown_on(async move {
            shutdown.await;
        })
        .run(
            controller::reconcile_watched,
            controller::error_policy_watched,
            ctx.clone(),
        )
        .for_each(|result| {
            let ctx = ctx.clone();
            async move {
                match result {
                    // A deleted pool: its Deployment goes with it (owner
                    // reference); drop its engine state.
                    Err(kube::runtime::controller::Error::ObjectNotFound(pool)) => {
                        let ns = pool.namespace.unwrap_or_default();
                        ctx.forget(&format!("{ns}/{}", pool.name));
                    }
                    // A failed reconcile is logged by the error policy; a
                    // failing watch or queue is not, and stops every pool.
                    Err(kube::runtime::controller::Error::ReconcilerFailed(..)) => {}
                    Err(e) => tracing::warn!(error = %e, "the controller's watch failed"),
                    Ok(_) => {}
                }
            }
        });
    let controller = until_drained(controller, stop, listed);
    match leadership {
        Some((mut rx, task)) => {
            let outcome = tokio::select! {
                () = controller => Ok(()),
                lost = async { while rx.changed().await.is_ok() { if !*rx.borrow() { break; } } } => {
                    let () = lost;
                    Err(anyhow::anyhow!("lost leadership of the Lease; exiting so that one leader runs"))
                }
            };
            hand_over(rx, task, true).await;
            outcome
        }
        None => {
            controller.await;
            Ok(())
        }
    }
}

/// Awaits `work` unless a stop signal comes first: `None` then, once the
/// signal is logged.
async fn unless_stopped<T>(
    stop: &(impl Future<Output = &'static str> + Clone),
    work: impl Future<Output = T>,
) -> Option<T> {
    tokio::select! {
        biased;
        signal = stop.clone() => {
            tracing::info!(signal, "stopping");
            None
        }
        done = work => Some(done),
    }
}

/// Runs `controller` until it ends by itself, or after `stop` until the
/// reconciles it runs have finished, for at most [`DRAIN_FOR`].
///
/// Not until kube-runtime's controller ends whatever happens: before its
/// pools' store is first filled it holds every reconcile, and past a
/// graceful shutdown it waits for that store rather than noticing that its
/// input ended. When the pools were never listed (forbidden by RBAC, the
/// CRD missing, no API server) the shutdown has stopped the watcher that
/// would have filled it, so it would wait forever; it has no reconcile to
/// finish either, so the operator stops at once.
async fn until_drained(
    controller: impl Future<Output = ()>,
    stop: impl Future<Output = &'static str>,
    listed: reflector::Store<Watched>,
) {
    tokio::pin!(controller);
    tokio::select! {
        () = &mut controller => return,
        signal = stop => tracing::info!(signal, "stopping: no new reconcile starts"),
    }
    if !matches!(listed.wait_until_ready().now_or_never(), Some(Ok(()))) {
        tracing::info!("the WorkerPools were never listed: no reconcile to wait for");
        return;
    }
    if tokio::time::timeout(DRAIN_FOR, controller).await.is_err() {
        tracing::warn!(
            after_s = DRAIN_FOR.as_secs(),
            "reconciles still running; stopping without them"
        );
    }
}

/// Hands the Lease over: with the channel closed the lease manager
/// releases it when this replica holds it, so that a standby (or the
/// replacement Pod) leads within seconds instead of after the Lease's
/// duration.
async fn hand_over<T, E: std::fmt::Display>(
    rx: tokio::sync::watch::Receiver<bool>,
    task: tokio::task::JoinHandle<Result<T, E>>,
    leading: bool,
) {
    drop(rx);
    match tokio::time::timeout(RELEASE_FOR, task).await {
        Ok(Ok(Ok(_))) if leading => tracing::info!("released the Lease"),
        Ok(Ok(Ok(_))) => {}
        Ok(Ok(Err(e))) => tracing::warn!(error = %e, "cannot release the Lease"),
        Ok(Err(e)) => tracing::warn!(error = %e, "the lease task failed"),
        Err(_) => tracing::warn!("releasing the Lease took too long"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    async fn get(app: &Router, path: &str) -> (StatusCode, String) {
        let response = app
            .clone()
            .oneshot(Request::get(path).body(Body::empty()).expect("request"))
            .await
            .expect("infallible");
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .expect("body");
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn readyz_waits_for_the_controller_and_metrics_render_reconciles() {
        let probe = Probe {
            ready: Arc::new(AtomicBool::new(false)),
            watch: WatchHealth::default(),
            metrics: Metrics::new(),
        };
        let app = app(probe.clone());
        assert_eq!(get(&app, "/healthz").await.0, StatusCode::OK);
        assert_eq!(
            get(&app, "/readyz").await,
            (StatusCode::SERVICE_UNAVAILABLE, "starting\n".into())
        );
        probe.ready.store(true, Ordering::Relaxed);
        assert_eq!(get(&app, "/readyz").await.0, StatusCode::OK);
        probe
            .metrics
            .observe_reconcile(std::time::Duration::from_millis(3), None);
        let (_, body) = get(&app, "/metrics").await;
        assert!(
            body.contains(r#"workerpool_operator_reconciles_total{result="ok"} 1"#),
            "{body}"
        );
    }

    #[tokio::test]
    async fn readyz_says_so_when_the_pools_cannot_be_listed_for_a_minute() {
        let probe = Probe {
            ready: Arc::new(AtomicBool::new(true)),
            watch: WatchHealth::default(),
            metrics: Metrics::new(),
        };
        let app = app(probe.clone());
        let refused = || -> Result<watcher::Event<Watched>, watcher::Error> {
            Err(watcher::Error::InitialListFailed(kube::Error::Api(
                Box::new(
                    kube::core::Status::failure(
                        "workerpools.workerpool.dev is forbidden",
                        "Forbidden",
                    )
                    .with_code(403),
                ),
            )))
        };
        probe.watch.saw(&refused());
        // A failure just begun is the watcher's to retry: still ready.
        assert_eq!(get(&app, "/readyz").await.0, StatusCode::OK);
        probe.watch.saw(&refused());
        let later = Instant::now() + WATCH_FAILING_FOR;
        let problem = probe.watch.problem(later).expect("failing for a minute");
        assert!(
            problem.starts_with(
                "cannot list or watch WorkerPools for 60 s: failed to perform initial object list"
            ),
            "{problem}"
        );
        assert!(problem.contains("forbidden"), "{problem}");
        // The start of another attempt to list ends nothing; its end does.
        probe.watch.saw(&Ok(watcher::Event::<Watched>::Init));
        assert!(probe.watch.problem(later).is_some());
        probe.watch.saw(&Ok(watcher::Event::<Watched>::InitDone));
        assert_eq!(probe.watch.problem(later), None);
        assert_eq!(get(&app, "/readyz").await.0, StatusCode::OK);
    }

    #[tokio::test]
    async fn readyz_is_503_with_the_watch_error_while_the_pools_cannot_be_listed() {
        let watch = WatchHealth::default();
        // Failing since well before now.
        *watch.0.lock().expect("lock") = Some((
            Instant::now() - WATCH_FAILING_FOR - Duration::from_secs(5),
            "failed to perform initial object list: forbidden".into(),
        ));
        let app = app(Probe {
            ready: Arc::new(AtomicBool::new(true)),
            watch,
            metrics: Metrics::new(),
        });
        let (status, body) = get(&app, "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("cannot list or watch WorkerPools for 65 s: failed to perform initial object list: forbidden"), "{body}");
    }
}
