-- Takes up to `ARGV[1]` jobs from the queues in `KEYS` (triples of queue,
-- processing list and rate bucket, highest priority first), each moved
-- atomically and stamped on the way (stamp.lua), no more from a queue than
-- its rate limit allows (rate.lua), through take.lua's take_jobs().
-- KEYS: triples of queue, processing list and rate bucket, highest
-- priority first.
-- ARGV: how many jobs to take; the pool's attempt limit; one 32-digit hex
-- id per job to take, concatenated (for jobs that arrive without one); the
-- rate limit's interval and tolerance in ms (interval 0: no limit).
-- Returns one flat array: the index of the queue the limit stopped with
-- jobs left and the ms until its next start (0, -1 when no limit stopped
-- the fetch; the soonest when several did), then for each queue jobs were
-- taken from its index (1-based) and how many, followed by the payload as
-- held and the stamp of each.
local n = tonumber(ARGV[1])
local max_attempts, ids = tonumber(ARGV[2]), ARGV[3]
local interval, tolerance = tonumber(ARGV[4]), tonumber(ARGV[5])
for i = 1, #KEYS, 3 do
  expect(KEYS[i], 'list')
  expect(KEYS[i + 1], 'list')
  if interval > 0 then
    expect(KEYS[i + 2], 'string')
  end
end
local out = {0, -1}
local taken = 0
for i = 1, #KEYS, 3 do
  local index = (i + 2) / 3
  local started, next_in = take_jobs(KEYS[i], KEYS[i + 1], KEYS[i + 2], index, n, out, taken,
    max_attempts, ids, interval, tolerance)
  n, taken = n - started, taken + started
  if next_in and (out[2] < 0 or next_in < out[2]) then
    out[1], out[2] = index, next_in
  end
  if n == 0 then break end
end
return out
