-- A kept job's outcome (docs/queue-contract.md, "Outcomes"): its hash
-- `<q>:job:<id>` and its end stream `<q>:job:<id>:end`, both named in the
-- caller's KEYS. MAX_KEEP_MS is `ops::MAX_KEEP` (a test holds the two
-- together): no outcome lives longer than that past its last change, or,
-- while not final, past the time its next step is due. An outcome whose
-- job vanished for good (a key deleted by hand, a Redis restored from an
-- old snapshot) therefore goes too, and memory stays bounded.
local MAX_KEEP_MS = 604800000

-- ms(n): a number of ms as the text Redis is given. A number passed to
-- redis.call() is written with '%.17g', which costs Redis more than the
-- command it is passed to; the times and keeps of one script's jobs are
-- mostly the same few, so each is written once a run.
local ms_texts = {}
local function ms(n)
  if type(n) == 'string' then
    return n
  end
  local t = ms_texts[n]
  if not t then
    t = string.format('%d', n)
    ms_texts[n] = t
  end
  return t
end
local MAX_KEEP_TEXT = '604800000'

-- outcome_open(hash, ending, state, at, due): writes a state that is not
-- final (waiting, scheduled, running, retrying) at `at`, next due at
-- `due` ('' or nil: none). A wait's end entry from an earlier run goes.
local function outcome_open(hash, ending, state, at, due)
  local life = MAX_KEEP_TEXT
  if due and due ~= '' then
    redis.call('HSET', hash, 'state', state, 'updated_at', ms(at), 'next_at', ms(due))
    redis.call('HDEL', hash, 'ended_at')
    life = ms(MAX_KEEP_MS + math.max(0, tonumber(due) - tonumber(at)))
  else
    redis.call('HSET', hash, 'state', state, 'updated_at', ms(at))
    redis.call('HDEL', hash, 'ended_at', 'next_at')
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
  local was = redis.call('HGET', hash, 'state')
  if asked == 1 or was == 'cancelled' then
    return 'C'
  end
  redis.call('HSET', hash, 'state', 'running', 'updated_at', ms(at), 'attempt', attempt, 'worker', worker,
    'keep', ms(keep))
  redis.call('HDEL', hash, 'ended_at', 'next_at', 'progress', 'progress_at')
  redis.call('PEXPIRE', hash, MAX_KEEP_TEXT)
  -- An end stream is there only once a run ended (every other state's
  -- write removed it): a run after that one (the job run twice) starts
  -- without it.
  if was == 'done' or was == 'dead' then
    redis.call('DEL', ending)
  end
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

-- outcome_end(hash, ending, state, at, ttl, set, unset): writes a final
-- state (done, dead, cancelled) at `at`, kept `ttl` ms (the hash's own
-- `keep` when `ttl` is '' or nil, else MAX_KEEP_MS), with the fields of
-- the flat list `set` (name, value, ...) and without those named in
-- `unset` (either may be nil). When a waiter marked the hash (`waited`,
-- before it blocked), the end stream gets its one entry: what waiters
-- block on (XREAD: every waiter wakes). A stream costs some 4.6 KB, so a
-- job nobody waits for gets none; an earlier one is deleted first, so the
-- key is a stream whatever held it. The stream is written first: a user
-- the ACL refuses XADD stops here, before the hash says the job ended.
-- One HSET and one HDEL: each command a script calls costs Redis about
-- as much as a short one from a client.
local function outcome_end(hash, ending, state, at, ttl, set, unset)
  if not ttl or ttl == '' then
    ttl = redis.call('HGET', hash, 'keep') or MAX_KEEP_MS
  end
  ttl = ms(math.max(1, math.min(tonumber(ttl) or MAX_KEEP_MS, MAX_KEEP_MS)))
  at = ms(at)
  if redis.call('HEXISTS', hash, 'waited') == 1 then
    redis.call('DEL', ending)
    redis.call('XADD', ending, '*', 'state', state)
    redis.call('PEXPIRE', ending, ttl)
  end
  if unset then
    unset[#unset + 1] = 'next_at'
    redis.call('HDEL', hash, unpack(unset))
  else
    redis.call('HDEL', hash, 'next_at')
  end
  if set then
    local n = #set
    set[n + 1], set[n + 2], set[n + 3], set[n + 4] = 'state', state, 'updated_at', at
    set[n + 5], set[n + 6], set[n + 7], set[n + 8] = 'ended_at', at, 'keep', ttl
    redis.call('HSET', hash, unpack(set))
  else
    redis.call('HSET', hash, 'state', state, 'updated_at', at, 'ended_at', at, 'keep', ttl)
  end
  redis.call('PEXPIRE', hash, ttl)
end

-- outcome_back(hash, instance, at, why): a job its worker `instance` ran
-- is back in the queue (given back at shutdown, or its worker was lost):
-- waiting again, with `why`. Only while the outcome still says it runs
-- there: a later run's outcome is left alone.
local function outcome_back(hash, instance, at, why)
  if redis.call('HGET', hash, 'state') == 'running' and redis.call('HGET', hash, 'worker') == instance then
    redis.call('HSET', hash, 'state', 'waiting', 'updated_at', ms(at), 'error', why)
    redis.call('PEXPIRE', hash, MAX_KEEP_TEXT)
    return 1
  end
  return 0
end
