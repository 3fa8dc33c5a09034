//! What local mode shows: on a terminal, a table redrawn in place with the
//! latest notes and worker output below it; otherwise one `key=value` log
//! line per change, notes as they happen, and worker output on stderr
//! prefixed with the worker id.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::io::Write;
use std::time::Duration;

use workerpool_queue::snapshot::Counts;

/// Lines of notes and worker output kept under the table.
const RECENT: usize = 8;

/// The pool's state at one refresh.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    /// Time since local mode started.
    pub elapsed: Duration,
    /// What the queue looks like, or why it could not be read.
    pub queue: Result<QueueLine, String>,
    /// Worker processes alive and not stopping.
    pub running: usize,
    /// Worker processes stopping after SIGTERM.
    pub draining: usize,
    /// Replicas the engine (or `spec.replicas`) asks for.
    pub desired: i32,
    /// The engine's reason code (`BacklogTarget`, `IdleToZero`, …).
    pub reason: String,
    /// The reason as a sentence.
    pub reason_message: String,
}

/// What the queue looks like: its counts, and what local mode adds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueueLine {
    /// The pool's queues' counts, added up.
    pub counts: Counts,
    /// Jobs completed since local mode started.
    pub done: u64,
    /// Jobs completed per second, over the last few seconds.
    pub jobs_per_second: Option<f64>,
}

/// The final report.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Jobs completed during the run (None when Redis could not be read at the end).
    pub done: Option<u64>,
    /// Jobs dead-lettered during the run.
    pub dead: Option<u64>,
    /// Jobs still waiting at the end.
    pub left: Option<u64>,
    /// The most workers running at once.
    pub peak_workers: usize,
    /// Time from start to the last worker's exit.
    pub wall: Duration,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let count = |n: Option<u64>| n.map_or_else(|| "unknown".to_string(), |n| n.to_string());
        write!(
            f,
            "summary: {} jobs done, {} dead, {} left in the queue, peak {} workers, wall time {:.1}s",
            count(self.done),
            count(self.dead),
            count(self.left),
            self.peak_workers,
            self.wall.as_secs_f64()
        )
    }
}

/// Renders frames and notes to stdout (and worker output to stderr in plain mode).
#[derive(Debug)]
pub struct View {
    terminal: bool,
    header: String,
    drawn_lines: usize,
    recent: VecDeque<String>,
    last_plain: Option<String>,
    last_frame: Option<Frame>,
}

impl View {
    /// A view; `terminal` selects the redrawn table. `header` names the pool.
    pub fn new(terminal: bool, header: String) -> Self {
        Self {
            terminal,
            header,
            drawn_lines: 0,
            recent: VecDeque::new(),
            last_plain: None,
            last_frame: None,
        }
    }

    /// Shows a new frame.
    pub fn frame(&mut self, frame: Frame) {
        if self.terminal {
            self.last_frame = Some(frame);
            self.redraw();
        } else {
            let line = plain_line(&frame);
            // One line per change; the time and the rate change every refresh.
            let key = line
                .split(' ')
                .filter(|f| !f.starts_with("t=") && !f.starts_with("jobs_per_s="))
                .collect::<Vec<_>>()
                .join(" ");
            if self.last_plain.as_deref() != Some(&key) {
                let _ = writeln!(std::io::stdout(), "{line}");
                self.last_plain = Some(key);
            }
        }
    }

    /// Something that happened (a worker started, a signal, a Redis error).
    pub fn note(&mut self, elapsed: Duration, text: &str) {
        let line = format!("[{:>6.1}s] {text}", elapsed.as_secs_f64());
        if self.terminal {
            self.push_recent(line);
            self.redraw();
        } else {
            let _ = writeln!(std::io::stdout(), "{line}");
        }
    }

    /// A line of a worker's output. A worker's own log is escaped already,
    /// but its handlers' stderr passes through it as written: escape
    /// sequences, carriage returns and bidi controls are shown escaped, so
    /// that they cannot move the cursor over the table or forge a line.
    pub fn worker_output(&mut self, id: &str, line: &str) {
        let line = workerpool_queue::text::safe_line(line, workerpool_queue::text::LINE_CHARS);
        if self.terminal {
            self.push_recent(format!("{id} | {line}"));
        } else {
            let _ = writeln!(std::io::stderr(), "{id} | {line}");
        }
    }

    /// Prints the final report below everything else.
    pub fn summary(&mut self, summary: &Summary) {
        let _ = writeln!(std::io::stdout(), "{summary}");
    }

    fn push_recent(&mut self, line: String) {
        self.recent.push_back(line);
        while self.recent.len() > RECENT {
            self.recent.pop_front();
        }
    }

    fn redraw(&mut self) {
        // Lines wider than the terminal would wrap, and the cursor would no
        // longer go back to the table's first line.
        let width = rustix::termios::tcgetwinsize(std::io::stdout())
            .ok()
            .map(|w| usize::from(w.ws_col))
            .filter(|cols| *cols > 0)
            .unwrap_or(120)
            .max(20);
        let text = fit(
            &table(&self.header, self.last_frame.as_ref(), &self.recent),
            width - 1,
        );
        let mut out = std::io::stdout().lock();
        if self.drawn_lines > 0 {
            // Back to the table's first line, then clear to the end of the screen.
            let _ = write!(out, "\x1b[{}F\x1b[J", self.drawn_lines);
        }
        let _ = out.write_all(text.as_bytes());
        let _ = out.flush();
        self.drawn_lines = text.lines().count();
    }
}

/// The terminal table.
pub fn table(header: &str, frame: Option<&Frame>, recent: &VecDeque<String>) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{header}");
    if let Some(f) = frame {
        let _ = writeln!(
            s,
            "{:>7} {:>9} {:>7} {:>8} {:>7} {:>7} {:>7} {:>5} {:>7}",
            "backlog",
            "in-flight",
            "running",
            "draining",
            "desired",
            "jobs/s",
            "done",
            "dead",
            "elapsed"
        );
        let (backlog, in_flight, rate, done, dead) = match &f.queue {
            Ok(q) => (
                q.counts.backlog().to_string(),
                q.counts.held().to_string(),
                q.jobs_per_second
                    .map_or_else(|| "-".to_string(), |r| format!("{r:.1}")),
                q.done.to_string(),
                q.counts.dead.to_string(),
            ),
            Err(_) => ("?".into(), "?".into(), "?".into(), "?".into(), "?".into()),
        };
        let _ = writeln!(
            s,
            "{backlog:>7} {in_flight:>9} {:>7} {:>8} {:>7} {rate:>7} {done:>7} {dead:>5} {:>6.0}s",
            f.running,
            f.draining,
            f.desired,
            f.elapsed.as_secs_f64()
        );
        let _ = writeln!(s, "reason: {} — {}", f.reason, f.reason_message);
        if let Err(e) = &f.queue {
            let _ = writeln!(s, "queue: {e}");
        }
    }
    let _ = writeln!(s);
    for line in recent {
        let _ = writeln!(s, "{line}");
    }
    s
}

/// `text` with every line cut to `width` characters.
fn fit(text: &str, width: usize) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        out.extend(line.chars().take(width));
        out.push('\n');
    }
    out
}

/// One `key=value` line for logs and scripts.
pub fn plain_line(f: &Frame) -> String {
    let mut s = format!("t={:.1}s", f.elapsed.as_secs_f64());
    match &f.queue {
        Ok(q) => {
            let rate = q
                .jobs_per_second
                .map_or_else(|| "-".to_string(), |r| format!("{r:.1}"));
            let _ = write!(
                s,
                " backlog={} in_flight={} running={} draining={} desired={} reason={} jobs_per_s={rate} done={} dead={}",
                q.counts.backlog(),
                q.counts.held(),
                f.running,
                f.draining,
                f.desired,
                f.reason,
                q.done,
                q.counts.dead
            );
        }
        Err(_) => {
            let _ = write!(
                s,
                " queue=unreachable running={} draining={} desired={} reason={}",
                f.running, f.draining, f.desired, f.reason
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(backlog: u64) -> Frame {
        Frame {
            elapsed: Duration::from_millis(12_300),
            queue: Ok(QueueLine {
                counts: Counts {
                    waiting: backlog.saturating_sub(2),
                    retries_due: backlog.min(2),
                    in_flight: 16,
                    dead: 1,
                    ..Counts::default()
                },
                done: 800,
                jobs_per_second: Some(38.46),
            }),
            running: 4,
            draining: 1,
            desired: 4,
            reason: "MaxReplicas".into(),
            reason_message: "capped".into(),
        }
    }

    #[test]
    fn plain_lines_carry_every_figure_as_key_value() {
        assert_eq!(
            plain_line(&frame(1200)),
            "t=12.3s backlog=1200 in_flight=16 running=4 draining=1 desired=4 reason=MaxReplicas jobs_per_s=38.5 done=800 dead=1"
        );
        let mut down = frame(0);
        down.queue = Err("connection refused".into());
        assert_eq!(
            plain_line(&down),
            "t=12.3s queue=unreachable running=4 draining=1 desired=4 reason=MaxReplicas"
        );
    }

    #[test]
    fn worker_output_shows_escape_sequences_and_carriage_returns_escaped() {
        let mut view = View::new(true, "pool demo".into());
        view.worker_output(
            "demo-1",
            "job failed\r\u{1b}[2J\u{1b}]52;c;ZXZpbA==\u{7}\u{202e}txt.exe",
        );
        assert_eq!(
            view.recent.back().map(String::as_str),
            Some(r"demo-1 | job failed\r\u{1b}[2J\u{1b}]52;c;ZXZpbA==\u{7}\u{202e}txt.exe")
        );
        view.worker_output("demo-1", &"x".repeat(5_000));
        let long = view.recent.back().map_or(0, |l| l.chars().count());
        assert!(long <= "demo-1 | ".len() + 1_000, "{long}");
    }

    #[test]
    fn lines_are_cut_to_the_terminal_width_so_none_wraps() {
        assert_eq!(fit("abcdef\nab\n\nxyz", 3), "abc\nab\n\nxyz\n");
    }

    #[test]
    fn the_table_shows_the_figures_the_reason_and_recent_lines() {
        let recent = VecDeque::from(["demo-1 | worker ready".to_string()]);
        let text = table("pool demo", Some(&frame(1200)), &recent);
        assert!(text.contains("backlog"), "{text}");
        assert!(text.contains("1200"), "{text}");
        assert!(text.contains("reason: MaxReplicas — capped"), "{text}");
        assert!(text.ends_with("demo-1 | worker ready\n"), "{text}");
        for row in text.lines().skip(1).take(2) {
            assert!(
                row.chars().count() < 80,
                "fits an 80-column terminal: {row:?}"
            );
        }
    }
}
