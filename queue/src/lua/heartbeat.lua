-- uses: guard.lua, now.lua
-- Records a heartbeat. KEYS: workers, worker hash, the queue's job
-- duration (stats:duration), the mean of its squares (stats:duration_sq).
-- ARGV: instance, hash TTL in milliseconds, the mean duration in
-- milliseconds of the jobs the worker finished since its last beat, how
-- many, and the mean of their squares in ms² ('', 0 and '' for none), then
-- field/value pairs for the hash.
-- Returns {1 if the instance was not registered (new, or reaped), now}.
local workers, details, duration, duration_sq = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local instance, ttl_ms = ARGV[1], tonumber(ARGV[2])
local mean_ms, jobs, mean_sq = tonumber(ARGV[3]), tonumber(ARGV[4]) or 0, tonumber(ARGV[5])
expect(workers, 'zset')
expect(details, 'hash')
local record = jobs > 0 and mean_ms ~= nil and mean_ms >= 0
local record_sq = record and mean_sq ~= nil and mean_sq >= 0
if record then
  expect(duration, 'string')
end
if record_sq then
  expect(duration_sq, 'string')
end
local added = redis.call('ZADD', workers, now, instance)
if #ARGV > 5 then
  redis.call('HSET', details, 'beat', now, unpack(ARGV, 6))
else
  redis.call('HSET', details, 'beat', now)
end
redis.call('PEXPIRE', details, ttl_ms)
-- The queue's mean job duration, kept without expiry so that a reader
-- knows it before the next job runs (after an idle spell, a restart): a
-- moving average over all the queue's workers, each beat weighing as many
-- jobs as it reports (time constant: 20 jobs,
-- ops::DURATION_TIME_CONSTANT_JOBS; ops::fold_duration is the same rule).
-- The mean of the squares is folded with the same weight, so that the two
-- give the durations' variance (mean of squares less the square of the
-- mean); a queue that has a mean but no squares yet (its workers did not
-- report them) starts the squares from this beat's.
local weight = 1 - math.exp(-jobs / 20)
local function fold(key, value)
  local old = tonumber(redis.call('GET', key) or '')
  if old then
    value = old + weight * (value - old)
  end
  redis.call('SET', key, string.format('%.3f', value))
end
if record then
  fold(duration, mean_ms)
end
if record_sq then
  fold(duration_sq, mean_sq)
end
return {added, now}
