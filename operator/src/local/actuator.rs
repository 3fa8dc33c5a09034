//! The process actuator: a pool's workers as `workerpool-worker` processes
//! on this machine, started and stopped the way the kubelet and a ReplicaSet
//! treat pods.
//!
//! - Each worker has a slot number and the worker id `<pool>-<n>`.
//! - A worker that exits on its own is restarted under the same id, as the
//!   kubelet restarts a container in the same pod, with a growing delay when
//!   it keeps exiting (CrashLoopBackOff). The same id lets the new process
//!   return its predecessor's unfinished jobs at once.
//! - Scale-down picks the workers with the fewest jobs in flight (newest
//!   first among equals), as the operator's pod-deletion-cost makes the
//!   ReplicaSet do, sends SIGTERM, and SIGKILLs the process group only if it
//!   is still alive after the grace period.
//! - Each worker runs in its own process group, so a Ctrl-C in the terminal
//!   reaches local mode alone, which then stops the workers in order.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Container;
use rustix::process::{Pid, Signal};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use workerpool_queue::snapshot::WorkerActivity;

use crate::crd::WorkerPool;
use crate::deployment::worker_settings;

/// A worker that ran at least this long before exiting starts its restart
/// delays over.
const HEALTHY_RUN: Duration = Duration::from_secs(10);
/// The longest delay before restarting a worker that keeps exiting.
const MAX_RESTART_DELAY: Duration = Duration::from_secs(30);

/// How to start one worker process of a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerCommand {
    /// The pool's name; worker ids are `<pool>-<n>`.
    pub pool: String,
    /// The `workerpool-worker` executable.
    pub program: PathBuf,
    /// The worker container's `args`.
    pub args: Vec<String>,
    /// Environment: the container's plain `env` values, then the settings the
    /// operator injects into the Deployment (same names, same precedence).
    pub env: Vec<(String, String)>,
}

impl WorkerCommand {
    /// The command for `pool`'s worker container, with `redis_url` as the
    /// queue's Redis. Also returns notes about what local mode leaves out.
    pub fn for_pool(
        pool: &WorkerPool,
        container: &Container,
        program: PathBuf,
        redis_url: &str,
        tls: &workerpool_queue::connection::Tls,
    ) -> (Self, Vec<String>) {
        let spec = &pool.spec;
        let mut notes = Vec::new();
        let field = format!("spec.template.spec.containers[{:?}]", container.name);
        if let Some(command) = &container.command {
            notes.push(format!(
                "{field}.command {command:?} is not used locally: the worker runs as {}",
                program.display()
            ));
        }
        if container.env_from.as_ref().is_some_and(|e| !e.is_empty()) {
            notes.push(format!(
                "{field}.envFrom is not resolved locally: those variables are not set"
            ));
        }
        let containers = spec
            .template
            .spec
            .as_ref()
            .map(|s| s.containers.as_slice())
            .unwrap_or_default();
        if spec.disruption.is_some() {
            notes.push(
                "spec.disruption is not used locally: there are no nodes to protect workers from"
                    .to_string(),
            );
        }
        for other in containers.iter().filter(|c| c.name != container.name) {
            notes.push(format!(
                "container {:?} is not run locally: only the worker is",
                other.name
            ));
        }
        let mut env: Vec<(String, String)> = Vec::new();
        for var in container.env.iter().flatten() {
            if var.name == workerpool_settings::INSTANCE_FILE {
                // Two local runs of one pool give their workers the same
                // ids, and a file on this machine is not private to one
                // of them as a Pod's own volume is: an earlier process's
                // jobs wait for its heartbeat to go stale, as the worker
                // does without the file.
                notes.push(format!(
                    "{field}.env {:?} is not set locally: a restarted local worker takes back its \
                     earlier process's jobs once that one's heartbeat is stale",
                    var.name
                ));
            } else if var.value_from.is_some() {
                notes.push(format!(
                    "{field}.env {:?} uses valueFrom, which local mode cannot resolve: not set",
                    var.name
                ));
            } else {
                env.push((var.name.clone(), var.value.clone().unwrap_or_default()));
            }
        }
        // Any free port: several workers share this machine.
        let listen = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        let ours = worker_settings(pool, Some(redis_url.to_string()), tls.clone(), listen).to_env();
        env.retain(|(name, _)| !ours.iter().any(|(o, _)| o == name));
        env.extend(ours.into_iter().map(|(k, v)| (k.to_string(), v)));
        // spec.tracing as in the cluster, but what only the kubelet
        // resolves: a Secret's headers, the pod's name.
        for var in crate::deployment::tracing_env(pool) {
            if env.iter().any(|(name, _)| *name == var.name) {
                continue;
            }
            match var.value {
                Some(value) => {
                    let value = match value.split_once(",k8s.pod.name=") {
                        Some((before, _)) => before.to_string(),
                        None => value,
                    };
                    env.push((var.name, value));
                }
                None => notes.push(format!(
                    "spec.tracing: {} comes from a Secret, which local mode does not read: not set",
                    var.name
                )),
            }
        }
        if pool.spec.tracing.as_ref().is_some_and(|t| t.tls.is_some()) {
            notes.push(
                "spec.tracing.tls: its certificates are in Secrets, which local mode does not read: \
                 name files on this machine in the worker container's env \
                 (OTEL_EXPORTER_OTLP_CERTIFICATE, _CLIENT_CERTIFICATE, _CLIENT_KEY)"
                    .into(),
            );
        }
        let command = WorkerCommand {
            pool: pool.metadata.name.clone().unwrap_or_default(),
            program,
            args: container.args.clone().unwrap_or_default(),
            env,
        };
        (command, notes)
    }

    /// The worker id of slot `n`.
    pub fn worker_id(&self, n: u32) -> String {
        format!("{}-{n}", self.pool)
    }
}

/// Something the actuator did or saw, for the view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A worker process started.
    Started {
        /// Worker id.
        id: String,
        /// Process id.
        pid: u32,
    },
    /// A worker process could not be started.
    StartFailed {
        /// Worker id.
        id: String,
        /// Why.
        error: String,
    },
    /// SIGTERM sent to a worker.
    Stopping {
        /// Worker id.
        id: String,
        /// Its jobs in flight when it was picked.
        in_flight: u64,
    },
    /// A worker outlived the grace period: SIGKILL sent.
    Killed {
        /// Worker id.
        id: String,
        /// The grace period.
        grace: Duration,
    },
    /// A worker process exited.
    Exited {
        /// Worker id.
        id: String,
        /// How it ended.
        status: String,
        /// When it will be started again (None: it was being stopped).
        restart_in: Option<Duration>,
    },
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Started { id, pid } => write!(f, "started {id} (pid {pid})"),
            Event::StartFailed { id, error } => write!(f, "cannot start {id}: {error}"),
            Event::Stopping { id, in_flight } => {
                write!(f, "stopping {id}: SIGTERM ({in_flight} jobs in flight)")
            }
            Event::Killed { id, grace } => write!(
                f,
                "{id} still running after the {}s grace period: SIGKILL",
                grace.as_secs()
            ),
            Event::Exited {
                id,
                status,
                restart_in: None,
            } => write!(f, "{id} stopped ({status})"),
            Event::Exited {
                id,
                status,
                restart_in: Some(delay),
            } => write!(
                f,
                "{id} exited ({status}); restarting in {:.0}s",
                delay.as_secs_f64()
            ),
        }
    }
}

/// One line a worker wrote to stdout or stderr.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// Worker id.
    pub id: String,
    /// The line, without its newline.
    pub line: String,
}

#[derive(Debug)]
struct Process {
    child: Child,
    started: Instant,
}

#[derive(Debug, Default)]
struct Slot {
    process: Option<Process>,
    restarts: u32,
    restart_at: Option<Instant>,
}

#[derive(Debug)]
struct Draining {
    id: String,
    process: Process,
    deadline: Instant,
    killed: bool,
}

/// The worker processes of one pool.
#[derive(Debug)]
pub struct Actuator {
    command: WorkerCommand,
    grace: Duration,
    slots: BTreeMap<u32, Slot>,
    draining: Vec<Draining>,
    logs: mpsc::UnboundedSender<LogLine>,
}

impl Actuator {
    /// An actuator with no workers yet; worker output goes to `logs`.
    pub fn new(
        command: WorkerCommand,
        grace: Duration,
        logs: mpsc::UnboundedSender<LogLine>,
    ) -> Self {
        Self {
            command,
            grace,
            slots: BTreeMap::new(),
            draining: Vec::new(),
            logs,
        }
    }

    /// Workers the pool should have (the Deployment's replicas).
    pub fn replicas(&self) -> usize {
        self.slots.len()
    }

    /// Worker processes alive and not stopping.
    pub fn running(&self) -> usize {
        self.slots.values().filter(|s| s.process.is_some()).count()
    }

    /// Worker processes stopping after SIGTERM.
    pub fn draining(&self) -> usize {
        self.draining.len()
    }

    /// Ids of the workers alive and not stopping.
    pub fn running_ids(&self) -> Vec<String> {
        self.slots
            .iter()
            .filter(|(_, s)| s.process.is_some())
            .map(|(n, _)| self.command.worker_id(*n))
            .collect()
    }

    /// True when no worker process is left.
    pub fn is_empty(&self) -> bool {
        self.running() == 0 && self.draining.is_empty()
    }

    /// Starts or stops workers until the pool has `n`. `activity` maps the
    /// live workers' ids to what they are doing; the least busy stop first.
    pub fn scale_to(
        &mut self,
        n: usize,
        activity: &BTreeMap<String, WorkerActivity>,
        now: Instant,
    ) -> Vec<Event> {
        let in_flight = |id: &str| activity.get(id).map_or(0, |a| a.in_flight);
        let mut events = Vec::new();
        while self.slots.len() < n {
            let slot = self.free_slot();
            let mut entry = Slot::default();
            events.push(self.start(slot, &mut entry, now));
            self.slots.insert(slot, entry);
        }
        while self.slots.len() > n {
            let victim = self
                .slots
                .iter()
                .min_by_key(|(n, s)| {
                    let busy = in_flight(&self.command.worker_id(**n));
                    // Not running at all first, then the least busy, then the newest.
                    let started = s.process.as_ref().map(|p| p.started);
                    (
                        s.process.is_some(),
                        busy,
                        std::cmp::Reverse(started),
                        std::cmp::Reverse(**n),
                    )
                })
                .map(|(n, _)| *n);
            let Some(victim) = victim else { break };
            let Some(slot) = self.slots.remove(&victim) else {
                break;
            };
            let id = self.command.worker_id(victim);
            if let Some(process) = slot.process {
                let busy = in_flight(&id);
                events.push(self.terminate(id, process, now, busy));
            }
        }
        events
    }

    /// Notices exits, restarts workers that exited on their own (after their
    /// delay) and SIGKILLs stopping workers past the grace period.
    pub fn poll(&mut self, now: Instant) -> Vec<Event> {
        let mut events = Vec::new();
        let mut slots = std::mem::take(&mut self.slots);
        for (n, slot) in &mut slots {
            let id = self.command.worker_id(*n);
            if let Some(process) = &mut slot.process {
                let Some(status) = exit_status(&mut process.child) else {
                    continue;
                };
                if now.duration_since(process.started) >= HEALTHY_RUN {
                    slot.restarts = 0;
                }
                let delay = restart_delay(slot.restarts);
                slot.restarts = slot.restarts.saturating_add(1);
                slot.process = None;
                slot.restart_at = Some(now + delay);
                events.push(Event::Exited {
                    id,
                    status,
                    restart_in: Some(delay),
                });
            } else if slot.restart_at.is_none_or(|at| at <= now) {
                events.push(self.start(*n, slot, now));
            }
        }
        self.slots = slots;
        let mut still = Vec::new();
        for mut d in std::mem::take(&mut self.draining) {
            if let Some(status) = exit_status(&mut d.process.child) {
                events.push(Event::Exited {
                    id: d.id,
                    status,
                    restart_in: None,
                });
                continue;
            }
            if now >= d.deadline && !d.killed {
                d.killed = true;
                signal_group(&d.process.child, Signal::KILL);
                events.push(Event::Killed {
                    id: d.id.clone(),
                    grace: self.grace,
                });
            }
            still.push(d);
        }
        self.draining = still;
        events
    }

    /// SIGTERM to every worker: the pool is going away.
    pub fn stop_all(
        &mut self,
        activity: &BTreeMap<String, WorkerActivity>,
        now: Instant,
    ) -> Vec<Event> {
        self.scale_to(0, activity, now)
    }

    /// A second SIGTERM to every stopping worker, which makes it return its
    /// unfinished jobs to the queue at once instead of waiting for them.
    pub fn hurry(&self) {
        for d in &self.draining {
            signal(&d.process.child, Signal::TERM);
        }
    }

    fn free_slot(&self) -> u32 {
        // A stopping worker's id is not reused: a new process under that id
        // would take back the jobs the stopping one is still finishing.
        (1..)
            .find(|n| {
                let id = self.command.worker_id(*n);
                !self.slots.contains_key(n) && !self.draining.iter().any(|d| d.id == id)
            })
            .unwrap_or(u32::MAX)
    }

    fn start(&self, n: u32, slot: &mut Slot, now: Instant) -> Event {
        let id = self.command.worker_id(n);
        let mut cmd = Command::new(&self.command.program);
        cmd.args(&self.command.args);
        // Only what the manifest says reaches the worker, as in a pod.
        for (name, _) in std::env::vars_os() {
            if name
                .to_string_lossy()
                .starts_with(workerpool_settings::PREFIX)
            {
                cmd.env_remove(name);
            }
        }
        cmd.envs(self.command.env.iter().map(|(k, v)| (k, v)))
            .env(workerpool_settings::WORKER_ID, &id)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        match cmd.spawn() {
            Ok(mut child) => {
                if let Some(out) = child.stdout.take() {
                    forward(out, id.clone(), self.logs.clone());
                }
                if let Some(err) = child.stderr.take() {
                    forward(err, id.clone(), self.logs.clone());
                }
                let pid = child.id().unwrap_or(0);
                slot.process = Some(Process {
                    child,
                    started: now,
                });
                slot.restart_at = None;
                Event::Started { id, pid }
            }
            Err(e) => {
                let delay = restart_delay(slot.restarts.max(1));
                slot.restarts = slot.restarts.saturating_add(1);
                slot.restart_at = Some(now + delay);
                Event::StartFailed {
                    id,
                    error: format!("{}: {e}", self.command.program.display()),
                }
            }
        }
    }

    fn terminate(&mut self, id: String, process: Process, now: Instant, busy: u64) -> Event {
        signal(&process.child, Signal::TERM);
        self.draining.push(Draining {
            id: id.clone(),
            process,
            deadline: now + self.grace,
            killed: false,
        });
        Event::Stopping {
            id,
            in_flight: busy,
        }
    }
}

/// The delay before the next start of a worker that exited `restarts` times
/// in a row: at once the first time, then 1 s doubling up to 30 s.
fn restart_delay(restarts: u32) -> Duration {
    match restarts {
        0 => Duration::ZERO,
        n => Duration::from_secs(1u64 << (n - 1).min(5)).min(MAX_RESTART_DELAY),
    }
}

fn exit_status(child: &mut Child) -> Option<String> {
    match child.try_wait() {
        Ok(Some(status)) => Some(describe(status)),
        Ok(None) => None,
        Err(e) => Some(format!("cannot wait for it: {e}")),
    }
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(9)) => "killed by SIGKILL".into(),
        (None, Some(15)) => "killed by SIGTERM".into(),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        (None, None) => status.to_string(),
    }
}

fn pid_of(child: &Child) -> Option<Pid> {
    // `id()` is None once the child has been reaped, so a recycled pid is
    // never signalled.
    child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .and_then(Pid::from_raw)
}

fn signal(child: &Child, sig: Signal) {
    if let Some(pid) = pid_of(child) {
        let _ = rustix::process::kill_process(pid, sig);
    }
}

/// Signals the worker's process group, as the kubelet's SIGKILL ends every
/// process of a container. Its exec handlers and their keeper lead groups
/// of their own; the keeper kills the handlers' groups once the worker is
/// gone, and then exits.
fn signal_group(child: &Child, sig: Signal) {
    if let Some(pid) = pid_of(child) {
        let _ = rustix::process::kill_process_group(pid, sig);
    }
}

fn forward(
    stream: impl AsyncRead + Unpin + Send + 'static,
    id: String,
    logs: mpsc::UnboundedSender<LogLine>,
) {
    tokio::spawn(async move {
        let mut lines = BufReader::new(stream).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if logs
                .send(LogLine {
                    id: id.clone(),
                    line,
                })
                .is_err()
            {
                break;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(yaml: &str) -> WorkerPool {
        super::super::manifest::parse(yaml, None).expect("valid manifest")
    }

    const POOL: &str = r#"
apiVersion: workerpool.dev/v1alpha1
kind: WorkerPool
metadata: {name: mail, uid: "00000000-0000-0000-0000-000000000000"}
spec:
  queue: {redis: {url: "redis://cluster-redis:6379/0", keys: [high, low]}}
  template:
    spec:
      containers:
      - name: worker
        image: example/worker:1
        args: ["--", "python3", "handler.py"]
        env:
        - {name: GREETING, value: hello}
        - {name: WORKERPOOL_CONCURRENCY, value: "99"}
        - name: TOKEN
          valueFrom: {secretKeyRef: {name: s, key: t}}
  worker: {concurrency: 3, children: 2, maxAttempts: 7, jobTimeoutSeconds: 20, rateLimit: 20/s, maxPayloadBytes: 1048576, keepOutcomesSeconds: 86400}
  replicas: 2
  shutdown: {gracePeriodSeconds: 10}
"#;

    #[test]
    fn workers_get_the_settings_the_deployment_injects_and_the_container_args() {
        let pool = pool(POOL);
        let container = super::super::manifest::worker_container(&pool).expect("worker");
        let (command, notes) = WorkerCommand::for_pool(
            &pool,
            container,
            PathBuf::from("workerpool-worker"),
            "redis://127.0.0.1:7000/0",
            &workerpool_queue::connection::Tls::default(),
        );
        assert_eq!(command.args, ["--", "python3", "handler.py"]);
        assert_eq!(command.worker_id(3), "mail-3");
        let env: BTreeMap<_, _> = command.env.iter().cloned().collect();
        assert_eq!(env["GREETING"], "hello");
        assert_eq!(env["WORKERPOOL_CONCURRENCY"], "3", "the spec wins");
        assert_eq!(env["WORKERPOOL_QUEUE"], "high,low");
        assert_eq!(env["WORKERPOOL_REDIS_URL"], "redis://127.0.0.1:7000/0");
        assert_eq!(env["WORKERPOOL_SHUTDOWN_TIMEOUT"], "7500ms");
        assert_eq!(env["WORKERPOOL_RATE_LIMIT"], "20/s");
        assert_eq!(env["WORKERPOOL_MAX_PAYLOAD_BYTES"], "1048576");
        assert_eq!(env["WORKERPOOL_CHILDREN"], "2");
        assert_eq!(env["WORKERPOOL_KEEP_OUTCOMES"], "86400s");
        assert!(!env.contains_key("TOKEN"));
        assert!(notes.iter().any(|n| n.contains("TOKEN")), "{notes:?}");

        // The same settings, by name and value, as the cluster's Deployment.
        let deployment = crate::deployment::build(&pool, 1).expect("deployment");
        let pod = deployment
            .spec
            .and_then(|s| s.template.spec)
            .expect("pod spec");
        for var in pod.containers[0].env.iter().flatten() {
            match var.name.as_str() {
                "WORKERPOOL_LISTEN" | "WORKERPOOL_WORKER_ID" | "TOKEN" => {}
                // The Pod's own volume: local workers run without it.
                "WORKERPOOL_INSTANCE_FILE" => assert!(!env.contains_key(&var.name)),
                "WORKERPOOL_REDIS_URL" => assert!(env.contains_key(&var.name)),
                name => assert_eq!(Some(&env[name]), var.value.as_ref(), "{name}"),
            }
        }
    }

    /// The worker command local mode builds for the pool in `yaml`, and its notes.
    fn command_for(yaml: &str) -> (WorkerCommand, Vec<String>) {
        let pool = pool(yaml);
        let container = super::super::manifest::worker_container(&pool).expect("worker");
        WorkerCommand::for_pool(
            &pool,
            container,
            PathBuf::from("workerpool-worker"),
            "redis://127.0.0.1:7000/0",
            &workerpool_queue::connection::Tls::default(),
        )
    }

    #[test]
    fn a_disruption_spec_is_named_as_not_used_locally() {
        let with = POOL.replace(
            "  replicas: 2\n",
            "  replicas: 2\n  disruption: {protectBusyPods: true}\n",
        );
        for (yaml, noted) in [(POOL.to_string(), false), (with, true)] {
            let (_, notes) = command_for(&yaml);
            assert_eq!(
                notes
                    .iter()
                    .any(|n| n.contains("spec.disruption is not used locally")),
                noted,
                "{notes:?}"
            );
        }
    }

    /// Two local runs of one pool share worker ids, and no file on this
    /// machine is private to one worker as a Pod's volume is: a local
    /// worker keeps the shared-id rule, even when the template names a
    /// file.
    #[test]
    fn local_workers_run_without_an_instance_file_even_when_the_template_names_one() {
        let (command, notes) = command_for(POOL);
        assert!(
            !command
                .env
                .iter()
                .any(|(name, _)| name == workerpool_settings::INSTANCE_FILE)
        );
        assert!(
            !notes.iter().any(|n| n.contains("INSTANCE_FILE")),
            "{notes:?}"
        );
        let named = POOL.replace(
            "        - {name: GREETING, value: hello}\n",
            "        - {name: GREETING, value: hello}\n        - {name: WORKERPOOL_INSTANCE_FILE, value: /tmp/mail}\n",
        );
        let (command, notes) = command_for(&named);
        assert!(
            !command
                .env
                .iter()
                .any(|(name, _)| name == workerpool_settings::INSTANCE_FILE),
            "{:?}",
            command.env
        );
        assert!(
            notes
                .iter()
                .any(|n| n.contains("\"WORKERPOOL_INSTANCE_FILE\" is not set locally")),
            "{notes:?}"
        );
    }

    #[test]
    fn tracing_reaches_local_workers_but_what_only_the_kubelet_resolves() {
        let with = POOL.replace(
            "  replicas: 2\n",
            "  replicas: 2\n  tracing: {endpoint: \"https://127.0.0.1:4318\", headersSecretRef: {name: o, key: h}, tls: {caSecretRef: {name: ca, key: ca.crt}}}\n",
        );
        let (command, notes) = command_for(&with);
        let env: BTreeMap<_, _> = command.env.iter().cloned().collect();
        assert_eq!(env["OTEL_EXPORTER_OTLP_ENDPOINT"], "https://127.0.0.1:4318");
        // A path in a Secret volume would not exist here.
        assert!(!env.contains_key("OTEL_EXPORTER_OTLP_CERTIFICATE"));
        assert!(
            notes.iter().any(|n| n.starts_with("spec.tracing.tls")),
            "{notes:?}"
        );
        assert_eq!(env["OTEL_SERVICE_NAME"], "mail");
        assert!(
            !env["OTEL_RESOURCE_ATTRIBUTES"].contains("k8s.pod.name"),
            "{env:?}"
        );
        assert!(!env.contains_key("OTEL_EXPORTER_OTLP_HEADERS"));
        assert!(
            notes
                .iter()
                .any(|n| n.contains("OTEL_EXPORTER_OTLP_HEADERS")),
            "{notes:?}"
        );
    }

    /// An actuator whose "worker" is `sh -c script`.
    fn shell(script: &str, grace: Duration) -> Actuator {
        let command = WorkerCommand {
            pool: "p".into(),
            program: PathBuf::from("sh"),
            args: vec!["-c".into(), script.into()],
            env: Vec::new(),
        };
        let (logs, _) = mpsc::unbounded_channel();
        Actuator::new(command, grace, logs)
    }

    /// Polls until `done` holds, collecting events.
    async fn poll_until(actuator: &mut Actuator, done: impl Fn(&Actuator) -> bool) -> Vec<Event> {
        let mut events = Vec::new();
        for _ in 0..500 {
            events.extend(actuator.poll(Instant::now()));
            if done(actuator) {
                return events;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("condition not reached; events so far: {events:?}");
    }

    #[tokio::test]
    async fn scale_down_sends_sigterm_to_the_least_busy_workers() {
        let mut actuator = shell("sleep 30", Duration::from_secs(10));
        let started = actuator.scale_to(3, &BTreeMap::new(), Instant::now());
        assert_eq!(started.len(), 3);
        assert!(matches!(&started[0], Event::Started { id, .. } if id == "p-1"));
        let busy = BTreeMap::from([("p-1", 0), ("p-2", 5), ("p-3", 1)].map(|(id, in_flight)| {
            (
                id.to_string(),
                WorkerActivity {
                    in_flight,
                    ..WorkerActivity::default()
                },
            )
        }));
        let stopping = actuator.scale_to(1, &busy, Instant::now());
        assert_eq!(
            stopping,
            [
                Event::Stopping {
                    id: "p-1".into(),
                    in_flight: 0
                },
                Event::Stopping {
                    id: "p-3".into(),
                    in_flight: 1
                },
            ]
        );
        assert_eq!(actuator.running_ids(), ["p-2"]);
        let events = poll_until(&mut actuator, |a| a.draining() == 0).await;
        assert!(
            events.iter().all(|e| matches!(
                e,
                Event::Exited { status, restart_in: None, .. } if status == "killed by SIGTERM"
            )),
            "{events:?}"
        );
        actuator.stop_all(&BTreeMap::new(), Instant::now());
        poll_until(&mut actuator, Actuator::is_empty).await;
    }

    #[tokio::test]
    async fn a_worker_still_running_after_the_grace_period_gets_sigkill() {
        let mut actuator = shell("trap '' TERM; sleep 30", Duration::from_millis(300));
        actuator.scale_to(1, &BTreeMap::new(), Instant::now());
        // Give sh time to install its trap before the SIGTERM.
        tokio::time::sleep(Duration::from_millis(200)).await;
        actuator.stop_all(&BTreeMap::new(), Instant::now());
        let events = poll_until(&mut actuator, Actuator::is_empty).await;
        assert!(
            matches!(&events[..], [
                Event::Killed { id, .. },
                Event::Exited { status, restart_in: None, .. },
            ] if id == "p-1" && status == "killed by SIGKILL"),
            "{events:?}"
        );
    }

    #[tokio::test]
    async fn a_worker_that_exits_on_its_own_is_started_again_under_the_same_id() {
        let mut actuator = shell("exit 3", Duration::from_secs(1));
        actuator.scale_to(1, &BTreeMap::new(), Instant::now());
        let events = poll_until(&mut actuator, |a| a.running() == 0).await;
        assert_eq!(
            events,
            [Event::Exited {
                id: "p-1".into(),
                status: "exit code 3".into(),
                restart_in: Some(Duration::ZERO)
            }]
        );
        let events = actuator.poll(Instant::now());
        assert!(
            matches!(&events[..], [Event::Started { id, .. }] if id == "p-1"),
            "{events:?}"
        );
        assert_eq!(actuator.replicas(), 1);
    }

    #[test]
    fn restarts_back_off_like_a_crash_loop() {
        let delays: Vec<u64> = (0..8).map(|n| restart_delay(n).as_secs()).collect();
        assert_eq!(delays, [0, 1, 2, 4, 8, 16, 30, 30]);
    }
}
