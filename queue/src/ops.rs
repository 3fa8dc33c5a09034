//! Queue operations on Redis: thin async wrappers over the scripts in
//! [`crate::scripts`], shared by the worker runtime and the tools.
//!
//! Payloads are bytes here, as Redis stores them: a producer can push
//! anything, and only intake decides whether it is a job. Reading them as
//! text would fail on the first payload that is not UTF-8, after the fetch
//! had already moved it.

use std::borrow::Cow;
use std::time::Duration;

use crate::connection::Conn;
use redis::AsyncCommands;

use crate::job::{Stamp, push_new_id};
use crate::keys::QueueKeys;
use crate::rate::RateLimit;
use crate::scripts;

pub use redis::RedisResult;

/// A payload exactly as stored in Redis.
pub type Payload = Vec<u8>;

/// A payload taken from a queue into the instance's processing list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// Index of its queue in the list given to the fetch (priority order).
    pub queue: usize,
    /// The payload as the processing list holds it.
    pub payload: Payload,
    /// How the taking script stamped it.
    pub stamp: Stamp,
    /// What the taking script wrote of its outcome, when it keeps one.
    pub start: Start,
}

/// What a taking script did with the outcome of a job it took (take.lua):
/// a job that keeps its outcome starts as it is taken, with no round trip
/// of its own before its handler runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Start {
    /// Nothing: it keeps no outcome, or only the worker can tell how
    /// (then it notes the start itself, [`crate::outcome::start`]).
    #[default]
    Unnoted,
    /// Written `running` for this attempt on this worker.
    Running,
    /// A cancel was asked for it: it is not to run, and settles
    /// [`Settlement::Cancelled`].
    Cancelled,
}

impl Start {
    fn from_mark(mark: Option<&u8>) -> Self {
        match mark {
            Some(b'R') => Start::Running,
            Some(b'C') => Start::Cancelled,
            _ => Start::Unnoted,
        }
    }
}

impl Fetched {
    /// A payload taken as it was, unstamped (the blocking wait's).
    pub fn untouched(queue: usize, payload: Payload) -> Self {
        Self {
            queue,
            payload,
            stamp: Stamp::Untouched,
            start: Start::Unnoted,
        }
    }
}

/// The payload size limit a worker runs with when it is not told
/// otherwise: 16 MiB. Redis takes up to 512 MB in one value, but a worker
/// holds a job it runs more than once on the way (measured: about 3 times
/// its size at the peak, `docs/benchmarks.md`), and a handler's own
/// process or server holds it again; 16 MiB keeps the largest job within
/// some 60 MB of the worker and is far above what a job that carries
/// references rather than data needs.
pub const DEFAULT_MAX_PAYLOAD_BYTES: u64 = 16 * 1024 * 1024;

/// What the taking scripts ([`fetch`], [`settle`], [`wait_then_fetch`])
/// enforce as they take jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The pool's attempt limit: a job past it is left to intake.
    pub max_attempts: u32,
    /// Payloads longer than this many bytes are dead-lettered as
    /// `too_large` by the script, whole, and never reach the worker; 0:
    /// no limit.
    pub max_payload_bytes: u64,
    /// How long to keep the outcome of a job that does not say (the
    /// worker's `--keep-outcomes`); `None`: only jobs that ask keep theirs.
    /// A kept job is written `running` as it is taken.
    pub keep_outcomes: Option<Duration>,
}

impl From<u32> for Limits {
    /// The attempt limit alone: no size limit, no outcomes kept but those
    /// jobs ask for.
    fn from(max_attempts: u32) -> Self {
        Limits {
            max_attempts,
            max_payload_bytes: 0,
            keep_outcomes: None,
        }
    }
}

/// A payload a taking script dead-lettered as `too_large` instead of
/// taking it (the whole payload is in the dead letter).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooLarge {
    /// Index of its queue in the list given to the script.
    pub queue: usize,
    /// The dead letter's error: the size, the limit and the payload's
    /// start, escaped.
    pub error: String,
}

/// What a taking script ([`fetch`], [`settle`]) took, and whether a rate
/// limit stopped it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Taken {
    /// The jobs taken, in the order taken.
    pub jobs: Vec<Fetched>,
    /// Payloads over the size limit, dead-lettered instead of taken.
    pub too_large: Vec<TooLarge>,
    /// Set when the rate limit of a queue with jobs left stopped the
    /// taking before the slots were full (the soonest to allow a start
    /// again when several did).
    pub limited: Option<Limited>,
}

/// A queue whose rate limit stopped a taking script with jobs left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limited {
    /// Index of the queue in the list given to the script.
    pub queue: usize,
    /// Time until the queue's next start is allowed.
    pub wait: Duration,
}

/// What to do with one freshly fetched payload (see [`settle_intake`]);
/// `held` is the payload as the processing list holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IntakeAction {
    /// Replace the held payload with its stamped form before running it.
    Run { held: Payload, stamped: String },
    /// As `Run`, for a large payload stamped as text: the held payload
    /// named by [`name_of`], and the bytes its stamped form has after the
    /// opening brace in front of the held one's
    /// ([`crate::job::fresh_stamp`]). Neither is sent whole.
    RunNamed { name: String, added: String },
    /// Park `payload` in the scheduled set until `run_at` (a kept job's
    /// outcome written `scheduled`).
    Schedule {
        held: Payload,
        payload: Payload,
        run_at: u64,
        kept: Option<KeptAt>,
    },
    /// Dead-letter the payload with this envelope, freeing the job's
    /// unique key with `release` ([`crate::job::release_token`]) (a kept
    /// job's outcome written `dead` with the envelope's error).
    Dead {
        held: Payload,
        envelope: String,
        release: Option<String>,
        kept: Option<KeptAt>,
    },
}

/// Which job's outcome a script that moves it writes, and how long a
/// final one is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptAt {
    /// The job's id.
    pub id: String,
    /// How long a final outcome is kept (at most [`MAX_KEEP`]).
    pub keep: Duration,
}

impl KeptAt {
    fn keep_ms(&self) -> u64 {
        keep_ms(Some(self.keep))
    }
}

/// The ARGV head of the scripts that take jobs: the count, the attempt
/// limit, an id for each job that arrives without one, the rate limit's
/// interval and tolerance in ms (0 and 0 without one), the payload size
/// limit (0: none) and the instance.
fn taking_args(
    invocation: &mut Eval<'_>,
    n: usize,
    limits: Limits,
    rate: Option<&RateLimit>,
    instance: &str,
) {
    // One buffer for every id (they are written for every slot, whether
    // the jobs need them or not).
    let mut ids = String::with_capacity(32 * n);
    for _ in 0..n {
        push_new_id(&mut ids);
    }
    let (interval, tolerance) = rate.map_or((0.0, 0.0), |r| (r.interval_ms(), r.tolerance_ms()));
    invocation
        .arg(n)
        .arg(limits.max_attempts)
        .arg(ids)
        .arg(interval)
        .arg(tolerance)
        .arg(limits.max_payload_bytes)
        .arg(instance)
        .arg(keep_ms(limits.keep_outcomes));
}

/// A keep as the scripts take it: ms, at most [`MAX_KEEP`], at least 1;
/// 0 for none.
pub(crate) fn keep_ms(keep: Option<Duration>) -> u64 {
    keep.map_or(0, |k| k.min(MAX_KEEP).as_millis().max(1) as u64)
}

/// Payloads longer than this are named to the settle script by their
/// length and SHA-1 ([`name_of`]) instead of sent back whole; shorter ones
/// go as they are, which costs Redis nothing to match.
pub const NAMED_ABOVE: usize = 256 * 1024;

/// How the settle script knows a large payload: `<length>:<sha1 hex>`
/// (settle.lua's `#` heads; the digest is the one `redis.sha1hex` gives).
pub fn name_of(payload: &[u8]) -> String {
    format!(
        "{}:{}",
        payload.len(),
        sha1_smol::Sha1::from(payload).digest()
    )
}

/// A script call written straight into the command that goes out.
/// redis' `ScriptInvocation` keeps its own copy of every argument and
/// copies them all again into the command it sends, so a payload passed
/// back to a script (the settle names each job by its exact bytes) was
/// held twice more than needed, at the size limit 16 MiB each; here it is
/// written once, into the command.
struct Eval<'a> {
    script: &'a redis::Script,
    cmd: redis::Cmd,
}

impl<'a> Eval<'a> {
    /// `EVALSHA` of `script` with these keys; the arguments follow.
    fn new(script: &'a redis::Script, keys: &[String]) -> Self {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(keys.len()).arg(keys);
        Self { script, cmd }
    }

    /// Adds an argument (`ARGV[i]`).
    fn arg(&mut self, arg: impl redis::ToRedisArgs) -> &mut Self {
        self.cmd.arg(arg);
        self
    }

    /// Runs it, loading the script first when the server does not have it
    /// (as `ScriptInvocation` does).
    async fn invoke<T: redis::FromRedisValue>(&self, conn: &mut impl Conn) -> RedisResult<T> {
        match self.cmd.query_async(conn).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                self.script.load_async(conn).await?;
                self.cmd.query_async(conn).await
            }
            other => other,
        }
    }
}

/// Reads a taking script's flat reply from `at` on: groups of a queue
/// index (1-based), a count and the outcome marks (take.lua: '' or one
/// letter per job), each followed by that many pairs of the payload as
/// held and its stamp (or, stamp -2, the error of a payload dead-lettered
/// as too large).
fn taken(reply: &mut [redis::Value], mut at: usize) -> RedisResult<(Vec<Fetched>, Vec<TooLarge>)> {
    let int = |v: &redis::Value| redis::from_redis_value_ref::<i64>(v);
    let mut jobs = Vec::new();
    let mut too_large = Vec::new();
    while at + 2 < reply.len() {
        let index = int(&reply[at])?;
        let count = usize::try_from(int(&reply[at + 1])?).unwrap_or(0);
        let marks: Vec<u8> = redis::from_redis_value_ref(&reply[at + 2])?;
        let pairs = reply
            .get_mut(at + 3..at + 3 + 2 * count)
            .ok_or_else(|| malformed_reply("a group of taken jobs is cut short"))?;
        jobs.reserve(count);
        let queue = usize::try_from(index - 1).unwrap_or(0);
        for (j, pair) in pairs.chunks_exact_mut(2).enumerate() {
            // The payload's bytes move out of the reply rather than being copied.
            let payload = std::mem::replace(&mut pair[0], redis::Value::Nil);
            let code = int(&pair[1])?;
            if code == TOO_LARGE {
                let error: Vec<u8> = redis::from_redis_value(payload)?;
                too_large.push(TooLarge {
                    queue,
                    error: String::from_utf8_lossy(&error).into_owned(),
                });
                continue;
            }
            jobs.push(Fetched {
                queue,
                payload: redis::from_redis_value(payload)?,
                stamp: Stamp::from_reply(code),
                start: Start::from_mark(marks.get(j)),
            });
        }
        at += 3 + 2 * count;
    }
    Ok((jobs, too_large))
}

/// The stamp code of a payload the taking script dead-lettered as too
/// large (take.lua).
const TOO_LARGE: i64 = -2;

/// The `limited queue, wait ms` pair that starts a taking script's reply.
fn limited(reply: &[redis::Value]) -> RedisResult<Option<Limited>> {
    let (Some(queue), Some(wait)) = (reply.first(), reply.get(1)) else {
        return Err(malformed_reply("no rate-limit pair"));
    };
    let queue: i64 = redis::from_redis_value_ref(queue)?;
    let wait: i64 = redis::from_redis_value_ref(wait)?;
    Ok((queue > 0 && wait >= 0).then(|| Limited {
        queue: (queue - 1) as usize,
        wait: Duration::from_millis(wait as u64),
    }))
}

fn malformed_reply(what: &'static str) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Client,
        "unexpected reply from a queue script",
        what.to_string(),
    ))
}

/// Takes up to `n` jobs from `queues` in priority order into the instance's
/// processing lists, in one round trip, stamping each for its attempt
/// (`limits.max_attempts` is the pool's limit: a job past it is left to
/// intake; a payload over `limits.max_payload_bytes` is dead-lettered as
/// `too_large` and never sent here). With a `rate` limit, no more jobs
/// start per queue than its bucket allows; the rest stay in the queue
/// untouched.
pub async fn fetch(
    conn: &mut impl Conn,
    queues: &[QueueKeys],
    instance: &str,
    n: usize,
    limits: impl Into<Limits>,
    rate: Option<&RateLimit>,
) -> RedisResult<Taken> {
    let mut keys = Vec::with_capacity(5 * queues.len());
    for q in queues {
        fetch_keys(&mut keys, q, instance);
    }
    let mut invocation = Eval::new(&scripts::FETCH, &keys);
    taking_args(&mut invocation, n, limits.into(), rate, instance);
    let mut reply: Vec<redis::Value> = invocation.invoke(conn).await?;
    let (jobs, too_large) = taken(&mut reply, 2)?;
    Ok(Taken {
        limited: limited(&reply)?,
        jobs,
        too_large,
    })
}

fn fetch_keys(keys: &mut Vec<String>, q: &QueueKeys, instance: &str) {
    keys.extend([
        q.waiting().to_string(),
        q.processing(instance),
        q.rate(),
        q.dead(),
        q.stats_dead(),
    ]);
}

/// Waits up to `timeout` for a job on one queue, then takes one as
/// [`fetch`] does (stamped, a payload over the size limit dead-lettered),
/// in one round trip. Use a connection of its own: a blocked connection
/// serves nothing else.
///
/// The wait is `BLMOVE <q> <q> RIGHT RIGHT`, which moves the oldest job
/// onto the end it came from (the list stays as it was) and so returns as
/// soon as the queue has a job, with `CLIENT REPLY SKIP` before it: the
/// server sends no reply to it, so the job's bytes never travel here
/// however large they are. The taking script (`EVALSHA` of [`fetch`]'s),
/// sent in the same write,
/// runs once the wait is over (a job came, the wait timed out, or
/// `CLIENT UNBLOCK` ended it) and its reply is the only one. A job the
/// script takes is in the processing list at once, as with [`fetch`]; a
/// job taken meanwhile by another worker only leaves the script nothing to
/// take.
///
/// Call it only on a connection [`probe_wait`] found may wait this way. A
/// Redis that refuses `CLIENT REPLY` answers with an error here, but only
/// for that command: the `BLMOVE` and the script sent with it still run,
/// and the script may move a job into the processing list whose reply
/// never reaches this side (two more replies follow on the connection).
/// [`reply_skip_refused`] tells that error apart: drop the connection,
/// check the processing list for jobs beyond those in hand, and fetch by
/// polling.
pub async fn wait_then_fetch(
    conn: &mut impl Conn,
    queue: &QueueKeys,
    instance: &str,
    timeout: Duration,
    limits: Limits,
) -> RedisResult<Taken> {
    let mut ids = String::with_capacity(32);
    push_new_id(&mut ids);
    let mut pipe = redis::pipe();
    pipe.cmd("CLIENT").arg("REPLY").arg("SKIP");
    pipe.cmd("BLMOVE")
        .arg(queue.waiting())
        .arg(queue.waiting())
        .arg("RIGHT")
        .arg("RIGHT")
        .arg(timeout.as_secs_f64());
    // EVALSHA: the round's fetch before the wait loaded the script on
    // this node (should the cache have been flushed since, this wait takes
    // nothing and loads it: the job stays in the queue for the next).
    pipe.cmd("EVALSHA")
        .arg(scripts::FETCH.get_hash())
        .arg(5)
        .arg(queue.waiting())
        .arg(queue.processing(instance))
        .arg(queue.rate())
        .arg(queue.dead())
        .arg(queue.stats_dead())
        .arg(1)
        .arg(limits.max_attempts)
        .arg(ids)
        .arg(0)
        .arg(0)
        .arg(limits.max_payload_bytes)
        .arg(instance)
        .arg(keep_ms(limits.keep_outcomes));
    // Three commands, one reply: the script's.
    let mut replies = conn.req_packed_commands(&pipe, 0, 1).await?;
    let reply = replies
        .pop()
        .ok_or_else(|| malformed_reply("no reply to the wait"))?;
    if let redis::Value::ServerError(e) = reply {
        let e: redis::RedisError = e.into();
        if e.code() == Some("NOSCRIPT") {
            // Nothing was taken: load it for the next wait.
            let _: String = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(scripts::FETCH_SOURCE.as_str())
                .query_async(conn)
                .await?;
            return Ok(Taken::default());
        }
        return Err(e);
    }
    let mut reply: Vec<redis::Value> = redis::from_redis_value(reply)?;
    let (jobs, too_large) = taken(&mut reply, 2)?;
    Ok(Taken {
        limited: None,
        jobs,
        too_large,
    })
}

/// What [`probe_wait`] found out about a connection about to wait.
#[derive(Debug)]
pub enum WaitProbe {
    /// The server lets it wait with [`wait_then_fetch`].
    Blocks,
    /// The server refuses `CLIENT REPLY` (an ACL without it, a proxy that
    /// does not pass it on), with this error: fetch by polling instead.
    /// Nothing was sent that could take a job.
    ReplyRefused(redis::RedisError),
}

/// Checks once, on a connection about to wait with [`wait_then_fetch`],
/// that the server lets it wait that way, in one round trip that can take
/// no job: `CLIENT REPLY ON` (what the connection is in already, so
/// harmless), then `BLMOVE` on `<q>:wait-probe`, a key that is never
/// written, for 10 ms. Both are needed because the wait sends
/// `CLIENT REPLY SKIP`, `BLMOVE` and the taking script in one write: a
/// refused `CLIENT REPLY` is learned only after the other two have run
/// (and may have moved a job nobody hears of), and the `BLMOVE`, which
/// answers nothing there, would be refused unseen and the worker would
/// spin. `ACL DRYRUN` would say the same without running anything, but
/// only to a user allowed `ACL`, which the worker is not.
///
/// Sent as one pipeline, like the wait's, so that on a cluster it reaches
/// the node the wait will.
pub async fn probe_wait(conn: &mut impl Conn, queue: &QueueKeys) -> RedisResult<WaitProbe> {
    let probe = queue.wait_probe();
    let mut pipe = redis::pipe();
    pipe.cmd("CLIENT").arg("REPLY").arg("ON");
    pipe.cmd("BLMOVE")
        .arg(&probe)
        .arg(&probe)
        .arg("RIGHT")
        .arg("RIGHT")
        .arg(0.01);
    let replies = conn.req_packed_commands(&pipe, 0, 2).await?;
    let mut replies = replies.into_iter();
    let (Some(reply_on), Some(blmove)) = (replies.next(), replies.next()) else {
        return Err(malformed_reply("no reply to the wait's probe"));
    };
    if let redis::Value::ServerError(e) = reply_on {
        let e: redis::RedisError = e.into();
        if reply_skip_refused(&e) {
            return Ok(WaitProbe::ReplyRefused(e));
        }
        return Err(e);
    }
    if let redis::Value::ServerError(e) = blmove {
        return Err(e.into());
    }
    Ok(WaitProbe::Blocks)
}

/// Whether `error`, from [`probe_wait`]'s `CLIENT REPLY ON` or from
/// [`wait_then_fetch`], is the server refusing `CLIENT REPLY` (an ACL
/// without it, a proxy that does not pass it on).
pub fn reply_skip_refused(error: &redis::RedisError) -> bool {
    let text = error.to_string().to_ascii_lowercase();
    error.code() == Some("NOPERM")
        || (text.contains("client")
            && (text.contains("reply") || text.contains("unknown") || text.contains("not allowed")))
}

/// Settles fresh payloads that the taking script's stamp did not settle
/// (stamp, schedule or dead-letter). Returns, per action, whether the
/// payload was still in the processing list.
pub async fn settle_intake(
    conn: &mut impl Conn,
    queue: &QueueKeys,
    instance: &str,
    actions: &[IntakeAction],
) -> RedisResult<Vec<bool>> {
    let keys = [
        queue.processing(instance),
        queue.scheduled(),
        queue.dead(),
        queue.stats_dead(),
        queue.unique(),
        queue.unique_expiry(),
    ];
    let mut keys = keys.to_vec();
    // A kept job's outcome keys follow the six (their 1-based position).
    let mut kept_at = Vec::with_capacity(actions.len());
    for action in actions {
        match action {
            IntakeAction::Schedule { kept: Some(k), .. }
            | IntakeAction::Dead { kept: Some(k), .. } => {
                kept_at.push(Some((keys.len() + 1, k.keep_ms())));
                keys.push(queue.outcome(&k.id));
                keys.push(queue.outcome_end(&k.id));
            }
            _ => kept_at.push(None),
        }
    }
    // Payloads go straight into the command (see `Eval`).
    let mut invocation = Eval::new(&scripts::SETTLE_INTAKE, &keys);
    for (action, kept) in actions.iter().zip(kept_at) {
        match action {
            IntakeAction::Run { held, stamped } => {
                invocation.arg("R").arg(held).arg(stamped).arg("")
            }
            IntakeAction::RunNamed { name, added } => {
                invocation.arg("N").arg(name).arg(added).arg("")
            }
            IntakeAction::Schedule {
                held,
                payload,
                run_at,
                ..
            } => invocation.arg("S").arg(held).arg(payload).arg(*run_at),
            IntakeAction::Dead {
                held,
                envelope,
                release,
                ..
            } => invocation
                .arg("D")
                .arg(held)
                .arg(envelope)
                .arg(release.as_deref().unwrap_or_default()),
        };
        match kept {
            Some((at, ms)) => invocation.arg(at).arg(ms),
            None => invocation.arg("").arg(""),
        };
    }
    let done: Vec<i64> = invocation.invoke(conn).await?;
    Ok(done.into_iter().map(|d| d == 1).collect())
}

/// How one finished job is settled (see [`settle`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settlement {
    /// Completed.
    Done,
    /// Failed; the next attempt (`next`) is due `delay` from now.
    Retry {
        /// The payload of the next attempt.
        next: String,
        /// Backoff before it.
        delay: Duration,
    },
    /// Not run (the handler could not start it): back in `delay`, as a
    /// retry is, but counted as no failure (`stats:failed` stays), since
    /// its attempt is not spent.
    NotRun {
        /// The payload it goes back with.
        next: String,
        /// Backoff before it.
        delay: Duration,
    },
    /// Failed for good; dead-lettered with this envelope.
    Dead {
        /// The dead-letter envelope.
        envelope: String,
    },
    /// Cancelled at a producer's request before its handler ran (or after
    /// it failed): removed, its unique key freed, its outcome `cancelled`.
    /// Only a kept job is settled so (its outcome is where the request
    /// is); one that is not is settled as done.
    Cancelled,
}

/// One finished job to settle.
#[derive(Debug, Clone, Copy)]
pub struct Finished<'a> {
    /// Index of its queue in the list given to [`settle`].
    pub queue: usize,
    /// The payload as the processing list holds it.
    pub payload: &'a [u8],
    /// What to do with it.
    pub settlement: &'a Settlement,
    /// The token that frees its unique key once it is done or dead
    /// ([`crate::job::release_token`]); `None` without one.
    pub release: Option<&'a str>,
    /// Its outcome to keep, written by the same script (`None`: the job
    /// did not ask, and nothing is written).
    pub kept: Option<Kept<'a>>,
}

/// A job's outcome, kept with its settlement in `<q>:job:<id>`
/// (docs/queue-contract.md, "Outcomes").
#[derive(Debug, Clone, Copy)]
pub struct Kept<'a> {
    /// The job's id.
    pub id: &'a str,
    /// How long a final outcome (done, dead) is kept.
    pub keep: Duration,
    /// The attempt that ended.
    pub attempt: u32,
    /// The worker (instance) it ran on.
    pub worker: &'a str,
    /// The result of a job done (JSON text; empty for none), or the error
    /// of one retried or dead-lettered.
    pub value: &'a str,
    /// Why a done job's result is not kept (too large, not JSON); empty
    /// when it is.
    pub note: &'a str,
    /// The token that frees its unique key should it end cancelled
    /// ([`crate::job::release_token`]); `None` without one.
    pub release: Option<&'a str>,
}

/// The longest a job's outcome may be kept: a week. A job asking for more
/// is kept this long.
pub const MAX_KEEP: Duration = Duration::from_secs(7 * 24 * 3600);

/// Settles `finished` jobs and takes up to `take` new ones from `queues`
/// (priority order) into the instance's processing lists, in one round
/// trip, stamped and rate-limited as [`fetch`] does. Returns, per finished
/// job, whether it was still ours (a job a reaper returned meanwhile is
/// not settled again), and what was taken.
pub async fn settle(
    conn: &mut impl Conn,
    queues: &[QueueKeys],
    instance: &str,
    finished: &[Finished<'_>],
    take: usize,
    limits: impl Into<Limits>,
    rate: Option<&RateLimit>,
) -> RedisResult<(Vec<bool>, Taken)> {
    let mut keys = Vec::with_capacity(10 * queues.len());
    for q in queues {
        keys.extend([
            q.waiting().to_string(),
            q.processing(instance),
            q.stats_processed(),
            q.retry(),
            q.stats_failed(),
            q.dead(),
            q.stats_dead(),
            q.unique(),
            q.unique_expiry(),
            q.rate(),
        ]);
    }
    let queue_keys = keys.len();
    // Each kept outcome's two keys, after the queues' (their position is
    // the script's, 1-based).
    let mut at = Vec::with_capacity(finished.len());
    for f in finished {
        match (&f.kept, queues.get(f.queue)) {
            (Some(kept), Some(q)) => {
                at.push(keys.len() + 1);
                keys.push(q.outcome(kept.id));
                keys.push(q.outcome_end(kept.id));
            }
            _ => at.push(0),
        }
    }
    // The payloads go straight into the command (see `Eval`).
    let mut invocation = Eval::new(&scripts::SETTLE, &keys);
    taking_args(&mut invocation, take, limits.into(), rate, instance);
    invocation.arg(queue_keys);
    for (f, at) in finished.iter().zip(at) {
        let kept = if at > 0 { "+" } else { "" };
        let index = f.queue + 1;
        // A large payload is named by its length and digest rather than
        // sent back whole (settle.lua finds it by them): the command would
        // otherwise hold it several times over on its way out.
        let (named, payload) = if f.payload.len() > NAMED_ABOVE {
            ("#", Cow::Owned(name_of(f.payload).into_bytes()))
        } else {
            ("", Cow::Borrowed(f.payload))
        };
        let payload = payload.as_ref();
        match (f.settlement, f.release) {
            (Settlement::Done, None) => invocation
                .arg(format!("{kept}{named}A{index}"))
                .arg(payload),
            (Settlement::Done, Some(release)) => invocation
                .arg(format!("{kept}{named}U{index}"))
                .arg(payload)
                .arg(release),
            (Settlement::Retry { next, delay }, _) => invocation
                .arg(format!("{kept}{named}T{index}"))
                .arg(payload)
                .arg(next.as_str())
                .arg(delay.as_millis() as u64),
            (Settlement::NotRun { next, delay }, _) => invocation
                .arg(format!("{kept}{named}R{index}"))
                .arg(payload)
                .arg(next.as_str())
                .arg(delay.as_millis() as u64),
            (Settlement::Dead { envelope }, release) => invocation
                .arg(format!("{kept}{named}B{index}"))
                .arg(payload)
                .arg(envelope.as_str())
                .arg(release.unwrap_or_default()),
            (Settlement::Cancelled, _) if at > 0 => invocation
                .arg(format!("{kept}{named}C{index}"))
                .arg(payload),
            (Settlement::Cancelled, None) => {
                invocation.arg(format!("{named}A{index}")).arg(payload)
            }
            (Settlement::Cancelled, Some(release)) => invocation
                .arg(format!("{named}U{index}"))
                .arg(payload)
                .arg(release),
        };
        if let (Some(k), true) = (&f.kept, at > 0) {
            invocation
                .arg(at)
                .arg(k.keep.min(MAX_KEEP).as_millis().max(1) as u64)
                .arg(k.attempt)
                .arg(k.worker)
                .arg(k.value)
                .arg(k.note)
                .arg(k.release.unwrap_or_default());
        }
    }
    let mut reply: Vec<redis::Value> = invocation.invoke(conn).await?;
    let lost = reply
        .get(2)
        .map(redis::from_redis_value_ref::<usize>)
        .transpose()?
        .ok_or_else(|| malformed_reply("no count of settlements whose job was gone"))?;
    let mut kept = vec![true; finished.len()];
    let gone = reply.get(3..3 + lost).ok_or_else(|| {
        malformed_reply("the positions of settlements whose job was gone are cut short")
    })?;
    for position in gone {
        let position: usize = redis::from_redis_value_ref(position)?;
        if let Some(k) = position.checked_sub(1).and_then(|i| kept.get_mut(i)) {
            *k = false;
        }
    }
    let (jobs, too_large) = taken(&mut reply, 3 + lost)?;
    Ok((
        kept,
        Taken {
            limited: limited(&reply)?,
            jobs,
            too_large,
        },
    ))
}

/// A job to put back in the queue (see [`give_back`]).
#[derive(Debug, Clone, Copy)]
pub struct Back<'a> {
    /// The payload as held in the processing list.
    pub held: &'a [u8],
    /// The payload to push.
    pub push: &'a [u8],
    /// The job's id when it keeps its outcome: written `waiting` again.
    pub kept: Option<&'a str>,
}

/// Why jobs go back to the queue, as a kept job's outcome says it
/// ([`give_back`]): its worker stops.
pub const STOPPING: &str = "as it stopped";

/// Why jobs go back to the queue: taken and never started (more came than
/// slots were free, or a reply was lost).
pub const NOT_STARTED: &str = "before it started them";

/// Puts jobs back at the head of the queue, a kept job's outcome `waiting`
/// again ("given back by its worker `instance` `why`", [`STOPPING`] or
/// [`NOT_STARTED`]). The last ends at the very head. Returns how many were
/// still ours.
pub async fn give_back(
    conn: &mut impl Conn,
    queue: &QueueKeys,
    instance: &str,
    jobs: &[Back<'_>],
    why: &str,
) -> RedisResult<usize> {
    if jobs.is_empty() {
        return Ok(0);
    }
    let mut keys = vec![queue.processing(instance), queue.waiting().to_string()];
    let mut at = Vec::with_capacity(jobs.len());
    for job in jobs {
        match job.kept {
            Some(id) => {
                at.push(keys.len() + 1);
                keys.push(queue.outcome(id));
            }
            None => at.push(0),
        }
    }
    // Payloads go straight into the command (see `Eval`).
    let mut invocation = Eval::new(&scripts::GIVE_BACK, &keys);
    invocation.arg(instance).arg(why);
    for (job, at) in jobs.iter().zip(at) {
        invocation.arg(job.held).arg(job.push).arg(at);
    }
    invocation.invoke(conn).await
}

/// Moves due retries and due delayed jobs to the queue. Returns how many.
pub async fn promote_due(
    conn: &mut impl Conn,
    queue: &QueueKeys,
    limit: usize,
) -> RedisResult<u64> {
    scripts::PROMOTE
        .key(queue.retry())
        .key(queue.scheduled())
        .key(queue.waiting())
        .arg(limit)
        .invoke_async(conn)
        .await
}

/// Result of a heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Beat {
    /// The instance was not in the registry before this beat: it is new,
    /// or a reaper took it for lost and returned its jobs.
    pub registered_anew: bool,
    /// The Redis server's clock, unix milliseconds.
    pub server_time_ms: u64,
}

/// Jobs a worker finished since its last heartbeat, for the queue's mean
/// job duration (`<q>:stats:duration`) and its spread
/// (`<q>:stats:duration_sq`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JobsTimed {
    /// How many jobs.
    pub jobs: u64,
    /// Their mean duration.
    pub mean: Duration,
    /// The standard deviation of their durations, when known.
    pub deviation: Option<Duration>,
}

impl JobsTimed {
    /// The mean of the squares of their durations in ms², which the
    /// heartbeat folds: `deviation² + mean²`.
    fn mean_square_ms2(&self) -> Option<f64> {
        let mean = self.mean.as_secs_f64() * 1000.0;
        self.deviation.map(|d| {
            let d = d.as_secs_f64() * 1000.0;
            d * d + mean * mean
        })
    }
}

/// How many jobs move the queue's mean job duration `1 - 1/e` of the way
/// to their own mean (`heartbeat.lua` has the same number).
pub const DURATION_TIME_CONSTANT_JOBS: f64 = 20.0;

/// The queue's mean job duration after `jobs` more jobs with this mean, as
/// `heartbeat.lua` folds them (in any unit).
pub fn fold_duration(old: Option<f64>, mean: f64, jobs: u64) -> f64 {
    match old {
        None => mean,
        Some(old) => {
            old + (1.0 - (-(jobs as f64) / DURATION_TIME_CONSTANT_JOBS).exp()) * (mean - old)
        }
    }
}

/// Records a heartbeat with the worker's details.
pub async fn heartbeat(
    conn: &mut impl Conn,
    queue: &QueueKeys,
    instance: &str,
    ttl: Duration,
    details: &[(&str, String)],
) -> RedisResult<Beat> {
    heartbeat_with(conn, queue, instance, ttl, details, None).await
}

/// [`heartbeat`], also folding the jobs finished since the last beat into
/// the queue's mean job duration, which the scaling engine reads before a
/// pool's first job runs (`docs/queue-contract.md`, "Keys").
pub async fn heartbeat_with(
    conn: &mut impl Conn,
    queue: &QueueKeys,
    instance: &str,
    ttl: Duration,
    details: &[(&str, String)],
    finished: Option<JobsTimed>,
) -> RedisResult<Beat> {
    let mut invocation = scripts::HEARTBEAT.prepare_invoke();
    invocation
        .key(queue.workers())
        .key(queue.worker(instance))
        .key(queue.stats_duration())
        .key(queue.stats_duration_sq())
        .arg(instance)
        .arg(ttl.as_millis() as u64);
    match finished.filter(|f| f.jobs > 0) {
        Some(f) => invocation
            .arg(format!("{:.3}", f.mean.as_secs_f64() * 1000.0))
            .arg(f.jobs)
            .arg(
                f.mean_square_ms2()
                    .map_or(String::new(), |sq| format!("{sq:.3}")),
            ),
        None => invocation.arg("").arg(0).arg(""),
    };
    for (field, value) in details {
        invocation.arg(*field).arg(value);
    }
    let (added, now): (i64, u64) = invocation.invoke_async(conn).await?;
    Ok(Beat {
        registered_anew: added == 1,
        server_time_ms: now,
    })
}

/// Registered worker instances with their last heartbeat (unix ms).
pub async fn workers(conn: &mut impl Conn, queue: &QueueKeys) -> RedisResult<Vec<(String, u64)>> {
    let entries: Vec<(String, f64)> = conn.zrange_withscores(queue.workers(), 0, -1).await?;
    Ok(entries
        .into_iter()
        .map(|(name, beat)| (name, beat as u64))
        .collect())
}

/// Instances whose last heartbeat is older than `cutoff_ms`.
pub async fn silent_workers(
    conn: &mut impl Conn,
    queue: &QueueKeys,
    cutoff_ms: u64,
) -> RedisResult<Vec<String>> {
    conn.zrangebyscore(queue.workers(), "-inf", format!("({cutoff_ms}"))
        .await
}

/// Returns a lost instance's jobs to the head of the queue if it has been
/// silent for `dead_after` (or regardless, with `None`). Returns the number
/// of jobs moved, or `None` when the instance turned out to be alive.
pub async fn reap(
    conn: &mut impl Conn,
    queue: &QueueKeys,
    instance: &str,
    dead_after: Option<Duration>,
) -> RedisResult<Option<u64>> {
    let limit = dead_after.map_or(-1, |d| d.as_millis() as i64);
    // The ids of its jobs, read first: each one's outcome, when it keeps
    // one still saying it runs there, is written `waiting` by the script
    // that moves the job (a job it holds that is not yet in the list
    // leaves an outcome that goes in a week, as any stranded one does).
    let held: Vec<Payload> = conn.lrange(queue.processing(instance), 0, -1).await?;
    let mut invocation = scripts::REAP.prepare_invoke();
    invocation
        .key(queue.workers())
        .key(queue.processing(instance))
        .key(queue.waiting())
        .key(queue.worker(instance))
        .key(queue.stats_recovered());
    for payload in &held {
        if let Some(id) = crate::job::id_in(payload) {
            invocation.key(queue.outcome(&id));
        }
    }
    let moved: i64 = invocation
        .arg(instance)
        .arg(limit)
        .invoke_async(conn)
        .await?;
    Ok(u64::try_from(moved).ok())
}

/// Removes the instance from the registry if its processing list is empty.
pub async fn deregister(
    conn: &mut impl Conn,
    queue: &QueueKeys,
    instance: &str,
) -> RedisResult<bool> {
    scripts::DEREGISTER
        .key(queue.workers())
        .key(queue.processing(instance))
        .key(queue.worker(instance))
        .arg(instance)
        .invoke_async(conn)
        .await
}

/// Everything in the instance's processing list.
pub async fn processing(
    conn: &mut impl Conn,
    queue: &QueueKeys,
    instance: &str,
) -> RedisResult<Vec<Payload>> {
    conn.lrange(queue.processing(instance), 0, -1).await
}
