-- uses: guard.lua, now.lua, outcome.lua
-- Returns a lost worker's jobs to the head of the queue, oldest taken at
-- the very head, and forgets the worker. KEYS: workers, its processing
-- list, queue, its hash, stats:recovered, then the outcome hashes of the
-- jobs its processing list held that may keep one (read just before:
-- each that still says it runs on this worker is written `waiting`).
-- ARGV: instance, silence in
-- milliseconds after which it counts as lost unless the worker declared
-- its own (-1: lost regardless). The silence is checked again here,
-- so a worker that has just beaten is left alone and concurrent reapers
-- move each job once. Returns the number of jobs moved, or -1 if the
-- worker was not lost.
local workers, processing, queue, details, recovered =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local instance, limit = ARGV[1], tonumber(ARGV[2])
expect(workers, 'zset')
expect(processing, 'list')
expect(queue, 'list')
expect(details, 'hash')
expect_counter(recovered)
for k = 6, #KEYS do
  expect(KEYS[k], 'hash')
end
-- The worker's own declared window decides (its hash's dead_after_ms,
-- there while the worker is within twice that window of its last beat),
-- not the reaper's: workers of one queue may be set differently.
if limit >= 0 then
  limit = tonumber(redis.call('HGET', details, 'dead_after_ms')) or limit
end
local beat = redis.call('ZSCORE', workers, instance)
if limit >= 0 and beat and tonumber(beat) > now - limit then
  return -1
end
local n = 0
while redis.call('LMOVE', processing, queue, 'LEFT', 'RIGHT') do
  n = n + 1
end
if n > 0 then
  for k = 6, #KEYS do
    outcome_back(KEYS[k], instance, now, 'its worker ' .. instance .. ' was lost; back in the queue')
  end
end
redis.call('ZREM', workers, instance)
redis.call('DEL', details)
if n > 0 then
  redis.call('INCRBY', recovered, n)
end
return n
