-- Returns a lost worker's jobs to the head of the queue, oldest taken at
-- the very head, and forgets the worker. KEYS: workers, its processing
-- list, queue, its hash, stats:recovered. ARGV: instance, silence in
-- milliseconds after which it counts as lost (-1: lost regardless, for a
-- worker's own earlier incarnations). The silence is checked again here,
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
expect(recovered, 'string')
local beat = redis.call('ZSCORE', workers, instance)
if limit >= 0 and beat and tonumber(beat) > now - limit then
  return -1
end
local n = 0
while redis.call('LMOVE', processing, queue, 'LEFT', 'RIGHT') do
  n = n + 1
end
redis.call('ZREM', workers, instance)
redis.call('DEL', details)
if n > 0 then
  redis.call('INCRBY', recovered, n)
end
return n
