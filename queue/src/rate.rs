//! A queue's rate limit: at most `count` job starts per `period`, across
//! every worker of the queue, enforced in Redis by the taking scripts with
//! a GCRA bucket (generic cell rate algorithm) in `<q>:rate`
//! (`lua/rate.lua`).
//!
//! Written `N/PERIOD`: `20/s`, `600/1m`, `5/30s`, `1000/h`, `2/500ms`. The
//! period is an optional positive whole number and a unit (`ms`, `s`, `m`,
//! `h`). Starts are spaced by the emission interval `period / count`, with
//! a burst of [`RateLimit::burst`] starts at once after a quiet spell.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// At most `count` job starts per `period`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    count: u32,
    period_ms: u64,
    /// How the period was written (`s`, `1m`, `30s`), kept for display.
    unit: Unit,
    /// The period's number as written; 0 when it was left out (`20/s`).
    amount: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unit {
    Millis,
    Seconds,
    Minutes,
    Hours,
}

impl Unit {
    fn millis(self) -> u64 {
        match self {
            Unit::Millis => 1,
            Unit::Seconds => 1_000,
            Unit::Minutes => 60_000,
            Unit::Hours => 3_600_000,
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            Unit::Millis => "ms",
            Unit::Seconds => "s",
            Unit::Minutes => "m",
            Unit::Hours => "h",
        }
    }
}

/// The accepted forms, for error messages.
pub const RATE_LIMIT_FORMS: &str = "N/PERIOD with N a positive whole number and PERIOD a unit (ms, s, m, h), optionally after a positive whole number: 20/s, 600/1m, 5/30s, 1000/h";

/// A rate limit that does not parse, with the accepted forms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a rate limit: use {RATE_LIMIT_FORMS}")]
pub struct RateLimitError {
    text: String,
}

impl FromStr for RateLimit {
    type Err = RateLimitError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let fail = || RateLimitError { text: s.into() };
        let (count, period) = s.trim().split_once('/').ok_or_else(fail)?;
        let count: u32 = positive(count).ok_or_else(fail)?;
        let digits = period.len()
            - period
                .trim_start_matches(|c: char| c.is_ascii_digit())
                .len();
        let (amount, unit) = period.split_at(digits);
        let unit = match unit {
            "ms" => Unit::Millis,
            "s" => Unit::Seconds,
            "m" => Unit::Minutes,
            "h" => Unit::Hours,
            _ => return Err(fail()),
        };
        let amount: u64 = if amount.is_empty() {
            0
        } else {
            positive(amount).ok_or_else(fail)?
        };
        let period_ms = amount
            .max(1)
            .checked_mul(unit.millis())
            .filter(|ms| *ms <= 366 * 24 * 3_600_000)
            .ok_or_else(fail)?;
        Ok(Self {
            count,
            period_ms,
            unit,
            amount,
        })
    }
}

/// A positive whole number in plain digits (no sign, no leading zero).
fn positive<T: FromStr + Default + PartialEq>(s: &str) -> Option<T> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || s.starts_with('0') {
        return None;
    }
    s.parse().ok().filter(|n| *n != T::default())
}

impl fmt::Display for RateLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/", self.count)?;
        if self.amount > 0 {
            write!(f, "{}", self.amount)?;
        }
        f.write_str(self.unit.suffix())
    }
}

impl RateLimit {
    /// At most `count` starts per `period` (at least 1 ms).
    pub fn new(count: u32, period: Duration) -> Option<Self> {
        let period_ms = u64::try_from(period.as_millis()).ok()?;
        (count > 0 && period_ms > 0).then_some(Self {
            count,
            period_ms,
            unit: Unit::Millis,
            amount: period_ms,
        })
    }

    /// Starts allowed per period.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The period.
    pub fn period(&self) -> Duration {
        Duration::from_millis(self.period_ms)
    }

    /// Starts per second on average.
    pub fn per_second(&self) -> f64 {
        f64::from(self.count) * 1000.0 / self.period_ms as f64
    }

    /// The emission interval in milliseconds: the spacing of starts at the
    /// limit (`period / count`, possibly fractional).
    pub fn interval_ms(&self) -> f64 {
        self.period_ms as f64 / f64::from(self.count)
    }

    /// Starts allowed at once after a quiet spell: a tenth of the count,
    /// rounded up (1 for a count up to 10). Over any window `w` at most
    /// `w / interval + burst` jobs start.
    pub fn burst(&self) -> u32 {
        self.count.div_ceil(10).max(1)
    }

    /// The GCRA tolerance in milliseconds: how far ahead of the schedule a
    /// start may be, `(burst - 1) × interval`.
    pub fn tolerance_ms(&self) -> f64 {
        f64::from(self.burst() - 1) * self.interval_ms()
    }
}

/// As its text, `20/s`.
impl serde::Serialize for RateLimit {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for RateLimit {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limits_parse_in_every_accepted_form_and_print_as_written() {
        for (text, count, period_ms, interval, burst) in [
            ("20/s", 20, 1_000, 50.0, 2),
            ("600/1m", 600, 60_000, 100.0, 60),
            ("5/30s", 5, 30_000, 6_000.0, 1),
            ("1000/h", 1000, 3_600_000, 3_600.0, 100),
            ("2/500ms", 2, 500, 250.0, 1),
            ("1/s", 1, 1_000, 1_000.0, 1),
        ] {
            let limit: RateLimit = text.parse().expect(text);
            assert_eq!(limit.count(), count, "{text}");
            assert_eq!(limit.period(), Duration::from_millis(period_ms), "{text}");
            assert_eq!(limit.interval_ms(), interval, "{text}");
            assert_eq!(limit.burst(), burst, "{text}");
            assert_eq!(limit.to_string(), text);
        }
        assert_eq!(
            "20/s".parse::<RateLimit>().map(|l| l.per_second()),
            Ok(20.0)
        );
        assert_eq!(
            "600/1m".parse::<RateLimit>().map(|l| l.per_second()),
            Ok(10.0)
        );
    }

    #[test]
    fn malformed_rate_limits_are_refused_with_the_accepted_forms() {
        for text in [
            "",
            "20",
            "/s",
            "0/s",
            "20/0s",
            "20/",
            "20/sec",
            "-1/s",
            "20/s/s",
            "1.5/s",
            "020/s",
            "20/1d",
            "a/s",
            "20/99999999h",
        ] {
            let e = text.parse::<RateLimit>().expect_err(text).to_string();
            assert!(e.contains("20/s, 600/1m"), "{text}: {e}");
        }
    }
}
