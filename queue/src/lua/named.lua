-- named(list, name): the entry of `list` that `name` names as
-- `<length>:<sha1 hex>` (a worker names a large payload so rather than
-- sending it back whole), searched from the tail; nil when none matches.
-- Only entries of that length are hashed. One entry at a time, with
-- LRANGE rather than LINDEX, which the worker's Redis user may not have
-- (docs/redis-acl.md).
local function named(list, name)
  local colon = string.find(name, ':', 1, true)
  local size, digest = tonumber(string.sub(name, 1, colon - 1)), string.sub(name, colon + 1)
  for at = -1, -redis.call('LLEN', list), -1 do
    local entry = redis.call('LRANGE', list, at, at)[1]
    if entry and #entry == size and redis.sha1hex(entry) == digest then
      return entry
    end
  end
  return nil
end
