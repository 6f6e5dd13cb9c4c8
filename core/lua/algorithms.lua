-- algorithms.lua: the three sliding-window algorithms. It is prepended to
-- allow.lua and reserve.lua and reads no KEYS or ARGV itself.
--
-- Times are microseconds since the epoch. Lua numbers are doubles, exact for
-- integers up to 2^53, far beyond any time or count used here. Numbers are
-- passed to redis.call as numbers (Redis formats them with full precision);
-- never with tostring or '..', which would print 1.76e+15.
--
-- A check returns a state table for one limit:
--   free   units that fit now (Count minus what is counted), >= 0
--   retry  µs until n more units fit: 0 now, -1 never (n > Count)
--   reset  µs until the limit is back to its full Count
-- An add records n units and sets the key's TTL, returning the new reset.

-- now_us returns the time passed in (tests), or the server's TIME.
local function now_us(arg)
  local t = tonumber(arg)
  if t and t > 0 then return t end
  local tm = redis.call('TIME')
  return tonumber(tm[1]) * 1000000 + tonumber(tm[2])
end

-- expire_us sets the key's TTL to us microseconds, rounded up to a millisecond.
local function expire_us(key, us)
  local ms = math.ceil(us / 1000)
  if ms < 1 then ms = 1 end
  redis.call('PEXPIRE', key, ms)
end

-- Sliding log: a sorted set with one member per unit, scored by its time.
-- A unit at time s counts while now - window < s <= now + (reservations are
-- in the future). Members are small integers, unique within the key, so the
-- set stays in the compact listpack encoding with 4-byte members.
local LOG_MEMBERS = 8388608 -- 2^23: fits listpack's 24-bit integer encoding

local function log_check(key, count, window, n, now)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
  local used = redis.call('ZCARD', key)
  local s = {free = count - used, retry = 0, reset = 0, newest = now}
  if s.free < 0 then s.free = 0 end
  if used > 0 then
    local top = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    local newest = tonumber(top[2])
    if newest > now then s.newest = newest end
    s.reset = newest + window - now
  end
  -- n units fit at time t once the k-th newest unit has left the window at
  -- t: then every window holding t holds at most count - n other units.
  local k = count - n + 1
  if k <= 0 then
    s.retry = -1
  elseif used >= k then
    local e = redis.call('ZRANGE', key, -k, -k, 'WITHSCORES')
    s.retry = tonumber(e[2]) + window - now
  end
  return s
end

-- log_add records n units at time t and returns their members and the new
-- reset. A member already taken (an older unit whose time was equal modulo
-- 2^23) is stepped over, so every unit gets its own member.
local function log_add(key, window, n, t, now, s)
  local members = {}
  local m = t % LOG_MEMBERS
  for i = 1, n do
    while redis.call('ZADD', key, 'NX', t, m) == 0 do m = (m + 1) % LOG_MEMBERS end
    members[i] = m
    m = (m + 1) % LOG_MEMBERS
  end
  local newest = s.newest
  if t > newest then newest = t end
  expire_us(key, newest + window - now)
  return members, newest + window - now
end

-- Sliding buckets: a hash with one field per sub-window of prec µs, named by
-- its index (time / prec), holding its count. A bucket counts until its end
-- plus window, so a unit is never forgotten before it has left the window.
local function buckets_check(key, count, window, prec, n, now)
  local oldest = math.floor((now - window) / prec) -- older buckets have left
  local h = redis.call('HGETALL', key)
  local used, live, stale = 0, {}, {}
  for i = 1, #h, 2 do
    local b = tonumber(h[i])
    if b < oldest then
      stale[#stale + 1] = h[i]
    else
      local c = tonumber(h[i + 1])
      used = used + c
      live[#live + 1] = {b, c}
    end
  end
  if #stale > 0 then redis.call('HDEL', key, unpack(stale)) end
  local s = {free = count - used, retry = 0, reset = 0}
  if s.free < 0 then s.free = 0 end
  if #live > 0 then
    table.sort(live, function(x, y) return x[1] < y[1] end)
    s.reset = (live[#live][1] + 1) * prec + window - now
  end
  if n > count then
    s.retry = -1
  elseif used + n > count then
    local over = used + n - count -- units that must leave first, oldest first
    for _, e in ipairs(live) do
      over = over - e[2]
      if over <= 0 then
        s.retry = (e[1] + 1) * prec + window - now
        break
      end
    end
  end
  return s
end

local function buckets_add(key, window, prec, n, now)
  local b = math.floor(now / prec)
  redis.call('HINCRBY', key, b, n)
  local reset = (b + 1) * prec + window - now
  expire_us(key, reset)
  return reset
end

-- Sliding counter: a hash {w = index of the current fixed window, p = count
-- of the previous one, c = count of the current one}. The estimate weighs
-- the previous window by the part of it still inside the sliding window:
--   p * (window - elapsed) / window + c
local function counter_state(key, window, now)
  local c = math.floor(now / window)
  local v = redis.call('HMGET', key, 'w', 'p', 'c')
  local w, prev, cur = tonumber(v[1]), tonumber(v[2]) or 0, tonumber(v[3]) or 0
  if w ~= c then
    if w == c - 1 then prev, cur = cur, 0 else prev, cur = 0, 0 end
  end
  return c, prev, cur, now - c * window
end

local function counter_check(key, count, window, n, now)
  local c, prev, cur, elapsed = counter_state(key, window, now)
  -- all in integers: prev*(window-elapsed) + used*window <= count*window
  local weighted = prev * (window - elapsed)
  local s = {free = math.floor((count * window - weighted - cur * window) / window), retry = 0, reset = 0}
  if s.free < 0 then s.free = 0 end
  if cur > 0 then
    s.reset = (c + 2) * window - now
  elseif prev > 0 then
    s.reset = (c + 1) * window - now
  end
  if n > count then
    s.retry = -1
  elseif weighted + (cur + n) * window > count * window then
    if cur + n <= count then
      -- later in this window: prev*(window-e) <= (count-n-cur)*window
      local e = window - math.floor((count - n - cur) * window / prev)
      s.retry = e - elapsed
    else
      -- in the next window, where this one's count is the previous one
      local e = window - math.floor((count - n) * window / cur)
      s.retry = (c + 1) * window - now + e
    end
  end
  return s
end

local function counter_add(key, window, n, now)
  local c, prev, cur = counter_state(key, window, now)
  redis.call('HSET', key, 'w', c, 'p', prev, 'c', cur + n)
  local reset = (c + 2) * window - now
  expire_us(key, reset)
  return reset
end
