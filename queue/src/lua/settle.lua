-- uses: guard.lua, clock.lua, stamp.lua, rate.lua, outcome.lua, take.lua, unique.lua, named.lua
-- Settles finished jobs (done, retried later, dead-lettered) in one round
-- trip and takes the next jobs into the slots they free as fetch.lua does,
-- its jobs stamped by stamp.lua and limited by rate.lua. This is how a
-- worker settles: there is no single-job form.
-- KEYS: ten per queue, highest priority first: queue, processing,
-- stats:processed, retry, stats:failed, dead, stats:dead, unique,
-- unique:expiry, rate; then, for each settlement that keeps its outcome,
-- the job's outcome hash and end stream (`<q>:job:<id>`, `<q>:job:<id>:end`).
-- ARGV: how many jobs to take, the pool's attempt limit, one 32-digit
-- hex id per job to take, concatenated, and the rate limit's interval and
-- tolerance in ms, the payload size limit in bytes (0: none), the
-- worker instance and the outcome keep of jobs that do not say (as for
-- fetch.lua), how many KEYS are the queues' (ten
-- per queue), then per settlement a head, the
-- kind followed by the queue's index (1-based, e.g. `A1`), the payload as
-- the processing list holds it, and what the kind needs. A head led by `#`
-- (e.g. `#A1`) names the payload instead by its length and SHA-1, as
-- `<length>:<40 hex digits>`: a worker does not send a large payload back
-- whole to settle it. A head led by `+` (before any `#`: `+A1`, `+#A1`)
-- keeps the job's outcome: after what the kind needs come the position in
-- KEYS of its outcome hash (the end stream follows it), how long to keep a
-- final outcome in ms, the attempt, the worker, and the value: the result
-- (JSON text, '' for none) of a job done, the error of one retried or dead;
-- then a note: why a done job's result was not kept ('' when it was); then
-- the job's unique key release token ('' for none), for a job that ends
-- cancelled.
--   `A` done: nothing more;
--   `U` done, freeing its unique key: the release token (unique.lua);
--   `T` retry later: the next attempt's payload, the delay in ms;
--   `R` back later, its attempt not spent (the handler could not start
--       it): as `T`, without counting a failure;
--   `B` dead-letter: the envelope, the release token ('' for none);
--   `C` cancelled (only kept: `+C1`): nothing more; its unique key is
--       freed with the kept release token.
-- A kept `T` or `R` whose outcome has a cancellation request
-- (`cancel_requested`, cancel.lua) ends as `C` instead: a job asked to
-- stop that failed is not run again.
-- Each settlement first finds its exact payload in the processing list
-- and writes only if it is there, removing it last: a job a reaper
-- returned meanwhile is not settled twice, and a kept outcome the Redis
-- user may not write (an ACL without XADD) stops the script with the job
-- still in the processing list, not in no list at all.
-- Returns one flat array: the queue index and ms until its next start
-- when a rate limit stopped the taking with jobs left (else 0, -1); how
-- many settlements found their job gone (a reaper returned it meanwhile)
-- and the position (1-based) of each; then the jobs taken, grouped as
-- fetch.lua returns them (a kept one written running as it is taken).
local take = tonumber(ARGV[1])
local max_attempts, ids = tonumber(ARGV[2]), ARGV[3]
local interval, tolerance = tonumber(ARGV[4]), tonumber(ARGV[5])
local max_bytes, worker = tonumber(ARGV[6]), ARGV[7]
local keep_ms = tonumber(ARGV[8]) or 0
local queue_keys = tonumber(ARGV[9])
local out = {0, -1, 0}
local settlement = 0
-- Counters add up per key and are written once per script, not per job.
local counts, counted = {}, {}
local function count(key)
  local n = counts[key]
  if not n then
    counted[#counted + 1] = key
    n = 0
  end
  counts[key] = n + 1
end
-- A head's kind and its queue's first key, read once per distinct head.
-- Every key a settlement or the taking may write is checked before the
-- first write (guard.lua): a batch is settled whole or not at all.
local kinds, bases, by_name, keeps = {}, {}, {}, {}
-- How many arguments follow a head of `kind`, and a kept outcome's.
local function args_of(kind)
  return (kind == 65 or kind == 67) and 1 or kind == 85 and 2 or 3
end
local KEPT = 7
local i = 10
while i <= #ARGV do
  local head = ARGV[i]
  local kind, base = kinds[head], bases[head]
  if not kind then
    local at = byte(head, 1) == 43 and 2 or 1 -- +
    local kept = at == 2
    local named = byte(head, at) == 35 -- #
    if named then at = at + 1 end
    kind, base = byte(head, at), (tonumber(sub(head, at + 1)) - 1) * 10
    kinds[head], bases[head], by_name[head], keeps[head] = kind, base, named, kept
    expect(KEYS[base + 2], 'list')
    if kind == 65 or kind == 85 then -- A, U
      expect_counter(KEYS[base + 3])
    elseif kind == 84 then -- T
      expect(KEYS[base + 4], 'zset')
      expect_counter(KEYS[base + 5])
    elseif kind == 82 then -- R
      expect(KEYS[base + 4], 'zset')
    elseif kind == 67 then -- C
      if not kept then
        error('a C settlement keeps its outcome (+C)')
      end
    else -- B
      expect(KEYS[base + 6], 'list')
      expect_counter(KEYS[base + 5])
      expect_counter(KEYS[base + 7])
    end
  end
  local step = 1 + args_of(kind)
  if (kind == 85 or kind == 66) and ARGV[i + step - 1] ~= '' then
    expect(KEYS[base + 8], 'hash')
    expect(KEYS[base + 9], 'zset')
  end
  if keeps[head] then
    local at = tonumber(ARGV[i + step])
    expect(KEYS[at], 'hash')
    -- The end stream needs no check: outcome_end() deletes it before it
    -- adds to it, and outcome_open() only deletes it.
    if ARGV[i + step + 6] ~= '' then
      expect(KEYS[base + 8], 'hash')
      expect(KEYS[base + 9], 'zset')
    end
    step = step + KEPT
  end
  i = i + step
end
if take > 0 then
  for base = 0, queue_keys - 10, 10 do
    expect(KEYS[base + 1], 'list')
    expect(KEYS[base + 2], 'list')
    if interval > 0 then
      expect(KEYS[base + 10], 'string')
    end
    if max_bytes > 0 then
      expect(KEYS[base + 6], 'list')
      expect_counter(KEYS[base + 7])
    end
  end
end
-- A kept outcome, written with the settlement that found its job: `o` is
-- the position in ARGV of its first argument, `delay` a retry's.
local function keep(kind, o, delay)
  local hash, ending = KEYS[tonumber(ARGV[o])], KEYS[tonumber(ARGV[o]) + 1]
  local ttl, attempt, by, value, note = ARGV[o + 1], ARGV[o + 2], ARGV[o + 3], ARGV[o + 4], ARGV[o + 5]
  local t = now()
  if kind == 84 or kind == 82 then -- T, R
    redis.call('HSET', hash, 'attempt', attempt, 'worker', by, 'keep', ttl, 'error', value)
    outcome_open(hash, ending, 'retrying', t, t + tonumber(delay))
    return
  end
  -- What goes and what is written, in one HDEL and one HSET
  -- (outcome_end(): the HDEL comes first).
  local state, set, unset = 'dead', {'attempt', attempt, 'worker', by}, {'result', 'result_error'}
  if kind == 65 or kind == 85 then -- A, U
    state = 'done'
    unset[3] = 'error'
    if value ~= '' then
      set[#set + 1], set[#set + 2] = 'result', value
    end
    if note ~= '' then
      set[#set + 1], set[#set + 2] = 'result_error', note
    end
  else -- B, C
    if kind == 67 then
      state = 'cancelled'
    end
    if value ~= '' then
      set[#set + 1], set[#set + 2] = 'error', value
    end
  end
  outcome_end(hash, ending, state, t, ttl, set, unset)
end

i = 10
while i <= #ARGV do
  local head, payload = ARGV[i], ARGV[i + 1]
  local kind, base = kinds[head], bases[head]
  local extra = ARGV[i + 2]
  local own = i + 1 + args_of(kind) -- the first argument after the kind's
  i = own + (keeps[head] and KEPT or 0)
  local list = KEYS[base + 2]
  -- From the tail: the list is newest first, and the jobs that finish
  -- first are mostly the oldest, so the match is found within a few
  -- entries instead of after every job still running.
  -- The count as text: Redis formats a number argument with snprintf.
  local ok = 0
  if keeps[head] then
    -- Found first, its outcome written, then removed (see the header).
    local entry
    if by_name[head] then
      entry = named(list, payload)
    elseif redis.call('LPOS', list, payload, 'RANK', '-1') then
      entry = payload
    end
    if entry then
      if (kind == 84 or kind == 82)
        and redis.call('HEXISTS', KEYS[tonumber(ARGV[own])], 'cancel_requested') == 1 then
        kind = 67
      end
      keep(kind, own, ARGV[own - 1])
      ok = redis.call('LREM', list, '-1', entry)
    end
  elseif by_name[head] then
    -- named.lua: the entry from the tail, as LREM -1 searches.
    local entry = named(list, payload)
    ok = entry and redis.call('LREM', list, '-1', entry) or 0
  else
    ok = redis.call('LREM', list, '-1', payload)
  end
  settlement = settlement + 1
  if ok == 0 then
    out[3] = out[3] + 1
    out[#out + 1] = settlement
  else
    if kind == 65 or kind == 85 then -- A, U
      count(KEYS[base + 3])
      if kind == 85 then
        release(KEYS[base + 8], KEYS[base + 9], extra)
      end
    elseif kind == 84 or kind == 82 then -- T, R
      redis.call('ZADD', KEYS[base + 4], now() + tonumber(ARGV[own - 1]), extra)
      if kind == 84 then
        count(KEYS[base + 5])
      end
    elseif kind == 67 then -- C
      release(KEYS[base + 8], KEYS[base + 9], ARGV[own + 6])
    else -- B
      redis.call('LPUSH', KEYS[base + 6], extra)
      count(KEYS[base + 5])
      count(KEYS[base + 7])
      release(KEYS[base + 8], KEYS[base + 9], ARGV[own - 1])
    end
  end
end
for _, key in ipairs(counted) do
  redis.call('INCRBY', key, counts[key])
end
local taken = 0
for base = 0, queue_keys - 10, 10 do
  if take == 0 then break end
  local index = base / 10 + 1
  local started, next_in = take_jobs(KEYS[base + 1], KEYS[base + 2], KEYS[base + 10],
    KEYS[base + 6], KEYS[base + 7], index, take, out, taken, max_attempts, ids, interval, tolerance,
    max_bytes, worker, keep_ms)
  take, taken = take - started, taken + started
  if next_in and (out[2] < 0 or next_in < out[2]) then
    out[1], out[2] = index, next_in
  end
end
return out
