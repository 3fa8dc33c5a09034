-- Dead-letters a job after a failed attempt. KEYS: processing, dead,
-- stats:failed, stats:dead. ARGV: payload, dead-letter envelope.
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then
  redis.call('LPUSH', KEYS[2], ARGV[2])
  redis.call('INCR', KEYS[3])
  redis.call('INCR', KEYS[4])
  return 1
end
return 0
