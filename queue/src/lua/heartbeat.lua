-- uses: guard.lua, now.lua
-- Records a heartbeat. KEYS: workers, worker hash. ARGV: instance,
-- hash TTL in milliseconds, then field/value pairs for the hash.
-- Returns {1 if the instance was not registered (new, or reaped), now}.
local workers, details = KEYS[1], KEYS[2]
local instance, ttl_ms = ARGV[1], tonumber(ARGV[2])
expect(workers, 'zset')
expect(details, 'hash')
local added = redis.call('ZADD', workers, now, instance)
if #ARGV > 2 then
  redis.call('HSET', details, 'beat', now, unpack(ARGV, 3))
else
  redis.call('HSET', details, 'beat', now)
end
redis.call('PEXPIRE', details, ttl_ms)
return {added, now}
