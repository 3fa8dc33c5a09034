-- uses: guard.lua, now.lua
-- Everything a queue's readers need, for each queue, in one round trip.
-- KEYS: per queue, 11 keys: queue, retry, scheduled, dead, workers,
-- stats:processed, stats:failed, stats:dead, stats:recovered,
-- stats:duration, stats:duration_sq.
-- ARGV: per queue, the processing-list and worker-hash key prefixes.
-- Returns {now, per queue: {waiting, due retries, retries, due scheduled,
-- scheduled, dead, processed, failed, head payload or '' (a head over 64
-- KiB is not sent: `{"enqueued_at":N}` in its place, N found in its first
-- 4 KiB or last 256 bytes, or ''), workers as
-- {instance, beat, held, dead_after_ms or '-' or '', rate_limit or '',
-- handler_problem or '', oldest_job_ms or '', idle_ms or ''}...,
-- dead total, recovered total, mean job duration in ms or '', mean of
-- its squares in ms² or ''}}.
-- The job at the head of a queue, or what a reader needs of a long one.
local function head_of(queue)
  local head = redis.call('LINDEX', queue, -1) or ''
  if #head <= 65536 then
    return head
  end
  local at = string.match(string.sub(head, 1, 4096), '"enqueued_at":(%d+)')
    or string.match(string.sub(head, -256), '"enqueued_at":(%d+)')
  return at and ('{"enqueued_at":' .. at .. '}') or ''
end
local out = {now}
local per = 11
for i = 1, #KEYS, per do
  local q = (i - 1) / per
  local processing, details = ARGV[2 * q + 1], ARGV[2 * q + 2]
  local workers = redis.call('ZRANGE', KEYS[i + 4], 0, -1, 'WITHSCORES')
  local w = {}
  for j = 1, #workers, 2 do
    w[#w + 1] = workers[j]
    w[#w + 1] = workers[j + 1]
    w[#w + 1] = redis.call('LLEN', processing .. workers[j])
    local window = redis.call('HGET', details .. workers[j], 'dead_after_ms')
    if not window then
      window = redis.call('EXISTS', details .. workers[j]) == 1 and '-' or ''
    end
    w[#w + 1] = window
    w[#w + 1] = redis.call('HGET', details .. workers[j], 'rate_limit') or ''
    w[#w + 1] = redis.call('HGET', details .. workers[j], 'handler_problem') or ''
    w[#w + 1] = redis.call('HGET', details .. workers[j], 'oldest_job_ms') or ''
    w[#w + 1] = redis.call('HGET', details .. workers[j], 'idle_ms') or ''
  end
  out[#out + 1] = {
    redis.call('LLEN', KEYS[i]),
    redis.call('ZCOUNT', KEYS[i + 1], '-inf', now),
    redis.call('ZCARD', KEYS[i + 1]),
    redis.call('ZCOUNT', KEYS[i + 2], '-inf', now),
    redis.call('ZCARD', KEYS[i + 2]),
    redis.call('LLEN', KEYS[i + 3]),
    tonumber(redis.call('GET', KEYS[i + 5]) or '0'),
    tonumber(redis.call('GET', KEYS[i + 6]) or '0'),
    head_of(KEYS[i]),
    w,
    tonumber(redis.call('GET', KEYS[i + 7]) or '0'),
    tonumber(redis.call('GET', KEYS[i + 8]) or '0'),
    redis.call('GET', KEYS[i + 9]) or '',
    redis.call('GET', KEYS[i + 10]) or '',
  }
end
return out
