-- reset.lua: forgets the units of one key under the given limits, lifts its
-- block and forgets its penalty's denials; its override stays.
--
-- KEYS     the key's block and penalty keys and its limits' keys (one hash tag)
-- ARGV[1]  now in µs, or 0 for the server's TIME
--
-- Returns the number of keys deleted, the block key not counted.

return reset(KEYS, ARGV)
