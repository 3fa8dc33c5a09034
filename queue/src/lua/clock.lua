-- now(): server time in unix milliseconds, read with TIME the first time
-- a script asks (the taking scripts start with this instead of now.lua).
-- Taking jobs that carry their own enqueued_at and settling jobs that are
-- done need no clock, and a TIME call costs Redis about what settling a
-- job does.
local now_ms
local function now()
  if not now_ms then
    local t = redis.call('TIME')
    now_ms = t[1] * 1000 + math.floor(t[2] / 1000)
  end
  return now_ms
end
