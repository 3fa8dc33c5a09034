-- Server time in unix milliseconds: due times and heartbeats use Redis's
-- clock, not the caller's.
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
