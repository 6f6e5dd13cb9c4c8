-- reset.lua: forgets every unit counted for one key under the given limits,
-- and lifts the key's block.
--
-- KEYS  the key's block key and the storage keys of the limits; all keys
--       share one hash tag
-- ARGV  none
--
-- Returns the number of keys deleted.

return redis.call('DEL', unpack(KEYS))
