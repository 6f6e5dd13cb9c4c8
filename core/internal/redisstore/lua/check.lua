-- check.lua: Limiter.Check's script. It proves that this client may run
-- scripts on keys under the Limiter's prefix, that TIME is readable from a
-- script, and that the server takes a write (one refusing writes: used
-- memory above maxmemory under noeviction, a read-only replica, a failed
-- save with stop-writes-on-bgsave-error, fails every decision).
--
-- KEYS[1]  a key under the Limiter's prefix, set to '1' for 1s
--
-- Returns the key's PTTL after the write.

redis.call('TIME')
redis.call('SET', KEYS[1], '1', 'PX', 1000)
return redis.call('PTTL', KEYS[1])
