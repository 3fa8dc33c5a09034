//! Backoff schedules: for job retries (exponential with full jitter) and for
//! reconnecting to Redis (capped exponential with jitter).

use std::time::Duration;

use rand::Rng;

/// Delay before the attempt after `attempt` (1-based) failed: a uniform
/// draw from zero to `base × 2^(attempt-1)`, capped at `max` ("full
/// jitter", which spreads a burst of failures instead of retrying it in
/// lock-step).
pub fn retry_delay(attempt: u32, base: Duration, max: Duration, rng: &mut impl Rng) -> Duration {
    let ceiling = retry_ceiling(attempt, base, max);
    let ms = ceiling.as_millis() as u64;
    Duration::from_millis(rng.random_range(0..=ms))
}

/// The upper bound of [`retry_delay`] for `attempt`.
pub fn retry_ceiling(attempt: u32, base: Duration, max: Duration) -> Duration {
    let doublings = attempt.saturating_sub(1).min(32);
    base.saturating_mul(1u32 << doublings.min(31)).min(max)
}

/// Delays between attempts to reach Redis: 100 ms doubling to 5 s, each
/// with ±25% jitter so a fleet of workers does not reconnect in step.
#[derive(Debug, Clone)]
pub struct Reconnect {
    next: Duration,
}

impl Reconnect {
    const FIRST: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(5);

    /// A fresh schedule.
    pub fn new() -> Self {
        Self { next: Self::FIRST }
    }

    /// The next delay.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        d.mul_f64(rand::rng().random_range(0.75..1.25))
    }

    /// Back to the first delay after a success.
    pub fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

impl Default for Reconnect {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn the_retry_ceiling_doubles_per_attempt_up_to_the_maximum() {
        let ceilings: Vec<_> = (1..=6)
            .map(|a| retry_ceiling(a, S, 10 * S).as_secs())
            .collect();
        assert_eq!(ceilings, [1, 2, 4, 8, 10, 10]);
        assert_eq!(retry_ceiling(1000, S, 300 * S), 300 * S);
    }

    #[test]
    fn retry_delays_are_jittered_across_the_whole_range_below_the_ceiling() {
        let mut rng = StdRng::seed_from_u64(7);
        let draws: Vec<_> = (0..1000)
            .map(|_| retry_delay(3, S, 60 * S, &mut rng))
            .collect();
        assert!(draws.iter().all(|d| *d <= 4 * S));
        assert!(draws.iter().any(|d| *d < S), "low end reached");
        assert!(draws.iter().any(|d| *d > 3 * S), "high end reached");
    }

    #[test]
    fn reconnect_delays_grow_to_five_seconds_and_reset() {
        let mut r = Reconnect::new();
        let delays: Vec<_> = (0..10).map(|_| r.next_delay()).collect();
        assert!(delays[0] < Duration::from_millis(126));
        assert!(
            delays[9] >= Duration::from_millis(3750) && delays[9] <= Duration::from_millis(6250)
        );
        r.reset();
        assert!(r.next_delay() < Duration::from_millis(126));
    }
}
