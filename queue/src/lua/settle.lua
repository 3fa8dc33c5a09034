-- Settles finished jobs in one round trip and takes the next jobs into the
-- slots they free (the batched form of ack.lua, retry.lua and bury.lua,
-- with fetch.lua after them, its jobs stamped by stamp.lua and limited by
-- rate.lua).
-- KEYS: ten per queue, highest priority first: queue, processing,
-- stats:processed, retry, stats:failed, dead, stats:dead, unique,
-- unique:expiry, rate.
-- ARGV: how many jobs to take, the pool's attempt limit, one 32-digit
-- hex id per job to take, concatenated, and the rate limit's interval and
-- tolerance in ms (as for fetch.lua), then five per settlement: `A` (done), `T` (retry later) or `B` (dead-letter); the
-- queue's index (1-based); the payload as the processing list holds it;
-- for `T` the next attempt's payload and the delay in milliseconds, for
-- `B` the dead-letter envelope and the unique key's release token
-- (unique.lua; '' for none), for `A` an empty string and the release token.
-- Each settlement first removes its exact payload from the processing list
-- and writes only if that happened: a job a reaper returned meanwhile is
-- not settled twice.
-- Returns {{1 or 0 per settlement: whether the job was still ours},
-- {queue index (1-based), payload as held, stamp, … for each job taken},
-- {queue index, ms until its next start} when a rate limit stopped the
-- taking with jobs left, else {0, -1}}.
local take = tonumber(ARGV[1])
local max_attempts, ids = tonumber(ARGV[2]), ARGV[3]
local interval, tolerance = tonumber(ARGV[4]), tonumber(ARGV[5])
local kept = {}
for i = 6, #ARGV, 5 do
  local kind, base, payload = ARGV[i], (tonumber(ARGV[i + 1]) - 1) * 10, ARGV[i + 2]
  local processing, processed = KEYS[base + 2], KEYS[base + 3]
  local retry, failed, dead, dead_total = KEYS[base + 4], KEYS[base + 5], KEYS[base + 6], KEYS[base + 7]
  local ok = redis.call('LREM', processing, 1, payload)
  if ok == 1 then
    if kind == 'A' then
      redis.call('INCR', processed)
      release(KEYS[base + 8], KEYS[base + 9], ARGV[i + 4])
    elseif kind == 'T' then
      redis.call('ZADD', retry, now + tonumber(ARGV[i + 4]), ARGV[i + 3])
      redis.call('INCR', failed)
    else
      redis.call('LPUSH', dead, ARGV[i + 3])
      redis.call('INCR', failed)
      redis.call('INCR', dead_total)
      release(KEYS[base + 8], KEYS[base + 9], ARGV[i + 4])
    end
  end
  kept[#kept + 1] = ok
end
local taken = {}
local limited, wait = 0, -1
for base = 0, #KEYS - 10, 10 do
  if take == 0 then break end
  local index = base / 10 + 1
  local started, next_in = take_jobs(KEYS[base + 1], KEYS[base + 2], KEYS[base + 10], index,
    take, taken, max_attempts, ids, interval, tolerance)
  take = take - started
  if next_in and (wait < 0 or next_in < wait) then
    limited, wait = index, next_in
  end
end
return {kept, taken, {limited, wait}}
