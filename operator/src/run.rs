//! `workerpool-operator run`: the controller in a cluster, behind leader
//! election, with `/healthz`, `/readyz` and `/metrics`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context as _;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use kube::runtime::{Controller, WatchStreamExt, predicates, reflector, watcher};
use kube::{Api, Client};

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
    metrics: Metrics,
}

/// The operator's HTTP endpoints. `/readyz` is 200 once this replica is
/// leading and its controller runs, or is a healthy standby.
fn app(probe: Probe) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(|State(p): State<Probe>| async move {
                if p.ready.load(Ordering::Relaxed) {
                    (StatusCode::OK, "ok\n")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "starting\n")
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

/// Runs the operator until SIGTERM, or fails when leadership is lost (the
/// pod restarts and campaigns again, the usual controller practice).
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let client = Client::try_default()
        .await
        .context("no Kubernetes configuration (in-cluster or kubeconfig)")?;
    let metrics = Metrics::new();
    let ready = Arc::new(AtomicBool::new(false));
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on --listen {}", args.listen))?;
    let probe = Probe {
        ready: ready.clone(),
        metrics: metrics.clone(),
    };
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app(probe)).await {
            tracing::error!(error = %e, "http server failed");
        }
    });
    args.dashboard
        .spawn(client.clone(), args.namespace.as_deref())
        .await?;

    let identity = args
        .identity
        .clone()
        .unwrap_or_else(workerpool_queue::keys::host_name);
    let mut leadership = None;
    let mut lease_task = None;
    if !args.no_leader_election {
        let manager =
            kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &args.lease_name)
                .with_namespace(&args.lease_namespace)
                .with_identity(&identity)
                .build()
                .await
                .context("cannot set up leader election")?;
        let (mut rx, task) = manager.watch().await;
        lease_task = Some(task);
        ready.store(true, Ordering::Relaxed);
        tracing::info!(lease = %args.lease_name, identity = %identity, "waiting for leadership");
        while !*rx.borrow_and_update() {
            rx.changed().await.context("leader election stopped")?;
        }
        tracing::info!("leading");
        leadership = Some(rx);
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
    let ctx = Arc::new(Context::new(client, metrics, Some(identity)));
    ready.store(true, Ordering::Relaxed);
    // A pool is looked at again every pollIntervalSeconds (the requeue),
    // when its spec changes, and when its Deployment changes; not when its
    // status does. The status is this controller's own output and moves on
    // every look (rates, ages), so a trigger on it would start the next
    // look at once, and again after that: a loop of back-to-back reconciles
    // and status writes for as long as the pool lives.
    let stop = workerpool_settings::stop_signal();
    let (store, writer) = reflector::store();
    let pools = watcher(pools, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .applied_objects()
        .predicate_filter(predicates::generation, Default::default());
    let controller = Controller::for_stream(pools, store)
        .owns(
            deployments,
            watcher::Config::default().labels("app.kubernetes.io/managed-by=workerpool-operator"),
        )
        // The four signals every workerpool process stops on, where
        // `shutdown_on_signal` knows only SIGINT and SIGTERM.
        .graceful_shutdown_on(async move {
            let signal = stop.await;
            tracing::info!(signal, "stopping: no new reconcile starts");
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
    match leadership {
        Some(mut rx) => {
            let outcome = tokio::select! {
                _ = controller => Ok(()),
                lost = async { while rx.changed().await.is_ok() { if !*rx.borrow() { break; } } } => {
                    let () = lost;
                    Err(anyhow::anyhow!("lost leadership of the Lease; exiting so that one leader runs"))
                }
            };
            // Hand the Lease over now rather than let it expire: with the
            // channel closed the lease manager releases it, so a standby
            // (or the replacement Pod) leads within seconds instead of
            // after the Lease duration.
            drop(rx);
            if let Some(task) = lease_task {
                match tokio::time::timeout(std::time::Duration::from_secs(5), task).await {
                    Ok(Ok(Ok(_))) => tracing::info!("released the Lease"),
                    Ok(Ok(Err(e))) => tracing::warn!(error = %e, "cannot release the Lease"),
                    Ok(Err(e)) => tracing::warn!(error = %e, "the lease task failed"),
                    Err(_) => tracing::warn!("releasing the Lease took too long"),
                }
            }
            outcome
        }
        None => {
            controller.await;
            Ok(())
        }
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
}
