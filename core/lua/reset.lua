-- reset.lua: forgets every unit counted for one key under the given limits.
--
-- KEYS  the storage keys of the limits; all keys share one hash tag
-- ARGV  none
--
-- Returns the number of keys deleted.

return redis.call('DEL', unpack(KEYS))
