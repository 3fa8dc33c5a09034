-- Records a heartbeat. KEYS: workers, worker hash. ARGV: instance,
-- hash TTL in milliseconds, then field/value pairs for the hash.
-- Returns {1 if the instance was not registered (new, or reaped), now}.
local added = redis.call('ZADD', KEYS[1], now, ARGV[1])
if #ARGV > 2 then
  redis.call('HSET', KEYS[2], 'beat', now, unpack(ARGV, 3))
else
  redis.call('HSET', KEYS[2], 'beat', now)
end
redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[2]))
return {added, now}
