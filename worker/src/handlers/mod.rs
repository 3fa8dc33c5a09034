//! The handler adapters: how a job reaches code in any language.
//!
//! - [`exec_pool`]: a supervised pool of long-lived child processes speaking
//!   JSON lines, one job per child (the default);
//! - [`exec_mux`]: the same with several jobs per child (`--children`);
//! - [`exec_per_job`]: one process per job, judged by its exit status;
//! - [`http`]: a POST per job, judged by the status code.
//!
//! The built-ins `noop` and `sleep` and the [`Handler`](crate::Handler)
//! trait for handlers in Rust are in [`crate::handler`].

pub mod exec_mux;
pub mod exec_per_job;
pub mod exec_pool;
pub mod http;
pub mod keeper;

use exec_pool::ExecCommand;

/// The command that starts a handler process.
///
/// - It gets the worker's environment without the worker's own settings
///   (`WORKERPOOL_*`: the Redis URL with its password, TLS keys, the
///   dashboard token): a handler has no business with the queue's
///   credentials. `WORKERPOOL_WORKER_ID`, which names the worker (the pod),
///   stays, for the handler's own logs; the pools add
///   `WORKERPOOL_JOBS_PER_CHILD`, the child's share of the slots.
/// - It leads a process group of its own, so that killing it (a timeout,
///   a broken child, the end of a drain) also kills whatever it started
///   ([`GroupGuard`]).
/// - On Linux it is killed when the worker dies, even by SIGKILL or the
///   OOM killer (`PR_SET_PDEATHSIG`): a child that outlived its worker
///   would finish a job whose settlement is gone while a reaper runs it
///   again elsewhere. The signal reaches the child alone; the rest of its
///   group is the [`keeper`]'s to kill.
#[allow(unsafe_code)]
pub(crate) fn command(exec: &ExecCommand) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(&exec.program);
    cmd.args(&exec.args);
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(|n| {
            n.starts_with(workerpool_settings::PREFIX) && n != workerpool_settings::WORKER_ID
        }) {
            cmd.env_remove(name);
        }
    }
    cmd.process_group(0);
    #[cfg(target_os = "linux")]
    {
        let worker = rustix::process::getpid();
        // SAFETY: the closure runs in the child between fork and exec and
        // only makes two system calls (prctl, getppid), both
        // async-signal-safe; it allocates nothing and takes no lock.
        unsafe {
            cmd.pre_exec(move || {
                rustix::process::set_parent_process_death_signal(Some(
                    rustix::process::Signal::KILL,
                ))?;
                // The worker died before the prctl took effect.
                if rustix::process::getppid() != Some(worker) {
                    return Err(std::io::Error::other("the worker exited"));
                }
                Ok(())
            });
        }
    }
    cmd
}

/// The process group a handler child leads (see [`command`]): killed, the
/// child with it, when this is dropped unless disarmed first, so that an
/// attempt abandoned (its timeout, the shutdown deadline) or a child
/// replaced or left idle at the end takes whatever it started with it.
/// While it is armed, the [`keeper`] kills the group if the worker dies.
pub(crate) struct GroupGuard(Option<rustix::process::Pid>);

impl GroupGuard {
    /// Guards the group of `child`, which must lead one (see [`command`]).
    pub(crate) fn new(child: &tokio::process::Child) -> Self {
        let pgid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(rustix::process::Pid::from_raw);
        if let Some(pgid) = pgid {
            keeper::watch(pgid);
        }
        Self(pgid)
    }

    /// The child ended on its own: what it left running is its own
    /// business, and nothing is killed.
    pub(crate) fn disarm(&mut self) {
        if let Some(pgid) = self.0.take() {
            keeper::forget(pgid);
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pgid) = self.0.take() {
            let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
            // Killed with SIGKILL: nothing in the group lives on (a fork
            // racing the signal is signalled too), so the keeper can let
            // the number go.
            keeper::forget(pgid);
        }
    }
}

/// The jobs handed to a pool of handler children whose attempt has not
/// begun (waiting out a broken handler's restart backoff, or for a free
/// slot or stdin), each with whether a producer asked to cancel it
/// meanwhile: such a cancel is kept for the attempt, which has no child to
/// tell yet.
///
/// A pool asks [`Pending::asked`] only once the attempt is where the
/// producer's cancel looks for attempts, and the producer marks a job here
/// ([`Pending::cancel`]) before it looks there: whichever comes first, the
/// attempt or the cancel, the other sees it.
#[derive(Default)]
pub(crate) struct Pending {
    next: std::sync::atomic::AtomicU64,
    jobs: std::sync::Mutex<std::collections::HashMap<u64, (String, bool)>>,
}

impl Pending {
    fn jobs(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<u64, (String, bool)>> {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes job `id` handed to the pool, until the guard is dropped.
    pub(crate) fn wait(&self, id: &str) -> Waiting<'_> {
        let number = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.jobs().insert(number, (id.to_string(), false));
        Waiting {
            pending: self,
            number,
        }
    }

    /// A producer asked to cancel job `id`: every waiting job with that id
    /// is marked.
    pub(crate) fn cancel(&self, id: &str) {
        for (waiting, asked) in self.jobs().values_mut() {
            if waiting == id {
                *asked = true;
            }
        }
    }

    /// Whether a producer asked to cancel a waiting job with id `id`.
    pub(crate) fn asked(&self, id: &str) -> bool {
        self.jobs()
            .values()
            .any(|(waiting, asked)| waiting == id && *asked)
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.jobs().is_empty()
    }
}

/// A job noted in [`Pending`], until dropped.
pub(crate) struct Waiting<'a> {
    pending: &'a Pending,
    number: u64,
}

impl Waiting<'_> {
    /// Whether a producer asked to cancel this job while it waited.
    pub(crate) fn asked(&self) -> bool {
        self.pending
            .jobs()
            .get(&self.number)
            .is_some_and(|(_, asked)| *asked)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.pending.jobs().remove(&self.number);
    }
}

/// Writes a job's line and its newline to a child's stdin straight from
/// the job's shared text: the line is not copied into a buffer of its own
/// first (a job can be as large as the payload limit). One vectored write
/// where the pipe takes it, so a small job still costs one system call.
pub(crate) async fn write_line(
    to: &mut (impl tokio::io::AsyncWrite + Unpin),
    line: &str,
) -> std::io::Result<()> {
    use bytes::Buf;
    use tokio::io::AsyncWriteExt;
    let mut bytes = line.as_bytes().chain(&b"\n"[..]);
    to.write_all_buf(&mut bytes).await
}
