-- uses: guard.lua, now.lua, outcome.lua
-- A kept job's attempt starts on a worker, before its handler runs: its
-- outcome is written `running`, unless a cancellation was asked for
-- (cancel.lua: the job was taken before the cancel found it), when
-- nothing is written and the worker settles the job as cancelled without
-- running it. KEYS: its outcome hash, end stream. ARGV: the attempt, the
-- worker instance, how long to keep its final outcome in ms.
-- Returns 1 (running) or 0 (cancelled: do not run it).
local hash, ending = KEYS[1], KEYS[2]
expect(hash, 'hash')
expect(ending, 'stream')
return outcome_run(hash, ending, now, ARGV[1], ARGV[2], ARGV[3]) == 'C' and 0 or 1
