//! What produces and what handles a run's jobs: the command line, the
//! adapters of the clients (the protocol is in contract/README.md), the
//! reference handler, and a process speaking the adapter protocol.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde_json::{Map, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use workerpool_tests::root;

/// What enqueues a case's jobs.
#[derive(Debug, Clone)]
pub(crate) enum Producer {
    /// The `workerpool enqueue` command line.
    Cli,
    /// A program speaking the adapter protocol's `produce` mode.
    Adapter(Program),
}

/// A program to start, with its arguments and extra environment.
#[derive(Debug, Clone)]
pub(crate) struct Program {
    pub(crate) name: String,
    pub(crate) argv: Vec<String>,
    pub(crate) env: Vec<(String, String)>,
}

impl Program {
    /// The command, run from the repository's root, without the
    /// `WORKERPOOL_*` settings of the environment the suite runs in.
    pub(crate) fn std_command(&self) -> std::process::Command {
        let mut cmd = std::process::Command::new(&self.argv[0]);
        cmd.args(&self.argv[1..])
            .current_dir(root())
            .envs(self.env.iter().cloned());
        for (k, _) in std::env::vars() {
            if k.starts_with("WORKERPOOL_") {
                cmd.env_remove(k);
            }
        }
        cmd
    }

    pub(crate) fn command(&self) -> Command {
        let mut cmd = Command::from(self.std_command());
        cmd.kill_on_drop(true);
        cmd
    }
}

impl Producer {
    pub(crate) fn name(&self) -> &str {
        match self {
            Producer::Cli => "rust",
            Producer::Adapter(p) => &p.name,
        }
    }
}

/// The directory of `workerpool` and `workerpool-worker`:
/// `$WORKERPOOL_BIN_DIR`, else the build this test belongs to (built there
/// when missing).
pub(crate) fn bins() -> PathBuf {
    let dir = match std::env::var_os("WORKERPOOL_BIN_DIR") {
        Some(d) => PathBuf::from(d),
        None => workerpool_tests::bin_dir().to_path_buf(),
    };
    for bin in ["workerpool", "workerpool-worker"] {
        assert!(
            dir.join(bin).is_file(),
            "no {bin} in {} (WORKERPOOL_BIN_DIR): build it with \
             `cargo build -p workerpool-worker -p workerpool-cli`",
            dir.display()
        );
    }
    dir
}

/// The python that runs `python3` scripts of the suite itself.
pub(crate) fn system_python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".into())
}

/// The handler producer runs are checked with.
pub(crate) fn reference_handler() -> Program {
    Program {
        name: "reference".into(),
        argv: vec![
            system_python(),
            root()
                .join("contract/reference_handler.py")
                .display()
                .to_string(),
        ],
        env: vec![],
    }
}

/// Runs one of `scripts/sdk-env-*.sh`; its last line of output.
pub(crate) fn sdk_env(root: &Path, script: &str) -> Result<String, String> {
    let path = root.join("scripts").join(script);
    if !path.is_file() {
        return Err(format!("scripts/{script} is missing"));
    }
    let out = std::process::Command::new("bash")
        .arg(&path)
        .current_dir(root)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run scripts/{script}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "scripts/{script} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .trim()
        .to_string())
}

/// The adapter `name` of the checkout at `root`, with `mode` (`produce` or
/// `handle`) as its argument; the error says what to run or merge.
pub(crate) fn adapter(root: &Path, name: &str, mode: &str) -> Result<Program, String> {
    match name {
        "python" => {
            let script = root.join("contract/adapters/python_adapter.py");
            if !script.is_file() {
                return Err(
                    "the python adapter contract/adapters/python_adapter.py is missing (it comes \
                     with the Python client in sdk/python; run with CONTRACT_ADAPTERS=rust until then)"
                    .into());
            }
            static PYTHON: OnceLock<Result<String, String>> = OnceLock::new();
            let python = if root == self::root() {
                PYTHON
                    .get_or_init(|| sdk_env(root, "sdk-env-python.sh"))
                    .clone()
            } else {
                sdk_env(root, "sdk-env-python.sh")
            }
            .map_err(|e| {
                format!(
                    "the python adapter needs its environment: run scripts/sdk-env-python.sh ({e})"
                )
            })?;
            Ok(Program {
                name: "python".into(),
                argv: vec![python, script.display().to_string(), mode.into()],
                env: vec![(
                    "PYTHONPATH".into(),
                    root.join("sdk/python/src").display().to_string(),
                )],
            })
        }
        "node" => {
            let script = root.join("contract/adapters/node_adapter.mjs");
            if !script.is_file() {
                return Err(
                    "the node adapter contract/adapters/node_adapter.mjs is missing (it comes with \
                     the Node client in sdk/node; run with CONTRACT_ADAPTERS=rust until then)"
                    .into());
            }
            static NODE: OnceLock<Result<String, String>> = OnceLock::new();
            if root == self::root() {
                NODE.get_or_init(|| sdk_env(root, "sdk-env-node.sh"))
                    .clone()
            } else {
                sdk_env(root, "sdk-env-node.sh")
            }
            .map_err(|e| {
                format!("the node adapter needs sdk/node/node_modules: run scripts/sdk-env-node.sh ({e})")
            })?;
            Ok(Program {
                name: "node".into(),
                argv: vec!["node".into(), script.display().to_string(), mode.into()],
                env: vec![],
            })
        }
        other => {
            // Another language's client: its command from the environment.
            let var = format!(
                "CONTRACT_ADAPTER_{}",
                other
                    .to_uppercase()
                    .replace(|c: char| !c.is_ascii_alphanumeric(), "_")
            );
            match std::env::var(&var) {
                Ok(command) if !command.trim().is_empty() => Ok(Program {
                    name: other.into(),
                    argv: vec!["sh".into(), "-c".into(), format!("exec {command} {mode}")],
                    env: vec![],
                }),
                _ => Err(format!(
                    "unknown adapter {other:?} in CONTRACT_ADAPTERS (known: rust, python, node); \
                     for another client set {var} to the command that runs its adapter"
                )),
            }
        }
    }
}

/// The adapters `CONTRACT_ADAPTERS` names (all when unset).
pub(crate) fn chosen_adapters() -> Vec<String> {
    match std::env::var("CONTRACT_ADAPTERS") {
        Ok(list) => list
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect(),
        Err(_) => vec!["rust".into(), "python".into(), "node".into()],
    }
}

/// A process speaking the adapter protocol.
pub(crate) struct AdapterProcess {
    pub(crate) name: String,
    pub(crate) child: Child,
    pub(crate) stdin: ChildStdin,
    pub(crate) stdout: BufReader<ChildStdout>,
    pub(crate) stderr: Arc<Mutex<String>>,
}

impl AdapterProcess {
    pub(crate) fn start(program: &Program) -> Result<Self, String> {
        let mut child = program
            .command()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                format!(
                    "cannot start the {} adapter {:?}: {e}",
                    program.name, program.argv
                )
            })?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut err = child.stderr.take().expect("piped stderr");
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 8192];
            while let Ok(n) = err.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .expect("stderr buffer")
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Ok(Self {
            name: program.name.clone(),
            child,
            stdin,
            stdout,
            stderr,
        })
    }

    pub(crate) async fn send(&mut self, request: &Value) -> Result<(), String> {
        let line = format!("{request}\n");
        self.stdin
            .write_all(line.as_bytes())
            .await
            .map_err(|e| format!("writing to the {} adapter: {e}{}", self.name, self.said()))?;
        self.stdin.flush().await.map_err(|e| e.to_string())
    }

    /// The answer to the request sent last.
    pub(crate) async fn answer(&mut self) -> Result<Value, String> {
        let mut line = String::new();
        let read = tokio::time::timeout(Duration::from_secs(30), self.stdout.read_line(&mut line));
        match read.await {
            Err(_) => Err(format!(
                "the {} adapter did not answer within 30 s{}",
                self.name,
                self.said()
            )),
            Ok(Err(e)) => Err(format!("reading the {} adapter: {e}", self.name)),
            Ok(Ok(0)) => {
                let status = self.child.wait().await.map(|s| s.to_string());
                Err(format!(
                    "the {} adapter exited without answering ({}){}",
                    self.name,
                    status.unwrap_or_default(),
                    self.said()
                ))
            }
            Ok(Ok(_)) => serde_json::from_str(line.trim_end()).map_err(|e| {
                format!(
                    "the {} adapter answered a line that is not JSON ({e}): {:?}",
                    self.name,
                    line.trim_end()
                )
            }),
        }
    }

    pub(crate) fn said(&self) -> String {
        let text = self.stderr.lock().expect("stderr buffer").clone();
        if text.trim().is_empty() {
            String::new()
        } else {
            format!("; its stderr:\n{}", tail(&text, 20))
        }
    }
}

/// The last `n` lines of `text`.
pub(crate) fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// What one producer answered to one request: ids (None: a refused
/// duplicate), or the library's error.
pub(crate) type Answer = Result<Vec<Option<String>>, String>;

/// A producer's answer as an [`Answer`], or a protocol error.
pub(crate) fn parse_answer(answer: Value, jobs: usize) -> Result<Answer, String> {
    if let Some(e) = answer.get("error") {
        return Ok(Err(e
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| e.to_string())));
    }
    let Some(ids) = answer.get("ids").and_then(Value::as_array) else {
        return Err(format!(
            "the answer {answer} has neither \"ids\" (an array) nor \"error\""
        ));
    };
    if ids.len() != jobs {
        return Err(format!(
            "the answer {answer} has {} ids for {jobs} jobs",
            ids.len()
        ));
    }
    ids.iter()
        .map(|id| match id {
            Value::Null => Ok(None),
            Value::String(s) => Ok(Some(s.clone())),
            other => Err(format!(
                "the answer {answer} has an id that is not a string or null: {other}"
            )),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Ok)
}

/// Seconds as JSON: an integer when whole.
fn whole(s: f64) -> Value {
    if s.fract() == 0.0 && s >= 0.0 {
        Value::from(s as u64)
    } else {
        Value::from(s)
    }
}

/// The CLI's answer to a `status`, `wait` or `cancel` request of the
/// adapter protocol, through `workerpool job show|wait|cancel --json`.
pub(crate) fn cli_op(bins: &Path, flags: &[String], request: &Value) -> Result<Value, String> {
    let op = request["op"].as_str().unwrap_or_default();
    let (queue, id) = (
        request["queue"].as_str().unwrap_or_default(),
        request["id"].as_str().unwrap_or_default(),
    );
    let action = match op {
        "status" => "show",
        "wait" | "cancel" => op,
        other => return Err(format!("no such request: {other:?}")),
    };
    let mut cmd = Program {
        name: "rust".into(),
        argv: vec![bins.join("workerpool").display().to_string()],
        env: vec![],
    }
    .std_command();
    cmd.args(["job", action])
        .args(flags)
        .args(["--queue", queue]);
    if op == "wait" {
        let ms = request["timeout_ms"].as_u64().unwrap_or(60_000);
        cmd.arg("--timeout").arg(format!("{ms}ms"));
    }
    let out = cmd
        .arg("--json")
        .arg(id)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run workerpool job {action}: {e}"))?;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    let json = |text: &str| -> Result<Value, String> {
        let last = text
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        serde_json::from_str(last).map_err(|e| {
            format!(
                "workerpool job {action} printed no JSON ({e}): {:?} {:?}",
                stdout.trim(),
                stderr.trim()
            )
        })
    };
    let key = if op == "cancel" { "cancel" } else { "status" };
    if out.status.success() {
        return Ok(serde_json::json!({ key: json(&stdout)? }));
    }
    // Exit 1: no outcome kept (show), a job that did not end done or in
    // time (wait, its outcome on the last line of stderr).
    if op == "status" && stderr.contains("no outcome is kept") {
        return Ok(serde_json::json!({"status": null}));
    }
    if op == "wait" && stderr.contains("did not end within") {
        if stderr.contains("no outcome is kept") {
            return Ok(serde_json::json!({"timeout": null}));
        }
        return Ok(serde_json::json!({"timeout": json(&stderr)?}));
    }
    if op == "wait" && stderr.contains(" is ") {
        return Ok(serde_json::json!({"status": json(&stderr)?}));
    }
    Ok(serde_json::json!({"error": stderr.trim()}))
}

/// The CLI's answer to one adapter request: one `workerpool enqueue` per
/// job, or one for all of them when `many`.
pub(crate) fn cli_produce(
    bins: &Path,
    flags: &[String],
    request: &Value,
) -> Result<Answer, String> {
    let jobs = request["jobs"].as_array().expect("jobs");
    let queue = request["queue"].as_str().expect("queue");
    let payload = |job: &Value| {
        // Fields in the order the contract wants them, `id` last so the
        // command line's `enqueued_at` follows it.
        let mut fields = Map::new();
        fields.insert("task".into(), job["task"].clone());
        if !job["data"].is_null() {
            fields.insert("data".into(), job["data"].clone());
        }
        if let Some(at) = job["run_at_ms"].as_u64() {
            fields.insert("run_at".into(), at.into());
        }
        if let Some(key) = job["unique_key"].as_str() {
            fields.insert("unique_key".into(), key.into());
        }
        if let Some(s) = job["unique_for_s"].as_f64() {
            fields.insert("unique_for".into(), whole(s));
        }
        if let Some(s) = job["keep_s"].as_f64() {
            fields.insert("keep".into(), whole(s));
        }
        if let Some(id) = job["id"].as_str() {
            fields.insert("id".into(), id.into());
        }
        Value::Object(fields).to_string()
    };
    let groups: Vec<Vec<&Value>> = if request["many"] == true {
        vec![jobs.iter().collect()]
    } else {
        jobs.iter().map(|j| vec![j]).collect()
    };
    let mut ids = Vec::new();
    for group in groups {
        let delays: HashSet<Option<u64>> = group.iter().map(|j| j["delay_ms"].as_u64()).collect();
        if delays.len() > 1 {
            return Ok(Err(
                "workerpool enqueue has one --delay per call: jobs of one enqueue_many must share delay_ms".into(),
            ));
        }
        let mut cmd = Program {
            name: "rust".into(),
            argv: vec![bins.join("workerpool").display().to_string()],
            env: vec![],
        }
        .std_command();
        cmd.arg("enqueue").args(flags).arg("--queue").arg(queue);
        if let Some(Some(ms)) = delays.into_iter().next() {
            cmd.arg("--delay").arg(format!("{ms}ms"));
        }
        for job in &group {
            cmd.arg(payload(job));
        }
        let out = cmd
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run workerpool enqueue: {e}"))?;
        if !out.status.success() {
            return Ok(Err(String::from_utf8_lossy(&out.stderr).trim().to_string()));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = text.lines().collect();
        if lines.len() != group.len() {
            return Err(format!(
                "workerpool enqueue printed {} lines for {} jobs: {text:?}",
                lines.len(),
                group.len()
            ));
        }
        ids.extend(
            lines
                .iter()
                .map(|l| (*l != "duplicate").then(|| l.to_string())),
        );
    }
    Ok(Ok(ids))
}
