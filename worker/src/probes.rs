//! `/healthz`, `/readyz` and `/metrics`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::metrics::Metrics;

/// What the probes report, updated by the runtime's loops.
#[derive(Debug)]
pub struct Health {
    started: Instant,
    stall_after: Duration,
    last_tick_ms: AtomicU64,
    fetching: AtomicBool,
    registered: AtomicBool,
    redis_ok: AtomicBool,
    /// Why the last Redis operation failed, for `/readyz`.
    redis_problem: std::sync::Mutex<Option<String>>,
    /// A Redis operation the ACL refuses, until that operation succeeds:
    /// other operations succeeding meanwhile do not make the worker ready.
    redis_refused: std::sync::Mutex<Option<String>>,
    /// Why the handler cannot run jobs (a command that cannot start, or
    /// dies before answering, again and again), for `/readyz`.
    handler_problem: std::sync::Mutex<Option<String>>,
    draining: AtomicBool,
}

impl Health {
    /// Health of a worker whose maintenance loop ticks every `interval`;
    /// it counts as stalled after three missed ticks.
    pub fn new(interval: Duration) -> Self {
        Self {
            started: Instant::now(),
            stall_after: (interval * 3).max(Duration::from_secs(10)),
            last_tick_ms: AtomicU64::new(0),
            fetching: AtomicBool::new(true),
            registered: AtomicBool::new(false),
            redis_ok: AtomicBool::new(false),
            redis_problem: std::sync::Mutex::new(None),
            redis_refused: std::sync::Mutex::new(None),
            handler_problem: std::sync::Mutex::new(None),
            draining: AtomicBool::new(false),
        }
    }

    /// The maintenance loop is alive.
    pub fn tick(&self) {
        let ms = self.started.elapsed().as_millis() as u64;
        self.last_tick_ms.store(ms, Ordering::Relaxed);
    }

    /// The fetch loop ended (it only does when draining or on a bug).
    pub fn fetch_loop_ended(&self) {
        self.fetching.store(false, Ordering::Relaxed);
    }

    /// The worker is in the registry and has returned its leftovers.
    pub fn set_registered(&self) {
        self.registered.store(true, Ordering::Relaxed);
    }

    /// The last Redis operation succeeded (`true`) or failed. Returns the
    /// previous state.
    pub fn set_redis_ok(&self, ok: bool) -> bool {
        self.redis_ok.swap(ok, Ordering::Relaxed)
    }

    /// The last Redis operation failed, for the reason given (what `/readyz`
    /// says).
    pub fn set_redis_failed(&self, why: String) {
        *self.redis_problem.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
        self.set_redis_ok(false);
    }

    /// An operation the Redis ACL refuses (`Some(why)`: the worker is not
    /// ready whatever else succeeds), or none any more (`None`).
    pub fn set_redis_refused(&self, why: Option<String>) {
        *self.redis_refused.lock().unwrap_or_else(|e| e.into_inner()) = why;
    }

    /// The handler cannot run jobs (`Some(why)`), or can again (`None`).
    pub fn set_handler_problem(&self, why: Option<String>) {
        *self
            .handler_problem
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = why;
    }

    /// Shutdown has begun.
    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// Whether the process's loops are alive; `Err` says which is not.
    pub fn live(&self) -> Result<(), &'static str> {
        let since_tick = self.started.elapsed().saturating_sub(Duration::from_millis(
            self.last_tick_ms.load(Ordering::Relaxed),
        ));
        if since_tick > self.stall_after {
            return Err("maintenance loop stalled");
        }
        if !self.fetching.load(Ordering::Relaxed) && !self.draining.load(Ordering::Relaxed) {
            return Err("fetch loop ended");
        }
        Ok(())
    }

    /// Whether the worker should get traffic; `Err` says why not.
    pub fn ready(&self) -> Result<(), String> {
        if self.draining.load(Ordering::Relaxed) {
            return Err("draining".into());
        }
        if let Some(refused) = self
            .redis_refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            return Err(refused);
        }
        if !self.redis_ok.load(Ordering::Relaxed) {
            let problem = self
                .redis_problem
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            return Err(problem.unwrap_or_else(|| "redis unreachable".into()));
        }
        if let Some(problem) = self
            .handler_problem
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            return Err(format!("handler: {problem}"));
        }
        if !self.registered.load(Ordering::Relaxed) {
            return Err("starting".into());
        }
        Ok(())
    }
}

#[derive(Clone)]
struct AppState {
    health: Arc<Health>,
    metrics: Metrics,
}

/// The router serving the three endpoints.
pub fn app(health: Arc<Health>, metrics: Metrics) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(AppState { health, metrics })
}

fn probe<E: std::fmt::Display>(result: Result<(), E>) -> (StatusCode, String) {
    match result {
        Ok(()) => (StatusCode::OK, "ok\n".into()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

async fn healthz(State(s): State<AppState>) -> impl IntoResponse {
    probe(s.health.live())
}

async fn readyz(State(s): State<AppState>) -> impl IntoResponse {
    probe(s.health.ready())
}

async fn metrics_text(State(s): State<AppState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)],
        s.metrics.render(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    async fn get(app: &Router, path: &str) -> (StatusCode, String) {
        let response = app
            .clone()
            .oneshot(Request::get(path).body(Body::empty()).expect("request"))
            .await
            .expect("infallible");
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn readyz_turns_ready_once_registered_with_redis_up_and_unready_when_draining() {
        let health = Arc::new(Health::new(Duration::from_secs(5)));
        let app = app(health.clone(), Metrics::new());
        assert_eq!(
            get(&app, "/readyz").await,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "redis unreachable\n".into()
            )
        );
        health.set_redis_ok(true);
        assert_eq!(get(&app, "/readyz").await.1, "starting\n");
        health.set_registered();
        assert_eq!(get(&app, "/readyz").await, (StatusCode::OK, "ok\n".into()));
        health.set_redis_ok(false);
        assert_eq!(
            get(&app, "/readyz").await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        health.set_redis_ok(true);
        health.set_draining();
        assert_eq!(
            get(&app, "/readyz").await,
            (StatusCode::SERVICE_UNAVAILABLE, "draining\n".into())
        );
    }

    #[tokio::test]
    async fn healthz_does_not_depend_on_redis_but_on_the_loops() {
        let health = Arc::new(Health::new(Duration::from_secs(5)));
        let app = app(health.clone(), Metrics::new());
        health.tick();
        assert_eq!(
            get(&app, "/healthz").await.0,
            StatusCode::OK,
            "redis down is not a liveness failure"
        );
        health.fetch_loop_ended();
        assert_eq!(
            get(&app, "/healthz").await,
            (StatusCode::SERVICE_UNAVAILABLE, "fetch loop ended\n".into())
        );
    }

    #[tokio::test]
    async fn metrics_are_served_in_the_prometheus_text_format() {
        let metrics = Metrics::new();
        metrics.jobs.with_label_values(&["q", "done"]).inc_by(3);
        metrics.in_flight.with_label_values(&["q"]).set(2);
        let app = app(Arc::new(Health::new(Duration::from_secs(5))), metrics);
        let (status, body) = get(&app, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(
            body.contains("workerpool_jobs_total{outcome=\"done\",queue=\"q\"} 3"),
            "{body}"
        );
        assert!(
            body.contains("# TYPE workerpool_jobs_in_flight gauge"),
            "{body}"
        );
        assert!(
            body.contains("workerpool_jobs_in_flight{queue=\"q\"} 2"),
            "{body}"
        );
    }
}
