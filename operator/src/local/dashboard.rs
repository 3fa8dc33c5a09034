//! `--dashboard ADDR` of `workerpool-operator local` and `run`: the web
//! dashboard of workerpool-dashboard with the pools on top. Local mode
//! shows its one pool and its queues; `run` shows every WorkerPool it can
//! see (from a watch of its own, so a standby replica serves it too) and
//! the queues named by `--dashboard-queue` on `--dashboard-redis-url`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, ResourceExt};
use workerpool_dashboard::{PoolRow, PoolSource, ServeOptions};
use workerpool_queue::connection::{Connection, Endpoint, Tls, redact};
use workerpool_queue::keys::QueueKeys;

use crate::crd::WorkerPool;
use crate::watched::Watched;

/// The dashboard's flags, the same for `local` and `run`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct DashboardArgs {
    /// Serve the web dashboard (queues, workers, retries, dead letters, the
    /// pools) on this address, for example 127.0.0.1:9090. Off without it.
    #[arg(long, value_name = "ADDR")]
    pub dashboard: Option<SocketAddr>,
    /// No actions on the dashboard: dead letters cannot be retried or purged.
    #[arg(long, env = "WORKERPOOL_DASHBOARD_READ_ONLY")]
    pub dashboard_read_only: bool,
    /// File holding a token every dashboard request must carry
    /// (Authorization: Bearer TOKEN, or ?token=TOKEN once in a browser).
    #[arg(long, env = "WORKERPOOL_DASHBOARD_TOKEN_FILE", value_name = "FILE")]
    pub dashboard_token_file: Option<PathBuf>,
}

/// What `run` adds: the Redis and queues to show, since its pools may use
/// several Redis servers (and URLs from Secrets).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ClusterDashboardArgs {
    /// The dashboard's settings.
    #[command(flatten)]
    pub common: DashboardArgs,
    /// The Redis whose queues the dashboard shows (needed with --dashboard).
    #[arg(long, env = "WORKERPOOL_DASHBOARD_REDIS_URL", value_name = "URL")]
    pub dashboard_redis_url: Option<String>,
    /// A queue to show; repeat for several (the environment variable takes
    /// a comma-separated list).
    #[arg(
        long,
        env = "WORKERPOOL_DASHBOARD_QUEUE",
        value_name = "NAME",
        value_delimiter = ','
    )]
    pub dashboard_queue: Vec<String>,
}

impl DashboardArgs {
    /// Binds the address and serves the dashboard in the background until
    /// the process ends; the address it serves on. `Ok(None)` without
    /// `--dashboard`.
    pub async fn start(
        &self,
        conn: Connection,
        queues: Vec<QueueKeys>,
        redis_label: String,
        pools: Arc<dyn PoolSource>,
    ) -> Result<Option<SocketAddr>, String> {
        let Some(listen) = self.dashboard else {
            return Ok(None);
        };
        let options = ServeOptions {
            listen,
            listen_flag: "--dashboard",
            token_file: self.dashboard_token_file.clone(),
            token_file_flag: "--dashboard-token-file",
            read_only: self.dashboard_read_only,
            redis_label,
        };
        let bound = workerpool_dashboard::bind(options, conn, queues)
            .await
            .map_err(|e| e.to_string())?
            .with_pools(pools);
        let addr = bound.addr();
        tokio::spawn(async move {
            if let Err(e) = bound.serve(std::future::pending()).await {
                tracing::error!(error = %e, "the dashboard stopped");
            }
        });
        Ok(Some(addr))
    }
}

/// Local mode's one pool, updated by its loop.
#[derive(Debug, Default)]
pub struct LocalPool {
    row: Mutex<PoolRow>,
}

impl LocalPool {
    /// The row of `pool` before any decision.
    pub fn new(pool: &WorkerPool) -> Self {
        Self {
            row: Mutex::new(PoolRow {
                desired: None,
                ready: None,
                reason: None,
                ..row_of_spec(pool)
            }),
        }
    }

    /// Records the last decision and the workers ready.
    pub fn update(&self, desired: i32, ready: i32, reason: String) {
        let mut row = self
            .row
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        row.desired = Some(desired);
        row.ready = Some(ready);
        row.reason = Some(reason);
    }
}

impl PoolSource for LocalPool {
    fn pools(&self) -> Vec<PoolRow> {
        vec![
            self.row
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
        ]
    }
}

/// What the pool's spec says (no status).
fn row_of_spec(pool: &WorkerPool) -> PoolRow {
    let scaling = pool.spec.scaling.as_ref();
    PoolRow {
        namespace: pool.namespace().unwrap_or_default(),
        name: pool.name_any(),
        queues: pool.spec.queue.redis.queue_names(),
        fixed_replicas: pool.spec.replicas,
        min_replicas: scaling.map(|s| s.min_replicas),
        max_replicas: scaling.map(|s| s.max_replicas),
        desired: None,
        ready: None,
        reason: None,
    }
}

/// A pool as its status shows it: the controller's last decision.
pub fn row_of(pool: &WorkerPool) -> PoolRow {
    let status = pool.status.as_ref();
    PoolRow {
        desired: status.map(|s| s.desired_replicas),
        ready: status.map(|s| s.ready_replicas),
        reason: status.and_then(|s| s.reason.clone()),
        ..row_of_spec(pool)
    }
}

/// The WorkerPools of a watch, as the cluster has them; one that does not
/// read is left out (the controller reports it on the pool).
struct ClusterPools(reflector::Store<Watched>);

impl PoolSource for ClusterPools {
    fn pools(&self) -> Vec<PoolRow> {
        let mut rows: Vec<PoolRow> = self
            .0
            .state()
            .iter()
            .filter_map(|object| match object.as_ref() {
                Watched::Pool(pool) => Some(row_of(pool)),
                Watched::Unreadable(_) => None,
            })
            .collect();
        rows.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        rows
    }
}

impl ClusterDashboardArgs {
    /// For `run`: with `--dashboard`, watches the WorkerPools (all
    /// namespaces, or `namespace`) and serves the dashboard. A Redis that
    /// cannot be reached is logged and the dashboard is left off, so that
    /// it never keeps the controller from running.
    pub async fn spawn(&self, client: Client, namespace: Option<&str>) -> anyhow::Result<()> {
        if self.common.dashboard.is_none() {
            return Ok(());
        }
        let Some(url) = &self.dashboard_redis_url else {
            anyhow::bail!(
                "--dashboard needs --dashboard-redis-url (the Redis whose queues it shows) and --dashboard-queue"
            );
        };
        if self.dashboard_queue.is_empty() {
            anyhow::bail!("--dashboard needs --dashboard-queue NAME (repeat for several)");
        }
        let endpoint = Endpoint::new(url.clone(), Tls::default())?;
        let shown = redact(url);
        // Watched, not WorkerPool: one object that does not read must not
        // fail the list of all.
        let api: Api<Watched> = match namespace {
            Some(ns) => Api::namespaced(client, ns),
            None => Api::all(client),
        };
        let (store, writer) = reflector::store();
        tokio::spawn(
            reflector(writer, watcher(api, watcher::Config::default()))
                .default_backoff()
                .touched_objects()
                .for_each(|_| std::future::ready(())),
        );
        let common = self.common.clone();
        let queues: Vec<QueueKeys> = self.dashboard_queue.iter().map(QueueKeys::new).collect();
        let conn = match endpoint
            .connect(
                std::time::Duration::from_secs(3),
                std::time::Duration::from_secs(10),
            )
            .await
        {
            Ok(conn) => conn,
            Err(e) => {
                tracing::error!(redis = %shown, error = %e, "the dashboard cannot reach Redis; it is off");
                return Ok(());
            }
        };
        let pools: Arc<dyn PoolSource> = Arc::new(ClusterPools(store));
        match common.start(conn, queues, shown, pools).await {
            Ok(Some(bound)) => tracing::info!(%bound, "dashboard"),
            Ok(None) => {}
            Err(e) => anyhow::bail!(e),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_row_carries_the_spec_and_the_last_decision() {
        let pool: WorkerPool = serde_yaml_ng::from_str(
            r#"
apiVersion: workerpool.dev/v1alpha1
kind: WorkerPool
metadata: {name: mail, namespace: prod}
spec:
  queue: {redis: {url: "redis://r:6379", keys: ["{mail}:high", "{mail}:low"]}}
  template: {spec: {containers: [{name: worker, image: w}]}}
  scaling: {minReplicas: 1, maxReplicas: 9}
status:
  replicas: 3
  readyReplicas: 2
  desiredReplicas: 4
  reason: BacklogTarget
  backlog: 10
  inFlight: 2
  selector: ""
"#,
        )
        .expect("a WorkerPool");
        let row = row_of(&pool);
        assert_eq!(
            (row.namespace.as_str(), row.name.as_str()),
            ("prod", "mail")
        );
        assert_eq!(row.queues, vec!["{mail}:high", "{mail}:low"]);
        assert_eq!((row.min_replicas, row.max_replicas), (Some(1), Some(9)));
        assert_eq!((row.desired, row.ready), (Some(4), Some(2)));
        assert_eq!(row.reason.as_deref(), Some("BacklogTarget"));

        let local = LocalPool::new(&pool);
        assert_eq!(local.pools()[0].desired, None);
        local.update(5, 3, "MaxReplicas: at the limit".into());
        assert_eq!(local.pools()[0].desired, Some(5));
        assert_eq!(
            local.pools()[0].reason.as_deref(),
            Some("MaxReplicas: at the limit")
        );
    }
}
