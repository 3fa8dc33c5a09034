//! The handler adapters: how a job reaches code in any language.
//!
//! - [`exec_pool`]: a supervised pool of long-lived child processes speaking
//!   JSON lines (the default);
//! - [`exec_per_job`]: one process per job, judged by its exit status;
//! - [`http`]: a POST per job, judged by the status code.
//!
//! The built-ins `noop` and `sleep` and the [`Handler`](crate::Handler)
//! trait for handlers in Rust are in [`crate::handler`].

pub mod exec_per_job;
pub mod exec_pool;
pub mod http;

use exec_pool::ExecCommand;

/// The command that starts a handler process.
///
/// - It gets the worker's environment without the worker's own settings
///   (`WORKERPOOL_*`: the Redis URL with its password, TLS keys, the
///   dashboard token): a handler has no business with the queue's
///   credentials. `WORKERPOOL_WORKER_ID`, which names the worker (the pod),
///   stays, for the handler's own logs.
/// - It leads a process group of its own, so that killing it (a timeout,
///   a broken child) also kills whatever it started.
/// - On Linux it is killed when the worker dies, even by SIGKILL or the
///   OOM killer (`PR_SET_PDEATHSIG`): a child that outlived its worker
///   would finish a job whose settlement is gone while a reaper runs it
///   again elsewhere.
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

/// Kills the process group a handler child leads (see [`command`]), the
/// child with it.
pub(crate) fn kill_group(child: &tokio::process::Child) {
    GroupGuard::new(child);
}

/// Kills a handler child's process group when dropped, unless disarmed
/// first: an attempt abandoned (its timeout, the shutdown deadline) takes
/// whatever the child started with it.
pub(crate) struct GroupGuard(Option<rustix::process::Pid>);

impl GroupGuard {
    pub(crate) fn new(child: &tokio::process::Child) -> Self {
        Self(
            child
                .id()
                .and_then(|id| i32::try_from(id).ok())
                .and_then(rustix::process::Pid::from_raw),
        )
    }

    /// The child ended on its own: nothing to kill.
    pub(crate) fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
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
