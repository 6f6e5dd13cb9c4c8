-- check.lua: Limiter.Check's script. KEYS[1], a key under the Limiter's
-- prefix, is set to '1' for 1s; returns its PTTL. It proves that this client
-- may run scripts there and, by its ACL, each command the scripts run there
-- (see check_test.go), read TIME, and write (a server refusing writes, out of
-- memory under noeviction, a read-only replica, fails every decision).

for c in string.gmatch('GET SET DEL EXISTS MGET INCRBY PEXPIRE HSET HGET HMGET HGETALL HINCRBY HDEL HEXISTS ' ..
    'HLEN ZADD ZCARD ZCOUNT ZSCORE ZRANGE ZREVRANGE ZRANGEBYSCORE ZREVRANGEBYSCORE ZREM ZREMRANGEBYSCORE', '%S+') do
  if redis.acl_check_cmd and not redis.acl_check_cmd(c, KEYS[1]) then -- Redis 7 (not miniredis)
    error({err = 'NOPERM ratewindow: this user may not run ' .. c .. ' on ' .. KEYS[1] .. ' as the scripts do (docs/redis.md)'})
  end
end
redis.call('TIME')
redis.call('SET', KEYS[1], '1', 'PX', 1000)
return redis.call('PTTL', KEYS[1])
