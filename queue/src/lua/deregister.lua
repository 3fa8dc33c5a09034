-- Removes a worker from the registry when it holds no jobs. KEYS:
-- workers, its processing list, its hash. ARGV: instance.
if redis.call('LLEN', KEYS[2]) == 0 then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('DEL', KEYS[3])
  return 1
end
return 0
