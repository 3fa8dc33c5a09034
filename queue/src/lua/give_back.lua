-- Puts jobs back at the head of the queue (they run next). KEYS:
-- processing, queue. ARGV: pairs of payload as held, payload to push.
-- Pairs are pushed in order, so the last pair ends up at the very head.
-- Returns how many were still ours.
local n = 0
for i = 1, #ARGV, 2 do
  if redis.call('LREM', KEYS[1], 1, ARGV[i]) == 1 then
    redis.call('RPUSH', KEYS[2], ARGV[i + 1])
    n = n + 1
  end
end
return n
