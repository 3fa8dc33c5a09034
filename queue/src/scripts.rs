//! Lua scripts that make each queue transition atomic.
//!
//! Every script that settles a job first removes that exact payload from the
//! worker's processing list and does its write only when the removal
//! happened. A job that a reaper has already returned to the queue is
//! therefore never completed, retried or dead-lettered a second time, and
//! two workers doing the same maintenance at once cannot both move a job.
//! Due times and heartbeats use the Redis server's clock (`TIME`).

use std::sync::LazyLock;

use redis::Script;

/// Server time in unix milliseconds, shared by the scripts below.
const NOW_MS: &str =
    "local t = redis.call('TIME')\nlocal now = t[1] * 1000 + math.floor(t[2] / 1000)\n";

fn script(body: &str) -> Script {
    Script::new(&format!("{NOW_MS}{body}"))
}

/// Takes up to `ARGV[1]` jobs from the queues in `KEYS` (pairs of queue and
/// processing list, highest priority first), each moved atomically.
/// Returns a flat list: queue index (1-based), payload, …
pub static FETCH: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local n = tonumber(ARGV[1])
local out = {}
for i = 1, #KEYS, 2 do
  while n > 0 do
    local v = redis.call('LMOVE', KEYS[i], KEYS[i + 1], 'RIGHT', 'LEFT')
    if not v then break end
    out[#out + 1] = (i + 1) / 2
    out[#out + 1] = v
    n = n - 1
  end
  if n == 0 then break end
end
return out
"#,
    )
});

/// Settles freshly fetched payloads. KEYS: processing, scheduled, dead,
/// stats:dead. ARGV: triples of action, raw payload, argument:
/// `R` replaces the raw payload with the stamped one (argument),
/// `S` parks it in the scheduled set at score `argument`,
/// `D` dead-letters it with the envelope `argument`.
/// Returns 1 or 0 per triple: whether the payload was still ours.
pub static SETTLE_INTAKE: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local out = {}
for i = 1, #ARGV, 3 do
  local action, raw, arg = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local ok = redis.call('LREM', KEYS[1], 1, raw)
  if ok == 1 then
    if action == 'R' then
      redis.call('LPUSH', KEYS[1], arg)
    elseif action == 'S' then
      redis.call('ZADD', KEYS[2], tonumber(arg), raw)
    else
      redis.call('LPUSH', KEYS[3], arg)
      redis.call('INCR', KEYS[4])
    end
  end
  out[#out + 1] = ok
end
return out
"#,
    )
});

/// Completes a job. KEYS: processing, stats:processed. ARGV: payload.
pub static ACK: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then
  redis.call('INCR', KEYS[2])
  return 1
end
return 0
"#,
    )
});

/// Completes a job and, in the same round trip, takes the next one into
/// the freed slot. KEYS: processing and stats:processed of the completed
/// job's queue, then pairs of queue and processing list, highest priority
/// first. ARGV: the completed payload. Returns {1 or 0 (whether the job was
/// still ours), then queue index (1-based) and payload when one was taken}.
pub static ACK_AND_TAKE: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local kept = redis.call('LREM', KEYS[1], 1, ARGV[1])
if kept == 1 then
  redis.call('INCR', KEYS[2])
end
for i = 3, #KEYS, 2 do
  local v = redis.call('LMOVE', KEYS[i], KEYS[i + 1], 'RIGHT', 'LEFT')
  if v then
    return {kept, (i - 1) / 2, v}
  end
end
return {kept}
"#,
    )
});

/// Schedules the next attempt of a failed job. KEYS: processing, retry,
/// stats:failed. ARGV: payload, next payload, delay in milliseconds.
pub static RETRY: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[2])
  redis.call('INCR', KEYS[3])
  return 1
end
return 0
"#,
    )
});

/// Dead-letters a job after a failed attempt. KEYS: processing, dead,
/// stats:failed, stats:dead. ARGV: payload, dead-letter envelope.
pub static BURY: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then
  redis.call('LPUSH', KEYS[2], ARGV[2])
  redis.call('INCR', KEYS[3])
  redis.call('INCR', KEYS[4])
  return 1
end
return 0
"#,
    )
});

/// Puts jobs back at the head of the queue (they run next). KEYS:
/// processing, queue. ARGV: pairs of payload as held, payload to push.
/// Pairs are pushed in order, so the last pair ends up at the very head.
/// Returns how many were still ours.
pub static GIVE_BACK: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local n = 0
for i = 1, #ARGV, 2 do
  if redis.call('LREM', KEYS[1], 1, ARGV[i]) == 1 then
    redis.call('RPUSH', KEYS[2], ARGV[i + 1])
    n = n + 1
  end
end
return n
"#,
    )
});

/// Moves due entries of the retry and scheduled sets to the tail of the
/// queue. KEYS: retry, scheduled, queue. ARGV: the most to move per set.
/// Returns how many moved.
pub static PROMOTE: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local n = 0
for k = 1, 2 do
  local due = redis.call('ZRANGE', KEYS[k], '-inf', now, 'BYSCORE', 'LIMIT', 0, tonumber(ARGV[1]))
  for _, v in ipairs(due) do
    redis.call('ZREM', KEYS[k], v)
    redis.call('LPUSH', KEYS[3], v)
    n = n + 1
  end
end
return n
"#,
    )
});

/// Records a heartbeat. KEYS: workers, worker hash. ARGV: instance,
/// hash TTL in milliseconds, then field/value pairs for the hash.
/// Returns {1 if the instance was not registered (new, or reaped), now}.
pub static HEARTBEAT: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local added = redis.call('ZADD', KEYS[1], now, ARGV[1])
if #ARGV > 2 then
  redis.call('HSET', KEYS[2], 'beat', now, unpack(ARGV, 3))
else
  redis.call('HSET', KEYS[2], 'beat', now)
end
redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[2]))
return {added, now}
"#,
    )
});

/// Returns a lost worker's jobs to the head of the queue, oldest taken at
/// the very head, and forgets the worker. KEYS: workers, its processing
/// list, queue, its hash, stats:recovered. ARGV: instance, silence in
/// milliseconds after which it counts as lost (-1: lost regardless, for a
/// worker's own earlier incarnations). The silence is checked again here,
/// so a worker that has just beaten is left alone and concurrent reapers
/// move each job once. Returns the number of jobs moved, or -1 if the
/// worker was not lost.
pub static REAP: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local limit = tonumber(ARGV[2])
local beat = redis.call('ZSCORE', KEYS[1], ARGV[1])
if limit >= 0 and beat and tonumber(beat) > now - limit then
  return -1
end
local n = 0
while redis.call('LMOVE', KEYS[2], KEYS[3], 'LEFT', 'RIGHT') do
  n = n + 1
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[4])
if n > 0 then
  redis.call('INCRBY', KEYS[5], n)
end
return n
"#,
    )
});

/// Removes a worker from the registry when it holds no jobs. KEYS:
/// workers, its processing list, its hash. ARGV: instance.
pub static DEREGISTER: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
if redis.call('LLEN', KEYS[2]) == 0 then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('DEL', KEYS[3])
  return 1
end
return 0
"#,
    )
});

/// Moves dead letters back onto the queue for a fresh start. KEYS: dead,
/// queue. ARGV: pairs of the dead-letter entry as stored and the payload to
/// push. An entry is moved only if it is still in the dead list, so two
/// operators retrying at once move each job once. Returns how many moved.
pub static RESURRECT: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local n = 0
for i = 1, #ARGV, 2 do
  if redis.call('LREM', KEYS[1], 1, ARGV[i]) == 1 then
    redis.call('LPUSH', KEYS[2], ARGV[i + 1])
    n = n + 1
  end
end
return n
"#,
    )
});

/// Removes the given entries from a list. KEYS: the list. ARGV: entries
/// as stored. Returns how many were removed.
pub static REMOVE: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local n = 0
for i = 1, #ARGV do
  n = n + redis.call('LREM', KEYS[1], 1, ARGV[i])
end
return n
"#,
    )
});
