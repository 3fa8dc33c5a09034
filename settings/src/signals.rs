//! The signals every long-running workerpool process stops on: SIGTERM
//! (the kubelet, `kill`), SIGINT (Ctrl-C), SIGHUP (the terminal closed) and
//! SIGQUIT (Ctrl-\). The worker stops on the same four, so `workerpool
//! dashboard`, `workerpool-operator run` and the worker behave alike under
//! one `kill -HUP` or a closed terminal.

use tokio::signal::unix::{SignalKind, signal};

/// The signals [`stop_signal`] waits for, in the order it installs them.
pub const STOP_SIGNALS: [&str; 4] = ["SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"];

/// Resolves at the first of SIGTERM, SIGINT, SIGHUP or SIGQUIT, and returns
/// its name. The handlers are installed when this is called, not when it is
/// first polled, so a signal sent after the call is never missed: call it
/// before the work it stops starts. A signal whose handler cannot be
/// installed is left out (a process can still be stopped by the others).
pub fn stop_signal() -> impl std::future::Future<Output = &'static str> + Send + 'static {
    let kinds = [
        SignalKind::terminate(),
        SignalKind::interrupt(),
        SignalKind::hangup(),
        SignalKind::quit(),
    ];
    let mut installed: Vec<(&'static str, tokio::signal::unix::Signal)> = STOP_SIGNALS
        .iter()
        .zip(kinds)
        .filter_map(|(name, kind)| signal(kind).ok().map(|s| (*name, s)))
        .collect();
    async move {
        if installed.is_empty() {
            return std::future::pending().await;
        }
        std::future::poll_fn(|cx| {
            for (name, s) in &mut installed {
                if s.poll_recv(cx).is_ready() {
                    return std::task::Poll::Ready(*name);
                }
            }
            std::task::Poll::Pending
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn each_stop_signal_resolves_the_future_with_its_name() {
        for (name, number) in STOP_SIGNALS.iter().zip([
            rustix::process::Signal::TERM,
            rustix::process::Signal::INT,
            rustix::process::Signal::HUP,
            rustix::process::Signal::QUIT,
        ]) {
            let stopped = stop_signal();
            rustix::process::kill_process(rustix::process::getpid(), number).expect("kill");
            let got = tokio::time::timeout(std::time::Duration::from_secs(5), stopped)
                .await
                .expect("the signal stops it");
            assert_eq!(got, *name);
        }
    }
}
