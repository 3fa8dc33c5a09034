-- A kept job's outcome (docs/queue-contract.md, "Outcomes"): its hash
-- `<q>:job:<id>` and its end stream `<q>:job:<id>:end`, both named in the
-- caller's KEYS. MAX_KEEP_MS is `ops::MAX_KEEP` (a test holds the two
-- together): no outcome lives longer than that past its last change, or,
-- while not final, past the time its next step is due. An outcome whose
-- job vanished for good (a key deleted by hand, a Redis restored from an
-- old snapshot) therefore goes too, and memory stays bounded.
local MAX_KEEP_MS = 604800000

-- outcome_open(hash, ending, state, at, due): writes a state that is not
-- final (waiting, scheduled, running, retrying) at `at`, next due at
-- `due` ('' or nil: none). A wait's end entry from an earlier run goes.
local function outcome_open(hash, ending, state, at, due)
  redis.call('HSET', hash, 'state', state, 'updated_at', at)
  redis.call('HDEL', hash, 'ended_at')
  local life = MAX_KEEP_MS
  if due and due ~= '' then
    redis.call('HSET', hash, 'next_at', due)
    life = life + math.max(0, tonumber(due) - at)
  else
    redis.call('HDEL', hash, 'next_at')
  end
  redis.call('PEXPIRE', hash, life)
  redis.call('DEL', ending)
end

-- outcome_run(hash, ending, at, attempt, worker, keep): attempt `attempt`
-- of a kept job starts on `worker` at `at`, its final outcome to be kept
-- `keep` ms: written `running` (the progress of an earlier attempt goes),
-- and 'R' returned; unless a cancellation was asked for (cancel.lua found
-- the job taken, or it came back to the queue since), when nothing is
-- written and 'C' is returned: the job is not to run. A hash another
-- program wrote (not a hash) returns nil, having written nothing: the
-- worker's own start (start.lua) reports it.
local function outcome_run(hash, ending, at, attempt, worker, keep)
  local asked = redis.pcall('HEXISTS', hash, 'cancel_requested')
  if type(asked) == 'table' then
    return nil
  end
  if asked == 1 or redis.call('HGET', hash, 'state') == 'cancelled' then
    return 'C'
  end
  redis.call('HSET', hash, 'state', 'running', 'updated_at', at, 'attempt', attempt, 'worker', worker,
    'keep', keep)
  redis.call('HDEL', hash, 'ended_at', 'next_at', 'progress', 'progress_at')
  redis.call('PEXPIRE', hash, MAX_KEEP_MS)
  redis.call('DEL', ending)
  return 'R'
end

-- outcome_new(hash, ending, keep, state, at, due): a job just enqueued
-- that keeps its outcome (final, `keep` ms): whatever an earlier job of
-- its id left goes, and it starts `state` (waiting, scheduled).
local function outcome_new(hash, ending, keep, state, at, due)
  redis.call('DEL', hash)
  redis.call('HSET', hash, 'keep', keep)
  outcome_open(hash, ending, state, at, due)
end

-- outcome_end(hash, ending, state, at, ttl): writes a final state (done,
-- dead, cancelled) at `at`, kept `ttl` ms (the hash's own `keep` when
-- `ttl` is '' or nil, else MAX_KEEP_MS), and, when a waiter marked the
-- hash (`waited`, before it blocked), gives the end stream its one entry:
-- what waiters block on (XREAD: every waiter wakes). A stream costs some
-- 4.6 KB, so a job nobody waits for gets none. The stream is written first:
-- a user the ACL refuses XADD stops here, before the hash says the job ended.
local function outcome_end(hash, ending, state, at, ttl)
  if not ttl or ttl == '' then
    ttl = redis.call('HGET', hash, 'keep') or MAX_KEEP_MS
  end
  ttl = math.max(1, math.min(tonumber(ttl) or MAX_KEEP_MS, MAX_KEEP_MS))
  redis.call('DEL', ending)
  if redis.call('HEXISTS', hash, 'waited') == 1 then
    redis.call('XADD', ending, '*', 'state', state)
    redis.call('PEXPIRE', ending, ttl)
  end
  redis.call('HSET', hash, 'state', state, 'updated_at', at, 'ended_at', at, 'keep', ttl)
  redis.call('HDEL', hash, 'next_at')
  redis.call('PEXPIRE', hash, ttl)
end

-- outcome_back(hash, instance, at, why): a job its worker `instance` ran
-- is back in the queue (given back at shutdown, or its worker was lost):
-- waiting again, with `why`. Only while the outcome still says it runs
-- there: a later run's outcome is left alone.
local function outcome_back(hash, instance, at, why)
  if redis.call('HGET', hash, 'state') == 'running' and redis.call('HGET', hash, 'worker') == instance then
    redis.call('HSET', hash, 'state', 'waiting', 'updated_at', at, 'error', why)
    redis.call('PEXPIRE', hash, MAX_KEEP_MS)
    return 1
  end
  return 0
end
