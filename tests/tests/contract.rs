//! The conformance suite of the queue contract (`contract/README.md`): every
//! case of `contract/cases/` runs against a real Redis (plain, TLS, mutual
//! TLS or a 3-node cluster) and the real `workerpool-worker`, once per
//! producer (the `workerpool enqueue` command line and each client's
//! adapter in `produce` mode, checked by the reference handler) and once per
//! handler adapter (`handle` mode under `--handler exec`, fed by the command
//! line). `CONTRACT_ADAPTERS=rust,python,node` (a comma list) picks the
//! adapters; unset, all run.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use workerpool_tests::{TestRedis, TestRedisCluster, TestTlsRedis, free_port, root};

// ---------------------------------------------------------------------------
// The case format (documented in contract/README.md).

/// One case file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    description: String,
    #[serde(default)]
    redis: RedisKind,
    sides: Vec<SideKind>,
    steps: Vec<Step>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum RedisKind {
    #[default]
    Plain,
    Tls,
    Mtls,
    Cluster,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum SideKind {
    Producer,
    Handler,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum Step {
    Produce(Produce),
    Worker(WorkerStep),
    Expect(Expect),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Produce {
    queue: String,
    #[serde(default)]
    many: bool,
    #[serde(default = "one")]
    concurrent: usize,
    jobs: Vec<CaseJob>,
    accepted: Option<Vec<bool>>,
    #[serde(default)]
    error: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct CaseJob {
    label: String,
    task: String,
    #[serde(default)]
    data: Value,
    id: Option<String>,
    delay_ms: Option<u64>,
    run_at_in_ms: Option<u64>,
    unique_key: Option<String>,
    unique_for_s: Option<f64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkerStep {
    queues: Vec<String>,
    #[serde(default = "one")]
    concurrency: usize,
    #[serde(default = "three")]
    max_attempts: u32,
    #[serde(default = "backoff_base")]
    backoff_base: String,
    #[serde(default = "backoff_max")]
    backoff_max: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Expect {
    #[serde(default)]
    records: Vec<RecordExpect>,
    #[serde(default)]
    dead: Vec<DeadExpect>,
    #[serde(default)]
    order: Vec<Vec<String>>,
    #[serde(default)]
    processed: BTreeMap<String, u64>,
    #[serde(default)]
    failed: BTreeMap<String, u64>,
    #[serde(default = "timeout_ms")]
    timeout_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordExpect {
    job: String,
    #[serde(default = "one_u64")]
    attempt: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeadExpect {
    queue: String,
    job: String,
    reason: String,
    attempts: u64,
    error_contains: String,
}

fn one() -> usize {
    1
}
fn one_u64() -> u64 {
    1
}
fn three() -> u32 {
    3
}
fn backoff_base() -> String {
    "10ms".into()
}
fn backoff_max() -> String {
    "50ms".into()
}
fn timeout_ms() -> u64 {
    20_000
}

/// Tasks the reference handler knows; a producer-side case may use only these.
const REFERENCE_TASKS: [&str; 3] = ["record", "fail", "permanent"];

/// Reads and checks one case file; the error names the file.
fn load_case(path: &Path) -> Result<Case, String> {
    let name = path.display();
    let text = std::fs::read_to_string(path).map_err(|e| format!("{name}: cannot read: {e}"))?;
    let case: Case = serde_json::from_str(&text)
        .map_err(|e| format!("{name}: not a valid case ({e}); see contract/README.md"))?;
    let bad = |what: String| Err(format!("{name}: {what}; see contract/README.md"));
    if case.description.trim().is_empty() {
        return bad("\"description\" is empty".into());
    }
    if case.sides.is_empty() {
        return bad("\"sides\" names neither \"producer\" nor \"handler\"".into());
    }
    let mut labels = HashSet::new();
    let mut worker = false;
    for (n, step) in case.steps.iter().enumerate() {
        let n = n + 1;
        match step {
            Step::Produce(p) => {
                if p.jobs.is_empty() {
                    return bad(format!("step {n}: no jobs"));
                }
                if p.concurrent == 0 {
                    return bad(format!("step {n}: \"concurrent\" must be 1 or more"));
                }
                if let Some(a) = &p.accepted
                    && a.len() != p.jobs.len()
                {
                    return bad(format!(
                        "step {n}: \"accepted\" has {} entries for {} jobs",
                        a.len(),
                        p.jobs.len()
                    ));
                }
                for job in &p.jobs {
                    if !labels.insert(job.label.clone()) {
                        return bad(format!("step {n}: label {:?} used twice", job.label));
                    }
                    if job.delay_ms.is_some() && job.run_at_in_ms.is_some() {
                        return bad(format!(
                            "step {n}: job {:?} has both delay_ms and run_at_in_ms",
                            job.label
                        ));
                    }
                    if case.sides.contains(&SideKind::Producer)
                        && !REFERENCE_TASKS.contains(&job.task.as_str())
                    {
                        return bad(format!(
                            "step {n}: job {:?} has task {:?}, which only a handler adapter runs: \
                             make the case \"sides\": [\"handler\"] or use one of {REFERENCE_TASKS:?}",
                            job.label, job.task
                        ));
                    }
                }
            }
            Step::Worker(w) => {
                if worker {
                    return bad(format!("step {n}: a second worker step"));
                }
                if w.queues.is_empty() || w.concurrency == 0 || w.max_attempts == 0 {
                    return bad(format!(
                        "step {n}: a worker needs queues, concurrency and max_attempts above 0"
                    ));
                }
                worker = true;
            }
            Step::Expect(e) => {
                if !worker {
                    return bad(format!("step {n}: an expect step before the worker step"));
                }
                let named = e
                    .records
                    .iter()
                    .map(|r| &r.job)
                    .chain(e.dead.iter().map(|d| &d.job))
                    .chain(e.order.iter().flatten());
                for label in named {
                    if !labels.contains(label) {
                        return bad(format!(
                            "step {n}: job {label:?} is not produced by an earlier step"
                        ));
                    }
                }
            }
        }
    }
    Ok(case)
}

/// Every case of `dir`, by file stem, sorted; the errors name the files.
fn load_cases(dir: &Path) -> Result<Vec<(String, Case)>, Vec<String>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| vec![format!("{}: cannot list: {e}", dir.display())])?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    let (mut cases, mut errors) = (Vec::new(), Vec::new());
    for path in paths {
        let stem = path.file_stem().unwrap_or_default().to_string_lossy();
        match load_case(&path) {
            Ok(case) => cases.push((stem.into_owned(), case)),
            Err(e) => errors.push(e),
        }
    }
    if cases.is_empty() && errors.is_empty() {
        errors.push(format!("{}: no case files (*.json)", dir.display()));
    }
    if errors.is_empty() {
        Ok(cases)
    } else {
        Err(errors)
    }
}

// ---------------------------------------------------------------------------
// Producers and handlers.

/// What enqueues a case's jobs.
#[derive(Debug, Clone)]
enum Producer {
    /// The `workerpool enqueue` command line.
    Cli,
    /// A program speaking the adapter protocol's `produce` mode.
    Adapter(Program),
}

/// A program to start, with its arguments and extra environment.
#[derive(Debug, Clone)]
struct Program {
    name: String,
    argv: Vec<String>,
    env: Vec<(String, String)>,
}

impl Program {
    /// The command, run from the repository's root, without the
    /// `WORKERPOOL_*` settings of the environment the suite runs in.
    fn std_command(&self) -> std::process::Command {
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

    fn command(&self) -> Command {
        let mut cmd = Command::from(self.std_command());
        cmd.kill_on_drop(true);
        cmd
    }
}

impl Producer {
    fn name(&self) -> &str {
        match self {
            Producer::Cli => "rust",
            Producer::Adapter(p) => &p.name,
        }
    }
}

/// The directory of `workerpool` and `workerpool-worker`:
/// `$WORKERPOOL_BIN_DIR`, else the build this test belongs to (built there
/// when missing).
fn bins() -> PathBuf {
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
fn system_python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".into())
}

/// The handler producer runs are checked with.
fn reference_handler() -> Program {
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
fn sdk_env(root: &Path, script: &str) -> Result<String, String> {
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
fn adapter(root: &Path, name: &str, mode: &str) -> Result<Program, String> {
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
fn chosen_adapters() -> Vec<String> {
    match std::env::var("CONTRACT_ADAPTERS") {
        Ok(list) => list
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect(),
        Err(_) => vec!["rust".into(), "python".into(), "node".into()],
    }
}

// ---------------------------------------------------------------------------
// One run: a case with one producer and one handler, on its own Redis.

/// The Redis of one run.
enum Server {
    Plain(TestRedis),
    Tls(TestTlsRedis, bool),
    Cluster(TestRedisCluster),
}

impl Server {
    fn start(kind: RedisKind) -> Self {
        match kind {
            RedisKind::Plain => Server::Plain(TestRedis::start()),
            RedisKind::Tls => Server::Tls(TestTlsRedis::start(false), false),
            RedisKind::Mtls => Server::Tls(TestTlsRedis::start(true), true),
            RedisKind::Cluster => Server::Cluster(TestRedisCluster::start(3, 0)),
        }
    }

    fn url(&self) -> String {
        match self {
            Server::Plain(r) => r.url(),
            Server::Tls(r, _) => r.url(),
            Server::Cluster(c) => c.url(0),
        }
    }

    /// The adapter request's `tls`.
    fn tls(&self) -> Value {
        match self {
            Server::Tls(r, mutual) => {
                let path = |p: &Path| Value::from(p.display().to_string());
                json!({
                    "ca": path(&r.certs.ca),
                    "cert": if *mutual { path(&r.certs.client_cert) } else { Value::Null },
                    "key": if *mutual { path(&r.certs.client_key) } else { Value::Null },
                })
            }
            _ => Value::Null,
        }
    }

    /// The worker's and the command line's connection flags.
    fn flags(&self) -> Vec<String> {
        let mut out = vec!["--redis-url".to_string(), self.url()];
        match self {
            Server::Tls(r, mutual) => {
                out.push("--redis-ca-file".into());
                out.push(r.certs.ca.display().to_string());
                if *mutual {
                    out.push("--redis-client-cert".into());
                    out.push(r.certs.client_cert.display().to_string());
                    out.push("--redis-client-key".into());
                    out.push(r.certs.client_key.display().to_string());
                }
            }
            Server::Cluster(_) => out.extend(["--redis-mode".into(), "cluster".into()]),
            Server::Plain(_) => {}
        }
        out
    }

    async fn conn(&self) -> Conn {
        match self {
            Server::Plain(r) => Conn::Single(r.conn().await),
            Server::Tls(r, _) => Conn::Single(r.conn().await),
            Server::Cluster(c) => Conn::Cluster(c.conn().await),
        }
    }
}

/// A connection for the runner's own reads.
enum Conn {
    Single(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Conn {
    async fn query<T: redis::FromRedisValue>(&mut self, cmd: &redis::Cmd) -> Result<T, String> {
        let r = match self {
            Conn::Single(c) => cmd.query_async(c).await,
            Conn::Cluster(c) => cmd.query_async(c).await,
        };
        r.map_err(|e| format!("redis: {e}"))
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

/// A job a produce step got accepted.
#[derive(Debug, Clone)]
struct Produced {
    id: String,
    task: String,
    data: Value,
    /// Not to run before this (unix ms), for a delayed job.
    not_before: Option<u64>,
}

/// A line of the record file and when the runner first saw it.
#[derive(Debug, Clone)]
struct Seen {
    record: Value,
    at_ms: u64,
}

/// A process speaking the adapter protocol.
struct AdapterProcess {
    name: String,
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    stderr: Arc<Mutex<String>>,
}

impl AdapterProcess {
    fn start(program: &Program) -> Result<Self, String> {
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

    async fn send(&mut self, request: &Value) -> Result<(), String> {
        let line = format!("{request}\n");
        self.stdin
            .write_all(line.as_bytes())
            .await
            .map_err(|e| format!("writing to the {} adapter: {e}{}", self.name, self.said()))?;
        self.stdin.flush().await.map_err(|e| e.to_string())
    }

    /// The answer to the request sent last.
    async fn answer(&mut self) -> Result<Value, String> {
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

    fn said(&self) -> String {
        let text = self.stderr.lock().expect("stderr buffer").clone();
        if text.trim().is_empty() {
            String::new()
        } else {
            format!("; its stderr:\n{}", tail(&text, 20))
        }
    }
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// What one producer answered to one request: ids (None: a refused
/// duplicate), or the library's error.
type Answer = Result<Vec<Option<String>>, String>;

/// A producer's answer as an [`Answer`], or a protocol error.
fn parse_answer(answer: Value, jobs: usize) -> Result<Answer, String> {
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

/// The state of one run.
struct Run<'a> {
    case: &'a Case,
    producer: &'a Producer,
    handler: &'a Program,
    bins: PathBuf,
    server: Server,
    conn: Conn,
    dir: tempfile::TempDir,
    adapter: Option<AdapterProcess>,
    worker: Option<Child>,
    jobs: HashMap<String, Produced>,
    /// Payloads each queue should hold while no worker has run.
    held: BTreeMap<String, usize>,
    seen: Vec<Seen>,
}

impl Run<'_> {
    fn records_path(&self) -> PathBuf {
        self.dir.path().join("records.jsonl")
    }

    fn worker_log(&self) -> String {
        let text = std::fs::read_to_string(self.dir.path().join("worker.log")).unwrap_or_default();
        if text.trim().is_empty() {
            String::new()
        } else {
            format!("\nthe worker's last lines:\n{}", tail(&text, 25))
        }
    }

    /// The request line of a produce step, with run_at_in_ms made absolute.
    fn request(&self, p: &Produce) -> Value {
        let now = now_ms();
        let jobs: Vec<Value> = p
            .jobs
            .iter()
            .map(|j| {
                json!({
                    "task": j.task,
                    "data": j.data,
                    "id": j.id,
                    "delay_ms": j.delay_ms,
                    "run_at_ms": j.run_at_in_ms.map(|d| now + d),
                    "unique_key": j.unique_key,
                    "unique_for_s": j.unique_for_s,
                })
            })
            .collect();
        json!({
            "url": self.server.url(),
            "tls": self.server.tls(),
            "cluster": matches!(self.server, Server::Cluster(_)),
            "queue": p.queue,
            "many": p.many,
            "jobs": jobs,
        })
    }

    /// Sends `request` through `concurrent` producers at once.
    async fn produce(&mut self, request: &Value, concurrent: usize) -> Result<Vec<Answer>, String> {
        let jobs = request["jobs"].as_array().map_or(0, Vec::len);
        match self.producer.clone() {
            Producer::Cli => {
                // Each producer a thread of its own, so their commands overlap.
                let (bins, flags) = (&self.bins, self.server.flags());
                std::thread::scope(|s| {
                    let calls: Vec<_> = (0..concurrent)
                        .map(|_| s.spawn(|| cli_produce(bins, &flags, request)))
                        .collect();
                    calls
                        .into_iter()
                        .map(|c| c.join().expect("a producer thread"))
                        .collect()
                })
            }
            Producer::Adapter(program) if concurrent == 1 => {
                if self.adapter.is_none() {
                    self.adapter = Some(AdapterProcess::start(&program)?);
                }
                let a = self.adapter.as_mut().expect("started");
                a.send(request).await?;
                let answer = a.answer().await?;
                Ok(vec![
                    parse_answer(answer, jobs).map_err(|e| format!("{}{}", e, a.said()))?,
                ])
            }
            Producer::Adapter(program) => {
                let mut procs = Vec::new();
                for _ in 0..concurrent {
                    procs.push(AdapterProcess::start(&program)?);
                }
                for p in &mut procs {
                    p.send(request).await?;
                }
                let mut out = Vec::new();
                for p in &mut procs {
                    let answer = p.answer().await?;
                    out.push(parse_answer(answer, jobs)?);
                }
                Ok(out)
            }
        }
    }

    async fn produce_step(&mut self, n: usize, p: &Produce) -> Result<(), String> {
        let before: Option<u64> = match self.server {
            Server::Cluster(_) => None,
            _ => Some(self.conn.query(&redis::cmd("DBSIZE")).await?),
        };
        let request = self.request(p);
        let t0 = now_ms();
        let answers = self.produce(&request, p.concurrent).await?;
        let t1 = now_ms() + 1;
        let labels: Vec<&str> = p.jobs.iter().map(|j| j.label.as_str()).collect();
        if p.error {
            for answer in &answers {
                match answer {
                    Err(e) if !e.trim().is_empty() => {}
                    Err(_) => return Err(format!("step {n}: jobs {labels:?}: the error is empty")),
                    Ok(ids) => {
                        return Err(format!(
                            "step {n}: jobs {labels:?} must be refused with an error, the producer answered ids {ids:?}"
                        ));
                    }
                }
            }
            if let Some(before) = before {
                let after: u64 = self.conn.query(&redis::cmd("DBSIZE")).await?;
                if after != before {
                    return Err(format!(
                        "step {n}: jobs {labels:?} were refused but the database went from {before} to {after} keys"
                    ));
                }
            }
            return Ok(());
        }
        let mut all = Vec::new();
        for answer in answers {
            match answer {
                Ok(ids) => all.push(ids),
                Err(e) => {
                    return Err(format!(
                        "step {n}: jobs {labels:?}: the producer raised: {e}"
                    ));
                }
            }
        }
        let jobs = request["jobs"].as_array().expect("jobs").clone();
        let mut fresh = Vec::new();
        for (i, job) in p.jobs.iter().enumerate() {
            let want = p.accepted.as_ref().is_none_or(|a| a[i]);
            let got: Vec<&String> = all.iter().filter_map(|ids| ids[i].as_ref()).collect();
            let what = if p.concurrent > 1 {
                format!("of {} producers at once, ", p.concurrent)
            } else {
                String::new()
            };
            match (want, got.as_slice()) {
                (true, [id]) => {
                    if let Some(given) = &job.id {
                        if *id != given {
                            return Err(format!(
                                "step {n}: job {:?}: the id {given:?} was given, the producer answered {id:?}",
                                job.label
                            ));
                        }
                    } else if !is_fresh_id(id) {
                        return Err(format!(
                            "step {n}: job {:?}: the new id {id:?} is not 32 lowercase hex digits",
                            job.label
                        ));
                    }
                    let produced = Produced {
                        id: id.to_string(),
                        task: job.task.clone(),
                        data: job.data.clone(),
                        not_before: jobs[i]["run_at_ms"]
                            .as_u64()
                            .or(job.delay_ms.map(|d| t0 + d)),
                    };
                    fresh.push((job, i, produced.clone()));
                    self.jobs.insert(job.label.clone(), produced);
                    *self.held.entry(p.queue.clone()).or_default() += 1;
                }
                (false, []) => {}
                (true, _) => {
                    return Err(format!(
                        "step {n}: job {:?}: {what}exactly one must be accepted, the ids answered were {got:?}",
                        job.label
                    ));
                }
                (false, _) => {
                    return Err(format!(
                        "step {n}: job {:?}: {what}none must be accepted (its unique key is held), the ids answered were {got:?}",
                        job.label
                    ));
                }
            }
        }
        if self.worker.is_none() {
            self.check_payloads(n, p, &jobs, &fresh, t0, t1).await?;
        }
        Ok(())
    }

    /// Reads the payloads of a produce step's jobs from Redis (before any
    /// worker runs) and checks them against the contract.
    async fn check_payloads(
        &mut self,
        n: usize,
        p: &Produce,
        request_jobs: &[Value],
        fresh: &[(&CaseJob, usize, Produced)],
        t0: u64,
        t1: u64,
    ) -> Result<(), String> {
        let q = &p.queue;
        let list: Vec<String> = self
            .conn
            .query(redis::cmd("LRANGE").arg(q).arg(0).arg(-1))
            .await?;
        let scheduled: Vec<(String, f64)> = self
            .conn
            .query(
                redis::cmd("ZRANGE")
                    .arg(format!("{q}:scheduled"))
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES"),
            )
            .await?;
        let held = self.held.get(q).copied().unwrap_or(0);
        if list.len() + scheduled.len() != held {
            return Err(format!(
                "step {n}: {q} and {q}:scheduled hold {} payloads, {held} jobs were accepted: {list:?} {scheduled:?}",
                list.len() + scheduled.len()
            ));
        }
        let entries = list
            .iter()
            .map(|p| (p, None))
            .chain(scheduled.iter().map(|(p, s)| (p, Some(*s))));
        let mut by_id: HashMap<String, Vec<(Value, Option<f64>, String)>> = HashMap::new();
        for (raw, score) in entries {
            let v: Value = serde_json::from_str(raw)
                .map_err(|e| format!("step {n}: a payload on {q} is not JSON ({e}): {raw}"))?;
            let id = v["id"].as_str().unwrap_or_default().to_string();
            by_id.entry(id).or_default().push((v, score, raw.clone()));
        }
        for (job, i, produced) in fresh {
            let label = &job.label;
            let found = by_id
                .get(&produced.id)
                .map(Vec::as_slice)
                .unwrap_or_default();
            let [(payload, score, raw)] = found else {
                return Err(format!(
                    "step {n}: job {label:?}: {} payloads with the id {:?} on {q} and {q}:scheduled (one expected); they hold {list:?} {scheduled:?}",
                    found.len(),
                    produced.id
                ));
            };
            let fail = |what: String| {
                Err(format!(
                    "step {n}: job {label:?}: {what}; the payload: {raw}"
                ))
            };
            let Some(fields) = payload.as_object() else {
                return fail("the payload is not a JSON object".into());
            };
            if fields.get("task") != Some(&Value::String(job.task.clone())) {
                return fail(format!("\"task\" must be {:?}", job.task));
            }
            let data = fields.get("data").cloned().unwrap_or(Value::Null);
            if let Some(diff) = difference(&job.data, &data, "data") {
                return fail(format!("the payload's data differs: {diff}"));
            }
            match fields.get("enqueued_at").and_then(Value::as_u64) {
                Some(at) if (t0..=t1).contains(&at) => {}
                Some(at) => {
                    return fail(format!(
                        "\"enqueued_at\" {at} is outside the enqueue call ({t0}..={t1} unix ms): it must be the Redis clock during the call, as `workerpool enqueue` reads it (TIME), not an estimate from an earlier reading"
                    ));
                }
                None => return fail("\"enqueued_at\" (unix ms, an integer) is missing".into()),
            }
            let keys: Vec<&str> = fields
                .keys()
                .map(String::as_str)
                .filter(|k| *k != "run_at")
                .collect();
            if !keys.ends_with(&["id", "enqueued_at"]) {
                return fail(format!(
                    "\"id\" and \"enqueued_at\" must be the object's last two fields (\"run_at\" may follow), the fields are {:?}",
                    fields.keys().collect::<Vec<_>>()
                ));
            }
            let run_at = fields.get("run_at");
            let asked = request_jobs[*i]["run_at_ms"].as_u64();
            match (job.delay_ms, asked) {
                (None, None) => {
                    if score.is_some() || run_at.is_some() {
                        return fail(format!(
                            "a job without delay must wait on {q}, not in {q}:scheduled, without run_at"
                        ));
                    }
                }
                (Some(delay), _) => {
                    let Some(at) = run_at.and_then(Value::as_u64) else {
                        return fail("a delayed job must carry \"run_at\" (unix ms)".into());
                    };
                    if !(t0 + delay..=t1 + delay).contains(&at) {
                        return fail(format!(
                            "\"run_at\" {at} is not the enqueue call's time plus {delay} ms ({}..={})",
                            t0 + delay,
                            t1 + delay
                        ));
                    }
                    if *score != Some(at as f64) {
                        return fail(format!(
                            "a delayed job must be in {q}:scheduled scored by its run_at {at}, its score is {score:?}"
                        ));
                    }
                }
                (None, Some(asked)) => {
                    if run_at.and_then(Value::as_u64) != Some(asked) {
                        return fail(format!("\"run_at\" must be {asked}, as asked"));
                    }
                    if score.is_some_and(|s| s != asked as f64) {
                        return fail(format!(
                            "the score in {q}:scheduled must be {asked}, it is {score:?}"
                        ));
                    }
                }
            }
            if let Some(key) = &job.unique_key {
                if fields.get("unique_key").and_then(Value::as_str) != Some(key) {
                    return fail(format!("\"unique_key\" must be {key:?}"));
                }
                if let Some(s) = job.unique_for_s
                    && fields.get("unique_for").and_then(Value::as_f64) != Some(s)
                {
                    return fail(format!("\"unique_for\" must be {s}"));
                }
                let holder: Option<String> = self
                    .conn
                    .query(redis::cmd("HGET").arg(format!("{q}:unique")).arg(key))
                    .await?;
                if holder.as_deref() != Some(produced.id.as_str()) {
                    return fail(format!(
                        "{q}:unique must name the job {:?} for {key:?}, it holds {holder:?}",
                        produced.id
                    ));
                }
                let until: Option<f64> = self
                    .conn
                    .query(
                        redis::cmd("ZSCORE")
                            .arg(format!("{q}:unique:expiry"))
                            .arg(key),
                    )
                    .await?;
                let hold = (job.unique_for_s.unwrap_or(3600.0) * 1000.0) as u64;
                if !until.is_some_and(|u| (t0 + hold) as f64 <= u && u <= (t1 + hold) as f64) {
                    return fail(format!(
                        "{q}:unique:expiry must end the hold of {key:?} {hold} ms after the call ({}..={}), it says {until:?}",
                        t0 + hold,
                        t1 + hold
                    ));
                }
            }
        }
        Ok(())
    }

    fn start_worker(&mut self, w: &WorkerStep) -> Result<(), String> {
        let log = std::fs::File::create(self.dir.path().join("worker.log"))
            .map_err(|e| format!("worker log: {e}"))?;
        let mut cmd = Program {
            name: "worker".into(),
            argv: vec![self.bins.join("workerpool-worker").display().to_string()],
            env: self.handler.env.clone(),
        }
        .command();
        cmd.args(self.server.flags());
        for q in &w.queues {
            cmd.arg("--queue").arg(q);
        }
        cmd.args(["--concurrency", &w.concurrency.to_string()])
            .args(["--max-attempts", &w.max_attempts.to_string()])
            .args([
                "--backoff-base",
                &w.backoff_base,
                "--backoff-max",
                &w.backoff_max,
            ])
            .args(["--shutdown-timeout", "1s", "--worker-id", "contract"])
            .args(["--listen", &format!("127.0.0.1:{}", free_port())])
            .args(["--handler", "exec", "--"])
            .args(&self.handler.argv)
            .env("CONTRACT_RECORD", self.records_path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log);
        self.worker = Some(
            cmd.spawn()
                .map_err(|e| format!("cannot start the worker: {e}"))?,
        );
        Ok(())
    }

    /// Reads the lines of the record file the runner has not seen yet.
    fn read_records(&mut self) -> Result<(), String> {
        let text = std::fs::read_to_string(self.records_path()).unwrap_or_default();
        let now = now_ms();
        let complete = text.rfind('\n').map_or("", |end| &text[..end]);
        for line in complete.lines().skip(self.seen.len()) {
            let record: Value = serde_json::from_str(line).map_err(|e| {
                format!("the handler recorded a line that is not JSON ({e}): {line:?}")
            })?;
            self.seen.push(Seen { record, at_ms: now });
        }
        Ok(())
    }

    fn label_of(&self, id: &str) -> Option<&str> {
        self.jobs
            .iter()
            .find(|(_, j)| j.id == id)
            .map(|(l, _)| l.as_str())
    }

    async fn counter(&mut self, q: &str, name: &str) -> Result<u64, String> {
        let v: Option<u64> = self
            .conn
            .query(redis::cmd("GET").arg(format!("{q}:stats:{name}")))
            .await?;
        Ok(v.unwrap_or(0))
    }

    async fn dead_entries(&mut self, q: &str) -> Result<Vec<Value>, String> {
        let raw: Vec<String> = self
            .conn
            .query(redis::cmd("LRANGE").arg(format!("{q}:dead")).arg(0).arg(-1))
            .await?;
        raw.iter()
            .map(|r| {
                serde_json::from_str(r)
                    .map_err(|e| format!("a dead letter on {q}:dead is not JSON ({e}): {r}"))
            })
            .collect()
    }

    /// What an expect step still waits for (empty when everything is there).
    async fn missing(&mut self, e: &Expect) -> Result<Vec<String>, String> {
        self.read_records()?;
        let mut missing = Vec::new();
        let recorded: HashSet<&str> = self
            .seen
            .iter()
            .filter_map(|s| s.record["id"].as_str())
            .collect();
        for r in &e.records {
            if !recorded.contains(self.jobs[&r.job].id.as_str()) {
                missing.push(format!("a record of {:?}", r.job));
            }
        }
        let mut dead_by_queue: BTreeMap<&str, Vec<Value>> = BTreeMap::new();
        for d in &e.dead {
            if !dead_by_queue.contains_key(d.queue.as_str()) {
                dead_by_queue.insert(&d.queue, self.dead_entries(&d.queue).await?);
            }
            let id = &self.jobs[&d.job].id;
            if !dead_by_queue[d.queue.as_str()]
                .iter()
                .any(|x| x["job"]["id"] == **id)
            {
                missing.push(format!(
                    "the dead letter of {:?} on {}:dead",
                    d.job, d.queue
                ));
            }
        }
        for (kind, want) in [("processed", &e.processed), ("failed", &e.failed)] {
            for (q, n) in want {
                let got = self.counter(q, kind).await?;
                if got < *n {
                    missing.push(format!("{q}:stats:{kind} at {n} (it is {got})"));
                }
            }
        }
        Ok(missing)
    }

    async fn expect_step(&mut self, n: usize, e: &Expect) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_millis(e.timeout_ms);
        loop {
            let missing = self.missing(e).await?;
            if missing.is_empty() {
                break;
            }
            if let Some(Ok(Some(status))) = self.worker.as_mut().map(Child::try_wait) {
                return Err(format!(
                    "step {n}: the worker exited ({status}) while waiting for {missing:?}{}",
                    self.worker_log()
                ));
            }
            if Instant::now() > deadline {
                let seen: Vec<String> = self
                    .seen
                    .iter()
                    .map(|s| {
                        let id = s.record["id"].as_str().unwrap_or_default();
                        format!("{} {}", self.label_of(id).unwrap_or("?"), s.record)
                    })
                    .collect();
                return Err(format!(
                    "step {n}: after {} ms still no {}; records seen: {seen:#?}{}",
                    e.timeout_ms,
                    missing.join(", "),
                    self.worker_log()
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.check_records(n, e)?;
        for d in &e.dead {
            self.check_dead(n, d).await?;
        }
        for (kind, want) in [("processed", &e.processed), ("failed", &e.failed)] {
            for (q, want) in want {
                let got = self.counter(q, kind).await?;
                if got != *want {
                    return Err(format!(
                        "step {n}: {q}:stats:{kind} is {got}, {want} expected"
                    ));
                }
            }
        }
        Ok(())
    }

    fn check_records(&self, n: usize, e: &Expect) -> Result<(), String> {
        let wanted: HashMap<&str, u64> = e
            .records
            .iter()
            .map(|r| (r.job.as_str(), r.attempt))
            .collect();
        let mut first: HashMap<&str, usize> = HashMap::new();
        for (pos, seen) in self.seen.iter().enumerate() {
            let r = &seen.record;
            let fail = |what: String| Err(format!("step {n}: the handler's record {r}: {what}"));
            let Some(id) = r["id"].as_str() else {
                return fail("no \"id\" string".into());
            };
            let Some(label) = self.label_of(id) else {
                return fail(format!("the id {id:?} is no accepted job's"));
            };
            let job = &self.jobs[label];
            let Some(attempt) = wanted.get(label) else {
                return fail(format!("job {label:?} must not have run (yet)"));
            };
            if first.insert(label, pos).is_some() {
                return fail(format!("job {label:?} was recorded twice"));
            }
            if r["attempt"].as_u64() != Some(*attempt) {
                return fail(format!("job {label:?}: \"attempt\" must be {attempt}"));
            }
            if r["task"].as_str() != Some(job.task.as_str()) {
                return fail(format!("job {label:?}: \"task\" must be {:?}", job.task));
            }
            let data = r.get("data").cloned().unwrap_or(Value::Null);
            if let Some(diff) = difference(&job.data, &data, "data") {
                return fail(format!(
                    "job {label:?}: the data differs from what was enqueued: {diff}"
                ));
            }
            if let Some(at) = job.not_before
                && seen.at_ms < at
            {
                return fail(format!(
                    "job {label:?} ran before its time: recorded by {} unix ms, {} ms before {at}",
                    seen.at_ms,
                    at - seen.at_ms
                ));
            }
        }
        for pair in e.order.windows(2) {
            for a in &pair[0] {
                for b in &pair[1] {
                    if first[a.as_str()] > first[b.as_str()] {
                        return Err(format!(
                            "step {n}: job {a:?} must run before job {b:?}, it ran after; the records in order: {:?}",
                            self.seen
                                .iter()
                                .map(|s| self
                                    .label_of(s.record["id"].as_str().unwrap_or_default())
                                    .unwrap_or("?"))
                                .collect::<Vec<_>>()
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    async fn check_dead(&mut self, n: usize, d: &DeadExpect) -> Result<(), String> {
        let job = self.jobs[&d.job].clone();
        let entries = self.dead_entries(&d.queue).await?;
        let entry = entries
            .iter()
            .find(|x| x["job"]["id"] == *job.id)
            .expect("waited for");
        let fail = |what: String| {
            Err(format!(
                "step {n}: the dead letter of {:?}: {what}; it is {entry}",
                d.job
            ))
        };
        if entry["reason"] != *d.reason {
            return fail(format!("\"reason\" must be {:?}", d.reason));
        }
        if entry["attempts"].as_u64() != Some(d.attempts) {
            return fail(format!("\"attempts\" must be {}", d.attempts));
        }
        if !entry["error"]
            .as_str()
            .is_some_and(|e| e.contains(&d.error_contains))
        {
            return fail(format!("\"error\" must contain {:?}", d.error_contains));
        }
        if !entry["died_at"].is_u64() || !entry["worker"].is_string() {
            return fail("\"died_at\" (unix ms) and \"worker\" must be set".into());
        }
        if entry["job"]["task"] != *job.task {
            return fail(format!("the job's task must be {:?}", job.task));
        }
        let data = entry["job"].get("data").cloned().unwrap_or(Value::Null);
        if let Some(diff) = difference(&job.data, &data, "data") {
            return fail(format!("the job's data differs: {diff}"));
        }
        Ok(())
    }

    async fn steps(&mut self) -> Result<(), String> {
        let steps = self.case.steps.clone();
        for (i, step) in steps.iter().enumerate() {
            match step {
                Step::Produce(p) => self.produce_step(i + 1, p).await?,
                Step::Worker(w) => self.start_worker(w)?,
                Step::Expect(e) => self.expect_step(i + 1, e).await?,
            }
        }
        Ok(())
    }
}

/// The CLI's answer to one adapter request: one `workerpool enqueue` per
/// job, or one for all of them when `many`.
fn cli_produce(bins: &Path, flags: &[String], request: &Value) -> Result<Answer, String> {
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
            let n = if s.fract() == 0.0 && s >= 0.0 {
                Value::from(s as u64)
            } else {
                Value::from(s)
            };
            fields.insert("unique_for".into(), n);
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

fn is_fresh_id(id: &str) -> bool {
    id.len() == 32
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Where `got` differs from `want` as JSON values (numbers by value, objects
/// whatever their key order), or None.
fn difference(want: &Value, got: &Value, path: &str) -> Option<String> {
    let show = |v: &Value| {
        let s = v.to_string();
        if s.len() > 120 {
            let start: String = s.chars().take(100).collect();
            format!("{start}… ({} bytes)", s.len())
        } else {
            s
        }
    };
    let differs = || {
        Some(format!(
            "at {path}: {} instead of {}",
            show(got),
            show(want)
        ))
    };
    match (want, got) {
        (Value::Number(a), Value::Number(b)) => {
            let same = match (a.as_i64(), b.as_i64(), a.as_u64(), b.as_u64()) {
                (Some(x), Some(y), _, _) => x == y,
                (_, _, Some(x), Some(y)) => x == y,
                _ => a.as_f64() == b.as_f64(),
            };
            if same { None } else { differs() }
        }
        (Value::Array(a), Value::Array(b)) => {
            if a.len() != b.len() {
                return Some(format!(
                    "at {path}: {} items instead of {}",
                    b.len(),
                    a.len()
                ));
            }
            a.iter()
                .zip(b)
                .enumerate()
                .find_map(|(i, (x, y))| difference(x, y, &format!("{path}[{i}]")))
        }
        (Value::Object(a), Value::Object(b)) => {
            let (ka, kb): (HashSet<&String>, HashSet<&String>) =
                (a.keys().collect(), b.keys().collect());
            if ka != kb {
                return Some(format!(
                    "at {path}: keys {:?} instead of {:?}",
                    b.keys().collect::<Vec<_>>(),
                    a.keys().collect::<Vec<_>>()
                ));
            }
            a.iter()
                .find_map(|(k, x)| difference(x, &b[k], &format!("{path}.{k}")))
        }
        (a, b) if a == b => None,
        _ => differs(),
    }
}

/// Runs one case with one producer and one handler; the error says what
/// differed.
fn run_case(case: &Case, producer: &Producer, handler: &Program) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let server = Server::start(case.redis);
        let conn = server.conn().await;
        let mut run = Run {
            case,
            producer,
            handler,
            bins: bins(),
            server,
            conn,
            dir: tempfile::tempdir().map_err(|e| e.to_string())?,
            adapter: None,
            worker: None,
            jobs: HashMap::new(),
            held: BTreeMap::new(),
            seen: Vec::new(),
        };
        let result = run.steps().await;
        if let Some(mut w) = run.worker.take() {
            let _ = w.kill().await;
        }
        result
    })
}

/// One entry of the matrix: a case, a producer and a handler.
struct Entry {
    case: String,
    producer: Producer,
    handler: Program,
}

/// Runs `entries` on `threads` threads; the failures, each naming its case,
/// producer and handler.
fn run_all(cases: &HashMap<String, Case>, entries: Vec<Entry>, threads: usize) -> Vec<String> {
    let queue = Arc::new(Mutex::new(entries));
    let failures = Arc::new(Mutex::new(Vec::new()));
    std::thread::scope(|s| {
        for _ in 0..threads {
            let (queue, failures) = (queue.clone(), failures.clone());
            s.spawn(move || {
                loop {
                    let Some(entry) = queue.lock().expect("queue").pop() else {
                        return;
                    };
                    let started = Instant::now();
                    // A helper that panics (a Redis that would not start) fails
                    // this run only, named like any other failure.
                    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        run_case(&cases[&entry.case], &entry.producer, &entry.handler)
                    }))
                    .unwrap_or_else(|panic| {
                        let said = panic
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_default();
                        Err(format!("panicked: {said}"))
                    });
                    let name = format!(
                        "case {} (producer {}, handler {})",
                        entry.case,
                        entry.producer.name(),
                        entry.handler.name
                    );
                    let line = format!("{name}: {:.1} s", started.elapsed().as_secs_f64());
                    let _ = writeln!(std::io::stderr(), "{line}");
                    if let Err(e) = result {
                        failures
                            .lock()
                            .expect("failures")
                            .push(format!("{name}: {e}"));
                    }
                }
            });
        }
    });
    let mut out = failures.lock().expect("failures").clone();
    out.sort();
    out
}

fn cases_dir() -> PathBuf {
    root().join("contract/cases")
}

fn cases_by_name() -> HashMap<String, Case> {
    match load_cases(&cases_dir()) {
        Ok(cases) => cases.into_iter().collect(),
        Err(errors) => panic!("case files that do not load:\n{}", errors.join("\n")),
    }
}

// ---------------------------------------------------------------------------
// The suite.

#[test]
fn every_case_holds_for_every_producer_and_handler() {
    let cases = cases_by_name();
    let mut names: Vec<&String> = cases.keys().collect();
    names.sort();
    let mut problems = Vec::new();
    let mut producers = Vec::new();
    let mut handlers = Vec::new();
    for name in chosen_adapters() {
        if name == "rust" {
            producers.push(Producer::Cli);
            continue;
        }
        match (
            adapter(&root(), &name, "produce"),
            adapter(&root(), &name, "handle"),
        ) {
            (Ok(p), Ok(h)) => {
                producers.push(Producer::Adapter(p));
                handlers.push(h);
            }
            (Err(e), _) | (_, Err(e)) => problems.push(e),
        }
    }
    let mut entries = Vec::new();
    for name in &names {
        let case = &cases[*name];
        if case.sides.contains(&SideKind::Producer) {
            for p in &producers {
                entries.push(Entry {
                    case: name.to_string(),
                    producer: p.clone(),
                    handler: reference_handler(),
                });
            }
        }
        if case.sides.contains(&SideKind::Handler) {
            for h in &handlers {
                entries.push(Entry {
                    case: name.to_string(),
                    producer: Producer::Cli,
                    handler: h.clone(),
                });
            }
        }
    }
    // Longest first (clusters, TLS, waits), so the threads finish together.
    entries.sort_by_key(|e| {
        let case = &cases[&e.case];
        (case.redis == RedisKind::Plain, e.case.contains("delay"))
    });
    entries.reverse();
    let runs = entries.len();
    problems.extend(run_all(&cases, entries, 3));
    assert!(
        problems.is_empty(),
        "{} of {runs} runs failed or could not start:\n\n{}",
        problems.len(),
        problems.join("\n\n")
    );
}

// ---------------------------------------------------------------------------
// Self-checks: the runner catches what it is there to catch.

#[test]
fn a_case_file_that_does_not_parse_is_named() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("broken.json"),
        "{\"description\": \"x\", \"steps\": [",
    )
    .expect("write");
    std::fs::write(
        dir.path().join("typo.json"),
        r#"{"description": "x", "sides": ["producer"], "steps": [{"produce": {"queue": "q", "jobz": []}}]}"#,
    )
    .expect("write");
    std::fs::write(
        dir.path().join("unknown_label.json"),
        r#"{"description": "x", "sides": ["producer"], "steps": [
            {"produce": {"queue": "q", "jobs": [{"label": "a", "task": "record"}]}},
            {"worker": {"queues": ["q"]}},
            {"expect": {"records": [{"job": "b"}]}}]}"#,
    )
    .expect("write");
    let errors = load_cases(dir.path()).expect_err("the cases must not load");
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert!(
        errors[0].contains("broken.json") && errors[0].contains("EOF"),
        "{errors:?}"
    );
    assert!(
        errors[1].contains("typo.json") && errors[1].contains("jobz"),
        "{errors:?}"
    );
    assert!(
        errors[2].contains("unknown_label.json") && errors[2].contains("\"b\" is not produced"),
        "{errors:?}"
    );
    // The suite's own cases all load.
    assert!(
        load_cases(&cases_dir()).is_ok(),
        "{:?}",
        load_cases(&cases_dir()).err()
    );
}

/// A producer adapter in Python's standard library that enqueues through
/// `workerpool enqueue`, passing on neither `unique_key` nor `delay_ms`,
/// and misbehaves further as `FAKE_MODE` says: `wrong-id`
/// answers an id it did not enqueue, `mangle` loses non-ASCII text.
const FAKE_PRODUCER: &str = r#"
import json, os, subprocess, sys
mode = os.environ["FAKE_MODE"]
cli = os.path.join(os.environ["FAKE_BINS"], "workerpool")
def mangle(v):
    if isinstance(v, str): return v.encode("ascii", "replace").decode()
    if isinstance(v, list): return [mangle(x) for x in v]
    if isinstance(v, dict): return {mangle(k): mangle(x) for k, x in v.items()}
    return v
for line in sys.stdin:
    req = json.loads(line)
    ids = []
    for job in req["jobs"]:
        fields = {"task": job["task"], "data": mangle(job["data"]) if mode == "mangle" else job["data"]}
        if job["id"] is not None: fields["id"] = job["id"]
        out = subprocess.run([cli, "enqueue", "--redis-url", req["url"], "--queue", req["queue"],
                              json.dumps(fields)], capture_output=True, text=True, check=True)
        ids.append(out.stdout.strip())
    if mode == "wrong-id": ids = ["0123456789abcdef0123456789abcdef" if i == ids[-1] else i for i in ids]
    print(json.dumps({"ids": ids}), flush=True)
"#;

/// A handler adapter that rounds every number with a fraction to 6 places,
/// as a client that parsed floats lossily would.
const FAKE_HANDLER: &str = r#"
import json, os, sys
for line in sys.stdin:
    job = json.loads(line, parse_float=lambda s: round(float(s), 6))
    with open(os.environ["CONTRACT_RECORD"], "a") as f:
        f.write(json.dumps({"id": job["id"], "attempt": job["attempt"], "task": job["task"], "data": job.get("data")}) + "\n")
    print(json.dumps({"ok": True}), flush=True)
"#;

fn fake(dir: &Path, name: &str, script: &str, mode: &str) -> Program {
    let path = dir.join(format!("{name}.py"));
    std::fs::write(&path, script).expect("write the fake adapter");
    Program {
        name: name.into(),
        argv: vec![system_python(), path.display().to_string()],
        env: vec![
            ("FAKE_MODE".into(), mode.into()),
            ("FAKE_BINS".into(), bins().display().to_string()),
        ],
    }
}

#[test]
fn a_producer_that_answers_a_wrong_id_is_caught() {
    let dir = tempfile::tempdir().expect("temp dir");
    let producer = Producer::Adapter(fake(dir.path(), "wrong-id", FAKE_PRODUCER, "wrong-id"));
    let cases = cases_by_name();
    let err = run_case(&cases["ids_and_envelope"], &producer, &reference_handler())
        .expect_err("a wrong id must fail the case");
    assert!(
        err.contains("\"no-data\"")
            && err.contains("0 payloads with the id \"0123456789abcdef0123456789abcdef\""),
        "{err}"
    );
}

#[test]
fn a_producer_that_mangles_data_is_caught() {
    let dir = tempfile::tempdir().expect("temp dir");
    let producer = Producer::Adapter(fake(dir.path(), "mangler", FAKE_PRODUCER, "mangle"));
    let cases = cases_by_name();
    let err = run_case(&cases["payload_unicode"], &producer, &reference_handler())
        .expect_err("mangled text must fail the case");
    assert!(
        err.contains("job \"scripts\"")
            && err.contains(
                "the payload's data differs: at data.fr: \"d?j? vu\" instead of \"déjà vu\""
            ),
        "{err}"
    );
}

#[test]
fn a_handler_that_mangles_data_is_caught() {
    let dir = tempfile::tempdir().expect("temp dir");
    let handler = fake(dir.path(), "rounder", FAKE_HANDLER, "");
    let cases = cases_by_name();
    let err = run_case(&cases["payload_numbers"], &Producer::Cli, &handler)
        .expect_err("rounded floats must fail the case");
    assert!(
        err.contains("job \"floats\": the data differs from what was enqueued: at data.pi: 3.141593 instead of 3.141592653589793"),
        "{err}"
    );
}

#[test]
fn a_missing_adapter_names_what_to_run() {
    let empty = tempfile::tempdir().expect("temp dir");
    let python = adapter(empty.path(), "python", "produce").expect_err("no adapter there");
    assert!(
        python.contains("contract/adapters/python_adapter.py is missing"),
        "{python}"
    );
    std::fs::create_dir_all(empty.path().join("contract/adapters")).expect("mkdir");
    std::fs::write(empty.path().join("contract/adapters/node_adapter.mjs"), "").expect("write");
    let node = adapter(empty.path(), "node", "produce").expect_err("no environment there");
    assert!(node.contains("run scripts/sdk-env-node.sh"), "{node}");
    let other = adapter(empty.path(), "ruby", "produce").expect_err("unknown");
    assert!(
        other.contains("known: rust, python, node") && other.contains("set CONTRACT_ADAPTER_RUBY"),
        "{other}"
    );
}

#[test]
fn a_producer_that_ignores_unique_keys_is_caught() {
    let dir = tempfile::tempdir().expect("temp dir");
    // The fake producer passes neither unique_key nor delay_ms on.
    let producer = Producer::Adapter(fake(dir.path(), "careless", FAKE_PRODUCER, "careless"));
    let cases = cases_by_name();
    let err = run_case(&cases["unique_concurrent"], &producer, &reference_handler())
        .expect_err("four accepted duplicates must fail the case");
    assert!(
        err.contains("job \"first\": of 4 producers at once, exactly one must be accepted"),
        "{err}"
    );
}

#[test]
fn a_producer_that_ignores_delays_is_caught() {
    let dir = tempfile::tempdir().expect("temp dir");
    let producer = Producer::Adapter(fake(dir.path(), "careless", FAKE_PRODUCER, "careless"));
    let cases = cases_by_name();
    let err = run_case(&cases["delayed"], &producer, &reference_handler())
        .expect_err("a job run at once must fail the case");
    assert!(
        err.contains("job \"delayed\": a delayed job must carry \"run_at\""),
        "{err}"
    );
}
