-- uses: guard.lua, now.lua
-- Puts jobs back at the head of the queue (they run next). KEYS:
-- processing, queue. ARGV: pairs of payload as held, payload to push.
-- Pairs are pushed in order, so the last pair ends up at the very head.
-- Returns how many were still ours.
local processing, queue = KEYS[1], KEYS[2]
expect(processing, 'list')
expect(queue, 'list')
-- ARGV: pairs of payload as held, payload to push.
local n = 0
for i = 1, #ARGV, 2 do
  if redis.call('LREM', processing, 1, ARGV[i]) == 1 then
    redis.call('RPUSH', queue, ARGV[i + 1])
    n = n + 1
  end
end
return n
