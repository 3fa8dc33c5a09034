//! Standard error for log lines and notes, where a failed write is dropped.
//!
//! A worker whose stderr is a pipe with no reader left (`… 2>&1 | true`, a
//! log collector gone) gets EPIPE on every write. `eprintln!` and
//! tracing-subscriber's own fallback panic on a failed write; a panic in
//! the task that settles jobs or in the one that watches signals would
//! strand jobs and ignore SIGTERM. A lost log line is better: jobs keep
//! being settled and the drain still runs.

use std::io::{self, Write};

/// Standard error that never fails: what cannot be written is dropped.
/// Give it to `tracing_subscriber::fmt().with_writer(Stderr)`, or write
/// notes with `writeln!(Stderr, …)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stderr;

impl Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Ok(io::stderr().write(buf).unwrap_or(buf.len()))
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        let _ = io::stderr().write_all(buf);
        Ok(())
    }

    fn write_fmt(&mut self, args: std::fmt::Arguments<'_>) -> io::Result<()> {
        let _ = io::stderr().write_fmt(args);
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        let _ = io::stderr().flush();
        Ok(())
    }
}

/// Tracing's fmt subscriber as the binaries use it: `RUST_LOG` (default
/// `info`) to standard error, colours on a terminal, and no panic when
/// standard error is gone.
pub fn init() {
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(|| Stderr)
        .with_ansi(io::stderr().is_terminal())
        .log_internal_errors(false)
        .try_init();
}
