//! `workerpool-operator local` end to end: real `workerpool-worker`
//! processes, a real Redis, the scaling engine in between.
//!
//! The tests run local mode with `--plain` and read its `key=value` lines,
//! so they see what a user sees: the pool's size, the engine's reason, and
//! the notes about started, stopped and restarted workers.

use std::process::Stdio;
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use rustix::process::{Pid, Signal, kill_process};
use workerpool_queue::keys::QueueKeys;
use workerpool_tests::sentinel::Auth;
use workerpool_tests::{
    Local, TestRedis, TestRedisCluster, TestRedisSentinel, TestTlsRedis, collect_lines, eventually,
    free_port, http_get, local_command,
};

/// A handler that takes `seconds` per job.
fn handler(seconds: &str) -> String {
    format!(
        r#"["--", "sh", "-c", "while IFS= read -r job; do sleep {seconds}; echo '{{\"ok\":true}}'; done"]"#
    )
}

/// A manifest for queue `key`; `size` is `replicas: N` or a `scaling:` block,
/// `args` the worker container's args as a YAML flow list.
fn manifest(key: &str, size: &str, args: &str, concurrency: u32, grace: u32) -> String {
    format!(
        r#"apiVersion: workerpool.dev/v1alpha1
kind: WorkerPool
metadata: {{name: {key}}}
spec:
  queue: {{redis: {{url: "redis://127.0.0.1:1/0", key: {key}}}}}
  template:
    spec:
      containers:
      - name: worker
        image: ghcr.io/workerpool-dev/workerpool-worker:0.1.0
        args: {args}
  worker: {{concurrency: {concurrency}, maxAttempts: 5, jobTimeoutSeconds: 30}}
  {size}
  shutdown: {{gracePeriodSeconds: {grace}}}
"#
    )
}

/// The directory holding `workerpool-operator` and `workerpool-worker`: the
/// one this test executable was built into (`<target>/<profile>/deps/..`),
/// building them there when they are missing.
async fn push(
    conn: &mut (impl redis::aio::ConnectionLike + Send + Sync),
    queue: &str,
    from: u32,
    to: u32,
) {
    let jobs: Vec<String> = (from..=to)
        .map(|n| format!(r#"{{"task":"t","data":{{"n":{n}}}}}"#))
        .collect();
    let _: i64 = conn.lpush(queue, jobs).await.expect("push jobs");
}

async fn count(
    conn: &mut (impl redis::aio::ConnectionLike + Send + Sync),
    q: &QueueKeys,
) -> (u64, u64, u64) {
    let done: Option<u64> = conn.get(q.stats_processed()).await.expect("processed");
    let waiting: u64 = conn.llen(q.waiting()).await.expect("waiting");
    let dead: u64 = conn.llen(q.dead()).await.expect("dead");
    (done.unwrap_or(0), waiting, dead)
}

/// Jobs in every processing list of the queue.
async fn held(conn: &mut (impl redis::aio::ConnectionLike + Send + Sync), q: &QueueKeys) -> u64 {
    let keys: Vec<String> = conn
        .keys(format!("{}*", q.processing("")))
        .await
        .expect("processing keys");
    let mut n = 0;
    for key in keys {
        let len: u64 = conn.llen(&key).await.expect("llen");
        n += len;
    }
    n
}

#[tokio::test(flavor = "multi_thread")]
async fn a_burst_scales_the_pool_up_to_max_replicas_and_back_to_zero_when_idle() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let q = QueueKeys::new("burst");
    let scaling = "scaling: {minReplicas: 0, maxReplicas: 3, pollIntervalSeconds: 1, \
        targetBacklogPerReplica: 10, idleSecondsBeforeZero: 2, \
        behavior: {scaleDown: {stabilizationWindowSeconds: 1}}}";
    let local = Local::start(&redis, &manifest("burst", scaling, &handler("0.02"), 2, 5));
    eventually(Duration::from_secs(20), "the pool idle at zero", || async {
        local
            .last_status()
            .contains("reason=BelowActivation")
            .then_some(())
    })
    .await;

    push(&mut conn, q.name(), 1, 300).await;
    eventually(Duration::from_secs(90), "every job done", || {
        let mut conn = conn.clone();
        let q = q.clone();
        async move { (count(&mut conn, &q).await == (300, 0, 0)).then_some(()) }
    })
    .await;
    eventually(Duration::from_secs(30), "the pool back at zero", || async {
        let last = local.last_status();
        (last.contains("running=0") && last.contains("draining=0") && last.contains("desired=0"))
            .then_some(())
    })
    .await;

    let running = local.values("running");
    assert_eq!(running.iter().max(), Some(&3), "{}", local.report());
    assert!(
        local.values("desired").iter().all(|d| *d <= 3),
        "never above maxReplicas: {}",
        local.report()
    );
    assert!(
        local
            .lines()
            .iter()
            .any(|l| l.contains("reason=MaxReplicas")),
        "300 jobs at 10 per replica ask for more than 3: {}",
        local.report()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_to_the_pool_mid_run_leaves_every_job_done_or_back_in_the_queue() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let q = QueueKeys::new("stop");
    // Jobs take 3 s and the grace period is 2 s: jobs running at SIGTERM
    // cannot finish and must go back to the queue.
    let mut local = Local::start(
        &redis,
        &manifest("stop", "replicas: 2", &handler("3"), 3, 2),
    );
    push(&mut conn, q.name(), 1, 20).await;
    eventually(Duration::from_secs(30), "both workers busy", || {
        let mut conn = conn.clone();
        let q = q.clone();
        async move { (held(&mut conn, &q).await == 6).then_some(()) }
    })
    .await;

    local.signal(Signal::TERM);
    assert!(
        local.wait(Duration::from_secs(20)),
        "exit 0: {}",
        local.report()
    );
    let (done, waiting, dead) = count(&mut conn, &q).await;
    assert_eq!(
        held(&mut conn, &q).await,
        0,
        "no job left in a processing list"
    );
    assert_eq!(dead, 0);
    assert_eq!(done + waiting, 20, "done {done} + waiting {waiting}");
    assert!(waiting >= 14, "the unfinished jobs are back: {waiting}");
    assert!(
        local.lines().iter().any(|l| l.starts_with("summary:")),
        "{}",
        local.report()
    );
}

/// The `workerpool-worker` processes whose parent is `pid`.
fn workers_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in entries.flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`; comm is cut at 15 bytes.
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let (state, ppid) = (fields.next(), fields.next());
        if head.ends_with("(workerpool-work")
            && state != Some("Z")
            && ppid == Some(pid.to_string().as_str())
        {
            out.push(child);
        }
    }
    out
}

/// Whether `pid` is a live `workerpool-worker` (not gone, not a zombie).
fn worker_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')').is_some_and(|(head, rest)| {
            head.ends_with("(workerpool-work") && !rest.trim_start().starts_with('Z')
        })
    })
}

/// SIGKILLs, when dropped, the workers it lists that are still alive: a
/// test that fails must not leave local mode's workers behind.
struct KillWorkers(Vec<u32>);

impl Drop for KillWorkers {
    fn drop(&mut self) {
        for pid in &self.0 {
            if worker_alive(*pid)
                && let Some(pid) = Pid::from_raw(*pid as i32)
            {
                let _ = kill_process(pid, Signal::KILL);
            }
        }
    }
}

/// `signal` to local mode stops the pool as SIGTERM does: every worker it
/// started drains (no job is left in a processing list) and exits, and so
/// does local mode, with 0.
async fn stops_the_pool_on(signal: Signal, key: &str) {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let q = QueueKeys::new(key);
    let grace = 10;
    let mut local = Local::start(
        &redis,
        &manifest(key, "replicas: 2", &handler("1"), 1, grace),
    );
    push(&mut conn, q.name(), 1, 6).await;
    eventually(Duration::from_secs(30), "both workers busy", || {
        let mut conn = conn.clone();
        let q = q.clone();
        async move { (held(&mut conn, &q).await == 2).then_some(()) }
    })
    .await;
    let workers = KillWorkers(workers_of(local.id()));
    assert_eq!(workers.0.len(), 2, "{:?}: {}", workers.0, local.report());

    local.signal(signal);
    assert!(
        local.wait(Duration::from_secs(grace as u64 + 5)),
        "{signal:?}: exit 0 within the grace period: {}",
        local.report()
    );
    let left: Vec<u32> = workers
        .0
        .iter()
        .copied()
        .filter(|pid| worker_alive(*pid))
        .collect();
    assert!(
        left.is_empty(),
        "{signal:?}: workers left running: {left:?}"
    );
    assert_eq!(held(&mut conn, &q).await, 0, "no job in a processing list");
    let (done, waiting, dead) = count(&mut conn, &q).await;
    assert_eq!(
        (done + waiting, dead),
        (6, 0),
        "done {done} + waiting {waiting}"
    );
    assert!(
        local.lines().iter().any(|l| l.starts_with("summary:")),
        "{}",
        local.report()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sighup_to_the_pool_drains_its_workers_and_leaves_none_behind() {
    stops_the_pool_on(Signal::HUP, "hup").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sigquit_to_the_pool_drains_its_workers_and_leaves_none_behind() {
    stops_the_pool_on(Signal::QUIT, "quit").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_killed_with_sigkill_under_load_has_its_jobs_recovered() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let q = QueueKeys::new("kill");
    let args = r#"["--heartbeat-interval", "1s", "--dead-after", "3s", "--", "sh", "-c", "while IFS= read -r job; do sleep 0.3; echo '{\"ok\":true}'; done"]"#;
    let local = Local::start(&redis, &manifest("kill", "replicas: 2", args, 2, 5));
    push(&mut conn, q.name(), 1, 40).await;

    let (instance, pid) = eventually(Duration::from_secs(30), "a busy worker", || {
        let mut conn = conn.clone();
        let q = q.clone();
        async move {
            let instances: Vec<String> = conn.zrange(q.workers(), 0, -1).await.ok()?;
            for instance in instances {
                let busy: u64 = conn.llen(q.processing(&instance)).await.ok()?;
                let pid: Option<i32> = conn.hget(q.worker(&instance), "pid").await.ok()?;
                if let (true, Some(pid)) = (busy > 0, pid) {
                    return Some((instance, pid));
                }
            }
            None
        }
    })
    .await;
    let _ = kill_process(Pid::from_raw(pid).expect("a pid"), Signal::KILL);

    eventually(Duration::from_secs(60), "every job done", || {
        let mut conn = conn.clone();
        let q = q.clone();
        async move { (count(&mut conn, &q).await == (40, 0, 0)).then_some(()) }
    })
    .await;
    let leftover: u64 = conn.llen(q.processing(&instance)).await.expect("llen");
    assert_eq!(leftover, 0, "the killed worker's jobs were returned");
    assert!(
        local
            .lines()
            .iter()
            .any(|l| l.contains("exited (killed by SIGKILL); restarting")),
        "{}",
        local.report()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_pool_holds_while_redis_is_down_and_resumes_when_it_returns() {
    let mut redis = TestRedis::start_persistent();
    let q = QueueKeys::new("outage");
    let scaling = "scaling: {minReplicas: 1, maxReplicas: 2, pollIntervalSeconds: 1}";
    let local = Local::start(&redis, &manifest("outage", scaling, &handler("0.01"), 2, 5));
    let mut conn = redis.conn().await;
    push(&mut conn, q.name(), 1, 10).await;
    eventually(Duration::from_secs(30), "the first jobs done", || {
        let mut conn = conn.clone();
        let q = q.clone();
        async move { (count(&mut conn, &q).await.0 == 10).then_some(()) }
    })
    .await;

    redis.stop();
    eventually(Duration::from_secs(20), "the outage noticed", || async {
        local
            .last_status()
            .contains("queue=unreachable")
            .then_some(())
    })
    .await;
    redis.resume();
    let mut conn = redis.conn().await;
    push(&mut conn, q.name(), 11, 20).await;
    eventually(Duration::from_secs(60), "the later jobs done", || {
        let mut conn = conn.clone();
        let q = q.clone();
        async move { (count(&mut conn, &q).await == (20, 0, 0)).then_some(()) }
    })
    .await;
    assert!(
        local.values("running").iter().all(|n| *n >= 1),
        "the pool was held, not emptied: {}",
        local.report()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_redis_that_may_evict_jobs_is_named_in_a_warning_at_start() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("allkeys-lru")
        .query_async(&mut conn)
        .await
        .expect("config set");
    let local = Local::start(
        &redis,
        &manifest("evicting", "replicas: 0", &handler("0"), 1, 5),
    );
    let line = eventually(Duration::from_secs(20), "the warning", || async {
        local
            .lines()
            .into_iter()
            .find(|l| l.contains("warning: Redis deletes keys when memory is full"))
    })
    .await;
    assert!(
        line.contains("allkeys-lru") && line.contains("noeviction"),
        "{line}"
    );
}

#[test]
fn an_invalid_manifest_fails_with_a_line_naming_the_field() {
    let dir = tempfile::tempdir().expect("temp dir");
    for (size, concurrency, field) in [
        ("replicas: 1", 0, "spec.worker.concurrency"),
        (
            "scaling: {minReplicas: 5, maxReplicas: 2}",
            1,
            "spec.scaling.minReplicas must not exceed spec.scaling.maxReplicas",
        ),
        (
            "scaling: {maxReplicas: lots}",
            1,
            "spec.scaling.maxReplicas",
        ),
        ("scaling: {maxReplica: 3}", 1, "spec.scaling.maxReplica"),
    ] {
        let path = dir.path().join("pool.yaml");
        std::fs::write(&path, manifest("bad", size, &handler("0"), concurrency, 5))
            .expect("write manifest");
        let out = local_command(&path).output().expect("run local mode");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{size}: refused");
        assert!(stderr.contains(field), "{size}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    }
}

#[test]
fn an_unreachable_redis_at_start_exits_non_zero_naming_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("pool.yaml");
    std::fs::write(&path, manifest("nored", "replicas: 1", &handler("0"), 1, 5))
        .expect("write manifest");
    let url = format!("redis://127.0.0.1:{}/0", free_port());
    let out = local_command(&path)
        .args(["--redis-url", &url])
        .output()
        .expect("run local mode");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&format!("cannot reach Redis at {url}")),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tls_pool_runs_locally_with_the_ca_file_standing_in_for_its_secret() {
    let redis = TestTlsRedis::start(false);
    let mut conn = redis.conn().await;
    let q = QueueKeys::new("tlsq");
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("pool.yaml");
    let text = manifest("tlsq", "replicas: 2", &handler("0"), 2, 5).replace(
        r#"url: "redis://127.0.0.1:1/0", key: tlsq"#,
        &format!(
            r#"url: "{}", key: tlsq, tls: {{caSecretRef: {{name: redis-ca, key: ca.crt}}}}"#,
            redis.url()
        ),
    );
    std::fs::write(&path, text).expect("write manifest");

    // Local mode reads no Secrets: without the file it says which flag to pass.
    let out = local_command(&path).output().expect("run local mode");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("spec.queue.redis.tls.caSecretRef names a Secret, which local mode cannot read: pass --redis-ca-file FILE"),
        "{stderr}"
    );

    let mut child = local_command(&path)
        .arg("--redis-ca-file")
        .arg(&redis.certs.ca)
        .arg("--plain")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start local mode");
    let stderr = collect_lines(child.stderr.take().expect("piped stderr"));
    push(&mut conn, q.name(), 1, 40).await;
    eventually(Duration::from_secs(60), "40 jobs done over TLS", || {
        let mut conn = conn.clone();
        let q = q.clone();
        async move { (count(&mut conn, &q).await == (40, 0, 0)).then_some(()) }
    })
    .await;
    let pid = Pid::from_raw(child.id() as i32).expect("a pid");
    let _ = kill_process(pid, Signal::TERM);
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = child.try_wait().ok().flatten();
    let _ = child.kill();
    let errors = stderr.lock().map(|l| l.join("\n")).unwrap_or_default();
    assert!(
        status.is_some_and(|s| s.success()),
        "exits 0 on SIGTERM: {errors}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pool_scales_on_a_redis_cluster_reached_through_any_node() {
    let cluster = TestRedisCluster::start(3, 0);
    let mut conn = cluster.conn().await;
    let q = QueueKeys::new("{burst}");
    let url = cluster.url(cluster.primary_not_owning(workerpool_queue::keys::slot(q.name())));

    // A queue name without a hash tag cannot work on a cluster: refused
    // at start, with how to name it.
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("pool.yaml");
    std::fs::write(&path, manifest("burst", "replicas: 1", &handler("0"), 1, 5))
        .expect("write manifest");
    let out = local_command(&path)
        .args(["--redis-url", &url, "--plain"])
        .output()
        .expect("run local mode");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("queue burst has no hash tag") && stderr.contains("for example {burst}"),
        "{stderr}"
    );

    let scaling = "scaling: {minReplicas: 0, maxReplicas: 3, pollIntervalSeconds: 1, \
        targetBacklogPerReplica: 10, idleSecondsBeforeZero: 2, \
        behavior: {scaleDown: {stabilizationWindowSeconds: 1}}}";
    let text = manifest("burst", scaling, &handler("0.02"), 2, 5)
        .replace("key: burst}", r#"key: "{burst}"}"#);
    let local = Local::start_at(&url, &text);
    eventually(Duration::from_secs(30), "the pool idle at zero", || async {
        local
            .last_status()
            .contains("reason=BelowActivation")
            .then_some(())
    })
    .await;
    push(&mut conn, q.name(), 1, 200).await;
    eventually(Duration::from_secs(90), "every job done", || {
        let mut conn = conn.clone();
        let q = q.clone();
        async move { (count(&mut conn, &q).await == (200, 0, 0)).then_some(()) }
    })
    .await;
    eventually(Duration::from_secs(30), "the pool back at zero", || async {
        let last = local.last_status();
        (last.contains("running=0") && last.contains("desired=0")).then_some(())
    })
    .await;
    assert!(
        local.values("running").iter().max() >= Some(&2),
        "the burst scaled the pool out: {}",
        local.report()
    );
}

/// The rules of the `workerpool-local` line of `docs/redis-acl.md`.
fn local_acl_rules() -> Vec<String> {
    include_str!("../../docs/redis-acl.md")
        .lines()
        .find_map(|l| l.trim().strip_prefix("ACL SETUSER workerpool-local "))
        .expect("docs/redis-acl.md has the local mode line")
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn local_mode_runs_its_pool_and_dashboard_as_the_documented_acl_user() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let mut setuser = redis::cmd("ACL");
    setuser.arg("SETUSER").arg("local");
    for rule in local_acl_rules() {
        setuser.arg(rule);
    }
    let () = setuser.query_async(&mut conn).await.expect("acl setuser");
    let url = format!("redis://local:secret@127.0.0.1:{}", redis.port());
    let q = QueueKeys::new("jobs");
    let port = free_port();
    let scaling = "scaling: {minReplicas: 0, maxReplicas: 2, pollIntervalSeconds: 1, \
        targetBacklogPerReplica: 10, idleSecondsBeforeZero: 2}";
    let local = Local::start_with(
        &url,
        &manifest("jobs", scaling, &handler("0.01"), 2, 5),
        &["--dashboard", &format!("127.0.0.1:{port}")],
    );
    push(&mut conn, q.name(), 1, 60).await;
    eventually(Duration::from_secs(60), "every job done", || {
        let mut conn = conn.clone();
        let q = q.clone();
        async move { (count(&mut conn, &q).await == (60, 0, 0)).then_some(()) }
    })
    .await;
    for path in ["/api/overview", "/api/queues/jobs", "/queues/jobs/dead"] {
        let (status, body) = eventually(Duration::from_secs(10), "the dashboard", || async {
            http_get(port, path)
        })
        .await;
        assert_eq!(status, 200, "{path}: {body}");
    }
    let report = local.report();
    for refusal in ["NOPERM", "may not run", "can't run"] {
        assert!(!report.contains(refusal), "{refusal}: {report}");
    }
    assert!(
        local.values("running").iter().any(|r| *r > 0),
        "workers ran: {report}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pool_runs_locally_through_redis_sentinel_with_its_passwords_hidden() {
    let setup = TestRedisSentinel::start_with(
        1,
        Auth {
            password: Some("node-pw-123".into()),
            sentinel_password: Some("sentinel-pw-456".into()),
        },
    );
    let mut conn = setup.primary().await;
    let q = QueueKeys::new("sentq");
    let local = Local::start_at(
        &setup.url(),
        &manifest("sentq", "replicas: 2", &handler("0"), 2, 5),
    );
    push(&mut conn, q.name(), 1, 40).await;
    eventually(
        Duration::from_secs(60),
        "40 jobs done through the sentinels",
        || {
            let mut conn = conn.clone();
            let q = q.clone();
            async move { (count(&mut conn, &q).await == (40, 0, 0)).then_some(()) }
        },
    )
    .await;
    let report = local.report();
    assert!(
        !report.contains("node-pw-123") && !report.contains("sentinel-pw-456"),
        "{report}"
    );
}
