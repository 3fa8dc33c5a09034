-- uses: guard.lua, now.lua
-- Removes dead letters named by where they were read and their digest
-- (dead_page.lua), and with `Q` pushes the payload a too_large dead letter
-- keeps whole onto the queue, exactly as it was taken, in the same step:
-- the caller never holds the entry.
-- KEYS: dead, queue.
-- ARGV: the action (`R` remove, `Q` requeue), then triples: the entry's
-- index counted from the oldest end when it was read (-1 the oldest), its
-- length in bytes, its SHA-1 (hex).
-- Returns one integer per triple: 1 done; 0 gone (no longer in the list:
-- removed or retried by someone else meanwhile); -1 left as it is (`Q`
-- on an entry that is not a too_large one).
-- New dead letters are pushed at the newest end, so an entry only moves
-- towards the oldest end when older ones are removed: it is looked for
-- from where it was read to the oldest end, comparing lengths first.
local dead, queue = KEYS[1], KEYS[2]
expect(dead, 'list')
local action = ARGV[1]
if action == 'Q' then
  expect(queue, 'list')
end
local out = {}
for i = 2, #ARGV, 3 do
  local at, size, digest = tonumber(ARGV[i]), tonumber(ARGV[i + 1]), ARGV[i + 2]
  local found
  for j = math.max(at, -redis.call('LLEN', dead)), -1 do
    local e = redis.call('LINDEX', dead, j)
    if e and #e == size and redis.sha1hex(e) == digest then
      found = e
      break
    end
  end
  if not found then
    out[#out + 1] = 0
  elseif action == 'Q' then
    -- The payload is the entry's last `size` bytes before its closing
    -- brace (take.lua writes the entry so).
    local head = string.sub(found, 1, 4096)
    local job_size = tonumber(string.match(head,
      '^{"reason":"too_large",.*,"size":(%d+),"encoding":"raw","job":'))
    if job_size and job_size < #found then
      -- Write first, remove last (both keys' types were checked above).
      redis.call('LPUSH', queue, string.sub(found, #found - job_size, #found - 1))
      redis.call('LREM', dead, '-1', found)
      out[#out + 1] = 1
    else
      out[#out + 1] = -1
    end
  else
    redis.call('LREM', dead, '-1', found)
    out[#out + 1] = 1
  end
end
return out
