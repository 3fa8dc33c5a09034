//! The `exec` handler: a supervised pool of long-lived child processes
//! speaking JSON lines.
//!
//! Each job is one line of JSON on a child's stdin; the child answers one
//! line on stdout, `{"ok":true}` (with `"result"`, any JSON, for a job that
//! returns one) or `{"ok":false,"error":"…","retry":false}` (`retry`
//! defaults to true). The child's stderr is its log and goes to the
//! worker's stderr; its last lines are kept for the error of an attempt it
//! dies in. A child that exits or breaks the protocol mid-job fails that
//! attempt and is replaced at once; a child whose attempt is abandoned
//! (timeout, shutdown) is killed and replaced, so the pool keeps its size.
//!
//! A handler that cannot start is not the jobs' fault. When children die
//! before answering anything [`BROKEN_AFTER`] times in a row (a script that
//! does not exist, an import that fails), the pool counts as broken: the
//! job in hand goes back to the queue without spending an attempt
//! ([`Outcome::NotRun`]), new children start only after a backoff that
//! doubles up to [`RESTART_MAX`], and the worker reports not ready with
//! the children's last words ([`Handler::problem`]). One child that
//! answers ends it.
//!
//! Before its answer a child may write progress lines, `{"progress": <any
//! JSON>}` (a JSON object with `"progress"` and no `"ok"`): each is handed
//! to the [`Reports`] given by [`Handler::set_reports`] for the job the
//! child runs, and the worker reads on for the answer.
//!
//! A child that reads stdin while it runs a job may say so with an accepts
//! line, `{"accepts": ["cancel"]}` (a JSON object with an `"accepts"` array
//! and no `"ok"`), before or with its first answer. A producer's cancel of
//! the job such a child runs ([`Handler::cancel`]) then writes
//! `{"cancel":"<id>"}` to it, once per attempt, and the worker waits for the
//! answer as usual. A child that never says so is told nothing: a program
//! written for the one-job protocol would read the line as its next job. A
//! child replaced after it died accepts nothing until it says so again.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};

use futures::future::BoxFuture;
use prometheus::IntCounter;
use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};

use super::Pending;
use crate::handler::{Handler, Outcome, Reports};
use workerpool_queue::job::Job;
use workerpool_queue::outcome::MAX_PROGRESS_BYTES;
use workerpool_queue::text;

/// The longest answer line a child may write; a longer one is a protocol
/// break (the child is replaced) rather than memory the worker never gets
/// back.
pub use workerpool_queue::outcome::MAX_ANSWER_BYTES;
/// How long a child whose pipes closed gets to exit before it is replaced.
pub(crate) const EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(1);
/// How much of a broken answer an error message quotes.
pub(crate) const QUOTE_CHARS: usize = 200;
/// Children dying before their first answer, in a row, that make the pool
/// count as broken.
pub const BROKEN_AFTER: u32 = 3;
/// The first wait before starting a child once the pool is broken.
const RESTART_FIRST: std::time::Duration = std::time::Duration::from_secs(1);
/// How long the last lines of a child that died mid-job get to arrive.
pub(crate) const LAST_WORDS_WAIT: std::time::Duration = std::time::Duration::from_millis(300);
/// The longest wait before starting a child of a broken pool.
pub const RESTART_MAX: std::time::Duration = std::time::Duration::from_secs(30);

/// The command the pool runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecCommand {
    /// Program to run (looked up on `PATH`).
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
}

/// Error starting the pool.
#[derive(Debug, thiserror::Error)]
#[error("cannot start handler command `{program}`: {source}")]
pub struct SpawnError {
    program: String,
    #[source]
    source: std::io::Error,
}

impl SpawnError {
    /// The error for `program` failing to start with `source`.
    pub fn new(program: &str, source: std::io::Error) -> Self {
        Self {
            program: program.to_string(),
            source,
        }
    }
}

struct Proc {
    child: Child,
    /// Its process group: dropped with it (replaced, or left idle when the
    /// pool ends), the child and whatever it started are killed.
    _group: super::GroupGuard,
    /// Shared with a cancel line being written, which holds it while it
    /// writes: the next job line waits for the whole of it.
    stdin: Arc<tokio::sync::Mutex<ChildStdin>>,
    stdout: BufReader<ChildStdout>,
    /// The last lines of its stderr, kept by a task that copies them to
    /// the worker's stderr.
    last_words: std::sync::Arc<Mutex<String>>,
    /// The task copying its stderr: it ends at the end of the stream.
    log: Option<tokio::task::JoinHandle<()>>,
    /// Whether it has answered a job.
    answered: bool,
    /// Whether it said it takes a cancel line while it runs a job.
    accepts_cancel: bool,
}

impl Proc {
    fn last_words(&self) -> String {
        self.last_words
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Children that died before answering anything, in a row.
#[derive(Debug, Default)]
struct Startups {
    /// How many in a row.
    failed: u32,
    /// No child starts before this, once the pool is broken.
    next_start: Option<tokio::time::Instant>,
    /// What the last one said (its exit and its stderr's last lines).
    last: String,
}

/// The rule for a handler that cannot start, shared by the pools: children
/// dying before their first answer [`BROKEN_AFTER`] times in a row make the
/// handler count as broken until one answers.
#[derive(Debug)]
pub(crate) struct StartupRule {
    program: String,
    startups: Mutex<Startups>,
}

impl StartupRule {
    pub(crate) fn new(program: &str) -> Self {
        Self {
            program: program.to_string(),
            startups: Mutex::new(Startups::default()),
        }
    }

    fn startups(&self) -> std::sync::MutexGuard<'_, Startups> {
        self.startups.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes a child that died before answering anything; returns whether
    /// the handler now counts as broken.
    pub(crate) fn died_unanswered(&self, why: &str) -> bool {
        let mut s = self.startups();
        s.failed = s.failed.saturating_add(1);
        s.last = why.to_string();
        if s.failed < BROKEN_AFTER {
            return false;
        }
        let doublings = (s.failed - BROKEN_AFTER).min(10);
        let wait = RESTART_FIRST
            .saturating_mul(1 << doublings)
            .min(RESTART_MAX);
        s.next_start = Some(tokio::time::Instant::now() + wait);
        if s.failed == BROKEN_AFTER {
            tracing::error!(
                program = %self.program,
                "the handler keeps exiting before it answers a job ({BROKEN_AFTER} in a row): jobs go back to the queue uncounted and children restart with a backoff until one answers; last: {why}"
            );
        }
        true
    }

    /// A child answered: the handler works.
    pub(crate) fn answered(&self) {
        let mut s = self.startups();
        if s.failed == 0 {
            return;
        }
        if s.failed >= BROKEN_AFTER {
            tracing::info!(program = %self.program, "the handler answers again");
        }
        *s = Startups::default();
    }

    /// How long to wait before starting a child, while the handler is broken.
    pub(crate) fn start_wait(&self) -> Option<std::time::Duration> {
        let next = self.startups().next_start?;
        let now = tokio::time::Instant::now();
        (next > now).then(|| next - now)
    }

    /// The outcome of a job a broken handler could not run: back to the
    /// queue after the restart backoff (at least a second), uncounted.
    pub(crate) fn not_run(&self, error: String) -> Outcome {
        Outcome::NotRun {
            error,
            delay: self.start_wait().unwrap_or_default().max(RESTART_FIRST),
        }
    }

    /// The handler's problem while it counts as broken.
    pub(crate) fn problem(&self) -> Option<String> {
        let s = self.startups();
        (s.failed >= BROKEN_AFTER).then(|| {
            format!(
                "`{}` exited before answering a job {} times in a row; last: {}",
                self.program, s.failed, s.last
            )
        })
    }
}

/// A pool of `size` children; a job checks one out for its attempt.
pub struct ExecPool {
    command: ExecCommand,
    idle: Mutex<Vec<Proc>>,
    restarts: IntCounter,
    rule: StartupRule,
    /// Where the jobs' progress goes, once the worker says.
    reports: OnceLock<Arc<dyn Reports>>,
    /// The attempts under way, by a number of their own (two jobs with one
    /// id may run at once, in two children): what a producer's cancel needs.
    running: Arc<Mutex<Running>>,
    /// Jobs handed to the pool whose attempt has not begun (waiting out a broken
    /// handler's restart backoff, or for their child's stdin).
    pending: Pending,
}

/// The attempts under way.
#[derive(Default)]
struct Running {
    next: u64,
    attempts: HashMap<u64, Attempt>,
}

/// An attempt under way, as a producer's cancel sees it.
struct Attempt {
    id: String,
    /// Its child's stdin.
    stdin: Arc<tokio::sync::Mutex<ChildStdin>>,
    /// Whether its child said it takes a cancel line.
    accepts: bool,
    /// Whether a producer asked to cancel it.
    requested: bool,
    /// Whether its cancel line was sent (once per attempt).
    sent: bool,
}

impl Attempt {
    /// Whether its cancel line is due now; marks it sent if so.
    fn cancel_due(&mut self) -> bool {
        if self.requested && self.accepts && !self.sent {
            self.sent = true;
            return true;
        }
        false
    }
}

impl std::fmt::Debug for ExecPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecPool")
            .field("command", &self.command)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct Reply {
    /// The job it answers; required of a child that holds several at once.
    #[serde(default)]
    id: Option<String>,
    ok: bool,
    /// What the job returned (any JSON), kept as its outcome's result.
    #[serde(default)]
    result: Option<Box<serde_json::value::RawValue>>,
    /// Why the job's result is not in the answer (a client library's
    /// result over the limit).
    #[serde(default)]
    result_error: Option<String>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default = "yes")]
    retry: bool,
}

fn yes() -> bool {
    true
}

impl ExecPool {
    /// Starts `size` children. Fails when the command cannot be started, so
    /// a misconfigured worker stops at start rather than failing every job.
    /// `restarts` counts children replaced after dying or being killed.
    pub fn start(
        command: ExecCommand,
        size: usize,
        restarts: IntCounter,
    ) -> Result<Self, SpawnError> {
        let mut idle = Vec::with_capacity(size);
        for _ in 0..size {
            idle.push(spawn(&command)?);
        }
        let command_program = command.program.clone();
        Ok(Self {
            command,
            idle: Mutex::new(idle),
            restarts,
            rule: StartupRule::new(&command_program),
            reports: OnceLock::new(),
            running: Arc::default(),
            pending: Pending::default(),
        })
    }

    /// Process ids of the children waiting for a job.
    pub fn idle_pids(&self) -> Vec<u32> {
        self.lock().iter().filter_map(|p| p.child.id()).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Proc>> {
        // A panic while holding this lock cannot leave the Vec inconsistent.
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn checkout(&self) -> Result<Proc, SpawnError> {
        loop {
            let Some(mut proc) = self.lock().pop() else {
                // Only when a replacement failed to start earlier.
                return spawn(&self.command);
            };
            match proc.child.try_wait() {
                Ok(None) => return Ok(proc),
                // It died while idle: replace it and look again.
                Ok(Some(status)) if !proc.answered => {
                    let words = proc.last_words();
                    self.rule.died_unanswered(&said(
                        &format!("exited before its first job ({status})"),
                        &words,
                    ));
                    self.replace(proc);
                }
                _ => self.replace(proc),
            }
        }
    }

    /// Kills a child that can no longer be trusted and starts another.
    fn replace(&self, mut proc: Proc) {
        // The child itself too, should it have left its group.
        let _ = proc.child.start_kill();
        drop(proc);
        self.restarts.inc();
        match spawn(&self.command) {
            Ok(fresh) => self.lock().push(fresh),
            Err(e) => {
                tracing::error!(error = %e, "handler child could not be replaced; retrying on next job")
            }
        }
    }

    async fn attempt(&self, job: &Job) -> Outcome {
        // A producer's cancel that comes before the attempt begins is kept for it.
        let _waiting = self.pending.wait(job.id());
        // A broken handler's children start no faster than its backoff.
        if let Some(wait) = self.rule.start_wait() {
            tokio::time::sleep(wait).await;
        }
        let proc = match self.checkout() {
            Ok(proc) => proc,
            Err(e) => {
                let error = e.to_string();
                if self.rule.died_unanswered(&error) {
                    return self.rule.not_run(error);
                }
                return Outcome::retry(error);
            }
        };
        let fresh = !proc.answered;
        let mut lease = Lease {
            pool: self,
            proc: Some(proc),
        };
        let outcome = lease.exchange(job).await;
        match outcome {
            Ok(outcome) => {
                self.rule.answered();
                if let Some(proc) = lease.proc.as_mut() {
                    proc.answered = true;
                }
                lease.release();
                outcome
            }
            Err(error) => {
                // Its last lines may still be on their way.
                if let Some(log) = lease.proc.as_mut().and_then(|p| p.log.take()) {
                    let _ = tokio::time::timeout(LAST_WORDS_WAIT, log).await;
                }
                let words = lease
                    .proc
                    .as_ref()
                    .map(Proc::last_words)
                    .unwrap_or_default();
                lease.discard();
                let error = said(&error, &words);
                if fresh && self.rule.died_unanswered(&error) {
                    return self.rule.not_run(error);
                }
                Outcome::retry(error)
            }
        }
    }
}

impl ExecPool {
    fn running(&self) -> std::sync::MutexGuard<'_, Running> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes an attempt of job `id` starting on a child with `stdin`, which
    /// has said whether it `accepts` a cancel line; returns its number. A
    /// cancel a producer asked for while the job waited is the attempt's: its
    /// line is sent now if the child takes one (after the job line, whose
    /// writer holds the child's stdin), or once it says it does.
    fn begin(&self, id: &str, stdin: &Arc<tokio::sync::Mutex<ChildStdin>>, accepts: bool) -> u64 {
        let (seq, due) = {
            let mut running = self.running();
            running.next += 1;
            let seq = running.next;
            // Asked with the attempts held: a producer's cancel that comes
            // later finds the attempt among them, after this insert.
            let requested = self.pending.asked(id);
            let mut attempt = Attempt {
                id: id.to_string(),
                stdin: Arc::clone(stdin),
                accepts,
                requested,
                sent: false,
            };
            let due = attempt.cancel_due();
            running.attempts.insert(seq, attempt);
            (seq, due)
        };
        if due {
            self.send_cancel(seq, id.to_string(), Arc::clone(stdin));
        }
        seq
    }

    /// The child running attempt `seq` said whether it `accepts` a cancel
    /// line: one asked for already is sent now.
    fn accepts(&self, seq: u64, accepts: bool) {
        let due = {
            let mut running = self.running();
            let Some(attempt) = running.attempts.get_mut(&seq) else {
                return;
            };
            attempt.accepts = accepts;
            attempt
                .cancel_due()
                .then(|| (attempt.id.clone(), Arc::clone(&attempt.stdin)))
        };
        if let Some((id, stdin)) = due {
            self.send_cancel(seq, id, stdin);
        }
    }

    /// Writes the cancel line of attempt `seq` on a task of its own, so a
    /// child that does not read its stdin holds up no one: the task holds
    /// the child's stdin until the line is written (the next job line to
    /// that child waits for it), and writes nothing once the attempt has
    /// ended.
    fn send_cancel(&self, seq: u64, id: String, stdin: Arc<tokio::sync::Mutex<ChildStdin>>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(id = %text::escaped(id.as_bytes(), QUOTE_CHARS), "no runtime to write the cancel line on; the child is not told");
            return;
        };
        let running = Arc::downgrade(&self.running);
        let program = self.command.program.clone();
        runtime.spawn(async move {
            let mut stdin = stdin.lock().await;
            let under_way = running.upgrade().is_some_and(|r| {
                r.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .attempts
                    .contains_key(&seq)
            });
            if !under_way {
                return;
            }
            let line = serde_json::json!({ "cancel": id }).to_string();
            let written = match super::write_line(&mut *stdin, &line).await {
                Ok(()) => stdin.flush().await,
                Err(e) => Err(e),
            };
            match written {
                Ok(()) => tracing::debug!(
                    program,
                    id = %text::escaped(id.as_bytes(), QUOTE_CHARS),
                    "a producer cancels the job: the child is told"
                ),
                // The child has gone: its attempt learns so from its stdout.
                Err(e) => tracing::debug!(program, error = %e, "cannot write the cancel line"),
            }
        });
    }

    /// A producer asked to cancel job `id`: each attempt of it under way
    /// whose child accepts a cancel line gets one (once), and one whose
    /// child says so later gets it then, as does one that has not begun.
    fn producer_cancel(&self, id: &str) {
        let due: Vec<_> = {
            self.pending.cancel(id);
            let mut running = self.running();
            running
                .attempts
                .iter_mut()
                .filter(|(_, a)| a.id == id)
                .filter_map(|(seq, a)| {
                    a.requested = true;
                    if !a.accepts {
                        tracing::debug!(
                            program = %self.command.program,
                            id = %text::escaped(id.as_bytes(), QUOTE_CHARS),
                            "a producer cancels the job; its child has not said it takes a cancel line, so it is not told"
                        );
                    }
                    a.cancel_due().then(|| (*seq, Arc::clone(&a.stdin)))
                })
                .collect()
        };
        for (seq, stdin) in due {
            self.send_cancel(seq, id.to_string(), stdin);
        }
    }

    /// A progress line from the child running `job`: reported for it,
    /// unless it names another job (then logged and dropped).
    fn progress(&self, job: &Job, progress: ProgressLine, warned: &mut bool) {
        match &progress.id {
            None => {}
            Some(serde_json::Value::String(id)) if id == job.id() => {}
            Some(other) => {
                tracing::warn!(
                    program = %self.command.program,
                    "handler broke the protocol: a progress line names job {} while the child runs job \"{}\"; dropped",
                    text::escaped(other.to_string().as_bytes(), QUOTE_CHARS),
                    text::escaped(job.id().as_bytes(), QUOTE_CHARS)
                );
                return;
            }
        }
        if let Some(reports) = self.reports.get()
            && let Some(json) =
                progress_json(&self.command.program, job.id(), &progress.value, warned)
        {
            reports.progress(job.id(), json);
        }
    }
}

/// An error with what the child last wrote on stderr, when it wrote
/// anything.
pub(crate) fn said(error: &str, last_words: &str) -> String {
    if last_words.is_empty() {
        error.to_string()
    } else {
        format!("{error}; its stderr ended with: {last_words}")
    }
}

impl Handler for ExecPool {
    fn handle<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Outcome> {
        Box::pin(self.attempt(job))
    }

    fn problem(&self) -> Option<String> {
        self.rule.problem()
    }

    fn set_reports(&self, reports: Arc<dyn Reports>) {
        keep_reports(&self.reports, reports);
    }

    fn cancel(&self, id: &str) {
        self.producer_cancel(id);
    }
}

/// Keeps the worker's [`Reports`]: given once; a second is ignored.
pub(crate) fn keep_reports(slot: &OnceLock<Arc<dyn Reports>>, reports: Arc<dyn Reports>) {
    if slot.set(reports).is_err() {
        tracing::debug!("the handler was given its reports already; the later ones are ignored");
    }
}

/// A progress line: a JSON object with a `"progress"` key and no `"ok"`.
#[derive(Debug)]
pub(crate) struct ProgressLine {
    /// The `"id"` it names, as written (a string names a job).
    pub(crate) id: Option<serde_json::Value>,
    /// What it reports.
    pub(crate) value: serde_json::Value,
}

/// Reads `line` as a progress line, if it is one. Only lines that are not
/// answers are worth asking about: a line with `"ok"` never is one.
pub(crate) fn parse_progress(line: &[u8]) -> Option<ProgressLine> {
    if line.len() > MAX_ANSWER_BYTES {
        return None;
    }
    let line = std::str::from_utf8(line.trim_ascii_end()).ok()?;
    let mut fields: serde_json::Map<String, serde_json::Value> = serde_json::from_str(line).ok()?;
    if fields.contains_key("ok") {
        return None;
    }
    let value = fields.remove("progress")?;
    Some(ProgressLine {
        id: fields.remove("id"),
        value,
    })
}

/// The JSON text of job `id`'s progress `value`, to report; `None` (the
/// report dropped) when it is over [`MAX_PROGRESS_BYTES`], with a warning
/// once per job (`warned` says whether it was given).
pub(crate) fn progress_json(
    program: &str,
    id: &str,
    value: &serde_json::Value,
    warned: &mut bool,
) -> Option<String> {
    let json = match serde_json::to_string(value) {
        Ok(json) => json,
        Err(e) => {
            tracing::warn!(program, id = %text::escaped(id.as_bytes(), QUOTE_CHARS), error = %e, "a progress report cannot be written as JSON; dropped");
            return None;
        }
    };
    if json.len() > MAX_PROGRESS_BYTES {
        if !*warned {
            *warned = true;
            tracing::warn!(
                program,
                "job \"{}\" reported progress of {} bytes of JSON, over the limit of {MAX_PROGRESS_BYTES}: dropped (and any more like it, unlogged): \"{}\"",
                text::escaped(id.as_bytes(), QUOTE_CHARS),
                json.len(),
                text::escaped(json.as_bytes(), QUOTE_CHARS)
            );
        }
        return None;
    }
    Some(json)
}

/// A line a one-job child writes before its answer, or its answer.
enum Before {
    Progress(ProgressLine),
    /// An accepts line: whether it names `"cancel"`.
    Accepts(bool),
    /// Anything else: the answer, good or bad.
    Answer,
}

/// What an accepts line says (see [`before_answer`]): `Some(true)` when it
/// names `"cancel"`, `None` for any other line. A child of the multiplexed
/// pool whose share is one (an uneven split) speaks the one-job protocol and
/// may write one too.
pub(crate) fn accepts_line(line: &[u8]) -> Option<bool> {
    match before_answer(line) {
        Before::Accepts(cancel) => Some(cancel),
        _ => None,
    }
}

/// What a line from a one-job child is: a progress line (a JSON object
/// with `"progress"` and no `"ok"`), an accepts line (one with an
/// `"accepts"` array, no `"ok"` and no `"progress"`; values other than
/// `"cancel"` are ignored), or the answer.
fn before_answer(line: &[u8]) -> Before {
    if line.len() > MAX_ANSWER_BYTES {
        return Before::Answer;
    }
    let Ok(line) = std::str::from_utf8(line.trim_ascii_end()) else {
        return Before::Answer;
    };
    let Ok(mut fields) = serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(line)
    else {
        return Before::Answer;
    };
    if fields.contains_key("ok") {
        return Before::Answer;
    }
    if let Some(value) = fields.remove("progress") {
        return Before::Progress(ProgressLine {
            id: fields.remove("id"),
            value,
        });
    }
    match fields.get("accepts") {
        Some(serde_json::Value::Array(what)) => {
            Before::Accepts(what.iter().any(|w| w.as_str() == Some("cancel")))
        }
        _ => Before::Answer,
    }
}

/// Attempt `seq` under way, until dropped (answered, or abandoned).
struct UnderWay<'a> {
    pool: &'a ExecPool,
    seq: u64,
}

impl Drop for UnderWay<'_> {
    fn drop(&mut self) {
        self.pool.running().attempts.remove(&self.seq);
    }
}

/// A child checked out for one attempt. Dropped without `release` (the
/// attempt was abandoned mid-exchange), the child is killed and replaced.
struct Lease<'a> {
    pool: &'a ExecPool,
    proc: Option<Proc>,
}

impl Lease<'_> {
    /// One request/response exchange. `Err` means the child is unusable.
    async fn exchange(&mut self, job: &Job) -> Result<Outcome, String> {
        let pool = self.pool;
        let proc = self
            .proc
            .as_mut()
            .expect("a lease holds its child until released");
        let line = job.json_line();
        let mut reply = Vec::new();
        let mut warned = false;
        // Its stdin first (a cancel line of its last job may be on its
        // way), then the attempt is under way: a cancel line for it comes
        // after the job line.
        let stdin = Arc::clone(&proc.stdin);
        let mut writing = stdin.lock().await;
        let under_way = UnderWay {
            pool,
            seq: pool.begin(job.id(), &proc.stdin, proc.accepts_cancel),
        };
        let read: std::io::Result<usize> = async {
            super::write_line(&mut *writing, &line).await?;
            writing.flush().await?;
            drop(writing);
            // Bytes, not text: an answer that is not UTF-8 is a protocol
            // break to report, not a read error to wait out.
            let limit = MAX_ANSWER_BYTES as u64 + 1;
            loop {
                reply.clear();
                let read = (&mut proc.stdout)
                    .take(limit)
                    .read_until(b'\n', &mut reply)
                    .await?;
                // Progress and accepts lines come before the answer;
                // anything else is the answer, good or bad.
                match before_answer(&reply) {
                    _ if read == 0 => break Ok(read),
                    Before::Progress(progress) => pool.progress(job, progress, &mut warned),
                    Before::Accepts(cancel) => {
                        proc.accepts_cancel = cancel;
                        pool.accepts(under_way.seq, cancel);
                    }
                    Before::Answer => break Ok(read),
                }
            }
        }
        .await;
        // Answered (or gone): no cancel line for it from here on.
        drop(under_way);
        match read {
            Ok(0) | Err(_) => {
                // Its stdout closed or a pipe broke: it has exited, or is
                // about to. One that lingers is replaced all the same.
                let waited = tokio::time::timeout(EXIT_WAIT, proc.child.wait()).await;
                Err(match (waited, read) {
                    (Ok(Ok(status)), _) => {
                        format!("handler process exited during the job ({status})")
                    }
                    (Ok(Err(e)), _) => format!("handler process lost during the job: {e}"),
                    (Err(_), Err(e)) => format!("talking to the handler process failed: {e}"),
                    (Err(_), Ok(_)) => "handler process closed its stdout during the job".into(),
                })
            }
            Ok(_) => answer_for(job, &reply),
        }
    }

    fn release(mut self) {
        if let Some(proc) = self.proc.take() {
            self.pool.lock().push(proc);
        }
    }

    fn discard(mut self) {
        if let Some(proc) = self.proc.take() {
            self.pool.replace(proc);
        }
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if let Some(proc) = self.proc.take() {
            self.pool.replace(proc);
        }
    }
}

/// Reads a child's answer line. `Err` is a protocol break: the attempt
/// fails and the child is replaced, whatever the bytes were.
pub fn parse_answer(line: &[u8]) -> Result<Outcome, String> {
    parse_reply(line).map(|(_, outcome)| outcome)
}

/// Reads an answer line into the id it names, if any, and its outcome.
/// `Err` says what is wrong with the line, its bytes escaped and cut.
pub fn parse_reply(line: &[u8]) -> Result<(Option<String>, Outcome), String> {
    let broken = |why: String| {
        Err(format!(
            "handler broke the protocol: expected a line like {{\"ok\":true}}, {why}"
        ))
    };
    if line.len() > MAX_ANSWER_BYTES {
        return broken(format!(
            "got more than {MAX_ANSWER_BYTES} bytes without a newline: \"{}\"",
            text::escaped(line, QUOTE_CHARS)
        ));
    }
    let trimmed = line.trim_ascii_end();
    let Ok(answer) = std::str::from_utf8(trimmed) else {
        return broken(format!(
            "got bytes that are not UTF-8 ({}): \"{}\"",
            text::utf8_problem(trimmed).unwrap_or_default(),
            text::escaped(trimmed, QUOTE_CHARS)
        ));
    };
    match serde_json::from_str::<Reply>(answer) {
        Ok(Reply {
            id,
            ok: true,
            result,
            result_error,
            ..
        }) => Ok((
            id,
            match (result, result_error) {
                (Some(r), _) => Outcome::Returned(r.get().to_string()),
                (None, Some(why)) => Outcome::ResultNotKept(text::safe_line(&why, QUOTE_CHARS)),
                (None, None) => Outcome::Done,
            },
        )),
        Ok(Reply {
            id,
            ok: false,
            error,
            retry,
            ..
        }) => Ok((
            id,
            Outcome::Failed {
                error: error.unwrap_or_else(|| "handler reported failure".into()),
                retry,
            },
        )),
        Err(e) => broken(format!(
            "got \"{}\" ({e})",
            text::escaped(trimmed, QUOTE_CHARS)
        )),
    }
}

/// The answer of a child holding one job: any answer that names no other
/// job. Naming another is a protocol break, as any other bad line is.
fn answer_for(job: &Job, line: &[u8]) -> Result<Outcome, String> {
    match parse_reply(line)? {
        (Some(id), _) if id != job.id() => Err(format!(
            "handler broke the protocol: it answered job \"{}\" while it holds job \"{}\"",
            text::escaped(id.as_bytes(), QUOTE_CHARS),
            text::escaped(job.id().as_bytes(), QUOTE_CHARS)
        )),
        (_, outcome) => Ok(outcome),
    }
}

fn spawn(command: &ExecCommand) -> Result<Proc, SpawnError> {
    let c = spawn_child(command, 1)?;
    Ok(Proc {
        child: c.child,
        _group: c.group,
        stdin: Arc::new(tokio::sync::Mutex::new(c.stdin)),
        stdout: c.stdout,
        last_words: c.last_words,
        log: Some(c.log),
        answered: false,
        accepts_cancel: false,
    })
}

/// A handler child just started, with its pipes.
pub(crate) struct Spawned {
    pub(crate) child: Child,
    /// Its process group, killed when this is dropped.
    pub(crate) group: super::GroupGuard,
    pub(crate) stdin: ChildStdin,
    pub(crate) stdout: BufReader<ChildStdout>,
    /// The last lines of its stderr, kept by `log`.
    pub(crate) last_words: std::sync::Arc<Mutex<String>>,
    /// The task copying its stderr to the worker's: it ends at the end of
    /// the stream.
    pub(crate) log: tokio::task::JoinHandle<()>,
}

/// Starts a handler child that holds `share` jobs at once (in its
/// environment as `WORKERPOOL_JOBS_PER_CHILD`), its stderr copied to the
/// worker's with the last lines kept.
pub(crate) fn spawn_child(command: &ExecCommand, share: usize) -> Result<Spawned, SpawnError> {
    let err = |source| SpawnError {
        program: command.program.clone(),
        source,
    };
    let mut child = super::command(command)
        .env(workerpool_settings::JOBS_PER_CHILD, share.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(err)?;
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(err(std::io::Error::other(
            "child has no stdin/stdout/stderr pipe",
        )));
    };
    let group = super::GroupGuard::new(&child);
    let last_words = std::sync::Arc::new(Mutex::new(String::new()));
    let kept = last_words.clone();
    // Its log: each line to the worker's stderr, the last ones kept.
    let log = tokio::spawn(async move {
        let mut stderr = BufReader::new(stderr);
        let mut tail = super::exec_per_job::Tail::default();
        while tail.read_line(&mut stderr).await {
            *kept.lock().unwrap_or_else(|e| e.into_inner()) = tail.text();
        }
    });
    Ok(Spawned {
        child,
        group,
        stdin,
        stdout: BufReader::new(stdout),
        last_words,
        log,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use workerpool_queue::job::{Intake, intake};

    fn sh(script: &str) -> ExecCommand {
        ExecCommand {
            program: "sh".into(),
            args: vec!["-c".into(), script.into()],
        }
    }

    fn job(raw: &str) -> Job {
        match intake(raw, 0, 5, "w") {
            Intake::Run { job, .. } => job,
            other => panic!("{other:?}"),
        }
    }

    fn pool(script: &str, size: usize) -> ExecPool {
        ExecPool::start(
            sh(script),
            size,
            IntCounter::new("r", "r").expect("counter"),
        )
        .expect("start")
    }

    const ECHO_HANDLER: &str = r#"while read -r line; do
      case "$line" in
        *'"progress"'*) echo '{"progress":{"pct":10}}'
           echo '{"id":"someone-else","progress":1}'
           echo '{"id":"p1", "progress": "half"}'
           echo '{"ok":true,"result":1}' ;;
        *'"big_progress"'*) printf '{"progress":"%s"}\n' "$(head -c 5000 /dev/zero | tr '\0' x)"
           echo '{"progress":2}'; echo '{"ok":true}' ;;
        *'"progress_and_bad_ok"'*) echo '{"progress":1,"ok":"maybe"}' ;;
        *'"no_ok"'*) echo '{"id":"n","note":"no ok, no progress"}' ;;
        *'"fail"'*) echo '{"ok":false,"error":"asked to fail","retry":false}' ;;
        *'"returns"'*) echo '{"ok":true,"result":{"n":1.10, "s":"x"}}' ;;
        *'"too_large"'*) echo '{"ok":true,"result_error":"the result was not kept: 3000000 bytes"}' ;;
        *'"other_id"'*) echo '{"id":"someone-else","ok":true}' ;;
        *'"soft"'*) echo '{"ok":false,"error":"try again"}' ;;
        *'"die"'*) exit 3 ;;
        *'"garbage"'*) echo 'not json' ;;
        *'"binary"'*) printf '\377\376{"ok":true}\n' ;;
        *'"hang"'*) sleep 30 ;;
        *) echo '{"ok":true}' ;;
      esac
    done"#;

    #[tokio::test]
    async fn replies_map_to_outcomes_and_retry_defaults_to_true() {
        let p = pool(ECHO_HANDLER, 1);
        assert_eq!(p.handle(&job(r#"{"task":"a"}"#)).await, Outcome::Done);
        assert_eq!(
            p.handle(&job(r#"{"task":"fail"}"#)).await,
            Outcome::permanent("asked to fail")
        );
        assert_eq!(
            p.handle(&job(r#"{"task":"soft"}"#)).await,
            Outcome::retry("try again")
        );
        // A result is kept as the child wrote it, numbers and spacing too.
        assert_eq!(
            p.handle(&job(r#"{"task":"returns"}"#)).await,
            Outcome::Returned(r#"{"n":1.10, "s":"x"}"#.into())
        );
        assert_eq!(
            p.handle(&job(r#"{"task":"too_large"}"#)).await,
            Outcome::ResultNotKept("the result was not kept: 3000000 bytes".into())
        );
        assert_eq!(
            p.restarts.get(),
            0,
            "failures reported by the child keep the child"
        );
    }

    #[tokio::test]
    async fn a_child_that_exits_mid_job_fails_the_attempt_and_is_replaced() {
        let p = pool(ECHO_HANDLER, 2);
        let before = p.idle_pids();
        let outcome = p.handle(&job(r#"{"task":"die"}"#)).await;
        match outcome {
            Outcome::Failed { error, retry: true } => assert!(error.contains("exited"), "{error}"),
            other => panic!("{other:?}"),
        }
        let after = p.idle_pids();
        assert_eq!(after.len(), 2, "the pool keeps its size");
        assert_ne!(before, after);
        assert_eq!(p.restarts.get(), 1);
        assert_eq!(p.handle(&job(r#"{"task":"a"}"#)).await, Outcome::Done);
    }

    #[tokio::test]
    async fn a_protocol_violation_fails_the_attempt_and_replaces_the_child() {
        let p = pool(ECHO_HANDLER, 1);
        match p.handle(&job(r#"{"task":"garbage"}"#)).await {
            Outcome::Failed { error, retry: true } => {
                assert!(error.contains("protocol"), "{error}")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(p.restarts.get(), 1);
        assert_eq!(p.handle(&job(r#"{"task":"a"}"#)).await, Outcome::Done);
    }

    #[tokio::test]
    async fn an_answer_naming_another_job_is_a_protocol_break() {
        let p = pool(ECHO_HANDLER, 1);
        match p.handle(&job(r#"{"task":"other_id"}"#)).await {
            Outcome::Failed { error, retry: true } => {
                assert!(error.contains(r#"answered job "someone-else""#), "{error}")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(p.restarts.get(), 1);
        assert_eq!(p.handle(&job(r#"{"task":"a"}"#)).await, Outcome::Done);
    }

    #[tokio::test]
    async fn an_answer_that_is_not_utf8_fails_at_once_with_the_bytes_escaped() {
        let p = pool(ECHO_HANDLER, 1);
        let answered = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            p.handle(&job(r#"{"task":"binary"}"#)),
        )
        .await
        .expect("no wait for the job timeout");
        match answered {
            Outcome::Failed { error, retry: true } => {
                assert!(error.contains("not UTF-8"), "{error}");
                assert!(error.contains(r#"\xff\xfe{"ok":true}"#), "{error}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(p.restarts.get(), 1);
        assert_eq!(p.handle(&job(r#"{"task":"a"}"#)).await, Outcome::Done);
    }

    #[tokio::test]
    async fn an_abandoned_attempt_kills_the_child_and_replaces_it() {
        let p = pool(ECHO_HANDLER, 1);
        let hung = p.idle_pids();
        let timed_out = tokio::time::timeout(
            std::time::Duration::from_millis(200),
            p.handle(&job(r#"{"task":"hang"}"#)),
        )
        .await;
        assert!(timed_out.is_err());
        assert_eq!(p.restarts.get(), 1);
        assert_ne!(p.idle_pids(), hung);
        assert_eq!(p.handle(&job(r#"{"task":"a"}"#)).await, Outcome::Done);
    }

    #[tokio::test]
    async fn a_command_that_cannot_start_is_refused_at_start() {
        let missing = ExecCommand {
            program: "/nonexistent/handler".into(),
            args: vec![],
        };
        let err = ExecPool::start(missing, 1, IntCounter::new("r", "r").expect("counter"))
            .expect_err("must fail");
        assert!(err.to_string().contains("/nonexistent/handler"), "{err}");
    }

    /// The reports a pool handed on, in order.
    #[derive(Default)]
    struct Collected(Mutex<Vec<(String, String)>>);

    impl Reports for Collected {
        fn progress(&self, id: &str, value: String) {
            self.0
                .lock()
                .expect("reports")
                .push((id.to_string(), value));
        }
    }

    impl Collected {
        fn all(&self) -> Vec<(String, String)> {
            self.0.lock().expect("reports").clone()
        }
    }

    #[tokio::test]
    async fn progress_lines_before_the_answer_are_reported_and_the_answer_settles_the_job() {
        let p = pool(ECHO_HANDLER, 1);
        let reports = Arc::new(Collected::default());
        p.set_reports(reports.clone());
        assert_eq!(
            p.handle(&job(r#"{"id":"p1","task":"progress"}"#)).await,
            Outcome::Returned("1".into())
        );
        // The line naming another job is dropped, the two others reported.
        assert_eq!(
            reports.all(),
            [
                ("p1".to_string(), r#"{"pct":10}"#.to_string()),
                ("p1".to_string(), r#""half""#.to_string()),
            ]
        );
        // Over the limit: dropped; the next one is reported.
        assert_eq!(
            p.handle(&job(r#"{"id":"b1","task":"big_progress"}"#)).await,
            Outcome::Done
        );
        assert_eq!(reports.all()[2..], [("b1".to_string(), "2".to_string())]);
        assert_eq!(p.restarts.get(), 0, "progress keeps the child");
        // Without reports set, progress is read past and dropped.
        let quiet = pool(ECHO_HANDLER, 1);
        assert_eq!(
            quiet.handle(&job(r#"{"id":"p1","task":"progress"}"#)).await,
            Outcome::Returned("1".into())
        );
    }

    #[tokio::test]
    async fn a_line_that_is_neither_progress_nor_an_answer_is_a_protocol_break_as_before() {
        let p = pool(ECHO_HANDLER, 1);
        p.set_reports(Arc::new(Collected::default()));
        for task in ["progress_and_bad_ok", "no_ok"] {
            match p.handle(&job(&format!(r#"{{"task":"{task}"}}"#))).await {
                Outcome::Failed { error, retry: true } => {
                    assert!(error.contains("protocol"), "{task}: {error}")
                }
                other => panic!("{task}: {other:?}"),
            }
        }
        assert_eq!(p.restarts.get(), 2);
        assert_eq!(p.handle(&job(r#"{"task":"a"}"#)).await, Outcome::Done);
    }

    /// Waits until `p` runs `n` attempts (the job line is on its way).
    async fn until_under_way(p: &ExecPool, n: usize) {
        for _ in 0..500 {
            if p.running().attempts.len() == n {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("no attempt under way");
    }

    /// A handler that says it takes a cancel line; "wait" answers when its
    /// cancel comes, "ignore" finishes after a moment whatever comes.
    const ACCEPTS_CANCEL: &str = r#"echo '{"accepts":["pause","cancel"]}'
    while read -r line; do
      case "$line" in
        '{"cancel":'*) [ -n "$waiting" ] && echo '{"ok":false,"error":"stopped","retry":false}'
          [ -n "$badly" ] && { printf '{"ok":tr'; exit 0; }; waiting= ;;
        *'"wait"'*) waiting=1 ;;
        *'"badly"'*) waiting=1; badly=1 ;;
        *'"late"'*) sleep 0.3; echo '{"accepts":["cancel"]}'; waiting=1 ;;
        *'"ignore"'*) sleep 0.5; echo '{"ok":true,"result":"finished"}' ;;
        *) echo '{"ok":true}' ;;
      esac
    done"#;

    #[tokio::test]
    async fn a_child_that_accepts_cancel_is_told_and_its_answer_ends_the_job() {
        let p = pool(ACCEPTS_CANCEL, 1);
        let cancel = async {
            until_under_way(&p, 1).await;
            p.cancel("other");
            p.cancel("c1");
            // Once per attempt.
            p.cancel("c1");
        };
        let j = job(r#"{"id":"c1","task":"wait"}"#);
        let (outcome, ()) = tokio::join!(p.handle(&j), cancel);
        assert_eq!(outcome, Outcome::permanent("stopped"));
        // The child reads on: the next job is answered, no line left over.
        assert_eq!(p.handle(&job(r#"{"task":"a"}"#)).await, Outcome::Done);
        assert_eq!(p.restarts.get(), 0, "the accepts line is no protocol break");
        // A cancel of a job no child runs tells no one.
        p.cancel("c1");
        assert_eq!(p.handle(&job(r#"{"task":"a"}"#)).await, Outcome::Done);
    }

    #[tokio::test]
    async fn a_cancel_before_the_child_says_it_accepts_is_sent_once_it_does() {
        let p = ExecPool::start(
            sh(&ACCEPTS_CANCEL.replacen("echo", "true", 1)),
            1,
            IntCounter::new("r", "r").expect("counter"),
        )
        .expect("start");
        // The child says it accepts a moment after it gets the job: the
        // cancel comes before.
        let cancel = async {
            until_under_way(&p, 1).await;
            p.cancel("c2");
        };
        let j = job(r#"{"id":"c2","task":"late"}"#);
        let (outcome, ()) = tokio::join!(p.handle(&j), cancel);
        assert_eq!(outcome, Outcome::permanent("stopped"));
    }

    /// Runs job `raw` (of id `id`) on `p` after its children died unanswered, so
    /// that the attempt waits out the restart backoff before its job line is
    /// written; a producer cancels the job then. Returns the attempt's outcome.
    async fn cancelled_while_waiting_out_the_backoff(
        p: &ExecPool,
        raw: &str,
        id: &str,
    ) -> Result<Outcome, tokio::time::error::Elapsed> {
        for _ in 0..BROKEN_AFTER {
            p.rule.died_unanswered("exited before its first job");
        }
        assert!(p.rule.start_wait().is_some());
        let cancel = async {
            for _ in 0..500 {
                if !p.pending.is_empty() {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            assert!(p.running().attempts.is_empty(), "not waiting any more");
            p.cancel(id);
        };
        let j = job(raw);
        let attempt = tokio::time::timeout(std::time::Duration::from_secs(20), p.handle(&j));
        let (outcome, ()) = tokio::join!(attempt, cancel);
        outcome
    }

    #[tokio::test]
    async fn a_cancel_while_the_job_waits_out_a_broken_handlers_backoff_reaches_its_child() {
        let p = pool(ACCEPTS_CANCEL, 1);
        let outcome =
            cancelled_while_waiting_out_the_backoff(&p, r#"{"id":"b1","task":"wait"}"#, "b1").await;
        // Its child was told once the job reached it, and stopped it.
        assert_eq!(outcome, Ok(Outcome::permanent("stopped")));
        assert!(p.pending.is_empty());
    }

    #[tokio::test]
    async fn a_job_cancelled_while_it_waited_is_settled_by_its_answer_whatever_follows() {
        let p = pool(ACCEPTS_CANCEL, 1);
        // Told right after its job line, the child answers, writes half a
        // line and exits. (A second whole answer is not detectable in the
        // one-job protocol: it would be taken for the next job's.)
        let outcome =
            cancelled_while_waiting_out_the_backoff(&p, r#"{"id":"b2","task":"badly"}"#, "b2")
                .await;
        assert_eq!(outcome, Ok(Outcome::permanent("stopped")));
        assert!(p.pending.is_empty());
        // What it wrote after its answer is no job's: the next job is taken by
        // the child or, found dead, its replacement, and is answered there.
        let mut next = Outcome::retry("not run");
        for _ in 0..2 {
            next = p.handle(&job(r#"{"task":"a"}"#)).await;
            if next == Outcome::Done {
                break;
            }
        }
        assert_eq!(next, Outcome::Done);
        assert_eq!(p.restarts.get(), 1);
    }

    #[tokio::test]
    async fn a_child_that_accepts_cancel_may_ignore_it_and_finish() {
        let p = pool(ACCEPTS_CANCEL, 1);
        let cancel = async {
            until_under_way(&p, 1).await;
            p.cancel("i1");
        };
        let j = job(r#"{"id":"i1","task":"ignore"}"#);
        let (outcome, ()) = tokio::join!(p.handle(&j), cancel);
        assert_eq!(outcome, Outcome::Returned(r#""finished""#.into()));
        assert_eq!(p.handle(&job(r#"{"task":"a"}"#)).await, Outcome::Done);
        assert_eq!(p.restarts.get(), 0);
    }

    /// A handler that writes every line it reads to `$LINES`; "say_accepts"
    /// says it takes a cancel line, "die" exits, "slow" answers after a
    /// moment. It starts saying it accepts only what the worker knows not.
    fn recording(lines: &std::path::Path) -> String {
        format!(
            r#"echo '{{"accepts":["pause"]}}'
    while read -r line; do
      printf '%s\n' "$line" >> '{}'
      case "$line" in
        '{{"cancel":'*) ;;
        *'"say_accepts"'*) echo '{{"accepts":["cancel"]}}'; echo '{{"ok":true}}' ;;
        *'"die"'*) exit 3 ;;
        *'"slow"'*) sleep 0.5; echo '{{"ok":true}}' ;;
        *) echo '{{"ok":true}}' ;;
      esac
    done"#,
            lines.display()
        )
    }

    fn read_lines(path: &std::path::Path) -> Vec<String> {
        std::fs::read_to_string(path)
            .expect("lines")
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).expect("json");
                match (v.get("cancel"), v.get("id")) {
                    (Some(c), _) => format!("cancel {}", c.as_str().expect("id")),
                    (None, Some(id)) => format!("job {}", id.as_str().expect("id")),
                    _ => panic!("{l}"),
                }
            })
            .collect()
    }

    async fn cancelled_while_slow(p: &ExecPool, id: &str) -> Outcome {
        let cancel = async {
            until_under_way(p, 1).await;
            p.cancel(id);
        };
        let j = job(&format!(r#"{{"id":"{id}","task":"slow"}}"#));
        tokio::join!(p.handle(&j), cancel).0
    }

    #[tokio::test]
    async fn a_child_that_never_says_it_accepts_cancel_gets_no_cancel_line() {
        let dir = tempfile::tempdir().expect("dir");
        let lines = dir.path().join("lines");
        let p = pool(&recording(&lines), 1);
        assert_eq!(cancelled_while_slow(&p, "s1").await, Outcome::Done);
        assert_eq!(
            p.handle(&job(r#"{"id":"a1","task":"a"}"#)).await,
            Outcome::Done
        );
        assert_eq!(read_lines(&lines), ["job s1", "job a1"]);
        assert_eq!(
            p.restarts.get(),
            0,
            "an accepts line of unknown values only"
        );
    }

    #[tokio::test]
    async fn a_child_replaced_after_a_crash_gets_no_cancel_line_until_it_says_it_accepts() {
        let dir = tempfile::tempdir().expect("dir");
        let lines = dir.path().join("lines");
        let p = pool(&recording(&lines), 1);
        let said = |id: &str| job(&format!(r#"{{"id":"{id}","task":"say_accepts"}}"#));
        let y1 = said("y1");
        assert_eq!(p.handle(&y1).await, Outcome::Done);
        // Told while it accepts.
        assert_eq!(cancelled_while_slow(&p, "s1").await, Outcome::Done);
        // Dies: its replacement has said nothing.
        match p.handle(&job(r#"{"id":"d1","task":"die"}"#)).await {
            Outcome::Failed { error, retry: true } => assert!(error.contains("exited"), "{error}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(p.restarts.get(), 1);
        assert_eq!(cancelled_while_slow(&p, "s2").await, Outcome::Done);
        // Until it says so again.
        let y2 = said("y2");
        assert_eq!(p.handle(&y2).await, Outcome::Done);
        assert_eq!(cancelled_while_slow(&p, "s3").await, Outcome::Done);
        assert_eq!(
            p.handle(&job(r#"{"id":"a1","task":"a"}"#)).await,
            Outcome::Done
        );
        assert_eq!(
            read_lines(&lines),
            [
                "job y1",
                "job s1",
                "cancel s1",
                "job d1",
                "job s2",
                "job y2",
                "job s3",
                "cancel s3",
                "job a1"
            ]
        );
    }
}
