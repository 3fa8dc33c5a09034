//! The last hour of each queue, kept in memory: a sample every few seconds
//! taken in the background, so the chart has its hour even when no page
//! was open. Memory is bounded: an hour of samples per queue.
//!
//! Every read of a queue is recorded, the page's own reads included, so
//! that the counts a page shows and the last point of its chart (and the
//! chart's legend) are the same read. Samples are kept at least half the
//! sampling interval apart: a read closer to the last kept sample than
//! that is held as the newest point, replaced by the next one, and
//! its rates are measured from the kept sample before, so that a rate is
//! never taken over a few milliseconds.

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

/// One queue's samples: the kept ones, oldest first, and the newest read
/// when it came too soon after the last kept one to be kept itself.
#[derive(Debug, Default)]
struct Samples {
    kept: VecDeque<Sample>,
    newest: Option<Sample>,
}

impl Samples {
    fn last(&self) -> Option<Sample> {
        self.newest.or_else(|| self.kept.back().copied())
    }

    /// Every point of the chart with the sample its rates are measured
    /// from (none for the first).
    fn with_previous(&self) -> Vec<(Option<Sample>, Sample)> {
        let mut out = Vec::with_capacity(self.kept.len() + 1);
        let mut previous = None;
        for &s in &self.kept {
            out.push((previous, s));
            previous = Some(s);
        }
        if let Some(newest) = self.newest {
            // From the kept sample before the last kept one: the last kept
            // one may be a moment ago.
            let n = self.kept.len();
            let from = if n >= 2 {
                self.kept.get(n - 2)
            } else {
                self.kept.back()
            };
            out.push((from.copied(), newest));
        }
        out
    }
}

/// Samples per queue, at most `capacity` kept each.
#[derive(Debug)]
pub struct History {
    capacity: usize,
    /// The least time between two kept samples.
    min_gap_ms: u64,
    queues: HashMap<String, Samples>,
}

impl History {
    /// Room for an hour of samples taken every `interval_ms` (and of the
    /// pages' reads in between, kept at least half that apart).
    pub fn new(interval_ms: u64) -> Self {
        let min_gap_ms = (interval_ms / 2).max(1);
        Self {
            capacity: (WINDOW_MS / min_gap_ms) as usize + 1,
            min_gap_ms,
            queues: HashMap::new(),
        }
    }

    /// Records `s`, read at `now_ms` (Redis clock); drops what is older than
    /// the window, and a sample not later than the last one (a clock that
    /// went back).
    pub fn record(&mut self, s: &QueueSummary, now_ms: u64) {
        let samples = self.queues.entry(s.name.clone()).or_default();
        if samples.last().is_some_and(|last| last.at_ms >= now_ms) {
            return;
        }
        let sample = Sample {
            at_ms: now_ms,
            waiting: s.counts.waiting,
            in_flight: s.counts.in_flight,
            processed: s.counts.processed_total,
            failed: s.counts.failed_total,
        };
        match samples.kept.back() {
            Some(kept) if now_ms - kept.at_ms < self.min_gap_ms => {
                samples.newest = Some(sample);
            }
            _ => {
                samples.kept.push_back(sample);
                samples.newest = None;
            }
        }
        while samples.kept.len() > self.capacity
            || samples
                .kept
                .front()
                .is_some_and(|first| now_ms.saturating_sub(first.at_ms) > WINDOW_MS)
        {
            samples.kept.pop_front();
        }
    }

    /// Completions and failures per second at the last sample: the rates
    /// of the chart's last point.
    pub fn rates(&self, queue: &str) -> (Option<f64>, Option<f64>) {
        let Some(samples) = self.queues.get(queue) else {
            return (None, None);
        };
        match samples.with_previous().last() {
            Some(&(Some(a), b)) => {
                let (p, f) = per_second(a, b);
                (Some(p), Some(f))
            }
            _ => (None, None),
        }
    }

    /// The chart's points of `queue`, oldest first; the last one is the
    /// latest read.
    pub fn series(&self, queue: &str) -> Series {
        let points = self
            .queues
            .get(queue)
            .map(|samples| {
                samples
                    .with_previous()
                    .into_iter()
                    .map(|(previous, s)| {
                        let (p, f) = previous.map_or((0.0, 0.0), |a| per_second(a, s));
                        Point(s.at_ms, s.waiting, s.in_flight, p, f)
                    })
                    .collect()
            })
            .unwrap_or_default();
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
        QueueSummary::new(
            "q",
            workerpool_queue::snapshot::Counts {
                processed_total: processed,
                waiting,
                ..Default::default()
            },
        )
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
    fn the_latest_read_is_the_last_point_and_its_rates_are_the_last_points() {
        let mut h = History::new(5_000);
        h.record(&summary(0, 10), 10_000);
        h.record(&summary(50, 8), 15_000);
        // A page's read 100 ms after the background sample: the chart ends
        // with it, and its rate is measured over more than those 100 ms.
        h.record(&summary(53, 5), 15_100);
        let points = h.series("q").points;
        assert_eq!(points.len(), 3);
        let last = points[2];
        assert_eq!((last.0, last.1), (15_100, 5));
        assert_eq!(last.3, 10.39, "53 jobs over 5.1 s, from the sample at 10 s");
        assert_eq!(h.rates("q"), (Some(last.3), Some(last.4)));
        // The next read replaces it; one half an interval after the last
        // kept sample is kept in its place.
        h.record(&summary(60, 4), 16_000);
        assert_eq!(h.series("q").points.len(), 3);
        assert_eq!(h.series("q").points[2].1, 4);
        h.record(&summary(80, 2), 17_600);
        let points = h.series("q").points;
        assert_eq!(points.len(), 3);
        assert_eq!(points[2], Point(17_600, 2, 0, 11.54, 0.0));
        assert_eq!(h.rates("q"), (Some(11.54), Some(0.0)));
    }

    #[test]
    fn reads_every_second_keep_samples_half_an_interval_apart() {
        let mut h = History::new(5_000);
        for i in 0..100u64 {
            h.record(&summary(i, i), 1_000 + i * 1_000);
        }
        let points = h.series("q").points;
        // The kept ones 3 s apart (the first read at least 2.5 s after the
        // previous), and the newest read last.
        assert_eq!(points.len(), 34, "{points:?}");
        assert_eq!(points.last().map(|p| p.0), Some(100_000));
        for pair in points[..points.len() - 1].windows(2) {
            assert!(pair[1].0 - pair[0].0 >= 2_500, "{pair:?}");
        }
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
