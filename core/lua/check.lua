-- check.lua: Limiter.Check's script. It proves that this client may run
-- scripts (EVAL and EVALSHA) on keys under the Limiter's prefix, and that
-- the server's TIME is readable from a script, as the decisions need. It
-- reads one key and writes nothing.
--
-- KEYS[1]  a key under the Limiter's prefix
-- ARGV     none
--
-- Returns the key's PTTL (-2: it does not exist).

redis.call('TIME')
return redis.call('PTTL', KEYS[1])
