//! The Rust side of the stamp the taking scripts put on a job as they
//! take it (`lua/stamp.lua`): the reply code that says how a payload was
//! stamped, the pushed bytes recovered exactly from the stamped ones, and
//! the job a stamped payload runs when the worker reads it as the script
//! did. `queue/tests/stamp.rs` runs the script on a real Redis and checks
//! that the two agree.

use std::ops::Range;
use std::sync::OnceLock;

use serde_json::Value;

use super::head::{self, Scalar};
use super::{Held, Job, Repr, SharedText};

/// How the fetch script stamped a payload as it took it (`stamp.lua`), so
/// that a job can start without a second round trip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stamp {
    /// Left as it was: [`intake`] decides.
    Untouched,
    /// A fresh job: this many bytes (`"attempt":1`, and `"id"` and
    /// `"enqueued_at"` when absent) were added after the opening brace.
    Fresh(usize),
    /// The leading `"attempt":N` was counted up to N + 1.
    Counted,
}

/// What every stamped payload starts with.
const ATTEMPT_PREFIX: &[u8] = b"{\"attempt\":";

impl Stamp {
    /// The stamp as the fetch script reports it: -1, the number of bytes
    /// added, or 0.
    pub fn from_reply(code: i64) -> Self {
        match code {
            -1 => Stamp::Counted,
            n if n > 0 => Stamp::Fresh(n as usize),
            _ => Stamp::Untouched,
        }
    }

    /// The reply code of [`Stamp::from_reply`].
    pub fn code(self) -> i64 {
        match self {
            Stamp::Untouched => 0,
            Stamp::Fresh(n) => n as i64,
            Stamp::Counted => -1,
        }
    }
}

/// The leading `attempt` of a stamped payload and the bytes after its
/// comma.
fn leading_attempt(held: &[u8]) -> Option<(u64, &[u8])> {
    let after = held.strip_prefix(ATTEMPT_PREFIX)?;
    let digits = after.iter().take_while(|b| b.is_ascii_digit()).count();
    let rest = after[digits..].strip_prefix(b",")?;
    let n = std::str::from_utf8(&after[..digits]).ok()?.parse().ok()?;
    Some((n, rest))
}

/// The payload exactly as it was before the fetch script stamped it (what
/// a dead letter keeps, and what goes back to the queue unrun).
pub fn unstamped(held: &[u8], stamp: Stamp) -> Vec<u8> {
    match stamp {
        Stamp::Untouched => held.to_vec(),
        Stamp::Fresh(n) if held.len() > n => {
            let mut original = Vec::with_capacity(held.len() - n);
            original.push(b'{');
            original.extend_from_slice(&held[1 + n..]);
            original
        }
        Stamp::Counted => match leading_attempt(held) {
            Some((n, rest)) if n > 1 => {
                let mut original = ATTEMPT_PREFIX.to_vec();
                original.extend_from_slice((n - 1).to_string().as_bytes());
                original.push(b',');
                original.extend_from_slice(rest);
                original
            }
            _ => held.to_vec(),
        },
        Stamp::Fresh(_) => held.to_vec(),
    }
}

/// The job a payload stamped by the fetch script runs, when the worker
/// reads it as the script did: a UTF-8 JSON object whose known fields have
/// their types, with `attempt` as stamped, an `id` and an `enqueued_at`,
/// and no `run_at`. `None` means the stamp does not stand (the payload is
/// malformed, or holds something a text stamp cannot see, such as an
/// escaped field name): take [`unstamped`] through [`intake`] instead.
pub fn stamped(held: &[u8], stamp: Stamp) -> Option<Job> {
    if stamp == Stamp::Untouched {
        return None;
    }
    let text = std::str::from_utf8(held).ok()?;
    Some(match read(text, stamp)? {
        Read::Held(place) => place.job(SharedText::from(text)),
        Read::Whole(job) => job,
    })
}

/// As [`stamped`], for a payload the worker owns: the job, and the
/// payload as held (what settles it), keep these very bytes as their
/// text, without a copy (a payload can be megabytes, and the reply it came
/// in is the one copy the worker needs). When the stamp does not stand,
/// the bytes come back untouched.
pub fn take_stamped(held: Vec<u8>, stamp: Stamp) -> Result<(Job, SharedText), Vec<u8>> {
    if stamp == Stamp::Untouched {
        return Err(held);
    }
    let Some(found) = std::str::from_utf8(&held).ok().and_then(|t| read(t, stamp)) else {
        return Err(held);
    };
    let text = match String::from_utf8(held) {
        Ok(text) => SharedText::from(text),
        // Checked just above: never taken.
        Err(e) => return Err(e.into_bytes()),
    };
    let job = match found {
        Read::Held(place) => place.job(text.clone()),
        Read::Whole(job) => job,
    };
    Ok((job, text))
}

/// What one read of a stamped payload found.
enum Read {
    /// The stamp stands and the known fields are slices of the text.
    Held(Place),
    /// The stamp stands but a known string has escapes: the object was
    /// read whole (rare: producers' ids and names are plain).
    Whole(Job),
}

/// Where the known fields are in the text, and the numbers read.
struct Place {
    id: Range<usize>,
    task: Option<Range<usize>>,
    unique_key: Option<Range<usize>>,
    attempt: u64,
    enqueued_at: u64,
}

impl Place {
    /// The job of `text`, the text this place was read from.
    fn job(self, text: SharedText) -> Job {
        Job {
            attempt_trace: None,
            repr: Repr::Held(Held {
                text,
                id: self.id,
                task: self.task,
                unique_key: self.unique_key,
                attempt: self.attempt,
                enqueued_at: self.enqueued_at,
                fields: OnceLock::new(),
            }),
        }
    }
}

/// Reads a stamped payload's text as [`stamped`] describes: `None` when
/// the stamp does not stand.
fn read(text: &str, stamp: Stamp) -> Option<Read> {
    let held = text.as_bytes();
    let expected = match stamp {
        Stamp::Untouched => return None,
        Stamp::Fresh(_) => 1,
        Stamp::Counted => leading_attempt(held)?.0,
    };
    // One pass that checks the whole object and reads the known fields:
    // this runs for every job taken, and most jobs never need the rest.
    let head = head::read(text)?;
    if head.attempt_repeated {
        return None;
    }
    let (Some(Scalar::U64(attempt)), Some(Scalar::U64(enqueued_at))) =
        (head.attempt, head.enqueued_at)
    else {
        return None;
    };
    let id_holds = head.id.is_some_and(Scalar::is_string);
    let task_holds = head.task.is_none_or(Scalar::is_string);
    if attempt != expected || !id_holds || !task_holds {
        return None;
    }
    // Where each string is in the text; `Err` for one with escapes, whose
    // value is not a slice of the text.
    let place = |s: Option<Scalar<'_>>| match s {
        Some(Scalar::Str(s)) => range_in(text, s).map(Some).ok_or(()),
        Some(Scalar::Escaped) => Err(()),
        None | Some(_) => Ok(None),
    };
    let (Ok(Some(id)), Ok(task), Ok(unique_key)) =
        (place(head.id), place(head.task), place(head.unique_key))
    else {
        let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(text) else {
            return None;
        };
        return Some(Read::Whole(Job::from_fields(fields)));
    };
    Some(Read::Held(Place {
        id,
        task,
        unique_key,
        attempt,
        enqueued_at,
    }))
}

/// Where `part`, a slice of `whole`, lies in it (`None` if it is not one).
fn range_in(whole: &str, part: &str) -> Option<Range<usize>> {
    let start = (part.as_ptr() as usize).checked_sub(whole.as_ptr() as usize)?;
    let range = start..start + part.len();
    let found = whole.get(range.clone())?;
    (found.as_ptr() == part.as_ptr()).then_some(range)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: u64 = 1_700_000_000_000;

    /// The fetch script's fresh stamp of `raw` (stamp.lua), with a fixed id.
    fn fetch_stamped(raw: &str) -> (Vec<u8>, Stamp) {
        let add = format!(r#""attempt":1,"id":"{:032x}","enqueued_at":{NOW}"#, 7);
        let rest = &raw[1..];
        let (held, n) = if rest.trim_start().starts_with('}') {
            (format!("{{{add}{rest}"), add.len())
        } else {
            (format!("{{{add},{rest}"), add.len() + 1)
        };
        (held.into_bytes(), Stamp::Fresh(n))
    }

    #[test]
    fn a_stamped_payload_gives_back_the_pushed_bytes_exactly() {
        for raw in [
            r#"{"task":"t","data":{"b":1e400}}"#,
            "{ }",
            r#"{"a":"\u00e9"}"#,
        ] {
            let (held, stamp) = fetch_stamped(raw);
            assert_eq!(unstamped(&held, stamp), raw.as_bytes(), "{raw}");
        }
        let counted = br#"{"attempt":10,"id":"a","x":[1]}"#;
        assert_eq!(
            unstamped(counted, Stamp::Counted),
            br#"{"attempt":9,"id":"a","x":[1]}"#
        );
        assert_eq!(unstamped(b"\xff", Stamp::Untouched), b"\xff");
    }

    #[test]
    fn a_payload_taken_owned_becomes_the_jobs_text_without_a_copy() {
        let (held, stamp) = fetch_stamped(r#"{"task":"t","data":{"n":1.10}}"#);
        let at = held.as_ptr();
        let (job, text) = take_stamped(held.clone(), stamp).expect("a plain fresh job");
        assert_eq!(Some(&job), stamped(&held, stamp).as_ref());
        assert_eq!(text.as_bytes(), held.as_slice());
        assert_eq!(job.to_json().as_bytes(), held.as_slice());
        let (job, text) = take_stamped(held, stamp).expect("a plain fresh job");
        assert_eq!(text.as_ptr(), at, "the very bytes");
        assert_eq!(job.held().map(|t| t.as_ptr()), Some(at));
        assert_eq!(job.json_line().as_ptr(), at, "the line a handler gets");
        // Read whole (an escaped id): the held text is still the payload.
        let (escaped, stamp) = (
            br#"{"attempt":2,"id":"\u0061","enqueued_at":1}"#,
            Stamp::Counted,
        );
        let (job, text) = take_stamped(escaped.to_vec(), stamp).expect("a counted job");
        assert_eq!((job.id(), text.as_bytes()), ("a", escaped.as_slice()));
        let (bad, stamp) = fetch_stamped(r#"{"task":5}"#);
        assert!(take_stamped(bad.clone(), stamp).is_err_and(|b| b == bad));
        assert!(take_stamped(b"{}".to_vec(), Stamp::Untouched).is_err_and(|b| b == b"{}"));
    }

    #[test]
    fn a_stamp_stands_only_where_the_worker_reads_the_payload_as_the_script_did() {
        let (held, stamp) = fetch_stamped(r#"{"task":"t","data":{"id":1}}"#);
        let job = stamped(&held, stamp).expect("a plain fresh job");
        assert_eq!((job.attempt(), job.task()), (1, Some("t")));
        assert_eq!(job.id(), format!("{:032x}", 7));
        let job = stamped(br#"{"attempt":4,"id":"a","enqueued_at":1}"#, Stamp::Counted);
        assert_eq!(job.map(|j| j.attempt()), Some(4));
        for raw in [
            r#"{"task":5}"#,         // a known field of the wrong type
            r#"{"\u0061ttempt":3}"#, // an escaped name the text stamp missed
            r#"{"run_at":"soon"}"#,  // intake schedules or refuses it
            r#"{"a":1"#,             // not JSON
        ] {
            let (held, stamp) = fetch_stamped(raw);
            assert_eq!(stamped(&held, stamp), None, "{raw}");
        }
        assert_eq!(
            stamped(br#"{"attempt":2,"x":1}"#, Stamp::Counted),
            None,
            "no id"
        );
        assert_eq!(stamped(br#"{"id":"a"}"#, Stamp::Untouched), None);
        // The stamp counted the leading attempt to 2; a map keeps the last,
        // which intake counts to 3: the worker's own intake decides.
        assert_eq!(
            stamped(
                br#"{"attempt":2,"id":"a","enqueued_at":1,"attempt":2}"#,
                Stamp::Counted
            ),
            None,
            "attempt twice"
        );
    }

    #[test]
    fn a_stamped_job_hands_on_its_text_as_pushed_and_parses_the_rest_on_demand() {
        let held = br#"{"attempt":1,"id":"i","enqueued_at":5,"task":"t","data":{"n":1.50,"big":18446744073709551616},"unique_key":"k"}"#;
        let job = stamped(held, Stamp::Fresh(1)).expect("stands");
        // The numbers as written, not as a float re-serializes them.
        assert_eq!(job.to_json().as_bytes(), held);
        assert_eq!(job.held().map(|h| h.as_bytes()), Some(held.as_slice()));
        assert_eq!(
            (job.id(), job.task(), job.attempt(), job.enqueued_at()),
            ("i", Some("t"), 1, Some(5))
        );
        assert_eq!(job.release_token().as_deref(), Some("1:ik"));
        assert_eq!(job.data()["n"], json!(1.5));
        let failed: Value = serde_json::from_str(&job.failed("boom")).expect("json");
        assert_eq!(
            (failed["error"].as_str(), failed["id"].as_str()),
            (Some("boom"), Some("i"))
        );
        // Over several lines as pushed: one line for a handler.
        let pretty = b"{\"attempt\":1,\"id\":\"i\",\"enqueued_at\":5,\n \"x\":[1,\r\n2]}";
        let job = stamped(pretty, Stamp::Fresh(1)).expect("stands");
        assert_eq!(
            job.to_json(),
            r#"{"attempt":1,"id":"i","enqueued_at":5,"x":[1,2]}"#
        );
        // An escaped id is read whole; its value, not its text, is the id.
        let escaped = br#"{"attempt":1,"id":"\u0069d","enqueued_at":5,"unique_key":"k"}"#;
        let job = stamped(escaped, Stamp::Fresh(1)).expect("stands");
        assert_eq!((job.id(), job.held()), ("id", None));
        assert_eq!(job.release_token().as_deref(), Some("2:idk"));
    }

    #[test]
    fn stamps_round_trip_through_the_reply_codes() {
        for stamp in [Stamp::Untouched, Stamp::Fresh(57), Stamp::Counted] {
            assert_eq!(Stamp::from_reply(stamp.code()), stamp);
        }
    }
}
