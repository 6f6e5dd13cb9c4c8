-- allow.lua: decides whether n units fit under every limit of one key and,
-- when they do and the spec commits, records them: all or none (see decide
-- in algorithms.lua).
--
-- KEYS     the key's block key (which holds its override), its penalty key when the
--          spec has a penalty, then each limit's storage key (one hash tag)
-- ARGV[1]  the spec, one string of values separated by spaces: commit (1
--          records the units, 0 only looks: Peek), the penalty's denials
--          (0: none), within µs and ban µs, then per limit its algorithm
--          (0 log, 1 buckets, 2 counter), count, window µs, precision µs
-- ARGV[2]  n: units asked, > 0
-- ARGV[3]  now in µs; absent or 0: the server's TIME
--
-- Returns {allowed (1 or 0), blocked (0 no, 1 blocked, 2 banned by this
-- denial; plus 4 under an override), now µs, then per limit: remaining,
-- retry µs, reset µs; then, under an override only, per limit the
-- override's Count in force (0: none)}.

return allow(KEYS, ARGV)
