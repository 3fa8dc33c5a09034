-- Settles freshly fetched payloads. KEYS: processing, scheduled, dead,
-- stats:dead. ARGV: triples of action, raw payload, argument:
-- `R` replaces the raw payload with the stamped one (argument),
-- `S` parks it in the scheduled set at score `argument`,
-- `D` dead-letters it with the envelope `argument`.
-- Returns 1 or 0 per triple: whether the payload was still ours.
local out = {}
for i = 1, #ARGV, 3 do
  local action, raw, arg = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local ok = redis.call('LREM', KEYS[1], 1, raw)
  if ok == 1 then
    if action == 'R' then
      redis.call('LPUSH', KEYS[1], arg)
    elseif action == 'S' then
      redis.call('ZADD', KEYS[2], tonumber(arg), raw)
    else
      redis.call('LPUSH', KEYS[3], arg)
      redis.call('INCR', KEYS[4])
    end
  end
  out[#out + 1] = ok
end
return out
