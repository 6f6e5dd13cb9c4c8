-- allow.lua: decides whether n units fit under every limit of one key and,
-- when they do and commit is set, records them under every limit: all or
-- none. A denied request changes nothing but dropping expired state and,
-- under a penalty, counting the denial (and banning the key at the
-- penalty's count). Runs after algorithms.lua (see decide there).
--
-- KEYS[1]  the key's block key (see Limiter.Block)
-- KEYS[2]  the key's penalty key, when ARGV[4] > 0
-- then     the storage key of each limit; all keys share one hash tag
-- ARGV[1]  n: units asked, > 0
-- ARGV[2]  now in µs, or 0 to read the server's TIME
-- ARGV[3]  commit: 1 records the units when they fit, 0 only looks (Peek)
-- ARGV[4], ARGV[5], ARGV[6]  the penalty: denials (0: none), within µs,
--          ban µs (see Rule.Penalty)
-- ARGV[4i+3] .. ARGV[4i+6]  limit i: algorithm (0 log, 1 buckets,
--          2 counter), count, window µs, precision µs
--
-- Returns {allowed (1 or 0), blocked (0 no, 1 blocked, 2 banned by this
-- denial), now µs, then per limit: remaining, retry µs, reset µs}.

local out = {}
decide(KEYS, 1, tonumber(ARGV[1]), now_us(ARGV[2]), read_spec(ARGV, 3, (#ARGV - 6) / 4), out, 0, 1)
return out
