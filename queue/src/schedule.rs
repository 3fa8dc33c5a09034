//! The fires of recurring schedules: each fire claimed and its job enqueued
//! in one script (`fire.lua`), so two operators, a restart or a leader
//! change never enqueue one fire twice. When a schedule fires and what its
//! job holds is the operator's business (`workerpool_operator::schedule`).

use redis::{AsyncCommands, RedisResult};
use serde_json::{Map, Value};

use crate::connection::Conn;
use crate::job::field;
use crate::keys::QueueKeys;
use crate::scripts;

/// What became of one fire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fired {
    /// Claimed, and its job enqueued.
    Enqueued,
    /// Claimed, and its job refused: a job holding its unique key (the
    /// schedule's previous job, for `Forbid`) is still waiting, scheduled,
    /// retrying or running.
    Refused,
    /// Claimed before, by this process or another: this fire, or a later
    /// one of the schedule at `latest_ms`.
    AlreadyClaimed {
        /// The latest fire of the schedule claimed, unix ms.
        latest_ms: i64,
    },
}

/// Claims the fire at `at_ms` (unix ms) of `schedule` on queue `q` and, if
/// it was not claimed before, enqueues `job` with it: the job must have its
/// `id`; its `unique_key` and `unique_for` (see [`crate::job::unique_of`])
/// hold as for any job. An invalid job is an error and claims nothing.
pub async fn fire(
    conn: &mut impl Conn,
    q: &QueueKeys,
    schedule: &str,
    at_ms: i64,
    job: &Map<String, Value>,
) -> RedisResult<Fired> {
    let invalid =
        |why: String| redis::RedisError::from((redis::ErrorKind::Client, "invalid job", why));
    let id = job
        .get(field::ID)
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("a fire's job needs its id".into()))?;
    let (key, hold_ms) = match crate::job::unique_of(job).map_err(invalid)? {
        Some((key, secs)) => (key, secs.saturating_mul(1000)),
        None => ("", 0),
    };
    let (code, latest): (i64, i64) = scripts::FIRE
        .prepare_invoke()
        .key(q.waiting())
        .key(q.scheduled())
        .key(q.unique())
        .key(q.unique_expiry())
        .key(q.fires())
        .arg(schedule)
        .arg(at_ms)
        .arg(Value::Object(job.clone()).to_string())
        .arg(id)
        .arg(key)
        .arg(hold_ms)
        .invoke_async(conn)
        .await?;
    Ok(match code {
        1 => Fired::Enqueued,
        0 => Fired::Refused,
        _ => Fired::AlreadyClaimed { latest_ms: latest },
    })
}

/// The latest claimed fire of `schedule` on `q` (unix ms), if any: where a
/// process that starts picks up the schedule.
pub async fn last_fire(
    conn: &mut impl Conn,
    q: &QueueKeys,
    schedule: &str,
) -> RedisResult<Option<i64>> {
    conn.hget(q.fires(), schedule).await
}

/// Forgets the claims on `q` of the schedules of one pool (their field
/// names start with `owner`, `<namespace>/<pool>/`) that `keep` does not
/// name: a schedule removed from the pool, or moved to another queue,
/// leaves nothing behind that a schedule of the same name added later
/// would pick up. Returns how many were forgotten.
pub async fn forget_fires(
    conn: &mut impl Conn,
    q: &QueueKeys,
    owner: &str,
    keep: &[&str],
) -> RedisResult<usize> {
    let names: Vec<String> = conn.hkeys(q.fires()).await?;
    let gone: Vec<&String> = names
        .iter()
        .filter(|n| n.strip_prefix(owner).is_some_and(|s| !keep.contains(&s)))
        .collect();
    if gone.is_empty() {
        return Ok(0);
    }
    conn.hdel::<_, _, ()>(q.fires(), &gone).await?;
    Ok(gone.len())
}
