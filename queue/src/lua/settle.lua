-- Settles finished jobs in one round trip and takes the next jobs into the
-- slots they free (the batched form of ack.lua, retry.lua and bury.lua,
-- with fetch.lua after them, its jobs stamped by stamp.lua and limited by
-- rate.lua).
-- KEYS: ten per queue, highest priority first: queue, processing,
-- stats:processed, retry, stats:failed, dead, stats:dead, unique,
-- unique:expiry, rate.
-- ARGV: how many jobs to take, the pool's attempt limit, one 32-digit
-- hex id per job to take, concatenated, and the rate limit's interval and
-- tolerance in ms (as for fetch.lua), then per settlement a head, the
-- kind followed by the queue's index (1-based, e.g. `A1`), the payload as
-- the processing list holds it, and what the kind needs:
--   `A` done: nothing more;
--   `U` done, freeing its unique key: the release token (unique.lua);
--   `T` retry later: the next attempt's payload, the delay in ms;
--   `B` dead-letter: the envelope, the release token ('' for none).
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
local i = 6
while i <= #ARGV do
  local head, payload = ARGV[i], ARGV[i + 1]
  local kind, base = string.byte(head, 1), (tonumber(string.sub(head, 2)) - 1) * 10
  local extra = ARGV[i + 2]
  i = i + (kind == 65 and 2 or kind == 85 and 3 or 4)
  -- From the tail: the list is newest first, and the jobs that finish
  -- first are mostly the oldest, so the match is found within a few
  -- entries instead of after every job still running.
  local ok = redis.call('LREM', KEYS[base + 2], -1, payload)
  if ok == 1 then
    if kind == 65 or kind == 85 then -- A, U
      count(KEYS[base + 3])
      if kind == 85 then
        release(KEYS[base + 8], KEYS[base + 9], extra)
      end
    elseif kind == 84 then -- T
      redis.call('ZADD', KEYS[base + 4], now + tonumber(ARGV[i - 1]), extra)
      count(KEYS[base + 5])
    else -- B
      redis.call('LPUSH', KEYS[base + 6], extra)
      count(KEYS[base + 5])
      count(KEYS[base + 7])
      release(KEYS[base + 8], KEYS[base + 9], ARGV[i - 1])
    end
  end
  kept[#kept + 1] = ok
end
for _, key in ipairs(counted) do
  redis.call('INCRBY', key, counts[key])
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
