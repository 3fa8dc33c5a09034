//! `workerpool-operator local` run as a user runs it: real
//! `workerpool-worker` processes, and the `--plain` output read line by line.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

use crate::{TestRedis, bin_dir};

/// `workerpool-operator local -f <manifest>` with this build's worker
/// binary, logging warnings only.
pub fn local_command(manifest: &Path) -> Command {
    let mut cmd = Command::new(bin_dir().join("workerpool-operator"));
    cmd.arg("local")
        .arg("-f")
        .arg(manifest)
        .arg("--worker-bin")
        .arg(bin_dir().join("workerpool-worker"))
        .env("RUST_LOG", "warn");
    cmd
}

/// The lines of `stream`, gathered by a thread of their own as they come.
pub fn collect_lines(stream: impl std::io::Read + Send + 'static) -> Arc<Mutex<Vec<String>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            if let Ok(mut l) = sink.lock() {
                l.push(line);
            }
        }
    });
    lines
}

/// A running `workerpool-operator local --plain`, stopped with SIGTERM (its
/// workers with it) when dropped.
#[derive(Debug)]
pub struct Local {
    child: Child,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<Vec<String>>>,
    _dir: tempfile::TempDir,
}

impl Local {
    /// Local mode on `redis` for the manifest text `manifest`.
    pub fn start(redis: &TestRedis, manifest: &str) -> Self {
        Self::start_at(&redis.url(), manifest)
    }

    /// Local mode on the Redis at `url` for the manifest text `manifest`.
    pub fn start_at(url: &str, manifest: &str) -> Self {
        Self::start_with(url, manifest, &[])
    }

    /// [`Local::start_at`] with more arguments for local mode.
    pub fn start_with(url: &str, manifest: &str, args: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("pool.yaml");
        std::fs::write(&path, manifest).expect("write manifest");
        let mut child = local_command(&path)
            .args(["--redis-url", url, "--plain"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start workerpool-operator local");
        let stdout = collect_lines(child.stdout.take().expect("piped stdout"));
        let stderr = collect_lines(child.stderr.take().expect("piped stderr"));
        Self {
            child,
            stdout,
            stderr,
            _dir: dir,
        }
    }

    /// The process id of local mode.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Its standard output so far.
    pub fn lines(&self) -> Vec<String> {
        self.stdout.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// Values of `key=` over every status line.
    pub fn values(&self, key: &str) -> Vec<i64> {
        let prefix = format!("{key}=");
        self.lines()
            .iter()
            .filter(|l| l.starts_with("t="))
            .filter_map(|l| {
                l.split(' ')
                    .find_map(|f| f.strip_prefix(&prefix))
                    .and_then(|v| v.parse().ok())
            })
            .collect()
    }

    /// The latest status line.
    pub fn last_status(&self) -> String {
        self.lines()
            .into_iter()
            .rev()
            .find(|l| l.starts_with("t="))
            .unwrap_or_default()
    }

    /// Sends `sig` to the process.
    pub fn signal(&self, sig: Signal) {
        let pid = Pid::from_raw(self.child.id() as i32).expect("a pid");
        let _ = kill_process(pid, sig);
    }

    /// Waits for the process to exit and returns whether it exited with 0.
    pub fn wait(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.success();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "local mode still running after {timeout:?}: {:?}",
            self.lines()
        );
    }

    /// Its standard output and standard error so far, for a failure message.
    pub fn report(&self) -> String {
        let err = self.stderr.lock().map(|l| l.join("\n")).unwrap_or_default();
        format!("stdout:\n{}\nstderr:\n{err}", self.lines().join("\n"))
    }

    /// SIGTERM, then waits up to 20 s for the process to exit, and kills it
    /// if it has not.
    pub fn stop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.signal(Signal::TERM);
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        self.stop();
    }
}
