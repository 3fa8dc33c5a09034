//! Test support for workerpool: a throwaway `redis-server` per test, on a
//! free port of the loopback interface, never the machine's own Redis.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub mod cluster;
pub mod local;
pub mod sentinel;
pub mod tls;
pub use cluster::TestRedisCluster;
pub use local::{Local, collect_lines, local_command};
pub use sentinel::TestRedisSentinel;
pub use tls::TestTlsRedis;

/// A `redis-server` process owned by one test, killed on drop.
#[derive(Debug)]
pub struct TestRedis {
    port: u16,
    dir: tempfile::TempDir,
    persistent: bool,
    child: Option<Child>,
}

impl TestRedis {
    /// Starts a Redis that keeps nothing on disk.
    pub fn start() -> Self {
        Self::launch(false)
    }

    /// Starts a Redis that writes every change to its append-only file
    /// before answering, so [`TestRedis::restart`] loses nothing.
    pub fn start_persistent() -> Self {
        Self::launch(true)
    }

    fn launch(persistent: bool) -> Self {
        let dir = tempfile::tempdir().expect("temp dir for redis");
        let mut redis = Self {
            port: free_port(),
            dir,
            persistent,
            child: None,
        };
        // A port found free can be taken before the server binds it (by
        // another test's client socket): the server then exits, and starts
        // again on another port.
        for _ in 0..5 {
            if redis.spawn() {
                return redis;
            }
            redis.port = free_port();
        }
        panic!("redis-server did not start on 5 ports");
    }

    /// Starts the server; `false` when it exited at once (its port was
    /// taken).
    fn spawn(&mut self) -> bool {
        let mut cmd = Command::new(redis_server());
        cmd.arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--daemonize", "no"])
            .arg("--dir")
            .arg(self.dir.path());
        if self.persistent {
            cmd.args(["--appendonly", "yes", "--appendfsync", "always"]);
        } else {
            cmd.args(["--appendonly", "no"]);
        }
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("redis-server must be installed (apt-get install redis-server)");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.ping() {
                self.child = Some(child);
                return true;
            }
            if let Ok(Some(_)) = child.try_wait() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("redis-server did not answer on port {}", self.port);
    }

    fn ping(&self) -> bool {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
            .is_ok()
    }

    /// `redis://127.0.0.1:<port>/0`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The directory it keeps its files in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A client for it.
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("valid url")
    }

    /// An async connection to it.
    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        self.client()
            .get_multiplexed_async_connection()
            .await
            .expect("connect to test redis")
    }

    /// Stops the server (the clients see their connections drop).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if self.persistent {
                // SHUTDOWN flushes the append-only file; the connection
                // closes without a reply, which is the expected outcome.
                if let Ok(mut c) = self
                    .client()
                    .get_connection_with_timeout(Duration::from_secs(1))
                {
                    let _: redis::RedisResult<()> = redis::cmd("SHUTDOWN").query(&mut c);
                }
                let deadline = Instant::now() + Duration::from_secs(10);
                while Instant::now() < deadline {
                    if let Ok(Some(_)) = child.try_wait() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and directory.
    pub fn resume(&mut self) {
        assert!(self.child.is_none(), "stop before resume");
        assert!(
            self.spawn(),
            "redis-server exited at start on port {} (taken meanwhile?)",
            self.port
        );
    }

    /// Stops and starts it again.
    pub fn restart(&mut self) {
        self.stop();
        self.resume();
    }
}

impl Drop for TestRedis {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The directory holding the project's binaries (`workerpool`,
/// `workerpool-worker`, `workerpool-operator`): the one the calling test
/// executable was built into (`<target>/<profile>/deps/..`), building them
/// there when they are missing.
pub fn bin_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("test executable path");
        let dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("test executable in <target>/<profile>/deps")
            .to_path_buf();
        let present = |d: &Path| {
            ["workerpool", "workerpool-worker", "workerpool-operator"]
                .iter()
                .all(|b| d.join(b).is_file())
        };
        if !present(&dir) {
            let target = dir.parent().expect("target dir");
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            // The whole workspace with its examples, as `cargo test
            // --workspace` builds it: one set of features, so the tests'
            // dependencies serve.
            let status = Command::new(cargo)
                .args(["build", "--workspace", "--bins", "--examples"])
                .arg("--target-dir")
                .arg(target)
                .status()
                .expect("run cargo build");
            assert!(status.success(), "cargo build of the binaries failed");
        }
        assert!(present(&dir), "no binaries in {}", dir.display());
        dir
    })
}

/// The repository's root directory.
pub fn root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    root.canonicalize().unwrap_or(root)
}

/// The text of the repository's file `relative` (to [`root`]).
pub fn read(relative: &str) -> String {
    std::fs::read_to_string(root().join(relative))
        .unwrap_or_else(|e| panic!("cannot read {relative}: {e}"))
}

/// The program `name` in a directory of `PATH`, if there is one.
pub fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// The helm to run: `$HELM`, else the one `scripts/install-helm.sh` puts
/// in `target/tools/bin`, else the one on `PATH`.
pub fn helm() -> PathBuf {
    if let Some(path) = std::env::var_os("HELM") {
        return path.into();
    }
    let installed = root().join("target/tools/bin/helm");
    if installed.is_file() {
        return installed;
    }
    on_path("helm").unwrap_or_else(|| {
        panic!(
            "no helm binary: run scripts/install-helm.sh (it puts helm in target/tools/bin), or set HELM"
        )
    })
}

/// The instructions of a Dockerfile, with continuation lines joined and
/// comments dropped.
pub fn dockerfile_instructions(dockerfile: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in dockerfile.lines().map(str::trim) {
        if line.starts_with('#') || (line.is_empty() && current.is_empty()) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(part) => {
                current.push_str(part);
                current.push(' ');
            }
            None => {
                current.push_str(line);
                out.push(std::mem::take(&mut current));
            }
        }
    }
    out
}

/// The `redis-server` to run: `$REDIS_SERVER`, else the one on `PATH`.
pub fn redis_server() -> PathBuf {
    std::env::var_os("REDIS_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("redis-server"))
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local addr").port()
}

/// Polls `check` every 20 ms until it returns `Some` or `timeout` passes.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `GET path` on 127.0.0.1:`port`: the status and the body.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    std::io::Write::write_fmt(
        &mut s,
        format_args!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n"),
    )
    .ok()?;
    let mut response = String::new();
    std::io::Read::read_to_string(&mut s, &mut response).ok()?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())?;
    Some((status, body))
}
