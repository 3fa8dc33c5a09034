//! The last hour of each queue, kept in memory: a sample every few seconds
//! taken in the background, so the chart has its hour even when no page
//! was open. Memory is bounded: an hour of samples per queue.

use std::collections::{HashMap, VecDeque};

use crate::model::{Point, QueueSummary, Series};

/// How far back the chart goes.
pub const WINDOW_MS: u64 = 60 * 60 * 1000;

/// One reading of one queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sample {
    at_ms: u64,
    waiting: u64,
    in_flight: u64,
    processed: u64,
    failed: u64,
}

/// Samples per queue, oldest first, at most `capacity` each.
#[derive(Debug)]
pub struct History {
    capacity: usize,
    queues: HashMap<String, VecDeque<Sample>>,
}

impl History {
    /// Room for an hour of samples taken every `interval_ms`.
    pub fn new(interval_ms: u64) -> Self {
        Self {
            capacity: (WINDOW_MS / interval_ms.max(1)) as usize + 1,
            queues: HashMap::new(),
        }
    }

    /// Records `s`, read at `now_ms` (Redis clock); drops what is older than
    /// the window, and a sample not later than the last one (a clock that
    /// went back).
    pub fn record(&mut self, s: &QueueSummary, now_ms: u64) {
        let samples = self.queues.entry(s.name.clone()).or_default();
        if samples.back().is_some_and(|last| last.at_ms >= now_ms) {
            return;
        }
        samples.push_back(Sample {
            at_ms: now_ms,
            waiting: s.waiting,
            in_flight: s.in_flight,
            processed: s.processed_total,
            failed: s.failed_total,
        });
        while samples.len() > self.capacity
            || samples
                .front()
                .is_some_and(|first| now_ms.saturating_sub(first.at_ms) > WINDOW_MS)
        {
            samples.pop_front();
        }
    }

    /// Completions and failures per second between the last two samples.
    pub fn rates(&self, queue: &str) -> (Option<f64>, Option<f64>) {
        let Some(samples) = self.queues.get(queue) else {
            return (None, None);
        };
        let n = samples.len();
        if n < 2 {
            return (None, None);
        }
        let (a, b) = (samples[n - 2], samples[n - 1]);
        let (p, f) = per_second(a, b);
        (Some(p), Some(f))
    }

    /// The chart's points of `queue`, oldest first.
    pub fn series(&self, queue: &str) -> Series {
        let mut points = Vec::new();
        if let Some(samples) = self.queues.get(queue) {
            let mut previous: Option<Sample> = None;
            for &s in samples {
                let (p, f) = previous.map_or((0.0, 0.0), |a| per_second(a, s));
                points.push(Point(s.at_ms, s.waiting, s.in_flight, p, f));
                previous = Some(s);
            }
        }
        Series {
            queue: queue.to_string(),
            points,
        }
    }
}

/// A counter that went down (its key deleted) counts as no progress.
fn per_second(a: Sample, b: Sample) -> (f64, f64) {
    let secs = (b.at_ms.saturating_sub(a.at_ms) as f64 / 1000.0).max(0.001);
    let rate = |x: u64, y: u64| round2(y.saturating_sub(x) as f64 / secs);
    (rate(a.processed, b.processed), rate(a.failed, b.failed))
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(processed: u64, waiting: u64) -> QueueSummary {
        QueueSummary {
            name: "q".into(),
            processed_total: processed,
            waiting,
            ..QueueSummary::default()
        }
    }

    #[test]
    fn rates_come_from_the_last_two_samples() {
        let mut h = History::new(5_000);
        assert_eq!(h.rates("q"), (None, None));
        h.record(&summary(0, 9), 10_000);
        assert_eq!(h.rates("q"), (None, None));
        h.record(&summary(50, 8), 15_000);
        assert_eq!(h.rates("q"), (Some(10.0), Some(0.0)));
        let s = h.series("q");
        assert_eq!(s.points.len(), 2);
        assert_eq!(s.points[1], Point(15_000, 8, 0, 10.0, 0.0));
    }

    #[test]
    fn an_hour_is_kept_and_no_more() {
        let mut h = History::new(5_000);
        for i in 0..2_000u64 {
            h.record(&summary(i, i), i * 5_000);
        }
        let points = h.series("q").points;
        assert!(points.len() <= 721, "{}", points.len());
        let span = points.last().map(|p| p.0).unwrap_or(0) - points[0].0;
        assert!(span <= WINDOW_MS, "{span}");
    }

    #[test]
    fn a_counter_that_was_reset_gives_no_negative_rate() {
        let mut h = History::new(5_000);
        h.record(&summary(100, 0), 1_000);
        h.record(&summary(0, 0), 2_000);
        assert_eq!(h.rates("q"), (Some(0.0), Some(0.0)));
        // A clock that went back is ignored.
        h.record(&summary(5, 0), 1_500);
        assert_eq!(h.series("q").points.len(), 2);
    }
}
