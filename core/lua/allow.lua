-- allow.lua: decides whether n units fit under every limit of one key and,
-- when they do and commit is set, records them under every limit: all or
-- none. A denied request changes nothing but dropping expired state.
-- Runs after algorithms.lua (see decide there).
--
-- KEYS[1]    the key's block key (see Limiter.Block)
-- KEYS[i+1]  storage key of limit i; all keys share one hash tag
-- ARGV[1]  n: units asked, > 0
-- ARGV[2]  commit: 1 records the units when they fit, 0 only looks (Peek)
-- ARGV[3]  now in µs, or 0 to read the server's TIME
-- ARGV[4i], ARGV[4i+1], ARGV[4i+2], ARGV[4i+3]  limit i: algorithm
--          (0 log, 1 buckets, 2 counter), count, window µs, precision µs
--
-- Returns {allowed (1 or 0), then per limit: remaining, retry µs, reset µs}.
-- remaining counts after the units were recorded; retry is 0 for a limit
-- that admits, -1 for one that never can.

return decide(KEYS, 1, #KEYS - 1, ARGV, 1, now_us(ARGV[3]))
