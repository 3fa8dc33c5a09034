-- Schedules the next attempt of a failed job. KEYS: processing, retry,
-- stats:failed. ARGV: payload, next payload, delay in milliseconds.
local processing, retry, failed = KEYS[1], KEYS[2], KEYS[3]
local payload, next_payload, delay_ms = ARGV[1], ARGV[2], tonumber(ARGV[3])
expect(processing, 'list')
expect(retry, 'zset')
expect_counter(failed)
if redis.call('LREM', processing, 1, payload) == 1 then
  redis.call('ZADD', retry, now + delay_ms, next_payload)
  redis.call('INCR', failed)
  return 1
end
return 0
