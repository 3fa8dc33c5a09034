//! Releasing idle pods. Surplus pods above the recommendation, with nothing waiting and
//! the running jobs well within the pods kept, go after one measured start-up time
//! instead of the default scale-down window. The last pod goes, and the pool to zero,
//! only after its idle hold ([`Engine::idle_hold`]: `idleSecondsBeforeZero`, or when
//! that is left out, 300 s while work lately came back within 300 s of going idle, else
//! one pod start-up) with nothing queued, due or running; until then the pool keeps at
//! least one replica. Both holds follow the ski-rental rule: keep an idle pod as long
//! as one start-up costs, unless work is seen to come back.

use super::{Engine, ceil};
use crate::scaling::spec::DEFAULT_IDLE_SECONDS_BEFORE_ZERO;
use crate::scaling::{HoldBasis, IdleHold, Observation, Reason, Rule, ScalingSpec};

/// The idle spells [`Engine::idle_hold`] weighs: the last five that outlasted the short
/// hold.
const IDLE_SPELLS_REMEMBERED: usize = 5;

impl Engine {
    /// How long surplus pods are kept once nothing is waiting, when the engine's default
    /// scale-down window is in force (a window the user wrote is kept as written).
    ///
    /// The window guards against flapping on a noisy signal. With nothing waiting and the
    /// running jobs well within the recommended pods' slots, the pods above the
    /// recommendation are idle, not noise. "Well within" allows for the running count's
    /// own noise: with `r` jobs running, `r + √r` slots (the count in flight varies by
    /// about `√r`, as in the rate cap). While more run than that, the surplus pods are
    /// busy, or soon will be, and the full window stands; keeping one costs a replica per
    /// second, and letting it go costs, if work comes back, one start-up (the measured
    /// start-up time, during which a pod is paid for and does nothing). Keeping surplus
    /// pods exactly as long as one start-up takes (the ski-rental rule) never costs more
    /// than twice the best choice made knowing the future: if work returns within that
    /// time the pods were kept, and otherwise at most one start-up's worth was spent
    /// waiting for it. So the window shrinks to the measured start-up time (at least one
    /// poll), until the start-up time is measured it stays as it is.
    pub(super) fn idle_release_window(
        &self,
        spec: &ScalingSpec,
        obs: &Observation,
        recommendation: i32,
    ) -> Option<f64> {
        let written = spec
            .behavior
            .as_ref()
            .and_then(|b| b.scale_down.as_ref())
            .and_then(|rules| rules.stabilization_window_seconds);
        let slots = u64::from(self.workers.concurrency.max(1).unsigned_abs());
        let kept = u64::from(recommendation.max(1).unsigned_abs());
        if written.is_some()
            || obs.backlog > 0
            || with_noise(obs.in_flight as f64) > kept.saturating_mul(slots) as f64
        {
            return None;
        }
        self.one_start_up(spec)
    }

    /// Times the pool's idle spell: it starts at the first poll without work, and when
    /// work comes back its length is remembered for the idle hold.
    pub(super) fn note_idleness(&mut self, spec: &ScalingSpec, worked: bool, now: f64) {
        if worked {
            if let Some(since) = self.idle_since.take() {
                self.remember_idle_spell(spec, now - since);
            }
        } else if self.idle_since.is_none() {
            self.idle_since = Some(now);
        }
    }

    /// How long the pool keeps its last worker with nothing queued, due or running
    /// before it goes to zero.
    ///
    /// `idleSecondsBeforeZero` as written, when it is. Left out, keeping the worker is a
    /// bet that work comes back before serving it would cost a new pod's start-up:
    /// - the engine remembers the last idle spells that outlasted one start-up time (the
    ///   short hold below) and how long they lasted. When at least two of them, and at
    ///   least half, ended with new work within [`DEFAULT_IDLE_SECONDS_BEFORE_ZERO`]
    ///   (300 s, the default `cooldownPeriod` of KEDA), the worker is kept that long: the
    ///   next job then finds it warm instead of waiting for a pod to start. One return
    ///   is not yet a pattern: a lone spike soon after a stray job would otherwise keep
    ///   its last pod 300 s;
    /// - otherwise (no such spell yet, or work lately came back later than that) the
    ///   worker is kept one measured start-up time, at least one poll. Whatever comes
    ///   next, that costs at most twice what the best choice made knowing the future
    ///   costs (the ski-rental rule, as for the scale-down window): work back within the
    ///   hold finds the worker, and later work pays one start-up, no more than the hold;
    /// - until the start-up time is measured, the full 300 s.
    pub fn idle_hold(&self, spec: &ScalingSpec) -> IdleHold {
        if let Some(written) = spec.idle_seconds_before_zero {
            return IdleHold {
                seconds: written.max(0),
                basis: HoldBasis::Written,
            };
        }
        let cap = DEFAULT_IDLE_SECONDS_BEFORE_ZERO;
        let Some(short) = self.one_start_up(spec) else {
            return IdleHold {
                seconds: cap,
                basis: HoldBasis::StartupUnknown,
            };
        };
        let returned = self
            .idle_spells
            .iter()
            .filter(|spell| **spell <= f64::from(cap))
            .count();
        if returned >= 2 && 2 * returned >= self.idle_spells.len() {
            IdleHold {
                seconds: cap,
                basis: HoldBasis::WorkReturns,
            }
        } else {
            IdleHold {
                seconds: ceil(short).min(cap),
                basis: HoldBasis::Startup,
            }
        }
    }

    /// One measured start-up time, at least one poll; `None` until measured: the
    /// ski-rental hold of idle pods, surplus or last.
    fn one_start_up(&self, spec: &ScalingSpec) -> Option<f64> {
        let startup = self.startup.seconds()?;
        Some(startup.max(f64::from(spec.poll_interval_seconds.max(1))))
    }

    /// Remembers an idle spell that ended with new work after `length` seconds, when it
    /// outlasted the short hold: shorter spells are served by either hold and say
    /// nothing about whether the longer one pays.
    fn remember_idle_spell(&mut self, spec: &ScalingSpec, length: f64) {
        let Some(short) = self.one_start_up(spec) else {
            return;
        };
        if length > short {
            self.idle_spells.push_back(length);
            while self.idle_spells.len() > IDLE_SPELLS_REMEMBERED {
                self.idle_spells.pop_front();
            }
        }
    }

    /// Why the pool goes to zero now, when it does: `minReplicas` is 0 and the pool has
    /// been idle for its idle `hold`.
    pub(super) fn idle_to_zero(&self, min: i32, hold: IdleHold, now: f64) -> Option<Reason> {
        if min == 0
            && let Some(since) = self.idle_since
            && now - since >= f64::from(hold.seconds)
        {
            return Some(Reason {
                idle_hold: Some(hold),
                ..Reason::of(Rule::IdleToZero)
            });
        }
        None
    }
}

/// The recommendation and its rule for a proposal of `largest`, for a pool not at
/// zero: at least one replica while it awaits its idle `hold`.
pub(super) fn await_idle(
    largest: i32,
    rule: Rule,
    min: i32,
    hold: IdleHold,
) -> (i32, Rule, Option<IdleHold>) {
    // Below one replica only through the idle rule (`idle_to_zero`), taken before.
    if largest < 1 {
        (1, Rule::AwaitingIdle, (min == 0).then_some(hold))
    } else {
        (largest, rule, None)
    }
}

/// Slots for `jobs` in flight on average, with room for their noise: the count in
/// flight varies by about `√jobs` around its mean (as in an M/G/∞ queue), so
/// `jobs + √jobs` (the square-root staffing rule).
fn with_noise(jobs: f64) -> f64 {
    let jobs = jobs.max(0.0);
    jobs + jobs.sqrt()
}
