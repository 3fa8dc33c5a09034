-- Dead-letters a job after a failed attempt. KEYS: processing, dead,
-- stats:failed, stats:dead. ARGV: payload, dead-letter envelope.
local processing, dead, failed, dead_total = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local payload, envelope = ARGV[1], ARGV[2]
if redis.call('LREM', processing, 1, payload) == 1 then
  redis.call('LPUSH', dead, envelope)
  redis.call('INCR', failed)
  redis.call('INCR', dead_total)
  return 1
end
return 0
