-- uses: guard.lua, now.lua, outcome.lua
-- Enqueues jobs; a job with a unique key goes in only when no job holding
-- that key is waiting, scheduled, retrying or running, and then holds it
-- until it is done or dead-lettered, or for its hold time in any case.
-- KEYS: queue, scheduled, unique (hash: key -> holder's id),
-- unique:expiry (sorted set: key -> unix ms when the hold ends); then,
-- for each job that keeps its outcome, its outcome hash and end stream.
-- ARGV: seven per job, in the order they should run: the payload; `run_at`
-- in unix ms for a delayed job ('' for now); the job's id (the payload's
-- own `id`); its unique key ('' for none); how long it holds the key, in
-- milliseconds; the position in KEYS of its outcome hash ('' or 0 for a
-- job that keeps none; the end stream follows it); how long to keep its
-- final outcome, in ms. A kept job is written `waiting` (or `scheduled`,
-- with its `run_at` as `next_at`) in the same step, replacing whatever an
-- earlier job of that id left.
-- Returns 1 (enqueued) or 0 (refused: a duplicate) per job.
local queue, scheduled, unique, expiry = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
expect(queue, 'list')
expect(scheduled, 'zset')
expect(unique, 'hash')
expect(expiry, 'zset')
for i = 6, #ARGV, 7 do
  local at = tonumber(ARGV[i])
  if at and at > 0 then
    expect(KEYS[at], 'hash')
    expect(KEYS[at + 1], 'stream')
  end
end
-- Holds whose time ran out go first, a bounded number per call.
for _, key in ipairs(redis.call('ZRANGEBYSCORE', expiry, '-inf', now, 'LIMIT', 0, 100)) do
  redis.call('HDEL', unique, key)
  redis.call('ZREM', expiry, key)
end
local out = {}
for i = 1, #ARGV, 7 do
  local payload, run_at, id, key = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local ok = 1
  if key ~= '' then
    local till = redis.call('ZSCORE', expiry, key)
    if till and tonumber(till) > now then
      ok = 0
    else
      redis.call('HSET', unique, key, id)
      redis.call('ZADD', expiry, now + tonumber(ARGV[i + 4]), key)
    end
  end
  if ok == 1 then
    if run_at == '' then
      redis.call('LPUSH', queue, payload)
    else
      redis.call('ZADD', scheduled, tonumber(run_at), payload)
    end
    local at = tonumber(ARGV[i + 5])
    if at and at > 0 then
      outcome_new(KEYS[at], KEYS[at + 1], ARGV[i + 6], run_at == '' and 'waiting' or 'scheduled',
        now, run_at)
    end
  end
  out[#out + 1] = ok
end
return out
