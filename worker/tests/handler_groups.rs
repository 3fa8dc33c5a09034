//! What a handler process starts (a shell's background job, a Python
//! subprocess) ends with it: when the worker is SIGKILLed, when a job
//! times out, and at the end of a drain, for both exec handlers. Each
//! handler here starts `sleep 1000` in the background, records its pid and
//! waits for it, as `sh -c 'sleep 1000 & wait'` does.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::json;
use workerpool_queue::keys::QueueKeys;
use workerpool_tests::{TestRedis, eventually, free_port};

mod common;
use common::{counter, push};

const WAIT: Duration = Duration::from_secs(20);
/// How long the whole tree gets to be gone once it should be.
const GONE: Duration = Duration::from_secs(5);
const QUEUE: &str = "trees";

/// A job's handler: starts a grandchild, records its pid, waits for it.
fn per_job_script(pids: &Path) -> String {
    format!("sleep 1000 & echo $! >> {}; wait", pids.display())
}

/// An exec pool child that starts a grandchild for each job it takes.
fn pool_script(pids: &Path) -> String {
    format!("while IFS= read -r job; do {}; done", per_job_script(pids))
}

/// A worker on [`QUEUE`] running `handler` with `sh -c script`.
fn worker(redis: &TestRedis, handler: &str, script: &str, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_workerpool-worker"))
        .args(["--redis-url", &redis.url(), "--queue", QUEUE])
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .args(["--handler", handler])
        .args(extra)
        .args(["--", "sh", "-c", script])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn workerpool-worker")
}

/// The pids the handlers recorded, once there are `n`.
async fn recorded(pids: &Path, n: usize) -> Vec<u32> {
    eventually(WAIT, &format!("{n} grandchildren started"), || {
        let found: Vec<u32> = std::fs::read_to_string(pids)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.parse().ok())
            .collect();
        async move { (found.len() >= n).then_some(found) }
    })
    .await
}

/// Whether process `pid` exists (and is not a zombie).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
    })
}

async fn all_gone(pids: &[u32], what: &str) {
    let pids = pids.to_vec();
    eventually(GONE, what, || {
        let left = pids.iter().any(|&p| alive(p));
        async move { (!left).then_some(()) }
    })
    .await;
}

/// Kills the worker and every recorded grandchild when dropped, so that a
/// failing test leaves nothing behind.
struct Cleanup(Child, PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        for pid in std::fs::read_to_string(&self.1).unwrap_or_default().lines() {
            let _ = Command::new("kill").arg("-9").arg(pid).status();
        }
    }
}

async fn grandchild_dies_with_a_sigkilled_worker(handler: &str, script: fn(&Path) -> String) {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let pids = dir.path().join("pids");
    let mut run = Cleanup(worker(&redis, handler, &script(&pids), &[]), pids.clone());
    push(&mut c, QUEUE, &[json!({"task": "t"}).to_string()]).await;
    let grandchildren = recorded(&pids, 1).await;
    assert!(alive(grandchildren[0]));

    run.0.kill().expect("kill -9 the worker");
    let _ = run.0.wait();
    all_gone(
        &grandchildren,
        "the grandchild gone with its SIGKILLed worker",
    )
    .await;
}

#[tokio::test]
async fn an_exec_childs_grandchild_dies_with_a_sigkilled_worker() {
    grandchild_dies_with_a_sigkilled_worker("exec", pool_script).await;
}

#[tokio::test]
async fn an_exec_per_job_processs_grandchild_dies_with_a_sigkilled_worker() {
    grandchild_dies_with_a_sigkilled_worker("exec-per-job", per_job_script).await;
}

async fn a_timed_out_jobs_grandchild_is_killed(handler: &str, script: fn(&Path) -> String) {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let pids = dir.path().join("pids");
    let mut run = Cleanup(
        worker(&redis, handler, &script(&pids), &["--job-timeout", "1s"]),
        pids.clone(),
    );
    push(&mut c, QUEUE, &[json!({"task": "t"}).to_string()]).await;
    let grandchildren = recorded(&pids, 1).await;
    let q = QueueKeys::new(QUEUE);
    eventually(WAIT, "the attempt failed by its timeout", || {
        let mut c = c.clone();
        let key = q.stats_failed();
        async move { (counter(&mut c, key).await >= 1).then_some(()) }
    })
    .await;
    all_gone(&grandchildren, "the timed-out job's grandchild gone").await;
    assert!(
        run.0.try_wait().expect("try_wait").is_none(),
        "the worker keeps running"
    );
}

#[tokio::test]
async fn a_timed_out_exec_jobs_grandchild_is_killed_with_its_child() {
    a_timed_out_jobs_grandchild_is_killed("exec", pool_script).await;
}

#[tokio::test]
async fn a_timed_out_exec_per_job_jobs_grandchild_is_killed_with_its_process() {
    a_timed_out_jobs_grandchild_is_killed("exec-per-job", per_job_script).await;
}

#[tokio::test]
async fn at_the_end_of_a_drain_idle_exec_childrens_grandchildren_are_killed() {
    let redis = TestRedis::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let pids = dir.path().join("pids");
    // Each child starts a grandchild at once, then waits for jobs.
    let script = format!(
        "sleep 1000 & echo $! >> {}; while IFS= read -r job; do echo '{{\"ok\":true}}'; done",
        pids.display()
    );
    let mut run = Cleanup(
        worker(&redis, "exec", &script, &["--concurrency", "2"]),
        pids.clone(),
    );
    let grandchildren = recorded(&pids, 2).await;

    let term = Command::new("kill")
        .arg("-TERM")
        .arg(run.0.id().to_string())
        .status()
        .expect("kill -TERM");
    assert!(term.success());
    let child = &mut run.0;
    let status = eventually(WAIT, "the worker to exit", || {
        let status = child.try_wait().expect("try_wait");
        async move { status }
    })
    .await;
    assert!(status.success(), "{status}");
    all_gone(&grandchildren, "the idle children's grandchildren gone").await;
}
