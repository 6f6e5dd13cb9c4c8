-- allow_batch.lua: many allow.lua decisions in one call (on a Cluster or a
-- Ring, those of one hash tag), each atomic on its own; TIME read once.
-- Decisions that ask alike share one spec; a run of decisions asking the same
-- of the same keys (a hot key's) is answered by one check and one add.
--
-- KEYS     the keys of every decision, in turn, as allow.lua's KEYS
-- ARGV[1]  the number of decisions; ARGV[2] the number of specs
-- then     each spec (allow.lua's ARGV[1]), then per decision its spec
--          (from 1), n, now (0: the server's TIME)
--
-- Returns allow.lua's replies in one flat array. A decision that failed
-- (WRONGTYPE on a key not ours) answers -1, then zeros, so that every value
-- is an integer; the batcher sends it again alone, for Redis's error.

return allow_batch(KEYS, ARGV)
