-- uses: guard.lua, now.lua
-- Removes a worker from the registry when it holds no jobs. KEYS:
-- workers, its processing list, its hash. ARGV: instance.
local workers, processing, details = KEYS[1], KEYS[2], KEYS[3]
local instance = ARGV[1]
expect(workers, 'zset')
expect(processing, 'list')
expect(details, 'hash')
if redis.call('LLEN', processing) == 0 then
  redis.call('ZREM', workers, instance)
  redis.call('DEL', details)
  return 1
end
return 0
