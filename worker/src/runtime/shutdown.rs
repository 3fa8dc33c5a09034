//! Shutdown in two stages: drain (stop fetching, let in-flight jobs finish
//! until the shutdown timeout), then now (stop waiting, give jobs back);
//! and, beside them, a request to log the worker's state.

use std::future::Future;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

/// The two stages of shutdown: `drain` stops fetching and lets in-flight
/// jobs finish until the shutdown timeout; `now` cuts that wait short.
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    pub(super) drain: CancellationToken,
    pub(super) now: CancellationToken,
    /// Asks the running worker for one line of its state.
    pub(super) report: Arc<tokio::sync::Notify>,
}

impl Shutdown {
    /// A shutdown that only the caller triggers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts a graceful drain.
    pub fn drain(&self) {
        self.drain.cancel();
    }

    /// Stops waiting for in-flight jobs: they go back to the queue at once.
    pub fn now(&self) {
        self.drain.cancel();
        self.now.cancel();
    }

    /// Asks the running worker to log its state once, at info: whether it
    /// drains, and the jobs it holds per queue with their ids and how long
    /// they have run. Nothing else changes.
    pub fn log_state(&self) {
        self.report.notify_one();
    }

    /// Whether a drain has started.
    pub fn is_draining(&self) -> bool {
        self.drain.is_cancelled()
    }

    /// A shutdown that drains when `signal` completes, for example
    /// `async { tokio::signal::ctrl_c().await.ok(); }`. Must be called
    /// inside a Tokio runtime.
    pub fn when<F>(signal: F) -> Self
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let shutdown = Self::new();
        let s = shutdown.clone();
        tokio::spawn(async move {
            // Stop watching once the worker has stopped for another reason.
            tokio::select! {
                _ = signal => s.drain(),
                _ = s.drain.cancelled() => {}
            }
        });
        shutdown
    }

    /// A shutdown driven by signals. SIGTERM, SIGINT, SIGHUP and SIGQUIT
    /// all drain: a process manager, Ctrl-C, a closed terminal or
    /// `kill -QUIT` never skips it. A second of any of them skips the wait.
    /// SIGUSR1 logs the worker's state ([`Shutdown::log_state`]) and
    /// changes nothing. Must be called inside a Tokio runtime.
    pub fn on_signals() -> std::io::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let mut hup = signal(SignalKind::hangup())?;
        let mut quit = signal(SignalKind::quit())?;
        let mut usr1 = signal(SignalKind::user_defined1())?;
        let shutdown = Self::new();
        let s = shutdown.clone();
        tokio::spawn(async move {
            let mut received: u32 = 0;
            loop {
                let (name, got) = tokio::select! {
                    got = term.recv() => ("SIGTERM", got),
                    got = int.recv() => ("SIGINT", got),
                    got = hup.recv() => ("SIGHUP", got),
                    got = quit.recv() => ("SIGQUIT", got),
                    got = usr1.recv() => ("SIGUSR1", got),
                };
                if got.is_none() {
                    // The runtime is shutting down.
                    return;
                }
                if name == "SIGUSR1" {
                    s.log_state();
                    continue;
                }
                received = received.saturating_add(1);
                match received {
                    1 => {
                        tracing::info!(
                            signal = name,
                            "signal received: draining (a second signal stops waiting)"
                        );
                        s.drain();
                    }
                    2 => {
                        tracing::warn!(
                            signal = name,
                            "second signal: returning unfinished jobs now"
                        );
                        s.now();
                    }
                    _ => {}
                }
            }
        });
        Ok(shutdown)
    }
}
