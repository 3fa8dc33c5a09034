-- Schedules the next attempt of a failed job. KEYS: processing, retry,
-- stats:failed. ARGV: payload, next payload, delay in milliseconds.
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[2])
  redis.call('INCR', KEYS[3])
  return 1
end
return 0
