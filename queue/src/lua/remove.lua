-- Removes the given entries from a list. KEYS: the list. ARGV: entries
-- as stored. Returns how many were removed.
local n = 0
for i = 1, #ARGV do
  n = n + redis.call('LREM', KEYS[1], 1, ARGV[i])
end
return n
