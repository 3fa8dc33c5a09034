//! The `exec` handler with several jobs in each child: `--children N` below
//! `--concurrency` (docs/worker.md, "Many jobs in one child").
//!
//! The slots are spread over the children as evenly as they go; each child
//! learns its share from `WORKERPOOL_JOBS_PER_CHILD`. A child with a share
//! above one gets job lines as its slots free up, without waiting for the
//! answers before them, and names the job each answer is for; a child with
//! a share of one speaks the one-job protocol of [`super::exec_pool`].
//!
//! Each child has two tasks: a writer, so that a child that stops reading
//! stdin holds up only the jobs sent to it, and a reader, which hands each
//! answer to the attempt waiting for it and, at the end of the child's
//! stdout, fails every job the child still held. An attempt dropped
//! without its answer (its timeout) sends the child a cancel line; the job
//! keeps its slot until the child answers it, and a child that has not
//! after [`CANCEL_GRACE`] is killed as hung, its other jobs returned to the
//! queue uncounted.
//!
//! Before a job's answer the child may write progress lines for it,
//! `{"id": "<job id>", "progress": <any JSON>}` (no `"ok"`): each goes to
//! the [`Reports`] given by [`Handler::set_reports`], while the child holds
//! the job and the attempt still waits for it. A producer's cancel
//! ([`Handler::cancel`]) writes the child the same cancel line a timeout
//! does, once per job, but the attempt waits for the answer as before and
//! ends with it; no grace period runs (the job has not timed out).
//!
//! What can go wrong, and what it costs:
//! - a line that answers no job the child holds, or a progress line for
//!   one: logged and dropped, no job fails and none is settled twice;
//! - a line longer than [`MAX_ANSWER_BYTES`]: the stream cannot be trusted
//!   after it, so the child is killed and its jobs fail;
//! - a child that dies: each of its jobs fails with the exit and the last
//!   lines of its stderr, or goes back uncounted under the rule for a
//!   handler that cannot start ([`StartupRule`]).

use std::collections::HashMap;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use futures::future::BoxFuture;
use prometheus::IntCounter;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::sync::{Notify, mpsc, oneshot};

use super::exec_pool::{
    EXIT_WAIT, ExecCommand, LAST_WORDS_WAIT, MAX_ANSWER_BYTES, ProgressLine, QUOTE_CHARS,
    SpawnError, Spawned, StartupRule, keep_reports, parse_progress, parse_reply, progress_json,
    said, spawn_child,
};
use super::{Pending, Waiting};
use crate::handler::{Handler, Outcome, Reports};
use workerpool_queue::job::{Job, SharedText};
use workerpool_queue::text;

/// How long a child has to answer a job it was told to cancel before it
/// counts as hung and is killed.
pub const CANCEL_GRACE: Duration = Duration::from_secs(10);
/// How long a hung child stays the handler's problem (in `/readyz` and so
/// in the pool's status) after it was killed.
pub const HUNG_SHOWN_FOR: Duration = Duration::from_secs(60);
/// How long an attempt waiting for a free slot sleeps before it looks
/// again without being woken (a broken handler's backoff ends unannounced).
const RELOOK: Duration = Duration::from_secs(1);

/// The shares of `slots` over `children`: as even as they go, the larger
/// first (10 over 3: 4, 3, 3). Every child gets at least one when
/// `children <= slots`.
pub fn shares(slots: usize, children: usize) -> Vec<usize> {
    let children = children.max(1);
    let (base, extra) = (slots / children, slots % children);
    (0..children)
        .map(|i| base + usize::from(i < extra))
        .collect()
}

/// What the worker writes to a child.
enum Line {
    Job(SharedText),
    Cancel(String),
}

/// Why the worker killed a child, when it did.
enum Killed {
    /// Its one job passed its timeout (a child of the one-job protocol,
    /// which knows no cancel line).
    TimedOut,
    /// It ignored a cancel for [`CANCEL_GRACE`]: the reason, for the jobs
    /// it held.
    Hung(String),
}

/// A job a child holds.
struct Entry {
    /// Tells this attempt from another of a job with the same id.
    seq: u64,
    /// Where its outcome goes; `None` once cancelled (its answer then only
    /// frees the slot).
    waiter: Option<oneshot::Sender<Outcome>>,
    /// The child was written its cancel line (a producer's cancel or the
    /// timeout): it is never written twice.
    cancel_sent: bool,
    /// A progress report over the limit was logged for it.
    progress_warned: bool,
}

#[derive(Default)]
struct InHand {
    /// By job id: no two jobs with one id are in one child at once.
    jobs: HashMap<String, Entry>,
    /// Its stdout has ended: no job is placed on it any more.
    dead: bool,
    /// Whether it has answered a job.
    answered: bool,
    /// Whether it has named a job in an answer or a progress line.
    named: bool,
    killed: Option<Killed>,
}

/// One child.
struct Proc {
    /// Jobs it may hold at once.
    share: usize,
    pid: Option<u32>,
    /// Its process group; taken and dropped (the group killed) to end it.
    group: Mutex<Option<super::GroupGuard>>,
    lines: mpsc::UnboundedSender<Line>,
    in_hand: Mutex<InHand>,
    /// A child whose share is one said it reads cancel lines
    /// (`{"accepts": ["cancel"]}`); every other child reads them anyway.
    accepts_cancel: std::sync::atomic::AtomicBool,
    /// The pool's [`Inner::one_job_program`]: every child speaks the one-job
    /// protocol once one was found to, though its share is more.
    one_job: Arc<AtomicBool>,
}

impl Proc {
    /// Whether it speaks the one-job protocol: one job line, one answer, in
    /// turn, no cancel lines unless it said it reads them.
    fn one_job(&self) -> bool {
        self.share == 1 || self.one_job.load(Ordering::Relaxed)
    }

    /// Whether it is written cancel lines: the one-job protocol knows none,
    /// unless the child said it reads them.
    fn reads_cancel(&self) -> bool {
        !self.one_job() || self.accepts_cancel.load(Ordering::Relaxed)
    }

    /// Jobs it is given at once.
    fn capacity(&self) -> usize {
        if self.one_job() { 1 } else { self.share }
    }

    /// The job an answer or progress line that names none is for, from a child
    /// of the one-job protocol: its oldest, since such a child takes its jobs in
    /// the order it was given them and answers each before reading the next.
    fn oldest(&self, held: &InHand) -> Option<String> {
        if !self.one_job() || held.named {
            return None;
        }
        held.jobs
            .iter()
            .min_by_key(|(_, e)| e.seq)
            .map(|(id, _)| id.clone())
    }

    fn in_hand(&self) -> MutexGuard<'_, InHand> {
        // A panic while holding this lock cannot leave the map inconsistent.
        self.in_hand.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Kills the child and whatever it started.
    fn kill(&self) {
        drop(self.group.lock().unwrap_or_else(|e| e.into_inner()).take());
    }

    fn pid(&self) -> String {
        self.pid.map_or_else(|| "?".into(), |p| p.to_string())
    }
}

/// How a child's stdout ended.
enum End {
    Closed,
    Failed(String),
    TooLong(String),
}

struct Inner {
    command: ExecCommand,
    /// The children, one per share.
    procs: Mutex<Vec<Arc<Proc>>>,
    /// Woken when a slot frees up or a child is replaced.
    freed: Notify,
    restarts: IntCounter,
    rule: StartupRule,
    /// The last hung child: when, and what was said.
    hung: Mutex<Option<(tokio::time::Instant, String)>>,
    seq: AtomicU64,
    /// The pool is being dropped: children ending now are not replaced.
    closing: AtomicBool,
    /// [`CANCEL_GRACE`], shorter in tests.
    cancel_grace: Duration,
    /// Where the jobs' progress goes, once the worker says.
    reports: OnceLock<Arc<dyn Reports>>,
    /// A child answered without naming its job, never having named one: the
    /// program speaks the one-job protocol, so every child, the ones started
    /// later too, is given one job at a time. Shared with every child.
    one_job_program: Arc<AtomicBool>,
    /// Jobs handed to the pool and not yet placed on a child (waiting for a slot,
    /// or out a broken handler's restart backoff).
    pending: Pending,
}

/// The pool: `children` processes sharing the slots.
pub struct ExecMux {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ExecMux {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecMux")
            .field("command", &self.inner.command)
            .finish_non_exhaustive()
    }
}

enum Placement {
    Placed(Ticket, oneshot::Receiver<Outcome>),
    Full,
    Failed(Outcome),
}

/// A job placed on a child. Dropped before its answer came (the attempt
/// timed out or was abandoned), it cancels the job in the child.
struct Ticket {
    inner: Arc<Inner>,
    proc: Arc<Proc>,
    id: String,
    seq: u64,
    armed: bool,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.armed {
            self.inner.cancel(&self.proc, &self.id, self.seq);
        }
    }
}

impl ExecMux {
    /// Starts `children` children sharing `slots` slots. Fails when the
    /// command cannot be started, so a misconfigured worker stops at start.
    /// `restarts` counts children replaced after dying or being killed.
    pub fn start(
        command: ExecCommand,
        slots: usize,
        children: usize,
        restarts: IntCounter,
    ) -> Result<Self, SpawnError> {
        Self::start_with(command, slots, children, restarts, CANCEL_GRACE)
    }

    fn start_with(
        command: ExecCommand,
        slots: usize,
        children: usize,
        restarts: IntCounter,
        cancel_grace: Duration,
    ) -> Result<Self, SpawnError> {
        let inner = Arc::new(Inner {
            rule: StartupRule::new(&command.program),
            command,
            procs: Mutex::new(Vec::new()),
            freed: Notify::new(),
            restarts,
            hung: Mutex::new(None),
            seq: AtomicU64::new(0),
            closing: AtomicBool::new(false),
            cancel_grace,
            reports: OnceLock::new(),
            one_job_program: Arc::default(),
            pending: Pending::default(),
        });
        let mut procs = Vec::new();
        for share in shares(slots, children) {
            match inner.start_proc(share) {
                Ok(proc) => procs.push(proc),
                Err(e) => {
                    procs.iter().for_each(|p: &Arc<Proc>| p.kill());
                    return Err(e);
                }
            }
        }
        *inner.procs() = procs;
        Ok(Self { inner })
    }

    /// The process ids of the children, in the order of their shares.
    pub fn pids(&self) -> Vec<u32> {
        self.inner.procs().iter().filter_map(|p| p.pid).collect()
    }

    /// The jobs each child holds now, cancelled ones included.
    pub fn in_hand(&self) -> Vec<usize> {
        self.inner
            .procs()
            .iter()
            .map(|p| p.in_hand().jobs.len())
            .collect()
    }
}

impl Drop for ExecMux {
    fn drop(&mut self) {
        self.inner.closing.store(true, Ordering::SeqCst);
        for proc in self.inner.procs().iter() {
            proc.kill();
        }
    }
}

impl Handler for ExecMux {
    fn handle<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Outcome> {
        Box::pin(self.inner.attempt(job))
    }

    fn problem(&self) -> Option<String> {
        if let Some(problem) = self.inner.rule.problem() {
            return Some(problem);
        }
        let hung = self.inner.hung.lock().unwrap_or_else(|e| e.into_inner());
        let (at, why) = hung.as_ref()?;
        let ago = at.elapsed();
        (ago < HUNG_SHOWN_FOR).then(|| format!("{why} ({} s ago)", ago.as_secs()))
    }

    fn cancel(&self, id: &str) {
        self.inner.producer_cancel(id);
    }

    fn set_reports(&self, reports: Arc<dyn Reports>) {
        keep_reports(&self.inner.reports, reports);
    }
}

impl Inner {
    fn procs(&self) -> MutexGuard<'_, Vec<Arc<Proc>>> {
        self.procs.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn start_proc(self: &Arc<Self>, share: usize) -> Result<Arc<Proc>, SpawnError> {
        let Spawned {
            child,
            group,
            stdin,
            stdout,
            last_words,
            log,
        } = spawn_child(&self.command, share)?;
        let (lines, to_write) = mpsc::unbounded_channel();
        let proc = Arc::new(Proc {
            share,
            pid: child.id(),
            group: Mutex::new(Some(group)),
            lines,
            in_hand: Mutex::new(InHand::default()),
            accepts_cancel: std::sync::atomic::AtomicBool::new(false),
            one_job: Arc::clone(&self.one_job_program),
        });
        tokio::spawn(write_lines(stdin, to_write, Arc::downgrade(&proc)));
        tokio::spawn(read_answers(
            Arc::downgrade(self),
            Arc::clone(&proc),
            child,
            stdout,
            last_words,
            log,
        ));
        Ok(proc)
    }

    async fn attempt(self: &Arc<Self>, job: &Job) -> Outcome {
        let line = job.json_line();
        // A producer's cancel that comes before the job is placed is kept for it.
        let waiting = self.pending.wait(job.id());
        let (mut ticket, answer) = loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            match self.place(job.id(), &line, &waiting) {
                Placement::Placed(ticket, answer) => break (ticket, answer),
                Placement::Failed(outcome) => return outcome,
                Placement::Full => {
                    let _ = tokio::time::timeout(RELOOK, freed).await;
                }
            }
        };
        // Placed: a producer's cancel finds it on its child now.
        drop(waiting);
        let outcome = answer.await;
        ticket.armed = false;
        outcome.unwrap_or_else(|_| Outcome::retry("the handler child was lost during the job"))
    }

    /// Puts the job on the child with the most free slots that does not
    /// hold a job with its id, replacing dead children first unless the
    /// handler is broken and its backoff runs. A job a producer `asked` to
    /// cancel while it waited gets its cancel line right after its job line,
    /// when the child reads them.
    fn place(self: &Arc<Self>, id: &str, line: &SharedText, waiting: &Waiting<'_>) -> Placement {
        let mut procs = self.procs();
        if self.rule.start_wait().is_none() {
            for slot in procs.iter_mut() {
                if !slot.in_hand().dead {
                    continue;
                }
                match self.start_proc(slot.share) {
                    Ok(fresh) => {
                        self.restarts.inc();
                        *slot = fresh;
                    }
                    Err(e) => {
                        let error = e.to_string();
                        return Placement::Failed(if self.rule.died_unanswered(&error) {
                            self.rule.not_run(error)
                        } else {
                            Outcome::retry(error)
                        });
                    }
                }
            }
        }
        let mut best: Option<(usize, &Arc<Proc>)> = None;
        for proc in procs.iter() {
            let held = proc.in_hand();
            if held.dead || held.jobs.len() >= proc.capacity() || held.jobs.contains_key(id) {
                continue;
            }
            let free = proc.capacity() - held.jobs.len();
            if best.is_none_or(|(most, _)| free > most) {
                best = Some((free, proc));
            }
        }
        let Some((_, proc)) = best else {
            return Placement::Full;
        };
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let (waiter, answer) = oneshot::channel();
        // Asked with the children's list held: a producer's cancel that
        // comes later looks for the job on its child, after this insert.
        let tell = waiting.asked() && proc.reads_cancel();
        proc.in_hand().jobs.insert(
            id.to_string(),
            Entry {
                seq,
                waiter: Some(waiter),
                cancel_sent: tell,
                progress_warned: false,
            },
        );
        if proc.lines.send(Line::Job(line.clone())).is_err() {
            // Its writer has stopped: the child is on its way out.
            proc.in_hand().jobs.remove(id);
            return Placement::Full;
        }
        if tell {
            tracing::debug!(
                pid = %proc.pid(),
                id = %text::escaped(id.as_bytes(), QUOTE_CHARS),
                "a producer cancelled the job before it was placed: the child is told"
            );
            let _ = proc.lines.send(cancel_line(id));
        }
        Placement::Placed(
            Ticket {
                inner: Arc::clone(self),
                proc: Arc::clone(proc),
                id: id.to_string(),
                seq,
                armed: true,
            },
            answer,
        )
    }

    /// An attempt ended without its answer: the child is told to cancel
    /// the job, which keeps its slot until the child answers it.
    fn cancel(self: &Arc<Self>, proc: &Arc<Proc>, id: &str, seq: u64) {
        let sent = {
            let mut held = proc.in_hand();
            let sent = match held.jobs.get_mut(id) {
                Some(entry) if entry.seq == seq => {
                    entry.waiter = None;
                    std::mem::replace(&mut entry.cancel_sent, true)
                }
                _ => return,
            };
            if held.dead {
                return;
            }
            if proc.one_job() {
                // The one-job protocol has no cancel line: the child is
                // killed and replaced, as a pool of such children does.
                held.killed = Some(Killed::TimedOut);
                drop(held);
                proc.kill();
                return;
            }
            sent
        };
        // A producer's cancel may have been written already.
        if !sent {
            let _ = proc.lines.send(cancel_line(id));
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let inner = Arc::downgrade(self);
        let inner_grace = self.cancel_grace;
        let proc = Arc::clone(proc);
        let id = id.to_string();
        runtime.spawn(async move {
            tokio::time::sleep(inner_grace).await;
            let Some(inner) = inner.upgrade() else {
                return;
            };
            let mut held = proc.in_hand();
            if held.dead || held.jobs.get(&id).is_none_or(|e| e.seq != seq) {
                return;
            }
            let others = held.jobs.values().filter(|e| e.waiter.is_some()).count();
            let why = format!(
                "handler child {} did not answer the cancel of job \"{}\" within {:?} of its timeout: it was killed as hung, and the {others} other jobs it held go back to the queue uncounted",
                proc.pid(),
                text::escaped(id.as_bytes(), QUOTE_CHARS),
                inner_grace
            );
            held.killed = Some(Killed::Hung(why.clone()));
            drop(held);
            tracing::error!(program = %inner.command.program, "{why}");
            *inner.hung.lock().unwrap_or_else(|e| e.into_inner()) =
                Some((tokio::time::Instant::now(), why));
            proc.kill();
        });
    }

    /// A producer asked to cancel job `id`: each child of the multiplexed
    /// protocol holding it, still waited for and not yet told, gets the
    /// cancel line. The attempt waits for the answer as before.
    fn producer_cancel(&self, id: &str) {
        self.pending.cancel(id);
        let procs: Vec<_> = self.procs().iter().map(Arc::clone).collect();
        for proc in procs {
            if !proc.reads_cancel() {
                continue;
            }
            {
                let mut held = proc.in_hand();
                if held.dead {
                    continue;
                }
                match held.jobs.get_mut(id) {
                    Some(entry) if entry.waiter.is_some() && !entry.cancel_sent => {
                        entry.cancel_sent = true;
                    }
                    _ => continue,
                }
            }
            tracing::debug!(
                pid = %proc.pid(),
                id = %text::escaped(id.as_bytes(), QUOTE_CHARS),
                "a producer cancels the job: the child is told"
            );
            let _ = proc.lines.send(cancel_line(id));
        }
    }

    /// A progress line from a child: reported for the job it names, when
    /// the child holds it and it is still waited for; otherwise logged (a
    /// job the child does not hold) and dropped.
    fn progress(&self, proc: &Proc, line: &[u8], progress: ProgressLine) {
        let mut held = proc.in_hand();
        let named = match progress.id {
            Some(serde_json::Value::String(id)) => {
                held.named = true;
                Some(id)
            }
            // The one-job protocol: the progress is the oldest job's.
            None => proc.oldest(&held),
            _ => None,
        };
        let id = match named {
            Some(id) => id,
            None => {
                let holds = held.jobs.len();
                drop(held);
                tracing::warn!(
                    program = %self.command.program,
                    pid = %proc.pid(),
                    "handler broke the protocol: a progress line names no job (\"id\", a string) while the child holds {holds}; dropped: \"{}\"",
                    text::escaped(line.trim_ascii_end(), QUOTE_CHARS)
                );
                return;
            }
        };
        let Some(entry) = held.jobs.get_mut(&id) else {
            drop(held);
            tracing::warn!(
                program = %self.command.program,
                pid = %proc.pid(),
                "handler broke the protocol: a progress line names job \"{}\", which the child does not hold (never given to it, or answered already); dropped",
                text::escaped(id.as_bytes(), QUOTE_CHARS)
            );
            return;
        };
        // Its attempt ended (its timeout): no one runs it any more.
        let Some(reports) = self.reports.get().filter(|_| entry.waiter.is_some()) else {
            return;
        };
        let json = progress_json(
            &self.command.program,
            &id,
            &progress.value,
            &mut entry.progress_warned,
        );
        // The lock is not held while the report is handed on.
        drop(held);
        if let Some(json) = json {
            reports.progress(&id, json);
        }
    }

    /// One line from a child: the answer to a job it holds, progress for
    /// one, or something to log and drop.
    fn answer(&self, proc: &Proc, line: &[u8]) {
        let (id, outcome) = match parse_reply(line) {
            Ok(reply) => reply,
            Err(error) => {
                // A line with "progress" and no "ok" is no answer.
                if let Some(progress) = parse_progress(line) {
                    self.progress(proc, line, progress);
                    return;
                }
                // Nor is an accepts line: a child whose share is one gets
                // a producer's cancel once it said it reads them.
                if let Some(cancel) = super::exec_pool::accepts_line(line) {
                    proc.accepts_cancel
                        .store(cancel, std::sync::atomic::Ordering::Relaxed);
                    return;
                }
                tracing::warn!(
                    program = %self.command.program,
                    pid = %proc.pid(),
                    "{error}; the line is dropped and no job fails for it"
                );
                return;
            }
        };
        let mut held = proc.in_hand();
        // Said once the child's lock is let go: the pool's lock comes first.
        let mut revealed = None;
        if id.is_some() {
            held.named = true;
        } else if proc.share > 1
            && !held.named
            && !held.jobs.is_empty()
            && !proc.one_job.swap(true, Ordering::Relaxed)
        {
            revealed = Some(held.jobs.len());
        }
        let id = match id.or_else(|| proc.oldest(&held)) {
            Some(id) => id,
            None => {
                let holds = held.jobs.len();
                drop(held);
                tracing::warn!(
                    program = %self.command.program,
                    pid = %proc.pid(),
                    "handler broke the protocol: an answer names no job (\"id\") while the child holds {holds}; with several jobs per child every answer names its job. Dropped: \"{}\"",
                    text::escaped(line.trim_ascii_end(), QUOTE_CHARS)
                );
                return;
            }
        };
        let Some(entry) = held.jobs.remove(&id) else {
            drop(held);
            tracing::warn!(
                program = %self.command.program,
                pid = %proc.pid(),
                "handler broke the protocol: an answer names job \"{}\", which the child does not hold (never given to it, or answered already); dropped",
                text::escaped(id.as_bytes(), QUOTE_CHARS)
            );
            return;
        };
        held.answered = true;
        drop(held);
        if let Some(holds) = revealed {
            self.found_one_job_program(proc, holds);
        }
        self.rule.answered();
        match entry.waiter {
            Some(waiter) => {
                let _ = waiter.send(outcome);
            }
            None => tracing::debug!(
                pid = %proc.pid(),
                id = %text::escaped(id.as_bytes(), QUOTE_CHARS),
                "a cancelled job was answered; its slot is free"
            ),
        }
        self.freed.notify_waiters();
    }

    /// A child with a share above one answered without naming its job, never
    /// having named one: a program of the one-job protocol (a plain loop that
    /// reads a job and answers it) run under `--children` below
    /// `--concurrency`. It answers the jobs it was given in turn, so each such
    /// answer is its oldest job's, and from now on every child of the pool is
    /// given one job at a time. Said once, loudly: the pool runs a job a child.
    fn found_one_job_program(&self, proc: &Proc, holds: usize) {
        tracing::warn!(
            program = %self.command.program,
            pid = %proc.pid(),
            "handler child answers without naming its job (\"id\") and has named none: it speaks the one-job protocol though it was given {share} jobs at once (WORKERPOOL_JOBS_PER_CHILD); its answers go to its jobs in the order it was given them ({holds} in hand), and every child gets one job at a time from now on, so this pool runs {children} jobs at once, not its concurrency. Name each answer's job to run several in a child, or set --children (spec.worker.children) to the concurrency",
            share = proc.share,
            children = self.procs().len(),
        );
    }

    /// A child's stdout ended: every job it held gets its outcome, and the
    /// child is replaced.
    fn buried(
        self: &Arc<Self>,
        proc: &Arc<Proc>,
        end: End,
        status: Option<ExitStatus>,
        words: &str,
    ) {
        let (waiters, answered, killed) = {
            let mut held = proc.in_hand();
            let waiters: Vec<_> = held.jobs.drain().filter_map(|(_, e)| e.waiter).collect();
            (waiters, held.answered, held.killed.take())
        };
        if self.closing.load(Ordering::SeqCst) {
            return;
        }
        let outcome = match killed {
            Some(Killed::Hung(why)) => Some(Outcome::NotRun {
                error: said(&why, words),
                delay: Duration::ZERO,
            }),
            Some(Killed::TimedOut) => None,
            None => {
                let what = match (&end, status) {
                    (End::TooLong(start), _) => format!(
                        "handler broke the protocol: it wrote more than {MAX_ANSWER_BYTES} bytes without a newline: \"{start}\""
                    ),
                    (_, Some(status)) => {
                        format!("handler process exited during the job ({status})")
                    }
                    (End::Failed(e), None) => format!("talking to the handler process failed: {e}"),
                    (End::Closed, None) => {
                        "handler process closed its stdout during the job".into()
                    }
                };
                let error = said(&what, words);
                Some(if !answered && self.rule.died_unanswered(&error) {
                    self.rule.not_run(error)
                } else {
                    Outcome::retry(error)
                })
            }
        };
        if let Some(outcome) = outcome {
            for waiter in waiters {
                let _ = waiter.send(outcome.clone());
            }
        }
        if self.rule.start_wait().is_none() {
            let mut procs = self.procs();
            if let Some(slot) = procs.iter_mut().find(|p| Arc::ptr_eq(p, proc)) {
                match self.start_proc(proc.share) {
                    Ok(fresh) => {
                        self.restarts.inc();
                        *slot = fresh;
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "handler child could not be replaced; retrying on the next job")
                    }
                }
            }
        }
        self.freed.notify_waiters();
    }
}

/// The line that tells a child to cancel job `id`.
fn cancel_line(id: &str) -> Line {
    Line::Cancel(serde_json::json!({ "cancel": id }).to_string())
}

/// Writes the lines for one child. A write that fails means the child
/// cannot take jobs any more: it is killed, so that its jobs fail now
/// rather than at their timeout.
async fn write_lines(
    mut stdin: ChildStdin,
    mut lines: mpsc::UnboundedReceiver<Line>,
    proc: Weak<Proc>,
) {
    while let Some(line) = lines.recv().await {
        let text: &str = match &line {
            Line::Job(job) => job,
            Line::Cancel(cancel) => cancel,
        };
        let written = match super::write_line(&mut stdin, text).await {
            Ok(()) => stdin.flush().await,
            Err(e) => Err(e),
        };
        if let Err(e) = written {
            if let Some(proc) = proc.upgrade() {
                tracing::warn!(pid = %proc.pid(), error = %e, "cannot write to the handler child; it is replaced");
                proc.kill();
            }
            return;
        }
    }
}

/// Reads one child's answers until its stdout ends, then buries it.
async fn read_answers(
    inner: Weak<Inner>,
    proc: Arc<Proc>,
    mut child: Child,
    mut stdout: BufReader<ChildStdout>,
    last_words: Arc<Mutex<String>>,
    log: tokio::task::JoinHandle<()>,
) {
    let limit = MAX_ANSWER_BYTES as u64 + 1;
    let mut line = Vec::new();
    let end = loop {
        line.clear();
        // Bytes, not text: a line that is not UTF-8 is reported, not a
        // read error.
        match (&mut stdout).take(limit).read_until(b'\n', &mut line).await {
            Ok(0) => break End::Closed,
            Err(e) => break End::Failed(e.to_string()),
            Ok(_) if line.len() > MAX_ANSWER_BYTES => {
                break End::TooLong(text::escaped(&line, QUOTE_CHARS));
            }
            Ok(_) => match inner.upgrade() {
                Some(inner) => inner.answer(&proc, &line),
                None => return,
            },
        }
    };
    proc.in_hand().dead = true;
    if !matches!(end, End::Closed) {
        proc.kill();
    }
    let status = match tokio::time::timeout(EXIT_WAIT, child.wait()).await {
        Ok(Ok(status)) => Some(status),
        _ => {
            // One that lingers with its stdout closed is ended all the same.
            proc.kill();
            let _ = child.start_kill();
            None
        }
    };
    let _ = tokio::time::timeout(LAST_WORDS_WAIT, log).await;
    let words = last_words.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if let Some(inner) = inner.upgrade() {
        inner.buried(&proc, end, status, &words);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use workerpool_queue::job::{Intake, intake};

    /// A multiplexed child in Python: each job runs on a thread and is
    /// answered with its id; `data.do` picks a misbehaviour.
    const CHILD: &str = r#"
import json, os, sys, threading, time
share = int(os.environ["WORKERPOOL_JOBS_PER_CHILD"])
lock = threading.Lock()
held, cancels, barrier, cancel_lines = {}, {}, [], {}
def say(obj):
    with lock:
        sys.stdout.write(json.dumps(obj) + "\n"); sys.stdout.flush()
def run(job):
    jid, d = job["id"], job.get("data") or {}
    act = d.get("do", "ok")
    if act == "die":
        time.sleep(d.get("ms", 0) / 1000); print("dying on purpose", file=sys.stderr, flush=True); os._exit(3)
    if act == "barrier":
        with lock: barrier.append(jid); n = len(barrier)
        while len(barrier) < d["n"]: time.sleep(0.005)
    if act == "honour":
        cancels[jid].wait(); say({"id": jid, "ok": False, "error": "cancelled"}); return
    if act == "ignore":
        time.sleep(3600)
    if act == "progress":
        say({"id": jid, "progress": {"step": 1}}); say({"id": jid, "progress": "two"})
        say({"id": jid, "ok": True, "result": {"n": 2}}); return
    if act == "stray_progress":
        say({"id": "nobody", "progress": 1}); say({"progress": "no id"}); say({"id": 5, "progress": 1})
        say({"id": jid, "progress": 1})
    if act == "big_progress":
        say({"id": jid, "progress": "x" * 4095}); say({"id": jid, "progress": "y" * 9000})
        say({"id": jid, "progress": "z" * 4094})
    if act == "honour_ok":
        cancels[jid].wait(); time.sleep(0.2)
        say({"id": jid, "ok": True, "result": cancel_lines.get(jid)}); return
    if act == "honour_badly":
        cancels[jid].wait()
        say({"id": "never-given", "ok": True})
        say({"id": jid, "ok": False, "error": "stopped", "retry": False})
        say({"id": jid, "ok": True})
        with lock: sys.stdout.write('{"id": "' + jid + '", "ok": tr'); sys.stdout.flush()
        os._exit(0)
    if act == "unheeding":
        time.sleep(d["ms"] / 1000); say({"id": jid, "ok": True, "result": cancel_lines.get(jid)}); return
    if act == "report":
        say({"id": jid, "ok": True, "result": cancel_lines.get(d["of"])}); return
    if act == "flood":
        with lock: sys.stdout.write("x" * (3 << 20)); sys.stdout.flush()
        time.sleep(3600)
    time.sleep(d.get("ms", 0) / 1000)
    if act == "garbage": say("not an answer"); sys.stdout.write("{bad json\n"); sys.stdout.flush()
    if act == "unknown": say({"id": "never-given", "ok": True})
    if act == "noid": say({"ok": True}); return
    if act == "fail": say({"id": jid, "ok": False, "error": "asked", "retry": False}); return
    say({"id": jid, "ok": True})
    if act == "twice": say({"id": jid, "ok": False, "error": "second answer"})
for line in sys.stdin:
    msg = json.loads(line)
    if (msg.get("data") or {}).get("do") == "stall":
        time.sleep(3600)
    if "cancel" in msg:
        cancel_lines.setdefault(msg["cancel"], []).append(line.rstrip("\n"))
        ev = cancels.get(msg["cancel"])
        if ev: ev.set()
        continue
    with lock:
        if msg["id"] in held: print("DUPLICATE", file=sys.stderr, flush=True)
        held[msg["id"]] = 1
        if len(held) > share: print("OVER SHARE", file=sys.stderr, flush=True)
    cancels[msg["id"]] = threading.Event()
    def go(m=msg):
        try: run(m)
        finally:
            with lock: held.pop(m["id"], None)
    threading.Thread(target=go, daemon=True).start()
"#;

    fn mux(slots: usize, children: usize, grace: Duration) -> ExecMux {
        ExecMux::start_with(
            ExecCommand {
                program: "python3".into(),
                args: vec!["-c".into(), CHILD.into()],
            },
            slots,
            children,
            IntCounter::new("r", "r").expect("counter"),
            grace,
        )
        .expect("start")
    }

    fn job(id: &str, data: serde_json::Value) -> Job {
        let raw = serde_json::json!({"id": id, "task": "t", "data": data}).to_string();
        match intake(&raw, 0, 5, "w") {
            Intake::Run { job, .. } => job,
            other => panic!("{other:?}"),
        }
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
        fn of(&self, id: &str) -> Vec<String> {
            let all = self.0.lock().expect("reports");
            all.iter()
                .filter(|(i, _)| i == id)
                .map(|(_, v)| v.clone())
                .collect()
        }

        fn all(&self) -> Vec<(String, String)> {
            self.0.lock().expect("reports").clone()
        }
    }

    fn reported(pool: &ExecMux) -> Arc<Collected> {
        let reports = Arc::new(Collected::default());
        pool.set_reports(reports.clone());
        reports
    }

    /// The JSON a job returned, parsed.
    fn returned(outcome: &Outcome) -> serde_json::Value {
        match outcome {
            Outcome::Returned(json) => serde_json::from_str(json).expect("JSON"),
            other => panic!("expected a result, got {other:?}"),
        }
    }

    /// Starts `fut` and lets it run until its job is in a child.
    async fn started<F: std::future::Future<Output = Outcome>>(
        fut: std::pin::Pin<&mut F>,
    ) -> std::pin::Pin<&mut F> {
        let mut fut = fut;
        tokio::select! {
            o = &mut fut => panic!("ended before it was cancelled: {o:?}"),
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
        fut
    }

    fn failed(outcome: &Outcome) -> &str {
        match outcome {
            Outcome::Failed { error, retry: true } => error,
            other => panic!("expected a retried failure, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn one_child_holds_its_whole_share_at_once_and_answers_in_any_order() {
        let pool = mux(20, 1, CANCEL_GRACE);
        // 20 jobs that each answer only once all 20 are in the child.
        let jobs: Vec<_> = (0..20)
            .map(|i| {
                job(
                    &format!("b{i}"),
                    serde_json::json!({"do": "barrier", "n": 20}),
                )
            })
            .collect();
        let outcomes = futures::future::join_all(jobs.iter().map(|j| pool.handle(j))).await;
        assert!(outcomes.iter().all(|o| *o == Outcome::Done), "{outcomes:?}");
        // A quick job sent after a slow one is answered first.
        let (slow, quick) = (
            job("slow", serde_json::json!({"ms": 400})),
            job("quick", serde_json::json!({})),
        );
        let slow = pool.handle(&slow);
        tokio::pin!(slow);
        tokio::select! {
            _ = &mut slow => panic!("the slow job came first"),
            quick = pool.handle(&quick) => assert_eq!(quick, Outcome::Done),
        }
        assert_eq!(slow.await, Outcome::Done);
        assert_eq!(pool.inner.restarts.get(), 0);
    }

    #[tokio::test]
    async fn lines_that_answer_no_held_job_are_dropped_and_fail_nothing() {
        let pool = mux(4, 1, CANCEL_GRACE);
        let long = job("long", serde_json::json!({"ms": 3000}));
        let long = pool.handle(&long);
        tokio::pin!(long);
        for (id, act) in [
            ("g", "garbage"),
            ("u", "unknown"),
            ("n", "noid"),
            ("t", "twice"),
        ] {
            let j = job(id, serde_json::json!({"do": act}));
            let outcome = tokio::select! {
                _ = &mut long => panic!("the long job ended early"),
                o = tokio::time::timeout(Duration::from_secs(1), pool.handle(&j)) => o,
            };
            match act {
                // Its only answer named no job: it is never settled.
                "noid" => assert!(outcome.is_err(), "{outcome:?}"),
                _ => assert_eq!(outcome, Ok(Outcome::Done), "{act}"),
            }
        }
        // The second answer to "t" settled nothing: a new job with its id
        // gets its own answer. The child writes that second answer right
        // after the first, from the job's thread: a job sent after it (and
        // a moment) makes sure the line was read, and dropped, before a new
        // "t" is held.
        let sync = job("s", serde_json::json!({}));
        assert_eq!(pool.handle(&sync).await, Outcome::Done);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let again = job("t", serde_json::json!({"do": "fail"}));
        assert_eq!(pool.handle(&again).await, Outcome::permanent("asked"));
        assert_eq!(long.await, Outcome::Done);
        assert_eq!(pool.inner.restarts.get(), 0, "no child was replaced");
    }

    #[tokio::test]
    async fn a_child_that_dies_with_30_jobs_fails_all_30_with_its_last_words() {
        let pool = mux(30, 1, CANCEL_GRACE);
        let mut jobs: Vec<_> = (0..29)
            .map(|i| job(&format!("j{i}"), serde_json::json!({"ms": 5000})))
            .collect();
        jobs.push(job("die", serde_json::json!({"do": "die", "ms": 200})));
        let outcomes = futures::future::join_all(jobs.iter().map(|j| pool.handle(j))).await;
        for outcome in &outcomes {
            let error = failed(outcome);
            assert!(error.contains("exited"), "{error}");
            assert!(error.contains("dying on purpose"), "{error}");
        }
        assert_eq!(pool.inner.restarts.get(), 1);
        let next = job("next", serde_json::json!({}));
        assert_eq!(pool.handle(&next).await, Outcome::Done);
    }

    #[tokio::test]
    async fn a_line_past_the_limit_ends_the_child_and_fails_every_job_it_held() {
        let pool = mux(3, 1, CANCEL_GRACE);
        let jobs = [
            job("a", serde_json::json!({"ms": 60_000})),
            job("b", serde_json::json!({"ms": 60_000})),
            job("flood", serde_json::json!({"do": "flood"})),
        ];
        let outcomes = tokio::time::timeout(
            Duration::from_secs(10),
            futures::future::join_all(jobs.iter().map(|j| pool.handle(j))),
        )
        .await
        .expect("the flood ends the child");
        for outcome in &outcomes {
            let error = failed(outcome);
            assert!(
                error.contains("more than 2097152 bytes without a newline"),
                "{error}"
            );
            assert!(
                error.len() < 2000,
                "the line is quoted cut: {} bytes",
                error.len()
            );
        }
        assert_eq!(pool.inner.restarts.get(), 1);
        let next = job("next", serde_json::json!({}));
        assert_eq!(pool.handle(&next).await, Outcome::Done);
    }

    #[tokio::test]
    async fn a_timed_out_job_is_cancelled_in_the_child_which_keeps_the_others() {
        let pool = mux(2, 1, CANCEL_GRACE);
        let other = job("other", serde_json::json!({"ms": 500}));
        let other = pool.handle(&other);
        tokio::pin!(other);
        let slow = job("slow", serde_json::json!({"do": "honour"}));
        let timed_out = tokio::time::timeout(Duration::from_millis(100), pool.handle(&slow)).await;
        assert!(timed_out.is_err());
        assert_eq!(other.await, Outcome::Done);
        // The cancel was answered: the slot is free again.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while pool.in_hand() != [0] {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{:?}",
                pool.in_hand()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(pool.inner.restarts.get(), 0);
        assert!(pool.problem().is_none());
    }

    #[tokio::test]
    async fn a_child_that_ignores_a_cancel_is_killed_as_hung_and_its_other_jobs_go_back_uncounted()
    {
        let pool = mux(3, 1, Duration::from_millis(300));
        let others: Vec<_> = (0..2)
            .map(|i| job(&format!("o{i}"), serde_json::json!({"ms": 60_000})))
            .collect();
        let others = futures::future::join_all(others.iter().map(|j| pool.handle(j)));
        tokio::pin!(others);
        let stuck = job("stuck", serde_json::json!({"do": "ignore"}));
        let timed_out = tokio::select! {
            _ = &mut others => panic!("others ended first"),
            t = tokio::time::timeout(Duration::from_millis(100), pool.handle(&stuck)) => t,
        };
        assert!(timed_out.is_err());
        for outcome in others.await {
            match outcome {
                Outcome::NotRun { error, .. } => {
                    assert!(error.contains("did not answer the cancel"), "{error}");
                    assert!(error.contains("stuck"), "{error}");
                }
                other => panic!("{other:?}"),
            }
        }
        let problem = pool.problem().expect("a hung child is a handler problem");
        assert!(problem.contains("hung"), "{problem}");
        assert_eq!(pool.inner.restarts.get(), 1);
        let next = job("next", serde_json::json!({}));
        assert_eq!(pool.handle(&next).await, Outcome::Done);
    }

    #[tokio::test]
    async fn jobs_with_one_id_never_meet_in_a_child_and_no_child_exceeds_its_share() {
        let pool = mux(5, 2, CANCEL_GRACE);
        let mut rng = 0x9e37_79b9_u64;
        let mut jobs = Vec::new();
        for i in 0..60 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            // Few distinct ids, so that duplicates are common.
            let id = format!("k{}", rng % 6);
            jobs.push((i, job(&id, serde_json::json!({"ms": rng % 40}))));
        }
        let outcomes = futures::future::join_all(jobs.iter().map(|(_, j)| pool.handle(j))).await;
        assert!(outcomes.iter().all(|o| *o == Outcome::Done), "{outcomes:?}");
        let seen: HashSet<_> = jobs.iter().map(|(_, j)| j.id().to_string()).collect();
        assert!(seen.len() > 1);
        assert_eq!(pool.inner.restarts.get(), 0);
    }

    #[tokio::test]
    async fn a_child_that_stops_reading_holds_up_only_the_jobs_sent_to_it() {
        let pool = mux(4, 2, Duration::from_millis(300));
        // The first child stops reading stdin at its first job.
        let stall = job("stall", serde_json::json!({"do": "stall"}));
        let stalled = tokio::time::timeout(Duration::from_millis(200), pool.handle(&stall)).await;
        assert!(stalled.is_err());
        // Jobs far larger than a pipe holds: the one sent to the stalled
        // child blocks its writer, never the other child's.
        let big = "x".repeat(2 << 20);
        let jobs: Vec<_> = (0..6)
            .map(|i| job(&format!("big{i}"), serde_json::json!({"pad": big})))
            .collect();
        let outcomes =
            futures::future::join_all(jobs.iter().map(|j| async {
                tokio::time::timeout(Duration::from_secs(1), pool.handle(j)).await
            }))
            .await;
        let done = outcomes
            .iter()
            .filter(|o| matches!(o, Ok(Outcome::Done)))
            .count();
        assert!(done >= 4, "{outcomes:?}");
        // The stalled child is killed as hung once its cancels go
        // unanswered; the pool is whole again.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while pool.inner.restarts.get() == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the stalled child was never replaced"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let next = job("next", serde_json::json!({}));
        assert_eq!(pool.handle(&next).await, Outcome::Done);
    }

    #[tokio::test]
    async fn a_share_of_one_speaks_the_one_job_protocol() {
        // 3 slots over 2 children: shares 2 and 1. The child answers in
        // turn, naming the job only when its share says it must.
        let script = r#"
import json, os, sys
share = int(os.environ["WORKERPOOL_JOBS_PER_CHILD"])
for line in sys.stdin:
    job = json.loads(line)
    answer = {"ok": True, "share": share}
    if share > 1: answer["id"] = job["id"]
    print(json.dumps(answer), flush=True)
"#;
        let pool = ExecMux::start(
            ExecCommand {
                program: "python3".into(),
                args: vec!["-c".into(), script.into()],
            },
            3,
            2,
            IntCounter::new("r", "r").expect("counter"),
        )
        .expect("start");
        assert_eq!(pool.pids().len(), 2);
        let jobs: Vec<_> = (0..12)
            .map(|i| job(&format!("a{i}"), serde_json::json!({})))
            .collect();
        let outcomes = tokio::time::timeout(
            Duration::from_secs(10),
            futures::future::join_all(jobs.iter().map(|j| pool.handle(j))),
        )
        .await
        .expect("every job answered");
        assert!(outcomes.iter().all(|o| *o == Outcome::Done), "{outcomes:?}");
    }

    #[tokio::test]
    async fn a_one_job_program_under_fewer_children_gets_each_answer_to_its_job_and_a_job_at_a_time()
     {
        // A plain loop of the one-job protocol (no ids), given 4 jobs at once by
        // a share of 4: its answers, in the order it read the jobs, go to its
        // oldest job each, and from its first answer on it holds one job at a
        // time.
        let script = r#"
import json, sys, time
for line in sys.stdin:
    job = json.loads(line)
    time.sleep(job["data"]["ms"] / 1000)
    print(json.dumps({"ok": True, "result": {"n": job["data"]["n"]}}), flush=True)
"#;
        let pool = ExecMux::start(
            ExecCommand {
                program: "python3".into(),
                args: vec!["-c".into(), script.into()],
            },
            4,
            1,
            IntCounter::new("r", "r").expect("counter"),
        )
        .expect("start");
        // Durations out of order, so that answers in any other order than the
        // jobs' would give some job another's result.
        const MS: [u64; 4] = [30, 5, 20, 1];
        let jobs: Vec<_> = (0..10)
            .map(|n| {
                job(
                    &format!("s{n}"),
                    serde_json::json!({"n": n, "ms": MS[n % 4]}),
                )
            })
            .collect();
        let outcomes = tokio::time::timeout(
            Duration::from_secs(10),
            futures::future::join_all(jobs.iter().map(|j| pool.handle(j))),
        )
        .await
        .expect("every job answered");
        for (n, outcome) in outcomes.iter().enumerate() {
            assert_eq!(returned(outcome), serde_json::json!({"n": n}), "job s{n}");
        }
        assert!(pool.inner.one_job_program.load(Ordering::Relaxed));
        let held = pool.inner.procs()[0].capacity();
        assert_eq!(held, 1);
    }

    #[tokio::test]
    async fn progress_lines_are_reported_in_order_for_their_job_and_the_answer_settles_it() {
        let pool = mux(4, 1, CANCEL_GRACE);
        let reports = reported(&pool);
        let jobs = [
            job("p1", serde_json::json!({"do": "progress"})),
            job("p2", serde_json::json!({"do": "progress"})),
        ];
        let outcomes = futures::future::join_all(jobs.iter().map(|j| pool.handle(j))).await;
        for outcome in &outcomes {
            assert_eq!(returned(outcome), serde_json::json!({"n": 2}));
        }
        for id in ["p1", "p2"] {
            assert_eq!(reports.of(id), [r#"{"step":1}"#, r#""two""#], "{id}");
        }
        assert_eq!(reports.all().len(), 4);
        assert_eq!(pool.inner.restarts.get(), 0);
    }

    #[tokio::test]
    async fn progress_for_a_job_the_child_does_not_hold_is_dropped_and_fails_nothing() {
        let pool = mux(4, 1, CANCEL_GRACE);
        let reports = reported(&pool);
        let jobs = [
            job("s", serde_json::json!({"do": "stray_progress"})),
            job("p", serde_json::json!({"do": "progress"})),
        ];
        let outcomes = futures::future::join_all(jobs.iter().map(|j| pool.handle(j))).await;
        assert_eq!(outcomes[0], Outcome::Done);
        assert_eq!(returned(&outcomes[1]), serde_json::json!({"n": 2}));
        // "nobody", no id and a number for an id: none reported.
        assert_eq!(reports.of("s"), ["1"]);
        assert_eq!(reports.of("p"), [r#"{"step":1}"#, r#""two""#]);
        assert_eq!(reports.all().len(), 3, "{:?}", reports.all());
        assert_eq!(pool.inner.restarts.get(), 0);
        // Without reports set, progress is dropped and the job is as ever.
        let quiet = mux(2, 1, CANCEL_GRACE);
        let p = job("p", serde_json::json!({"do": "progress"}));
        assert_eq!(
            returned(&quiet.handle(&p).await),
            serde_json::json!({"n": 2})
        );
    }

    #[tokio::test]
    async fn progress_over_the_limit_is_dropped_and_the_rest_is_reported() {
        let pool = mux(2, 1, CANCEL_GRACE);
        let reports = reported(&pool);
        let big = job("big", serde_json::json!({"do": "big_progress"}));
        assert_eq!(pool.handle(&big).await, Outcome::Done);
        let got = reports.of("big");
        // 4095 x's and their quotes are 4097 bytes, 9000 y's more: both
        // dropped; 4094 z's are 4096 bytes, the limit: reported.
        assert_eq!(
            got.len(),
            1,
            "{:?}",
            got.iter().map(String::len).collect::<Vec<_>>()
        );
        assert_eq!(got[0].len(), workerpool_queue::outcome::MAX_PROGRESS_BYTES);
        assert!(got[0].starts_with("\"zzz"));
        assert_eq!(pool.inner.restarts.get(), 0);
    }

    #[tokio::test]
    async fn a_producers_cancel_writes_the_cancel_line_once_and_the_job_ends_with_its_answer() {
        // A grace far shorter than the job: a producer's cancel starts none.
        let pool = mux(2, 1, Duration::from_millis(50));
        let honour = job("c1", serde_json::json!({"do": "honour_ok"}));
        let running = pool.handle(&honour);
        tokio::pin!(running);
        let running = started(running).await;
        pool.cancel("c1");
        pool.cancel("c1");
        pool.cancel("not-held");
        // The child saw one cancel line, as a timeout writes it, and
        // answered ok: the job ends done with that answer.
        assert_eq!(
            returned(&running.await),
            serde_json::json!([r#"{"cancel":"c1"}"#])
        );
        assert_eq!(pool.inner.restarts.get(), 0);
        assert!(pool.problem().is_none());
    }

    #[tokio::test]
    async fn a_producers_cancel_of_a_job_waiting_for_a_slot_reaches_the_child_it_is_placed_on() {
        let pool = mux(2, 1, CANCEL_GRACE);
        let (a1, a2) = (
            job("a1", serde_json::json!({"do": "honour_ok"})),
            job("a2", serde_json::json!({"do": "honour_ok"})),
        );
        let waits = job("c3", serde_json::json!({"do": "honour_ok"}));
        let (first, second, third) = (pool.handle(&a1), pool.handle(&a2), pool.handle(&waits));
        tokio::pin!(first, second, third);
        let first = started(first).await;
        let second = started(second).await;
        // The child's two slots are taken: c3 waits for one, and is cancelled then.
        let third = started(third).await;
        assert_eq!(pool.in_hand(), vec![2]);
        pool.cancel("c3");
        // a1 ends, and c3 takes its slot: its cancel line follows its job line.
        pool.cancel("a1");
        assert_eq!(
            returned(&first.await),
            serde_json::json!([r#"{"cancel":"a1"}"#])
        );
        let third = tokio::time::timeout(Duration::from_secs(20), third).await;
        assert_eq!(
            third.map(|o| returned(&o)),
            Ok(serde_json::json!([r#"{"cancel":"c3"}"#]))
        );
        pool.cancel("a2");
        second.await;
        assert!(pool.inner.pending.is_empty());
    }

    #[tokio::test]
    async fn a_job_cancelled_while_it_waited_is_settled_by_its_first_answer_whatever_follows() {
        let pool = mux(2, 1, CANCEL_GRACE);
        let (a1, a2) = (
            job("a1", serde_json::json!({"do": "honour_ok"})),
            job("a2", serde_json::json!({"do": "honour_ok"})),
        );
        let waits = job("c4", serde_json::json!({"do": "honour_badly"}));
        let (first, second, third) = (pool.handle(&a1), pool.handle(&a2), pool.handle(&waits));
        tokio::pin!(first, second, third);
        let first = started(first).await;
        let second = started(second).await;
        let third = started(third).await;
        pool.cancel("c4");
        pool.cancel("a2");
        second.await;
        // Told right after its job line, the child answers an id it was never
        // given, then c4, then c4 again, then half a line, and exits.
        let third = tokio::time::timeout(Duration::from_secs(20), third).await;
        assert_eq!(third, Ok(Outcome::permanent("stopped")));
        assert!(pool.inner.pending.is_empty());
        // a1 went with the child.
        let first = tokio::time::timeout(Duration::from_secs(20), first).await;
        assert!(failed(&first.expect("a1 ends")).contains("exit"));
        // A new child takes the next job.
        let next = job("n", serde_json::json!({}));
        let next = tokio::time::timeout(Duration::from_secs(20), pool.handle(&next)).await;
        assert_eq!(next, Ok(Outcome::Done));
        assert_eq!(pool.inner.restarts.get(), 1);
    }

    #[tokio::test]
    async fn a_one_job_child_here_gets_a_producers_cancel_only_once_it_says_it_reads_them() {
        // An uneven split gives a child a share of one: it speaks the one-job
        // protocol, and an App there says it reads cancel lines.
        for accepts in [true, false] {
            let script = if accepts {
                format!(
                    "import json\nprint(json.dumps({{\"accepts\": [\"cancel\"]}}), flush=True)\n{CHILD}"
                )
            } else {
                CHILD.to_string()
            };
            let pool = ExecMux::start_with(
                ExecCommand {
                    program: "python3".into(),
                    args: vec!["-c".into(), script],
                },
                1,
                1,
                IntCounter::new("r", "r").expect("counter"),
                Duration::from_millis(50),
            )
            .expect("start");
            let unheeding = job("u1", serde_json::json!({"do": "unheeding", "ms": 600}));
            let running = pool.handle(&unheeding);
            tokio::pin!(running);
            let running = started(running).await;
            if accepts {
                let said = || {
                    pool.inner
                        .procs()
                        .iter()
                        .any(|p| p.accepts_cancel.load(std::sync::atomic::Ordering::Relaxed))
                };
                for _ in 0..50 {
                    if said() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                assert!(said(), "the accepts line was read");
            }
            pool.cancel("u1");
            let outcome = tokio::time::timeout(Duration::from_secs(5), running)
                .await
                .expect("answered");
            if accepts {
                assert_eq!(
                    returned(&outcome),
                    serde_json::json!([r#"{"cancel":"u1"}"#])
                );
            } else {
                // It saw no cancel line: its answer carries no result.
                assert_eq!(outcome, Outcome::Done);
            }
            assert_eq!(pool.inner.restarts.get(), 0);
        }
    }

    #[tokio::test]
    async fn a_child_that_ignores_a_producers_cancel_finishes_the_job_and_is_not_killed() {
        let pool = mux(2, 1, Duration::from_millis(50));
        let unheeding = job("c2", serde_json::json!({"do": "unheeding", "ms": 600}));
        let running = pool.handle(&unheeding);
        tokio::pin!(running);
        let running = started(running).await;
        pool.cancel("c2");
        let outcome = tokio::time::timeout(Duration::from_secs(5), running)
            .await
            .expect("answered");
        assert_eq!(
            returned(&outcome),
            serde_json::json!([r#"{"cancel":"c2"}"#])
        );
        assert_eq!(pool.inner.restarts.get(), 0, "no grace kill");
        assert!(pool.problem().is_none());
    }

    #[tokio::test]
    async fn a_job_cancelled_by_a_producer_then_timed_out_gets_no_second_cancel_line() {
        let pool = mux(2, 1, CANCEL_GRACE);
        let slow = job("c3", serde_json::json!({"do": "unheeding", "ms": 400}));
        let running = pool.handle(&slow);
        tokio::pin!(running);
        let running = started(running).await;
        pool.cancel("c3");
        let timed_out = tokio::time::timeout(Duration::from_millis(50), running).await;
        assert!(timed_out.is_err());
        let report = job("r", serde_json::json!({"do": "report", "of": "c3"}));
        assert_eq!(
            returned(&pool.handle(&report).await),
            serde_json::json!([r#"{"cancel":"c3"}"#])
        );
        // The timed-out job's late answer frees its slot, as ever.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while pool.in_hand() != [0] {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{:?}",
                pool.in_hand()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(pool.inner.restarts.get(), 0);
    }
}
