//! The workerpool dashboard: a web UI of queues, workers, retries and dead
//! letters, and the JSON it is drawn from. `workerpool dashboard` serves it
//! for the queues it is given; `workerpool-operator run|local --dashboard`
//! serves it with the pools on top.
//!
//! - [`model`]: what is shown, as plain data;
//! - [`html`]: the pages, pure functions of that data, everything escaped;
//! - [`history`]: the last hour of each queue, sampled in the background;
//! - the server: the routes, the token, the actions (through the same
//!   workerpool-queue functions as `workerpool dead retry|purge`).
//!
//! Queues are read only through workerpool-queue, a page at a time: a
//! list of a million jobs costs one `LRANGE` of one page.

pub mod history;
pub mod html;
pub mod model;
mod server;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::RedisResult;
use workerpool_queue::admin;
use workerpool_queue::connection::Connection;
use workerpool_queue::keys::QueueKeys;

use model::{DeadRow, JobRow, ListKind, ListPage, Overview, QueueDetail, QueueSummary, Rows};
pub use model::{PoolRow, PoolSource};

/// Rows of a list page.
pub const PER_PAGE: u64 = 50;
/// Rows of each list on a queue's page.
const PREVIEW_ROWS: u64 = 10;
/// The most rows the JSON API gives per page.
const MAX_PER_PAGE: u64 = 500;
/// How often the background task samples the queues for the chart.
pub const DEFAULT_SAMPLE_INTERVAL: Duration = Duration::from_secs(5);

/// How the dashboard behaves.
#[derive(Clone, Default)]
pub struct Options {
    /// No actions: the forms are not shown and every POST is refused (403).
    pub read_only: bool,
    /// When set, every request needs it (see `docs/dashboard.md`).
    pub token: Option<String>,
    /// The Redis URL as the header shows it, password already hidden
    /// (`workerpool_queue::connection::redact`).
    pub redis_label: String,
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("read_only", &self.read_only)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("redis_label", &self.redis_label)
            .finish()
    }
}

/// Why the dashboard stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Serving HTTP failed.
    #[error("serving the dashboard: {0}")]
    Serve(#[source] std::io::Error),
}

/// The dashboard of a set of queues. Cheap to clone.
#[derive(Clone)]
pub struct Dashboard {
    state: State,
}

impl std::fmt::Debug for Dashboard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dashboard")
            .field("queues", &self.state.queues)
            .field("options", &self.state.options)
            .field("pools", &self.state.pools.is_some())
            .finish()
    }
}

#[derive(Clone)]
struct State {
    conn: Connection,
    queues: Vec<QueueKeys>,
    options: Options,
    /// Sent back by the action forms, so that another site cannot post
    /// them through the browser.
    csrf: String,
    /// The cookie value a `?token=` login sets, instead of the token itself.
    session: String,
    history: Arc<Mutex<history::History>>,
    /// What the last look found wrong with Redis's eviction policy (the
    /// banner on every page), by queue.
    redis_warning: Arc<Mutex<Option<String>>>,
    pools: Option<Arc<dyn PoolSource>>,
    sample_every: Duration,
    /// Only `localhost`-style Host headers (on a loopback listener, against
    /// DNS rebinding).
    loopback_hosts_only: bool,
}

impl Dashboard {
    /// A dashboard of `queues` read over `conn`.
    pub fn new(conn: Connection, queues: Vec<QueueKeys>, options: Options) -> Self {
        Self {
            state: State {
                conn,
                queues,
                options,
                csrf: secret(),
                session: secret(),
                history: Arc::new(Mutex::new(history::History::new(
                    DEFAULT_SAMPLE_INTERVAL.as_millis() as u64,
                ))),
                redis_warning: Arc::new(Mutex::new(None)),
                pools: None,
                sample_every: DEFAULT_SAMPLE_INTERVAL,
                loopback_hosts_only: false,
            },
        }
    }

    /// Shows the operator's pools on top of the overview.
    pub fn with_pools(mut self, pools: Arc<dyn PoolSource>) -> Self {
        self.state.pools = Some(pools);
        self
    }

    /// Samples for the chart this often instead of every 5 s.
    pub fn with_sample_interval(mut self, every: Duration) -> Self {
        let every = every.max(Duration::from_millis(100));
        self.state.sample_every = every;
        self.state.history = Arc::new(Mutex::new(history::History::new(every.as_millis() as u64)));
        self
    }

    /// The routes, without the background sampling (see [`Dashboard::serve`]
    /// and [`Dashboard::sample`]).
    pub fn router(&self) -> axum::Router {
        server::router(Arc::new(self.state.clone()))
    }

    /// Takes one sample of every queue for the chart.
    pub async fn sample(&self) -> RedisResult<()> {
        self.state.sample().await
    }

    /// Serves on `listener` until `shutdown` resolves, sampling the queues
    /// in the background meanwhile. On a loopback listener only requests
    /// for `localhost`, `127.0.0.1` or `[::1]` are answered, so a web page
    /// cannot reach it through a DNS name of its own.
    pub async fn serve(
        mut self,
        listener: tokio::net::TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), Error> {
        self.state.loopback_hosts_only = listener
            .local_addr()
            .map(|a| a.ip().is_loopback())
            .unwrap_or(true);
        let sampler = tokio::spawn(self.state.clone().sample_forever());
        let app = self.router();
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(Error::Serve);
        sampler.abort();
        served
    }
}

/// 128 random bits as hex.
fn secret() -> String {
    format!("{:032x}", rand::random::<u128>())
}

impl State {
    fn queue(&self, name: &str) -> Option<&QueueKeys> {
        self.queues.iter().find(|q| q.name() == name)
    }

    fn history(&self) -> std::sync::MutexGuard<'_, history::History> {
        // A panic while holding it leaves plain data behind: keep using it.
        self.history
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn sample_forever(self) {
        let mut tick = tokio::time::interval(self.sample_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tick.tick().await;
            match self.sample().await {
                Ok(()) if failing => {
                    tracing::info!("dashboard: reading the queues again");
                    failing = false;
                }
                Ok(()) => {}
                Err(e) if !failing => {
                    tracing::warn!(error = %e, "dashboard: cannot read the queues for the chart");
                    failing = true;
                }
                Err(_) => {}
            }
        }
    }

    async fn sample(&self) -> RedisResult<()> {
        for q in &self.queues {
            self.summary(q).await?;
        }
        self.check_memory().await;
        Ok(())
    }

    /// Reads the eviction policy of the Redis of each queue and keeps the
    /// first warning for the banner (none when every one is `noeviction`).
    async fn check_memory(&self) -> Option<String> {
        let mut warning = None;
        for q in &self.queues {
            let mut conn = self.conn.clone();
            let memory = workerpool_queue::memory::read(&mut conn, q)
                .await
                .unwrap_or_default();
            if let Some(w) = memory.warning() {
                warning = Some(w);
                break;
            }
        }
        *self.redis_warning.lock().unwrap_or_else(|e| e.into_inner()) = warning.clone();
        warning
    }

    /// The banner's text as last read.
    fn redis_warning(&self) -> Option<String> {
        self.redis_warning
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// One queue's counts (one round trip), recorded in the history, with
    /// the rates of the history: a page shows the read its chart ends with.
    async fn summary(&self, q: &QueueKeys) -> RedisResult<(QueueSummary, u64)> {
        let mut conn = self.conn.clone();
        // One queue per read: queues of different hash tags live on
        // different nodes of a cluster.
        let counts = workerpool_queue::snapshot::counts(&mut conn, q).await?;
        let now = counts.taken_at_ms;
        let mut s = QueueSummary::new(q.name(), counts);
        let mut history = self.history();
        history.record(&s, now);
        (s.processed_per_second, s.failed_per_second) = history.rates(q.name());
        Ok((s, now))
    }

    async fn overview(&self) -> RedisResult<Overview> {
        let mut queues = Vec::with_capacity(self.queues.len());
        let mut server_time_ms = 0;
        for q in &self.queues {
            let (s, now) = self.summary(q).await?;
            server_time_ms = now;
            queues.push(s);
        }
        let history = {
            let h = self.history();
            self.queues.iter().map(|q| h.series(q.name())).collect()
        };
        let redis_warning = self.check_memory().await;
        Ok(Overview {
            redis: self.options.redis_label.clone(),
            redis_warning,
            read_only: self.options.read_only,
            server_time_ms,
            pools: self.pools.as_ref().map(|p| p.pools()).unwrap_or_default(),
            queues,
            history,
        })
    }

    async fn detail(&self, q: &QueueKeys) -> RedisResult<QueueDetail> {
        let (summary, now) = self.summary(q).await?;
        let mut conn = self.conn.clone();
        let workers = admin::workers(&mut conn, q, now).await?;
        let mut lists = Vec::with_capacity(ListKind::ALL.len());
        for kind in ListKind::ALL {
            lists.push(self.page(q, &summary, kind, 1, PREVIEW_ROWS).await?);
        }
        let history = self.history().series(q.name());
        Ok(QueueDetail {
            summary,
            server_time_ms: now,
            workers,
            lists,
            history,
        })
    }

    async fn list(
        &self,
        q: &QueueKeys,
        kind: ListKind,
        page: u64,
        per_page: u64,
    ) -> RedisResult<(ListPage, u64)> {
        let (summary, now) = self.summary(q).await?;
        let page = self.page(q, &summary, kind, page, per_page).await?;
        Ok((page, now))
    }

    /// Page `page` (from 1, clamped to the last) of one list; the total
    /// comes from `summary`, the rows from one range read.
    async fn page(
        &self,
        q: &QueueKeys,
        summary: &QueueSummary,
        kind: ListKind,
        page: u64,
        per_page: u64,
    ) -> RedisResult<ListPage> {
        let per_page = per_page.clamp(1, MAX_PER_PAGE);
        let total = match kind {
            ListKind::Waiting => summary.counts.waiting,
            ListKind::Scheduled => summary.counts.scheduled,
            ListKind::Retries => summary.counts.retries_due + summary.counts.retries_scheduled,
            ListKind::Dead => summary.counts.dead,
        };
        let pages = total.div_ceil(per_page).max(1);
        let page = page.clamp(1, pages);
        let offset = (page - 1) * per_page;
        let mut conn = self.conn.clone();
        let items = match kind {
            ListKind::Waiting => Rows::Jobs(
                admin::waiting_page(&mut conn, q, offset, per_page)
                    .await?
                    .iter()
                    .map(|raw| JobRow::from_raw(raw, None))
                    .collect(),
            ),
            ListKind::Scheduled | ListKind::Retries => {
                let key = if kind == ListKind::Scheduled {
                    q.scheduled()
                } else {
                    q.retry()
                };
                Rows::Jobs(
                    admin::due_page(&mut conn, &key, offset, per_page)
                        .await?
                        .iter()
                        .map(|(raw, due)| JobRow::from_raw(raw, Some(*due)))
                        .collect(),
                )
            }
            ListKind::Dead => Rows::Dead(
                admin::dead_page(&mut conn, q, offset, per_page)
                    .await?
                    .iter()
                    .map(DeadRow::from_entry)
                    .collect(),
            ),
        };
        Ok(ListPage {
            queue: q.name().to_string(),
            kind,
            total,
            page,
            per_page,
            items,
        })
    }
}
