-- uses: guard.lua, clock.lua, stamp.lua, rate.lua, outcome.lua, take.lua, unique.lua
-- Takes up to `ARGV[1]` jobs from the queues in `KEYS` (five keys each,
-- highest priority first), each moved
-- atomically and stamped on the way (stamp.lua), no more from a queue than
-- its rate limit allows (rate.lua), through take.lua's take_jobs().
-- A payload longer than the size limit goes to the queue's dead list as
-- `too_large` instead (take.lua).
-- KEYS: five per queue, highest priority first: queue, processing list,
-- rate bucket, dead list, stats:dead.
-- ARGV: how many jobs to take; the pool's attempt limit; one 32-digit hex
-- id per job to take, concatenated (for jobs that arrive without one); the
-- rate limit's interval and tolerance in ms (interval 0: no limit); the
-- payload size limit in bytes (0: none); the worker instance (named in a
-- dead letter and in a kept job's outcome); how long to keep the outcome
-- of a job that does not say, in ms (the worker's --keep-outcomes, 0:
-- none).
-- A kept job is written running as it is taken (take.lua).
-- Returns one flat array: the index of the queue the limit stopped with
-- jobs left and the ms until its next start (0, -1 when no limit stopped
-- the fetch; the soonest when several did), then for each queue jobs were
-- taken from its index (1-based), how many and their outcome marks
-- (take.lua), followed by the payload as held and the stamp of each (for
-- a payload dead-lettered as too large: its error and -2).
local n = tonumber(ARGV[1])
local max_attempts, ids = tonumber(ARGV[2]), ARGV[3]
local interval, tolerance = tonumber(ARGV[4]), tonumber(ARGV[5])
local max_bytes, worker = tonumber(ARGV[6]), ARGV[7]
local keep_ms = tonumber(ARGV[8]) or 0
for i = 1, #KEYS, 5 do
  expect(KEYS[i], 'list')
  expect(KEYS[i + 1], 'list')
  if interval > 0 then
    expect(KEYS[i + 2], 'string')
  end
  if max_bytes > 0 then
    expect(KEYS[i + 3], 'list')
    expect_counter(KEYS[i + 4])
  end
end
local out = {0, -1}
local taken = 0
for i = 1, #KEYS, 5 do
  local index = (i + 4) / 5
  local started, next_in = take_jobs(KEYS[i], KEYS[i + 1], KEYS[i + 2], KEYS[i + 3], KEYS[i + 4],
    index, n, out, taken, max_attempts, ids, interval, tolerance, max_bytes, worker, keep_ms)
  n, taken = n - started, taken + started
  if next_in and (out[2] < 0 or next_in < out[2]) then
    out[1], out[2] = index, next_in
  end
  if n == 0 then break end
end
return out
