-- release(unique, expiry, token): frees the unique key of a job that ended
-- (done or dead-lettered), but only while that job still holds it: a key
-- whose time ran out and that a newer job took stays with the newer job.
-- `token` is `<length of the id>:<id><unique key>`, or '' for a job
-- without a unique key. KEYS of the caller: the queue's `unique` hash (key
-- -> id of the holder) and `unique:expiry` sorted set (key -> unix ms when
-- the hold ends).
local function release(unique, expiry, token)
  if token == nil or token == '' then
    return
  end
  local colon = string.find(token, ':', 1, true)
  local n = colon and tonumber(string.sub(token, 1, colon - 1))
  if not n then
    return
  end
  local id, key = string.sub(token, colon + 1, colon + n), string.sub(token, colon + n + 1)
  if redis.call('HGET', unique, key) == id then
    redis.call('HDEL', unique, key)
    redis.call('ZREM', expiry, key)
  end
end
