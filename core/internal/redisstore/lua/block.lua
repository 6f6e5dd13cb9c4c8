-- block.lua: makes one key exhausted under any limits for d µs, on every
-- replica (Limiter.Block); a later block never shortens an earlier one.
--
-- KEYS[1]  the key's block key (the hash tag of the key's limits)
-- ARGV[1]  now in µs, or 0 for the server's TIME; ARGV[2] d, > 0
--
-- Returns the µs the key stays blocked.

return block(KEYS, ARGV)
