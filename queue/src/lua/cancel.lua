-- uses: guard.lua, now.lua, unique.lua, outcome.lua
-- Cancels one job by id. A job still waiting, scheduled or retrying is
-- removed from where it is and written `cancelled` (its unique key freed,
-- its waiters woken); a running one (or one taken and not yet started)
-- is asked to stop (`cancel_requested`): its worker tells its handler,
-- and a handler that finishes anyway ends as it would have. A job whose
-- outcome is final is left alone.
-- KEYS: queue, scheduled, retry, unique, unique:expiry, the job's outcome
-- hash, its end stream. ARGV: the id, how long to keep a cancelled
-- outcome in ms when the job kept none.
-- Finding a job that is not running costs a scan of the queue and both
-- sets (O(N), as removing a job by id costs in other queues): the payload
-- holds the id, the keys do not.
-- Returns {what was done, where}: {'removed', 'waiting'|'scheduled'|
-- 'retrying'}, {'requested', state}, {'final', state}, or {'unknown', ''}
-- (no job of that id is waiting, scheduled or retrying, and no outcome
-- kept says where it is).
local queue, scheduled, retry, unique, expiry, hash, ending =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local id, default_keep = ARGV[1], ARGV[2]
expect(queue, 'list')
expect(scheduled, 'zset')
expect(retry, 'zset')
expect(unique, 'hash')
expect(expiry, 'zset')
expect(hash, 'hash')
expect(ending, 'stream')
local state = redis.call('HGET', hash, 'state')
if state == 'done' or state == 'dead' or state == 'cancelled' then
  return {'final', state}
end
if state == 'running' then
  redis.call('HSET', hash, 'cancel_requested', now)
  return {'requested', state}
end
-- The job's own payload: its text names the id, and decoded its `id` is it.
local function is_it(payload)
  if not string.find(payload, id, 1, true) then
    return false
  end
  local ok, job = pcall(cjson.decode, payload)
  return ok and type(job) == 'table' and job.id == id
end
local CHUNK = 1000
-- Found first, moved last: the outcome is written before the job leaves
-- its list, so a user the ACL refuses a write stops the script with the
-- job where it was, not gone and still shown waiting.
local found, where, within
local length = redis.call('LLEN', queue)
for from = 0, length - 1, CHUNK do
  for _, payload in ipairs(redis.call('LRANGE', queue, from, from + CHUNK - 1)) do
    if is_it(payload) then
      found, where, within = payload, 'waiting', queue
      break
    end
  end
  if found then break end
end
for _, set in ipairs({{scheduled, 'scheduled'}, {retry, 'retrying'}}) do
  if found then break end
  local size = redis.call('ZCARD', set[1])
  for from = 0, size - 1, CHUNK do
    for _, payload in ipairs(redis.call('ZRANGE', set[1], from, from + CHUNK - 1)) do
      if is_it(payload) then
        found, where, within = payload, set[2], set[1]
        break
      end
    end
    if found then break end
  end
end
if not found then
  if state then
    -- Kept, and in no list: taken by a worker that has not started it.
    redis.call('HSET', hash, 'cancel_requested', now)
    return {'requested', state}
  end
  return {'unknown', ''}
end
-- A job that kept no outcome is kept cancelled for `default_keep`.
outcome_end(hash, ending, 'cancelled', now, not state and default_keep or nil)
redis.call('HSET', hash, 'cancel_requested', now)
if within == queue then
  redis.call('LREM', queue, 1, found)
else
  redis.call('ZREM', within, found)
end
local job = cjson.decode(found)
if type(job.unique_key) == 'string' then
  release(unique, expiry, string.len(id) .. ':' .. id .. job.unique_key)
end
return {'removed', where}
