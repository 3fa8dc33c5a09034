//! The cluster the suite runs on, and the few ways it talks to it: `kubectl`
//! and `helm` subprocesses, polled with deadlines.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

pub use workerpool_tests::{helm, root};

/// Where the cluster comes from.
#[derive(Debug)]
pub enum Source {
    /// A directory whose `up.sh` starts a cluster and prints its kubeconfig's
    /// path, and whose `down.sh` stops it.
    Scripts(PathBuf),
    /// A running cluster, neither started nor stopped by the suite.
    Kubeconfig(PathBuf),
}

impl Source {
    /// From `WORKERPOOL_E2E_K8S` or `WORKERPOOL_E2E_KUBECONFIG`; None when
    /// neither is set.
    pub fn from_env() -> Option<Self> {
        let set = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        if let Some(dir) = set("WORKERPOOL_E2E_K8S") {
            return Some(Source::Scripts(PathBuf::from(dir)));
        }
        set("WORKERPOOL_E2E_KUBECONFIG").map(|file| Source::Kubeconfig(PathBuf::from(file)))
    }
}

/// A started (or borrowed) cluster; a started one is stopped on drop, or
/// on SIGINT or SIGTERM, so the cluster goes down however the run ends
/// short of a SIGKILL.
#[derive(Debug)]
pub struct Cluster {
    pub kubeconfig: PathBuf,
    kubectl: OsString,
    /// `down.sh`, taken by whichever runs it first: the drop or a signal.
    down: Arc<Mutex<Option<PathBuf>>>,
}

impl Cluster {
    pub fn start(source: &Source) -> Cluster {
        let kubectl = std::env::var_os("KUBECTL").unwrap_or_else(|| "kubectl".into());
        match source {
            Source::Kubeconfig(file) => Cluster {
                kubeconfig: file.clone(),
                kubectl,
                down: Arc::default(),
            },
            Source::Scripts(dir) => {
                let up = dir.join("up.sh");
                assert!(
                    up.is_file(),
                    "WORKERPOOL_E2E_K8S={}: no up.sh there",
                    dir.display()
                );
                // From here on the cluster is ours to stop, even if up.sh fails half way.
                let mut cluster = Cluster {
                    kubeconfig: PathBuf::new(),
                    kubectl,
                    down: Arc::new(Mutex::new(Some(dir.join("down.sh")))),
                };
                stop_on_signal(cluster.down.clone());
                let out = Command::new(&up)
                    .stderr(Stdio::inherit())
                    .output()
                    .unwrap_or_else(|e| panic!("cannot run {}: {e}", up.display()));
                let stdout = String::from_utf8_lossy(&out.stdout);
                assert!(out.status.success(), "{} failed: {stdout}", up.display());
                let path = stdout
                    .lines()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or_else(|| panic!("{} printed no kubeconfig path", up.display()));
                cluster.kubeconfig = PathBuf::from(path.trim());
                cluster
            }
        }
    }

    /// Runs kubectl; Ok(stdout) or Err(stderr).
    pub fn try_kubectl(&self, args: &[&str]) -> Result<String, String> {
        self.kubectl_with_input(args, None)
    }

    /// Runs kubectl with `input` on its stdin.
    pub fn kubectl_with_input(&self, args: &[&str], input: Option<&str>) -> Result<String, String> {
        let mut child = Command::new(&self.kubectl)
            .env("KUBECONFIG", &self.kubeconfig)
            .args(args)
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run {:?} (set KUBECTL to a kubectl binary): {e}",
                    self.kubectl
                )
            });
        if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
            stdin
                .write_all(text.as_bytes())
                .expect("write kubectl's stdin");
        }
        let out = child.wait_with_output().expect("kubectl runs");
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "kubectl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// Runs kubectl, failing the test when it fails.
    /// The ClusterIP of Service `name` in `namespace`.
    pub fn cluster_ip(&self, namespace: &str, name: &str) -> String {
        self.get(&["service", "-n", namespace, name])
            .and_then(|s| s["spec"]["clusterIP"].as_str().map(String::from))
            .unwrap_or_else(|| panic!("the ClusterIP of Service {namespace}/{name}"))
    }

    pub fn kubectl(&self, args: &[&str]) -> String {
        self.try_kubectl(args).unwrap_or_else(|e| panic!("{e}"))
    }

    /// `kubectl ARGS` running in the background with its stdout piped.
    pub fn spawn_kubectl(&self, args: &[&str]) -> std::process::Child {
        Command::new(&self.kubectl)
            .env("KUBECONFIG", &self.kubeconfig)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {:?}: {e}", self.kubectl))
    }

    /// `kubectl apply --server-side -f -` of one or more documents.
    pub fn apply(&self, namespace: &str, manifest: &str) {
        self.kubectl_with_input(
            &["apply", "--server-side", "-n", namespace, "-f", "-"],
            Some(manifest),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    }

    /// The object(s) as JSON; None when kubectl fails (for example NotFound).
    pub fn get(&self, args: &[&str]) -> Option<Value> {
        let mut all = vec!["get"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-o", "json"]);
        let text = self.try_kubectl(&all).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Runs helm with this cluster's kubeconfig, in the workspace root.
    pub fn helm(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new(helm())
            .env("KUBECONFIG", &self.kubeconfig)
            .args(args)
            .current_dir(root())
            .output()
            .expect("helm runs");
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "helm {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        stop(&self.down);
    }
}

/// Runs `down.sh` unless it ran already.
fn stop(down: &Mutex<Option<PathBuf>>) {
    let mut down = down.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(script) = down.take() {
        eprintln!("e2e: stopping the cluster ({})", script.display());
        match Command::new(&script).stdout(Stdio::null()).status() {
            Ok(s) if s.success() => {}
            other => eprintln!("e2e: {} failed: {other:?}", script.display()),
        }
    }
}

/// An interrupted run (Ctrl-C, or CI's SIGTERM at a timeout) stops the
/// cluster before it exits, instead of leaving the node running.
fn stop_on_signal(down: Arc<Mutex<Option<PathBuf>>>) {
    std::thread::spawn(move || {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        let signalled = runtime.block_on(async {
            use tokio::signal::unix::{SignalKind, signal};
            let (Ok(mut interrupt), Ok(mut terminate)) = (
                signal(SignalKind::interrupt()),
                signal(SignalKind::terminate()),
            ) else {
                return false;
            };
            tokio::select! {
                _ = interrupt.recv() => true,
                _ = terminate.recv() => true,
            }
        });
        if signalled {
            eprintln!("e2e: interrupted");
            stop(&down);
            std::process::exit(130);
        }
    });
}

/// Calls `check` every 250 ms until it returns `Some` or `timeout` passes;
/// then fails with `what` and the last thing `check` saw.
pub fn eventually<T>(
    timeout: Duration,
    what: &str,
    mut check: impl FnMut(&mut String) -> Option<T>,
) -> T {
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    loop {
        if let Some(v) = check(&mut last) {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}; last seen: {last}");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// A namespace for one scenario, deleted (and waited for) on drop.
#[derive(Debug)]
pub struct Namespace<'a> {
    pub name: String,
    cluster: &'a Cluster,
}

impl<'a> Namespace<'a> {
    pub fn create(cluster: &'a Cluster, name: &str) -> Namespace<'a> {
        // A leftover of an interrupted run goes first.
        let _ = cluster.try_kubectl(&[
            "delete",
            "namespace",
            name,
            "--ignore-not-found",
            "--timeout=120s",
        ]);
        cluster.kubectl(&["create", "namespace", name]);
        // Pods need the namespace's default ServiceAccount, which the
        // controller-manager adds a moment later.
        eventually(
            Duration::from_secs(30),
            "the default ServiceAccount",
            |_| {
                cluster
                    .try_kubectl(&["-n", name, "get", "serviceaccount", "default"])
                    .ok()
            },
        );
        Namespace {
            name: name.into(),
            cluster,
        }
    }
}

impl Drop for Namespace<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.cluster.try_kubectl(&[
            "delete",
            "namespace",
            &self.name,
            "--ignore-not-found",
            "--timeout=120s",
        ]) {
            eprintln!("e2e: cannot delete namespace {}: {e}", self.name);
        }
    }
}
