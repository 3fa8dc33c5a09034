-- The rate limit of a queue (a function the scripts that take jobs start
-- with, after clock.lua): a GCRA bucket (generic cell rate algorithm) in one
-- key, `<q>:rate`, holding the theoretical arrival time (TAT) of the next
-- start in unix ms (Redis clock, with a fraction). A start at `now` is
-- allowed when now >= TAT - tolerance, and moves TAT to
-- max(TAT, now) + interval: starts are spaced by `interval` ms, and up to
-- 1 + tolerance / interval may start at once after a quiet spell.
--
-- admissible(key, want, interval, tolerance): how many of `want` starts
-- the bucket allows now, and the TAT to spend them from.
local function admissible(key, want, interval, tolerance)
  local t = now()
  local tat = tonumber(redis.call('GET', key)) or t
  if tat < t then
    tat = t
  end
  local k = math.floor((t + tolerance - tat) / interval + 1e-9) + 1
  if k < 0 then
    k = 0
  end
  if k > want then
    k = want
  end
  return k, tat
end

-- spend(key, tat, started, interval, tolerance): records `started` starts
-- from `tat` and returns the ms until the next start is allowed (>= 1).
-- The key expires once its TAT is in the past, where it means nothing.
local function spend(key, tat, started, interval, tolerance)
  if started > 0 then
    tat = tat + started * interval
    redis.call('SET', key, string.format('%.3f', tat), 'PX', math.ceil(tat - now()) + 1)
  end
  local wait = math.ceil(tat - tolerance - now())
  if wait < 1 then
    wait = 1
  end
  return wait
end
