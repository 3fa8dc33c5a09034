-- take_jobs(waiting, processing, bucket, index, want, out, max_attempts,
-- ids, interval, tolerance): the taking half shared by fetch.lua and
-- settle.lua (a function they start with, after now.lua, stamp.lua and
-- rate.lua). Moves up to `want` jobs from the queue `waiting` into
-- `processing`, stamped (stamp.lua, with the ids after those already in
-- `out`), no more than the rate bucket `bucket` allows (rate.lua; interval
-- 0: no limit), and appends a triple of `index`, payload as held and stamp
-- to `out` for each. Returns how many it took and, when the limit stopped
-- it with jobs left in the queue and more wanted, the ms until the next
-- start is allowed (else nil).
local function take_jobs(waiting, processing, bucket, index, want, out, max_attempts, ids,
                         interval, tolerance)
  local room, tat = want, 0
  if interval > 0 then
    room, tat = admissible(bucket, want, interval, tolerance)
  end
  local started = 0
  while started < room do
    local v = redis.call('RPOP', waiting)
    if not v then break end
    local k = #out / 3
    local held, how = stamp(v, max_attempts, string.sub(ids, 32 * k + 1, 32 * k + 32))
    redis.call('LPUSH', processing, held)
    out[#out + 1] = index
    out[#out + 1] = held
    out[#out + 1] = how
    started = started + 1
  end
  if interval > 0 then
    local next_in = spend(bucket, tat, started, interval, tolerance)
    if started == room and started < want and redis.call('LLEN', waiting) > 0 then
      return started, next_in
    end
  end
  return started, nil
end
