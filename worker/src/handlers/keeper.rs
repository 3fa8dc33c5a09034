//! The keeper: a small process that kills the handlers' process groups when
//! the worker dies, however it dies.
//!
//! Each handler child leads a process group of its own
//! ([`super::command`]). The parent-death signal kills the child when the
//! worker is SIGKILLed or OOM-killed, but it reaches direct children only:
//! what a child started (a shell's background job, a Python subprocess)
//! would live on, holding resources and perhaps still doing the job's side
//! effects while the job runs again elsewhere. Nothing in the worker can
//! act after a SIGKILL (a thread dies with it), so another process must:
//! the worker binary itself, started again with [`ARG`] as its only
//! argument. The worker writes `+PGID` on the keeper's stdin when a handler
//! group starts and `-PGID` once it no longer needs it (it killed the group
//! itself, or the child exited on its own); when its stdin ends, the
//! worker is gone (the kernel closes a dead process's pipes, whatever
//! killed it) and the keeper SIGKILLs every group it still holds, then
//! exits.
//!
//! Why this and not the alternatives: a cgroup needs a delegated hierarchy
//! the worker seldom has; `PR_SET_CHILD_SUBREAPER` only collects orphans
//! in a process that outlives them, which the worker is not, and would
//! need the keeper to start the handlers itself; forking a keeper without
//! exec in a multithreaded process would need unsafe code restricted to
//! async-signal-safe calls. Re-executing the binary is ordinary safe code.
//!
//! The keeper leads its own process group, so a signal to the worker's
//! group (a terminal's Ctrl-C, a process manager) does not take it first,
//! and it ignores the stop signals: its life is bound to the worker's
//! through the pipe. Only a binary that calls [`serve_if_asked`] first thing
//! in `main` (the `workerpool-worker` binary does) starts a keeper; in any
//! other program (a Rust program using the runtime as a library, a test)
//! handler children keep the parent-death signal alone.

use std::collections::BTreeSet;
use std::io::{BufRead, Write};
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::process::{Pid, Signal};

/// The argument that makes the worker binary a keeper. Not a flag of the
/// worker's: it is checked before the command line is parsed.
pub const ARG: &str = "__workerpool-handler-keeper";

/// Whether this program can start a keeper (it called [`serve_if_asked`]).
static ENABLED: AtomicBool = AtomicBool::new(false);

/// The running keeper and the groups it holds.
static STATE: Mutex<State> = Mutex::new(State {
    keeper: None,
    groups: BTreeSet::new(),
    cannot_start: false,
});

struct State {
    keeper: Option<Keeper>,
    /// The groups the keeper must kill if the worker dies, kept here too so
    /// that a keeper started again (the first one was killed) gets them all.
    groups: BTreeSet<i32>,
    /// Whether starting a keeper failed (and was logged).
    cannot_start: bool,
}

struct Keeper {
    child: Child,
    stdin: ChildStdin,
}

/// Serves as the keeper when this process was started as one (its first
/// argument is [`ARG`]) and returns its exit code; otherwise returns `None`
/// and lets this program start keepers for its handler children. Call it
/// first thing in `main`, inside the Tokio runtime.
pub fn serve_if_asked() -> Option<ExitCode> {
    let mut args = std::env::args_os().skip(1);
    if args.next().is_some_and(|a| a == ARG) && args.next().is_none() {
        // Installed handlers stay for the process's lifetime: the stop
        // signals no longer end the keeper (only the end of its stdin
        // does), and nothing needs to read them.
        let _ignored = workerpool_settings::stop_signal();
        keep(std::io::stdin().lock());
        return Some(ExitCode::SUCCESS);
    }
    ENABLED.store(true, Ordering::Relaxed);
    None
}

/// The keeper's work: holds the groups announced on `input` and kills
/// those still held when it ends.
pub(crate) fn keep(input: impl BufRead) {
    let mut groups = BTreeSet::new();
    // A read error is the end too: the worker can no longer speak.
    for line in input.split(b'\n').map_while(Result::ok) {
        let Some((&op, pgid)) = line.split_first() else {
            continue;
        };
        let Some(pgid) = std::str::from_utf8(pgid)
            .ok()
            .and_then(|p| p.parse::<i32>().ok())
            .filter(|&p| p > 0)
        else {
            continue;
        };
        match op {
            b'+' => {
                groups.insert(pgid);
            }
            b'-' => {
                groups.remove(&pgid);
            }
            _ => {}
        }
    }
    for pgid in groups.into_iter().filter_map(Pid::from_raw) {
        // A group already gone is the point.
        let _ = rustix::process::kill_process_group(pgid, Signal::KILL);
    }
}

/// The keeper is to kill group `pgid` if the worker dies.
pub(crate) fn watch(pgid: Pid) {
    if !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    let mut state = lock();
    state.groups.insert(pgid.as_raw_nonzero().get());
    state.send(&format!("+{}\n", pgid.as_raw_nonzero()));
}

/// The keeper no longer needs to kill group `pgid`: the worker killed it,
/// or left what its leader started to itself. Forgotten at once, so that a
/// number the kernel gives to an unrelated group later is never killed.
pub(crate) fn forget(pgid: Pid) {
    if !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    let mut state = lock();
    if state.groups.remove(&pgid.as_raw_nonzero().get()) {
        state.send(&format!("-{}\n", pgid.as_raw_nonzero()));
    }
}

fn lock() -> std::sync::MutexGuard<'static, State> {
    // A panic while holding this lock leaves a set of numbers, still valid.
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

impl State {
    /// Writes `message` to the keeper, starting one (told every group
    /// held) when there is none or the last one is gone.
    fn send(&mut self, message: &str) {
        if let Some(keeper) = self.keeper.as_mut()
            && (&keeper.stdin).write_all(message.as_bytes()).is_ok()
        {
            return;
        }
        if let Some(mut gone) = self.keeper.take() {
            // Its pipe broke or is full: it is dead or stuck. Reaped here,
            // not left a zombie.
            let _ = gone.child.kill();
            let _ = gone.child.wait();
        }
        if self.cannot_start {
            return;
        }
        let everything: String = self.groups.iter().map(|g| format!("+{g}\n")).collect();
        let started = start().and_then(|mut keeper| {
            if let Err(e) = (&keeper.stdin).write_all(everything.as_bytes()) {
                let _ = keeper.child.kill();
                let _ = keeper.child.wait();
                return Err(e);
            }
            Ok(keeper)
        });
        match started {
            Ok(keeper) => self.keeper = Some(keeper),
            Err(e) => {
                // Not tried again: a binary that cannot run itself once
                // will not later, and each try would cost a fork per job.
                self.cannot_start = true;
                tracing::warn!(
                    error = %e,
                    "cannot start the handler keeper: if the worker is killed (SIGKILL, the OOM killer), what its handler processes started may outlive it"
                );
            }
        }
    }
}

fn start() -> std::io::Result<Keeper> {
    // The running binary's own file, even if a newer one replaced it on
    // disk since.
    #[cfg(target_os = "linux")]
    let program = std::path::PathBuf::from("/proc/self/exe");
    #[cfg(not(target_os = "linux"))]
    let program = std::env::current_exe()?;
    let mut cmd = Command::new(program);
    if let Some(name) = std::env::args_os().next() {
        std::os::unix::process::CommandExt::arg0(&mut cmd, name);
    }
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd
        .arg(ARG)
        // It needs no setting, and should not hold the worker's secrets.
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()?;
    let Some(stdin) = child.stdin.take() else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(std::io::Error::other("the keeper has no stdin pipe"));
    };
    // A keeper that stops reading must not stop the worker: a full pipe
    // fails the write (the keeper is then replaced) instead of blocking.
    rustix::io::ioctl_fionbio(&stdin, true)?;
    Ok(Keeper { child, stdin })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alive(pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            !stat
                .rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
        })
    }

    fn group_leader() -> std::process::Child {
        let mut cmd = Command::new("sleep");
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        cmd.arg("1000").spawn().expect("sleep")
    }

    #[test]
    fn at_the_end_of_its_input_the_keeper_kills_the_groups_it_still_holds_and_only_those() {
        let mut held = group_leader();
        let mut forgotten = group_leader();
        let (h, f) = (held.id() as i32, forgotten.id() as i32);
        keep(std::io::Cursor::new(format!(
            "+{h}\n+{f}\nnot a line\n+0\n-{f}\n"
        )));
        assert!(held.wait().is_ok_and(|s| !s.success()));
        assert!(alive(f), "a forgotten group is left alone");
        let _ = forgotten.kill();
        let _ = forgotten.wait();
    }
}
