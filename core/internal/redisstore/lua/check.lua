-- check.lua: Limiter.Check's script. It proves that this client may run
-- scripts (EVAL and EVALSHA) on keys under the Limiter's prefix, that the
-- server's TIME is readable from a script, and that the server takes a
-- write, as the decisions need: a server that refuses writes (used memory
-- above maxmemory under noeviction, a read-only replica, a failed save
-- with stop-writes-on-bgsave-error) fails every decision. The write is one
-- small value on KEYS[1], which expires after 1s.
--
-- KEYS[1]  a key under the Limiter's prefix
-- ARGV     none
--
-- Returns the key's PTTL after the write.

redis.call('TIME')
redis.call('SET', KEYS[1], '1', 'PX', 1000)
return redis.call('PTTL', KEYS[1])
