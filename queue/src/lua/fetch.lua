-- Takes up to `ARGV[1]` jobs from the queues in `KEYS` (triples of queue,
-- processing list and rate bucket, highest priority first), each moved
-- atomically and stamped on the way (stamp.lua), no more from a queue than
-- its rate limit allows (rate.lua), through take.lua's take_jobs().
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
  local index = (i + 2) / 3
  local started, next_in = take_jobs(KEYS[i], KEYS[i + 1], KEYS[i + 2], index, n, out,
    max_attempts, ids, interval, tolerance)
  n = n - started
  if next_in and (wait < 0 or next_in < wait) then
    limited, wait = index, next_in
  end
  if n == 0 then break end
end
return {out, {limited, wait}}
