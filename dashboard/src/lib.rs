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

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::RedisResult;
use workerpool_queue::admin;
use workerpool_queue::connection::Connection;
use workerpool_queue::keys::QueueKeys;

use model::{
    DeadRow, JobRow, JobView, ListKind, ListPage, Overview, QueueDetail, QueueSummary, Rows,
};
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

/// How a program serves the dashboard: what [`bind`] is given. The flag
/// names are the caller's, for its messages (`workerpool dashboard` has
/// `--listen` and `--token-file`, the operator `--dashboard` and
/// `--dashboard-token-file`).
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The address to serve on.
    pub listen: SocketAddr,
    /// The flag that gave `listen`.
    pub listen_flag: &'static str,
    /// A file holding the token every request must carry (surrounding
    /// whitespace trimmed; an empty file is refused).
    pub token_file: Option<PathBuf>,
    /// The flag that gave `token_file`.
    pub token_file_flag: &'static str,
    /// No actions (see [`Options::read_only`]).
    pub read_only: bool,
    /// The Redis URL as the header shows it, password already hidden.
    pub redis_label: String,
}

/// Why the dashboard cannot be served as asked.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The token file cannot be used.
    #[error("{flag} {path}: {reason}")]
    TokenFile {
        /// The flag that named it.
        flag: &'static str,
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// The address cannot be bound.
    #[error("{flag} {addr}: {source}")]
    Listen {
        /// The flag that gave it.
        flag: &'static str,
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// The one way a program starts the dashboard: reads the token file, warns
/// on stderr when the address is beyond loopback and no token guards it,
/// and binds. [`Bound::serve`] then serves it.
pub async fn bind(
    options: ServeOptions,
    conn: Connection,
    queues: Vec<QueueKeys>,
) -> Result<Bound, StartError> {
    let token = token_of(&options)?;
    if let Some(warning) = exposure_warning(&options, token.is_some()) {
        // Never a panic for a closed stderr.
        let _ = writeln!(std::io::stderr(), "warning: {warning}");
    }
    let listener = tokio::net::TcpListener::bind(options.listen)
        .await
        .map_err(|source| StartError::Listen {
            flag: options.listen_flag,
            addr: options.listen,
            source,
        })?;
    let addr = listener.local_addr().unwrap_or(options.listen);
    let dashboard = Dashboard::new(
        conn,
        queues,
        Options {
            read_only: options.read_only,
            token,
            redis_label: options.redis_label,
        },
    );
    Ok(Bound {
        dashboard,
        listener,
        addr,
    })
}

/// The token in the token file, surrounding whitespace trimmed.
fn token_of(options: &ServeOptions) -> Result<Option<String>, StartError> {
    let Some(path) = &options.token_file else {
        return Ok(None);
    };
    let fail = |reason: String| StartError::TokenFile {
        flag: options.token_file_flag,
        path: path.display().to_string(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(fail("the file is empty".into()));
    }
    Ok(Some(token.to_string()))
}

/// What to warn of when anyone who can reach the address can use it.
fn exposure_warning(options: &ServeOptions, token: bool) -> Option<String> {
    (!options.listen.ip().is_loopback() && !token).then(|| {
        format!(
            "{} {} is not a loopback address and there is no {}: anyone who can reach it can read the jobs{}",
            options.listen_flag,
            options.listen,
            options.token_file_flag,
            if options.read_only {
                ""
            } else {
                " and retry or purge dead letters"
            }
        )
    })
}

/// A dashboard bound to its address, not serving yet.
#[derive(Debug)]
pub struct Bound {
    dashboard: Dashboard,
    listener: tokio::net::TcpListener,
    addr: SocketAddr,
}

impl Bound {
    /// The address it serves on (the port chosen when 0 was asked).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Shows the operator's pools on top of the overview.
    pub fn with_pools(mut self, pools: Arc<dyn PoolSource>) -> Self {
        self.dashboard = self.dashboard.with_pools(pools);
        self
    }

    /// Serves until `shutdown` resolves (see [`Dashboard::serve`]).
    pub async fn serve(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), Error> {
        self.dashboard.serve(self.listener, shutdown).await
    }
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

    /// Job `id`'s kept outcome, `None` when none is kept (never, or it
    /// expired): one `HGETALL`, and the clock to show its times against.
    async fn job(&self, q: &QueueKeys, id: &str) -> RedisResult<Option<JobView>> {
        let mut conn = self.conn.clone();
        let Some(outcome) = workerpool_queue::outcome::read(&mut conn, q, id).await? else {
            return Ok(None);
        };
        let server_time_ms = admin::server_time_ms(&mut conn).await?;
        // Shown generically, field by field: states and fields the outcome
        // gains show without a change here.
        // (An outcome is strings, numbers and JSON: it always serializes.)
        let outcome = serde_json::to_value(&outcome).unwrap_or_else(
            |e| serde_json::json!({ "id": id, "unshown": format!("cannot be shown: {e}") }),
        );
        Ok(Some(JobView {
            queue: q.name().to_string(),
            id: id.to_string(),
            outcome,
            server_time_ms,
        }))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn options(listen: &str, token_file: Option<PathBuf>, read_only: bool) -> ServeOptions {
        ServeOptions {
            listen: listen.parse().expect("an address"),
            listen_flag: "--listen",
            token_file,
            token_file_flag: "--token-file",
            read_only,
            redis_label: "redis://127.0.0.1:6379".into(),
        }
    }

    #[test]
    fn the_token_file_is_trimmed_and_an_empty_or_missing_one_is_refused_by_its_flag() {
        let dir = std::env::temp_dir().join(format!("workerpool-dashboard-{}", secret()));
        std::fs::create_dir_all(&dir).expect("a directory");
        let file = dir.join("token");
        std::fs::write(&file, "  s3cret \n").expect("write the token");
        let token = token_of(&options("127.0.0.1:0", Some(file.clone()), false));
        assert_eq!(token.expect("read").as_deref(), Some("s3cret"));
        assert_eq!(
            token_of(&options("127.0.0.1:0", None, false)).ok(),
            Some(None)
        );

        std::fs::write(&file, " \n").expect("write an empty token");
        let empty = token_of(&options("127.0.0.1:0", Some(file.clone()), false))
            .expect_err("an empty file is refused")
            .to_string();
        assert!(empty.starts_with("--token-file "), "{empty}");
        assert!(empty.ends_with(": the file is empty"), "{empty}");

        let missing = dir.join("missing");
        let mut o = options("127.0.0.1:0", Some(missing), false);
        o.token_file_flag = "--dashboard-token-file";
        let err = token_of(&o)
            .expect_err("a missing file is refused")
            .to_string();
        assert!(err.starts_with("--dashboard-token-file "), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn only_an_unguarded_address_beyond_loopback_is_warned_of() {
        assert_eq!(
            exposure_warning(&options("127.0.0.1:9090", None, false), false),
            None
        );
        assert_eq!(
            exposure_warning(&options("[::1]:9090", None, false), false),
            None
        );
        assert_eq!(
            exposure_warning(&options("0.0.0.0:9090", None, false), true),
            None
        );
        let open =
            exposure_warning(&options("0.0.0.0:9090", None, false), false).expect("a warning");
        assert!(
            open.starts_with(
                "--listen 0.0.0.0:9090 is not a loopback address and there is no --token-file"
            ),
            "{open}"
        );
        assert!(
            open.ends_with("read the jobs and retry or purge dead letters"),
            "{open}"
        );
        let read_only =
            exposure_warning(&options("10.0.0.1:9090", None, true), false).expect("a warning");
        assert!(read_only.ends_with("read the jobs"), "{read_only}");
    }
}
