-- uses: guard.lua, now.lua
-- Records a heartbeat. KEYS: workers, worker hash, the queue's job
-- duration (stats:duration). ARGV: instance, hash TTL in milliseconds, the
-- mean duration in milliseconds of the jobs the worker finished since its
-- last beat and how many ('' and 0 for none), then field/value pairs for
-- the hash.
-- Returns {1 if the instance was not registered (new, or reaped), now}.
local workers, details, duration = KEYS[1], KEYS[2], KEYS[3]
local instance, ttl_ms = ARGV[1], tonumber(ARGV[2])
local mean_ms, jobs = tonumber(ARGV[3]), tonumber(ARGV[4]) or 0
expect(workers, 'zset')
expect(details, 'hash')
local record = jobs > 0 and mean_ms ~= nil and mean_ms >= 0
if record then
  expect(duration, 'string')
end
local added = redis.call('ZADD', workers, now, instance)
if #ARGV > 4 then
  redis.call('HSET', details, 'beat', now, unpack(ARGV, 5))
else
  redis.call('HSET', details, 'beat', now)
end
redis.call('PEXPIRE', details, ttl_ms)
-- The queue's mean job duration, kept without expiry so that a reader
-- knows it before the next job runs (after an idle spell, a restart): a
-- moving average over all the queue's workers, each beat weighing as many
-- jobs as it reports (time constant: 20 jobs,
-- ops::DURATION_TIME_CONSTANT_JOBS; ops::fold_duration is the same rule).
if record then
  local old = tonumber(redis.call('GET', duration) or '')
  if old then
    mean_ms = old + (1 - math.exp(-jobs / 20)) * (mean_ms - old)
  end
  redis.call('SET', duration, string.format('%.3f', mean_ms))
end
return {added, now}
