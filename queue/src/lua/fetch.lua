-- Takes up to `ARGV[1]` jobs from the queues in `KEYS` (triples of queue,
-- processing list and rate bucket, highest priority first), each moved
-- atomically and stamped on the way (stamp.lua), no more from a queue than
-- its rate limit allows (rate.lua).
-- KEYS: triples of queue, processing list and rate bucket, highest
-- priority first.
-- ARGV: how many jobs to take; the pool's attempt limit; one 32-digit hex
-- id per job to take, concatenated (for jobs that arrive without one); the
-- rate limit's interval and tolerance in ms (interval 0: no limit).
-- Returns {{queue index (1-based), payload as held, stamp, …}, {index of
-- the queue the limit stopped with jobs left, ms until its next start}},
-- the second {0, -1} when no limit stopped the fetch (the soonest when
-- several did).
local n = tonumber(ARGV[1])
local max_attempts, ids = tonumber(ARGV[2]), ARGV[3]
local interval, tolerance = tonumber(ARGV[4]), tonumber(ARGV[5])
local out = {}
local limited, wait = 0, -1
for i = 1, #KEYS, 3 do
  local waiting, processing = KEYS[i], KEYS[i + 1]
  local room, tat = n, 0
  if interval > 0 then
    room, tat = admissible(KEYS[i + 2], n, interval, tolerance)
  end
  local started = 0
  while started < room do
    local v = redis.call('RPOP', waiting)
    if not v then break end
    local k = #out / 3
    local held, how = stamp(v, max_attempts, string.sub(ids, 32 * k + 1, 32 * k + 32))
    redis.call('LPUSH', processing, held)
    out[#out + 1] = (i + 2) / 3
    out[#out + 1] = held
    out[#out + 1] = how
    started = started + 1
  end
  n = n - started
  if interval > 0 then
    local next_in = spend(KEYS[i + 2], tat, started, interval, tolerance)
    if started == room and n > 0 and (wait < 0 or next_in < wait)
        and redis.call('LLEN', waiting) > 0 then
      limited, wait = (i + 2) / 3, next_in
    end
  end
  if n == 0 then break end
end
return {out, {limited, wait}}
