//! The `exec-per-job` handler: one process per job.
//!
//! The job's JSON object is written to the process's stdin (one line, then
//! stdin is closed). Exit status 0 completes the job; any other exit fails
//! the attempt (retried) with the last lines of the process's stderr as the
//! error. stdout is the process's log and goes to the worker's stdout; its
//! stderr is copied line by line to the worker's stderr as well. A process
//! whose attempt is abandoned (timeout, shutdown) is killed.

use std::collections::VecDeque;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::io::{AsyncBufReadExt, BufReader};

use super::exec_pool::{ExecCommand, SpawnError};
use crate::handler::{Handler, Outcome};
use workerpool_queue::job::Job;

/// Lines of stderr kept for the error of a failed attempt.
const TAIL_LINES: usize = 10;
/// Characters of stderr kept for the error of a failed attempt.
const TAIL_CHARS: usize = 2000;
/// How long stderr is still read after the process exited: a grandchild
/// that inherited the pipe must not hold the job open.
const STDERR_GRACE: Duration = Duration::from_millis(200);

/// Starts `command` once per job.
#[derive(Debug, Clone)]
pub struct ExecPerJob {
    command: ExecCommand,
}

impl ExecPerJob {
    /// A handler running `command` per job. Fails when the program cannot
    /// be found, so a misconfigured worker stops at start rather than
    /// failing every job.
    pub fn new(command: ExecCommand) -> Result<Self, SpawnError> {
        if !is_runnable(&command.program) {
            return Err(SpawnError::new(
                &command.program,
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "no such executable (looked it up on PATH)",
                ),
            ));
        }
        Ok(Self { command })
    }

    async fn run(&self, job: &Job) -> Outcome {
        let mut command = super::command(&self.command);
        // The attempt's trace context, as OpenTelemetry's environment
        // carrier names it.
        if let Some(traceparent) = job.attempt_trace() {
            command.env("TRACEPARENT", traceparent);
        }
        let mut child = match command
            .stdin(Stdio::piped())
            .stdout(Stdio::inherit())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                return Outcome::retry(format!("cannot start `{}`: {e}", self.command.program));
            }
        };
        let mut group = super::GroupGuard::new(&child);
        let (Some(mut stdin), Some(stderr)) = (child.stdin.take(), child.stderr.take()) else {
            return Outcome::retry("the handler process has no stdin/stderr pipe");
        };
        let line = job.json_line();
        let work = async {
            // A process that exits without reading its input is not an
            // error in itself: its exit status decides.
            let _ = super::write_line(&mut stdin, &line).await;
            drop(stdin);
            child.wait().await
        };
        tokio::pin!(work);
        let mut stderr = BufReader::new(stderr);
        let mut tail = Tail::default();
        let mut open = true;
        let status = loop {
            tokio::select! {
                status = &mut work => break status,
                more = tail.read_line(&mut stderr), if open => open = more,
            }
        };
        group.disarm();
        if open {
            let _ = tokio::time::timeout(STDERR_GRACE, async {
                while tail.read_line(&mut stderr).await {}
            })
            .await;
        }
        match status {
            Ok(s) if s.success() => Outcome::Done,
            Ok(s) => {
                let last = tail.text();
                if last.is_empty() {
                    Outcome::retry(format!("handler {s}"))
                } else {
                    Outcome::retry(format!("handler {s}: {last}"))
                }
            }
            Err(e) => Outcome::retry(format!("waiting for the handler process failed: {e}")),
        }
    }
}

impl Handler for ExecPerJob {
    fn handle<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Outcome> {
        Box::pin(self.run(job))
    }
}

/// The last lines of a stream.
#[derive(Default)]
pub(crate) struct Tail {
    lines: VecDeque<String>,
    buf: Vec<u8>,
}

impl Tail {
    /// Reads one line, keeps it and copies it to the worker's stderr.
    /// `false` at the end of the stream.
    pub(crate) async fn read_line<R: tokio::io::AsyncBufRead + Unpin>(
        &mut self,
        r: &mut R,
    ) -> bool {
        self.buf.clear();
        match r.read_until(b'\n', &mut self.buf).await {
            Ok(0) | Err(_) => false,
            Ok(_) => {
                // A line at a time to the worker's own stderr, as a log.
                let _ = std::io::Write::write_all(&mut std::io::stderr(), &self.buf);
                // Escaped, not lossy: bytes that are not UTF-8 show as `\xNN`.
                let line = workerpool_queue::text::escaped(self.buf.trim_ascii_end(), TAIL_CHARS);
                if !line.is_empty() {
                    if self.lines.len() == TAIL_LINES {
                        self.lines.pop_front();
                    }
                    self.lines.push_back(line);
                }
                true
            }
        }
    }

    /// The kept lines, newline-separated, at most [`TAIL_CHARS`] (the end).
    pub(crate) fn text(&self) -> String {
        let all = Vec::from(self.lines.clone()).join("\n");
        let skip = all.chars().count().saturating_sub(TAIL_CHARS);
        all.chars().skip(skip).collect()
    }
}

/// Whether `program` names an executable file, directly or on `PATH`.
fn is_runnable(program: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        return executable(Path::new(program));
    }
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| executable(&dir.join(program))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use workerpool_queue::job::{Intake, intake};

    fn sh(script: &str) -> ExecPerJob {
        ExecPerJob::new(ExecCommand {
            program: "sh".into(),
            args: vec!["-c".into(), script.into()],
        })
        .expect("sh exists")
    }

    fn job(raw: &str) -> Job {
        match intake(raw, 0, 5, "w") {
            Intake::Run { job, .. } => job,
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn exit_zero_is_done_and_the_job_arrives_on_stdin() {
        let h =
            sh(r#"read -r line; case "$line" in *'"task":"greet"'*) exit 0 ;; *) exit 9 ;; esac"#);
        assert_eq!(h.handle(&job(r#"{"task":"greet"}"#)).await, Outcome::Done);
        assert!(matches!(
            h.handle(&job(r#"{"task":"other"}"#)).await,
            Outcome::Failed { retry: true, .. }
        ));
    }

    #[tokio::test]
    async fn a_non_zero_exit_fails_with_the_status_and_the_last_lines_of_stderr() {
        let h = sh(r#"i=0; while [ $i -lt 15 ]; do echo "line $i" >&2; i=$((i+1)); done; exit 3"#);
        match h.handle(&job("{}")).await {
            Outcome::Failed { error, retry } => {
                assert!(retry);
                assert!(error.contains("exit status: 3"), "{error}");
                assert!(error.ends_with("line 14"), "{error}");
                assert!(error.contains("line 5"), "{error}");
                assert!(
                    !error.contains("line 4\n"),
                    "only the last 10 lines: {error}"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn stderr_that_is_not_utf8_shows_its_bytes_escaped() {
        let h = sh(r#"printf 'bad \377\376 bytes\n' >&2; exit 4"#);
        match h.handle(&job("{}")).await {
            Outcome::Failed { error, .. } => {
                assert!(error.ends_with(r"bad \xff\xfe bytes"), "{error}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_process_that_ignores_its_input_is_judged_by_its_exit_status() {
        assert_eq!(sh("exit 0").handle(&job("{}")).await, Outcome::Done);
        match sh("kill -9 $$").handle(&job("{}")).await {
            Outcome::Failed { error, .. } => assert!(error.contains("signal"), "{error}"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn an_abandoned_attempt_kills_the_process() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pid_file = dir.path().join("pid");
        let h = sh(&format!("echo $$ > {}; exec sleep 30", pid_file.display()));
        let abandoned =
            tokio::time::timeout(Duration::from_millis(500), h.handle(&job("{}"))).await;
        assert!(abandoned.is_err());
        let pid = std::fs::read_to_string(&pid_file).expect("pid written");
        let pid = pid.trim();
        // SIGKILL is sent on drop; give the kernel a moment to deliver it.
        let mut checks = 0;
        while running(pid) && checks < 100 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            checks += 1;
        }
        assert!(!running(pid), "the handler process must be killed");
    }

    /// Whether the process exists and is not a zombie.
    fn running(pid: &str) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
            .unwrap_or(false)
    }

    #[test]
    fn a_program_that_does_not_exist_is_refused_at_start() {
        let err = ExecPerJob::new(ExecCommand {
            program: "/nonexistent/handler".into(),
            args: vec![],
        })
        .expect_err("must fail");
        assert!(err.to_string().contains("/nonexistent/handler"), "{err}");
        assert!(is_runnable("sh"));
        assert!(!is_runnable("no-such-program-anywhere"));
    }
}
