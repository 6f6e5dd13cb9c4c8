-- own.lua: reads or changes a key's block and override, which its block
-- key holds together (see own_of in algorithms.lua); each change keeps the
-- other half.
--
-- KEYS[1]  the key's block key
-- ARGV[1]  now in µs, or 0 for the server's TIME
-- ARGV[2]  read; unblock; set (ARGV[3] the override, "<alg> <window µs>
--          <count>" per limit, ARGV[4] its time in µs, 0 for no end); rm
--
-- Returns {µs the block lasts (0: none), µs the override lasts (0: no
-- end, -1: no override), the override ('' for none)}, after the change.

return own(KEYS, ARGV)
