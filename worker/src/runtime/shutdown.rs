//! Shutdown in two stages: drain (stop fetching, let in-flight jobs finish
//! until the shutdown timeout), then now (stop waiting, give jobs back).

use super::*;

/// The two stages of shutdown: `drain` stops fetching and lets in-flight
/// jobs finish until the shutdown timeout; `now` cuts that wait short.
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    pub(super) drain: CancellationToken,
    pub(super) now: CancellationToken,
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

    /// A shutdown driven by SIGTERM and SIGINT: the first drains, the second
    /// skips the wait. Must be called inside a Tokio runtime.
    pub fn on_signals() -> std::io::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let shutdown = Self::new();
        let s = shutdown.clone();
        tokio::spawn(async move {
            for stage in 0..2 {
                tokio::select! {
                    _ = term.recv() => {},
                    _ = int.recv() => {},
                }
                if stage == 0 {
                    tracing::info!("signal received: draining (a second signal stops waiting)");
                    s.drain();
                } else {
                    tracing::warn!("second signal: returning unfinished jobs now");
                    s.now();
                }
            }
        });
        Ok(shutdown)
    }
}
