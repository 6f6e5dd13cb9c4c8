-- block.lua: makes one key exhausted under any limits for a while, on every
-- replica (Limiter.Block): until then allow.lua denies it and reserve.lua
-- places reservations after it. A later block never shortens an earlier
-- one. See block_key in algorithms.lua.
--
-- KEYS[1]  the key's block key; it shares the hash tag of the key's limits
-- ARGV[1]  now in µs, or 0 to read the server's TIME
-- ARGV[2]  d: how long to block, in µs, > 0
--
-- Returns the µs the key stays blocked (d, or longer when an earlier block
-- lasts longer).

return block(KEYS, ARGV)
