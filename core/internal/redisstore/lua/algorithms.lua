-- algorithms.lua: the three sliding-window algorithms, and the decision over
-- several limits built on them. It is prepended to allow.lua,
-- allow_batch.lua and reserve.lua and reads no KEYS or ARGV itself.
--
-- Times are microseconds since the epoch. Lua numbers are doubles, exact for
-- integers up to 2^53, far beyond any time or count used here. Numbers are
-- passed to redis.call as numbers (Redis formats them with full precision);
-- never with tostring or '..', which would print 1.76e+15.
--
-- A check returns the state of one limit, as values (no table: a decision
-- allocates as little as it can):
--   free   units that fit now (Count minus what is counted), >= 0
--   retry  µs until n more units fit: 0 now, -1 never (n > Count)
--   reset  µs until the limit is back to its full Count
-- then what its add needs. An add records n units and sets the key's TTL,
-- returning the new reset.

-- Only the two functions of the innermost loops are locals here. Every
-- script call runs this file's body again, and each function it defines
-- captures the locals it uses; a capture walks the list of the locals
-- captured so far, so that capturing many costs more than the lookups it
-- saves (string.sub and the like are looked up where used: measured, the
-- body of this file cost 8.2 µs a call with them all local, 4.6 without).
local byte, call = string.byte, redis.call

-- now_us returns the time passed in (tests), or the server's TIME.
local function now_us(arg)
  local t = arg and tonumber(arg)
  if t and t > 0 then return t end
  local tm = call('TIME')
  return tonumber(tm[1]) * 1000000 + tonumber(tm[2])
end

-- px returns the PX (or PEXPIRE) argument of a TTL of us microseconds:
-- rounded up to a millisecond, at least 1.
local function px(us)
  return math.max(math.ceil(us / 1000), 1)
end

-- Redis formats every number passed to redis.call with printf (about
-- 0.3 µs), a cost as large as a short command's, while a string goes as it
-- is. The arguments that recur are passed as strings, made once: small
-- integers (units, bucket fields) and the last TTL used (a decision at now
-- sets a TTL of its window, decision after decision).
local ints = {} -- ints[x]: x as a string, for integers 0 <= x < 4096
local ttl_us, ttl_arg = -1, ''

-- int_arg returns x for a redis.call argument: as a string when it is a
-- small integer. (Not named arg: Lua 5.1 gives that name to a vararg
-- function's implicit table of its arguments.)
local function int_arg(x)
  local s = ints[x]
  if s then return s end
  if x >= 0 and x < 4096 and x % 1 == 0 then
    s = string.format('%d', x)
    ints[x] = s
    return s
  end
  return x
end

-- px_arg returns px(us) for a redis.call argument (see int_arg).
local function px_arg(us)
  if us ~= ttl_us then ttl_us, ttl_arg = us, string.format('%d', px(us)) end
  return ttl_arg
end

-- expire_us sets the key's TTL to us microseconds (see px).
local function expire_us(key, us)
  call('PEXPIRE', key, px_arg(us))
end

-- Sliding log: one string per key holding the times of the units counted,
-- oldest first; a unit at time s counts while now - window < s <= now +
-- (reservations are in the future). Only units that may still count are
-- kept: the front is dropped as units leave, and a key never holds more
-- than Count units that count (see log_check), so every decision is O(1)
-- in Redis calls, however many units the window holds.
--
-- Times are stored as offsets from a base, big-endian, w bytes each (1 to
-- 7), in one of two layouts, told apart by the first byte:
--   compact  w, base (7 bytes), then the times. Read in one call and
--            written whole: a compact value is at most LOG_WHOLE bytes.
--            When it is written anew, its base is its oldest time and w as
--            small as its newest needs: ten units within 65 ms of each
--            other take 8 + 10 * 2 bytes, within 16 s 8 + 10 * 3.
--   ring     16 + w, base (7), cap (3), head (3), used (3), the newest
--            time (7), when the key expires (7, µs), then cap slots of w
--            bytes: the i-th oldest time (from 0) in slot (head + i) % cap.
--            For logs too long to rewrite on every decision: read and
--            written a few slots at a time (GETRANGE, SETRANGE), its
--            offsets with room for many windows before a rewrite. Its TTL
--            is set a window longer than needed, so that it is set again
--            once a window, not on every decision.
local LOG_WHOLE = 512 -- the longest compact value, in bytes

-- found tells whether the last check (log_open, buckets_check,
-- counter_state) found its key holding a value; decide learns from it
-- whether decisions find their keys missing (see fresh_hint).
local found = false

-- fresh_hint[alg] scores how often the decisions of one limit found
-- their key missing lately, by algorithm: +1 for a missing key (up to
-- FRESH_MAX), -FRESH_FOUND for one holding a value (down to 0). From
-- FRESH_AFTER on, a decision expects its key missing too, as on many keys
-- that are each used less often than once a window: a committed decision
-- that fits writes its units at once, with NX, without reading the key
-- first (see fresh_add), and a hash is read in one call (see
-- buckets_check). The score stays there while more than about one key in
-- five is missing (each saves a call, each other one costs one); a hot
-- key's decisions, which find it holding a value, read first, as before.
local FRESH_AFTER, FRESH_MAX, FRESH_FOUND = 2, 8, 4
local fresh_hint = {['0'] = 0, ['1'] = 0, ['2'] = 0}

-- learn scores a decision of one limit of algorithm alg that found its key
-- holding a value (was_found true) or missing (see fresh_hint).
local function learn(alg, was_found)
  local h = fresh_hint[alg]
  if was_found then
    fresh_hint[alg] = math.max(h - FRESH_FOUND, 0)
  elseif h < FRESH_MAX then
    fresh_hint[alg] = h + 1
  end
end
local LOG_WHOLE_LAST = '511' -- its last byte's index, for GETRANGE
local LOG_HEAD = 31 -- the bytes of a ring's header
local LOG_CHUNK = 32 -- the slots of a ring read in one call

-- A log of more than RING_MAX units is paged: a hash, not a string, so
-- that no call rewrites it whole (a ring is written anew when it runs out
-- of room while its units wrap, or when its offsets no longer fit: in Lua,
-- unit by unit, about 0.6 µs a unit, so that a ring is kept small enough
-- for that to stay a few ms). Its units are numbered by a sequence number
-- s from when the hash was made; unit s is in the field named
-- floor(s / PAGE) (a decimal integer), whose value holds the times of up
-- to PAGE units, 7 bytes each (µs since the epoch), slot s % PAGE. Field
-- 'h' holds the header, 7 bytes each: the sequence number of the oldest
-- unit kept (s0), the units kept (used), the newest time, when the key
-- expires (µs; its TTL is set a window longer than needed, as a ring's)
-- and the first page that may still be held below s0 (gc: pages that
-- have left are deleted up to PAGE_GC a call). A call reads and writes a
-- few pages: appending rewrites the last one; dropping units that left
-- moves s0; a refund of the newest units moves the end. Only units moved
-- by an insertion or a removal before later units (reservations, a refund
-- of a past decision) are rewritten. PAGE makes a page's value fit
-- jemalloc's 1 KB class (7 * 145 + sds header <= 1024): 7.4 bytes a unit
-- with the hash's own. Larger pages cost a hot key's decisions more (each
-- reads its first and last page and writes the last: 4 KB pages took
-- about 8 µs more a decision than 1 KB ones, measured). The last key
-- written paged (a hot key's, as a rule) is kept in paged_key, with its
-- first and last page: the next decision on it reads its header and those
-- two pages in one HMGET (not trying it as a string first), and writes its
-- pages and header in one HSET.
local RING_MAX = 4096
-- A paged log is written back as a ring (or compact) when it falls to
-- RING_MIN units: well below RING_MAX, so that a log holding about RING_MAX
-- units is not rewritten from one layout to the other again and again
-- (each a few ms: 25 µs a decision on average on a hot key measured).
local RING_MIN = RING_MAX / 4
local PAGE, PAGE_GC = 145, 64
local paged_key, paged_first, paged_last = false, 0, 0
local PAGE_HEADER = 'h'

-- uint reads the w-byte big-endian integer at position i of s. (These
-- two run on every decision: one call of string.byte or string.char, no
-- table.)
local function uint(s, i, w)
  local a, b, c, d, e, f, g = byte(s, i, i + w - 1)
  if w == 1 then return a end
  a = a * 256 + b
  if w == 2 then return a end
  a = a * 256 + c
  if w == 3 then return a end
  a = a * 256 + d
  if w == 4 then return a end
  a = a * 256 + e
  if w == 5 then return a end
  a = a * 256 + f
  if w == 6 then return a end
  return a * 256 + g
end

-- uint_bytes returns x as a w-byte big-endian integer.
local function uint_bytes(x, w)
  local g = x % 256
  if w == 1 then return string.char(g) end
  x = (x - g) / 256
  local f = x % 256
  if w == 2 then return string.char(f, g) end
  x = (x - f) / 256
  local e = x % 256
  if w == 3 then return string.char(e, f, g) end
  x = (x - e) / 256
  local d = x % 256
  if w == 4 then return string.char(d, e, f, g) end
  x = (x - d) / 256
  local c = x % 256
  if w == 5 then return string.char(c, d, e, f, g) end
  x = (x - c) / 256
  local b = x % 256
  if w == 6 then return string.char(b, c, d, e, f, g) end
  x = (x - b) / 256
  return string.char(x % 256, b, c, d, e, f, g)
end

-- width returns the bytes an offset of up to x takes: 1 to 7.
local function width(x)
  local w, m = 1, 256
  while x >= m and w < 7 do w, m = w + 1, m * 256 end
  return w
end

-- log_open reads the log of key into L (a table of log_open's, or nil:
-- a new one), which it returns. Its units are numbered from 1 (the oldest)
-- to used; those before lo have left (see log_trim). Decisions reuse their
-- L from decision to decision: its fields are all set here, so that
-- setting them again allocates nothing.
local pcall_ = redis.pcall
-- pre_key's value, read whole by allow_one, is pre_v: log_open takes it
-- instead of reading the key again (once).
local pre_key, pre_v = false, false
local function log_open(key, window, now, L)
  local v, r
  if key == paged_key then
    r = pcall_('HMGET', key, PAGE_HEADER, paged_first, paged_last) -- see PAGE
    if r.err or not r[1] then r = nil end -- a string now, or gone
  end
  local h = r and r[1]
  if key == pre_key then -- read already (see allow_one)
    v, pre_key = pre_v, false
  elseif not h then
    v = pcall_('GETRANGE', key, '0', LOG_WHOLE_LAST) -- strings: no number to format
  end
  if not L then
    L = {key = key, window = window, now = now, lo = 1, used = 0, base = false, w = false, v = false,
         cap = false, head = false, newest = false, expires = false, cs = false, ce = false, cv = false,
         paged = false, s0 = false, gc = false, pj = false, pv = false, qj = false, qv = false}
  else
    L.key, L.window, L.now, L.lo, L.used, L.base, L.w, L.v = key, window, now, 1, 0, false, false, false
    L.cap, L.head, L.newest, L.expires, L.cs, L.ce, L.cv = false, false, false, false, false, false, false
    L.paged, L.s0, L.gc, L.pj, L.pv, L.qj, L.qv = false, false, false, false, false, false, false
  end
  if h or type(v) == 'table' then -- not a string: a paged log, or not a log
    h = h or call('HGET', key, PAGE_HEADER) -- WRONGTYPE but for a hash
    if not h or #h ~= 35 then
      error({err = 'WRONGTYPE ' .. key .. ' holds a value that is not a sliding log'})
    end
    found = true
    L.paged, L.base, L.w = true, 0, 7
    if r then L.pj, L.pv, L.qj, L.qv = paged_first, r[2] or '', paged_last, r[3] or '' end
    L.s0, L.used, L.newest = uint(h, 1, 7), uint(h, 8, 7), uint(h, 15, 7)
    L.expires, L.gc = uint(h, 22, 7), uint(h, 29, 7)
    return L
  end
  found = #v > 0
  if not found then return L end
  local f = byte(v, 1)
  local w = f % 16
  if #v < 8 or w < 1 or w > 7 or f >= 32 or (f < 16 and (#v - 8) % w ~= 0) or (f >= 16 and #v < LOG_HEAD) then
    error({err = 'WRONGTYPE ' .. key .. ' holds a value that is not a sliding log'})
  end
  L.base, L.w = uint(v, 2, 7), w
  if f < 16 then -- compact: all of it
    L.v, L.used = v, (#v - 8) / w
  else
    L.cap, L.head, L.used = uint(v, 9, 3), uint(v, 12, 3), uint(v, 15, 3)
    L.newest, L.expires = uint(v, 18, 7), uint(v, 25, 7)
  end
  return L
end

-- log_newest returns the time of the newest unit (there is one).
local function log_newest(L)
  if L.newest then return L.newest end
  local w = L.w
  return L.base + uint(L.v, 9 + (L.used - 1) * w, w)
end

-- page_get returns page j of the paged log L: one of the two it keeps
-- (see log_open), else read, and kept in place of the first.
local function page_get(L, j)
  if j == L.pj then return L.pv end
  if j == L.qj then return L.qv end
  L.pj, L.pv = j, call('HGET', L.key, j) or ''
  return L.pv
end

-- log_at returns the time of unit i. A ring's slots are read LOG_CHUNK at
-- a time, around the one asked for (scans go both ways), and the last read
-- kept.
local function log_at(L, i)
  local w = L.w
  if L.v then return L.base + uint(L.v, 9 + (i - 1) * w, w) end
  if L.paged then
    local s = L.s0 + i - 1
    local j = math.floor(s / PAGE)
    return uint(page_get(L, j), (s - j * PAGE) * 7 + 1, 7)
  end
  local p = (L.head + i - 1) % L.cap
  if not (L.cs and p >= L.cs and p <= L.ce) then
    local first = math.max(p - LOG_CHUNK / 2, 0)
    local last = math.min(first + LOG_CHUNK, L.cap) - 1
    L.cv = call('GETRANGE', L.key, LOG_HEAD + first * w, LOG_HEAD + (last + 1) * w - 1)
    L.cs, L.ce = first, last
  end
  return L.base + uint(L.cv, (p - L.cs) * w + 1, w)
end

-- log_after returns the first unit after time t (from lo), or used + 1
-- when there is none: a binary search, as units are in time order.
local function log_after(L, t)
  local lo, hi = L.lo, L.used + 1
  while lo < hi do
    local m = math.floor((lo + hi) / 2)
    if log_at(L, m) > t then hi = m else lo = m + 1 end
  end
  return lo
end

-- log_slots returns the stored bytes of units from to to of a ring, in
-- order: at most two reads, to the ring's end, then from its start.
local function log_slots(L, from, to)
  if from > to then return '' end
  if L.paged then -- a page at a time
    local parts, s, e = {}, L.s0 + from - 1, L.s0 + to - 1
    while s <= e do
      local j = math.floor(s / PAGE)
      local last = math.min(e, j * PAGE + PAGE - 1)
      local v = page_get(L, j)
      parts[#parts + 1] = string.sub(v, (s - j * PAGE) * 7 + 1, (last - j * PAGE + 1) * 7)
      s = last + 1
    end
    return table.concat(parts)
  end
  local w, p, left, runs = L.w, (L.head + from - 1) % L.cap, to - from + 1, {}
  while left > 0 do
    local run = math.min(left, L.cap - p)
    runs[#runs + 1] = call('GETRANGE', L.key, LOG_HEAD + p * w, LOG_HEAD + (p + run) * w - 1)
    left, p = left - run, 0
  end
  return table.concat(runs)
end

-- log_times appends the times of units from to to, in order, to out.
local function log_times(L, from, to, out)
  if from > to then return out end
  local w, v = L.w, L.v
  local at = 9 + (from - 1) * w
  if not v then v, at = log_slots(L, from, to), 1 end
  for i = at, at + (to - from) * w, w do out[#out + 1] = L.base + uint(v, i, w) end
  return out
end

-- log_trim drops the units at or before oldest: it sets lo to the first
-- unit after it. Usually none or one has left since the last call; after
-- a pause, the steps double, then halve, so a long log costs a few reads.
local function log_trim(L, oldest)
  local gone = L.lo -- the last unit known to have left, once checked
  if gone > L.used or log_at(L, gone) > oldest then return end
  local step, next = 1, gone + 1
  while next <= L.used and log_at(L, next) <= oldest do
    gone, step = next, step * 2
    next = gone + step
  end
  local live = math.min(next, L.used + 1) -- the first unit that counts, or used + 1
  while live - gone > 1 do
    local m = math.floor((gone + live) / 2)
    if log_at(L, m) <= oldest then gone = m else live = m end
  end
  L.lo = live
end

-- log_ring_state returns the part of a ring's header that a decision
-- changes: head, used and the newest time, from byte LOG_STATE (from 0).
local LOG_STATE = '11'
local function log_ring_state(head, used, newest)
  return uint_bytes(head, 3) .. uint_bytes(used, 3) .. uint_bytes(newest, 7)
end

-- log_ring_header returns a ring's header after its first byte and base:
-- cap, then its state (see log_ring_state), and when the key expires.
local function log_ring_header(cap, head, used, newest, expires)
  return uint_bytes(cap, 3) .. log_ring_state(head, used, newest) .. uint_bytes(expires, 7)
end

-- page_write puts the pages that write bytes (the times of units, 7 bytes
-- each) into the pages of L from unit sequence number s on, as field and
-- value pairs, into fv (page_header writes them); what the pages held
-- after them goes (the units after the last written are dropped).
local function page_write(L, s, bytes, fv)
  local i, n = 1, #bytes
  while i <= n do
    local j = math.floor(s / PAGE)
    local off = s - j * PAGE
    local run = math.min(n - i + 1, (PAGE - off) * 7)
    local piece = string.sub(bytes, i, i + run - 1)
    if off > 0 then -- after the units the page keeps
      piece = string.sub(page_get(L, j), 1, off * 7) .. piece
    end
    fv[#fv + 1], fv[#fv + 2] = j, piece
    i, s = i + run, s + run / 7
  end
end

-- page_header writes the header of the paged log L holding used units from
-- sequence number s0 on, the newest at newest, sets its TTL when it
-- expires too early, and deletes up to PAGE_GC pages below s0.
local function page_header(L, s0, used, newest, fv)
  local expires = L.expires or 0
  if newest + L.window > expires then
    local ms = px(newest + 2 * L.window - L.now)
    call('PEXPIRE', L.key, ms)
    expires = L.now + ms * 1000
  end
  local gc, first = L.gc or 0, math.floor(s0 / PAGE)
  if gc < first then
    local last, gone = math.min(first, gc + PAGE_GC) - 1, {}
    for j = gc, last do gone[#gone + 1] = j end
    call('HDEL', L.key, unpack(gone))
    gc = last + 1
  end
  fv[#fv + 1], fv[#fv + 2] = PAGE_HEADER, uint_bytes(s0, 7) .. uint_bytes(used, 7) .. uint_bytes(newest, 7) ..
    uint_bytes(expires, 7) .. uint_bytes(gc, 7)
  for i = 1, #fv, 200 do -- in chunks: unpack takes a few thousand values at most
    call('HSET', L.key, unpack(fv, i, math.min(i + 199, #fv)))
  end
  L.pj, L.pv, L.qj, L.qv = false, false, false, false
  paged_key, paged_first, paged_last = L.key, math.floor(s0 / PAGE), math.floor((s0 + used - 1) / PAGE)
end

-- log_store writes the times (in order, at least one) as a new value:
-- compact when it fits, with its oldest time as the base and the narrowest
-- offsets; else a ring with room to grow and offsets wide enough for a
-- while.
local function log_store(L, times)
  local n, base = #times, times[1]
  local newest = times[n]
  if n > RING_MAX then -- paged, from sequence number 0
    local parts = {}
    for i = 1, n do parts[i] = uint_bytes(times[i], 7) end
    call('DEL', L.key)
    L.paged, L.expires, L.gc, L.pj, L.pv, L.qj, L.qv = true, 0, 0, false, false, false, false
    local fv = {}
    page_write(L, 0, table.concat(parts), fv)
    page_header(L, 0, n, newest, fv)
    return
  end
  local ttl = newest + L.window - L.now
  local parts = {}
  local w = width(newest - base)
  if 8 + n * w <= LOG_WHOLE then
    parts[1] = string.char(w) .. uint_bytes(base, 7)
  else
    w = width(2 * (newest - base + L.window))
    local cap = 2 * n
    ttl = ttl + L.window
    parts[1] = string.char(16 + w) .. uint_bytes(base, 7) ..
               log_ring_header(cap, 0, n, newest, L.now + px(ttl) * 1000)
    parts[n + 2] = string.rep('\0', (cap - n) * w)
  end
  for i = 1, n do parts[i + 1] = uint_bytes(times[i] - base, w) end
  call('SET', L.key, table.concat(parts), 'PX', px(ttl))
end

-- fresh_log returns the value of a log of n units all at t, or false
-- when it would be too long to be compact: compact, its base t, offsets of
-- one byte, all 0 (a log of one unit takes 9 bytes; the next unit's
-- offset, wider, writes it anew). The last one made is kept: the decisions
-- of one merged call share their time, and on many keys most of them find
-- their key's log empty (measured: building it took 0.5 µs, half as long
-- as the SET that writes it; taking it again, 0.04).
local fresh_t, fresh_n, fresh_v = -1, -1, ''
local function fresh_log(t, n)
  if 8 + n > LOG_WHOLE then return false end -- read whole: see log_open
  if t ~= fresh_t or n ~= fresh_n then
    -- one string.char, not uint_bytes and concatenations: each string
    -- made costs (measured: 1.4 µs a decision less on many keys)
    local x, g = t, t % 256
    x = (x - g) / 256
    local f = x % 256
    x = (x - f) / 256
    local e = x % 256
    x = (x - e) / 256
    local d = x % 256
    x = (x - d) / 256
    local c = x % 256
    x = (x - c) / 256
    local b = x % 256
    local a = (x - b) / 256 % 256
    if n == 1 then
      fresh_v = string.char(1, a, b, c, d, e, f, g, 0)
    else
      fresh_v = string.char(1, a, b, c, d, e, f, g) .. string.rep('\0', n)
    end
    fresh_t, fresh_n = t, n
  end
  return fresh_v
end

-- log_splice replaces the del units from unit p (lo <= p <= used + 1) with
-- ins units at time t (which keeps the order), drops the units before lo,
-- and stores the log, whose newest unit is then at newest; or deletes it
-- when it is left empty. Its TTL lasts until the newest unit has left the
-- window. Both layouts are changed where they stand while t fits their
-- offsets: a compact value is cut and joined as a string; a ring with room
-- moves only the units after the change and rewrites its header. Otherwise
-- the log is written anew (log_store).
local function log_splice(L, p, del, ins, t, newest)
  local left = L.used - L.lo + 1 - del + ins
  if left <= 0 then
    call('DEL', L.key)
    return
  end
  local fresh = del == 0 and L.lo > L.used and fresh_log(t, ins)
  if fresh then -- nothing else left: n units at t
    call('SET', L.key, fresh, 'PX', px_arg(t + L.window - L.now))
    return
  end
  if L.paged and left > RING_MIN then
    -- the new units, then the units after the change, written from unit
    -- p's place on (see page_write); pages that left go (page_header)
    local bytes, fv = string.rep(uint_bytes(t, 7), ins) .. log_slots(L, p + del, L.used), {}
    page_write(L, L.s0 + p - 1, bytes, fv)
    page_header(L, L.s0 + L.lo - 1, left, newest, fv)
    return
  end
  local w, off = L.w, 0
  if ins > 0 then off = t - (L.base or t) end
  local fits = w and off >= 0 and off < 256 ^ w
  if fits and L.v and 8 + left * w <= LOG_WHOLE then
    local v = L.v
    if L.lo == 1 and p > L.used then -- added at the end, none dropped: appended
      v = v .. string.rep(uint_bytes(off, w), ins)
    else
      v = string.sub(v, 1, 8) .. string.sub(v, 9 + (L.lo - 1) * w, 8 + (p - 1) * w) ..
          string.rep(uint_bytes(off, w), ins) .. string.sub(v, 9 + (p + del - 1) * w)
    end
    call('SET', L.key, v, 'PX', px_arg(newest + L.window - L.now))
    return
  end
  if fits and L.cap and left <= L.cap and left <= RING_MAX and 8 + 3 * left > LOG_WHOLE / 2 then
    local cap = L.cap
    local head = (L.head + L.lo - 1) % cap
    -- the new units, then the units after the change moved as they are
    local bytes = string.rep(uint_bytes(off, w), ins) .. log_slots(L, p + del, L.used)
    local at, i = (head + p - L.lo) % cap, 1 -- the slot of unit p, from the new head
    while i <= #bytes do -- in at most two writes, as in log_slots
      local run = math.min(#bytes - i + 1, (cap - at) * w)
      call('SETRANGE', L.key, LOG_HEAD + at * w, string.sub(bytes, i, i + run - 1))
      i, at = i + run, 0
    end
    local expires = L.expires
    if newest + L.window > expires then
      local ms = px(newest + 2 * L.window - L.now)
      call('PEXPIRE', L.key, ms)
      expires = L.now + ms * 1000
      call('SETRANGE', L.key, '8', log_ring_header(cap, head, left, newest, expires))
    else -- cap and expires stay: head, used and newest are rewritten
      call('SETRANGE', L.key, LOG_STATE, log_ring_state(head, left, newest))
    end
    return
  end
  local live = L.used - L.lo + 1
  if fits and L.cap and left > L.cap and left <= RING_MAX and ins > 0 and del == 0 and p == L.used + 1 then
    local head = (L.head + L.lo - 1) % L.cap
    if head + live <= L.cap then
      -- a ring out of room whose units do not wrap: it grows at its end,
      -- where they stand (the string extended, the new units written),
      -- not written anew: a long log filled without pause never is
      local cap = math.max(head + left, L.cap + math.ceil(L.cap / 4))
      if cap < 16777216 then -- the header's 3 bytes
        call('SETRANGE', L.key, LOG_HEAD + cap * w - 1, '\0') -- Redis fills with zeros
        call('SETRANGE', L.key, LOG_HEAD + (head + live) * w, string.rep(uint_bytes(off, w), ins))
        local expires = L.expires
        if newest + L.window > expires then
          local ms = px(newest + 2 * L.window - L.now)
          call('PEXPIRE', L.key, ms)
          expires = L.now + ms * 1000
        end
        call('SETRANGE', L.key, '8', log_ring_header(cap, head, left, newest, expires))
        return
      end
    end
  end
  local times = log_times(L, L.lo, p - 1, {})
  for _ = 1, ins do times[#times + 1] = t end
  log_store(L, log_times(L, p + del, L.used, times))
end

-- log_check checks n units of a log limit at now, its log read into L
-- (see log_open), and returns free, retry, reset, then what log_add takes:
-- the time of the newest unit (false: none) and the log.
local function log_check(key, count, window, n, now, L)
  L = log_open(key, window, now, L)
  log_trim(L, now - window)
  local used = L.used - L.lo + 1
  local free, retry, reset, newest = math.max(count - used, 0), 0, 0, false
  if used > 0 then
    newest = log_newest(L)
    reset = newest + window - now
  end
  -- n units fit at time t once the k-th newest unit has left the window at
  -- t: then every window holding t holds at most count - n other units.
  -- (So when they fit now, at most count - n units count, and the log
  -- never keeps more than count units that do.)
  local k = count - n + 1
  if k <= 0 then
    retry = -1
  elseif used >= k then
    retry = log_at(L, L.used - k + 1) + window - now
  end
  return free, retry, reset, newest, L
end

-- log_add records n units at time t and returns the new reset. L and
-- newest are log_check's, of the same call. Units go after every unit at
-- or before t: at the end, but for reservations made for later than t.
local function log_add(window, n, t, now, L, newest)
  local p = L.used + 1
  if newest and newest > t then -- before reservations
    p = log_after(L, t)
  else
    newest = t
  end
  log_splice(L, p, 0, n, t, newest)
  return math.max(newest, now) + window - now
end

-- log_remove removes up to n units with times in (after, upto], the
-- newest first, and returns how many. The log's units have been trimmed to
-- those that count (log_trim), or hold after > now - window.
local function log_remove(L, n, after, upto, now)
  local hi = log_after(L, upto) - 1 -- the newest unit at or before upto
  -- the units after after, up to n of them: a binary search, not a unit at
  -- a time (a refund of a million units read them all)
  local p = math.max(log_after(L, after), hi - n + 1)
  local del = hi - p + 1
  if del > 0 then
    local newest = now -- of the units left (none: the key goes)
    if hi < L.used then
      newest = log_newest(L)
    elseif p > L.lo then
      newest = log_at(L, p - 1)
    end
    log_splice(L, p, del, 0, 0, newest)
  end
  return del
end

-- Sliding buckets: a hash with one field per sub-window of prec µs, holding
-- its count. A bucket counts until its end plus window, so a unit is never
-- forgotten before it has left the window.
--
-- A field is named by the bucket's index (time / prec) modulo ring, a power
-- of two above four times the buckets of one window: small integers, so the
-- hash stays in the compact listpack encoding with 2- or 3-byte field names
-- (the default precision, window/60, gives ring 256). A field's index is the
-- latest one at or before now with that remainder. Every field is younger
-- than a window plus two buckets when read (older ones are dropped on every
-- check, and the key expires a window after its newest bucket ends), so no
-- two live buckets share a name.
--
-- A hash of more than BUCKETS_SUMMED live buckets also holds their sum:
-- field 't' the units counted, field 'o' the newest bucket's index and the
-- oldest one still counted (both modulo ring: newest * ring + oldest). A
-- check then reads two fields, and the buckets that left since the last
-- one (usually none), instead of every field; an add increments its bucket
-- and 't'. Smaller hashes are read whole, as before, and keep no sum, so
-- a key of a few buckets takes no more memory. A refund that empties a
-- bucket drops the sum, which the next check with many buckets writes
-- again.
local BUCKETS_SUMMED = 8
local function bucket_ring(window, prec)
  local ring, need = 8, 4 * math.ceil(window / prec) + 4
  while ring < need do ring = ring * 2 end
  return ring
end

-- bucket_of returns the index of the bucket whose field is named f: the
-- latest index at or before current with that remainder (see above); nil
-- for a field that names no bucket (the sum's).
local function bucket_of(f, current, ring)
  f = tonumber(f)
  return f and current - (current - f) % ring
end

-- buckets_retry returns the µs until n more units fit under count, the
-- hash h (HGETALL's reply) holding used units: the end of the bucket whose
-- leaving frees enough, plus the window.
local function buckets_retry(h, count, window, prec, n, now, used, oldest, current, ring)
  local counts = {} -- by index, from oldest
  for i = 1, #h, 2 do
    local b = bucket_of(h[i], current, ring)
    if b and b >= oldest then counts[b - oldest + 1] = tonumber(h[i + 1]) end
  end
  local over = used + n - count -- units that must leave first, oldest first
  for b = oldest, current do
    over = over - (counts[b - oldest + 1] or 0)
    if over <= 0 then return (b + 1) * prec + window - now end
  end
  return 0
end

-- buckets_scan reads the hash h (HGETALL's reply) of a limit that keeps no
-- sum and returns the units of its buckets from oldest on, how many such
-- buckets, the newest (nil: none), and the fields to drop (nil: none): the
-- buckets that left and any other field (half a sum, 't' or 'o' alone),
-- and whether there is such a field.
local function buckets_scan(h, oldest, current, ring)
  local used, live, newest, stale, odd = 0, 0, nil, nil, false
  for i = 1, #h, 2 do
    local b = bucket_of(h[i], current, ring)
    if not b or b < oldest then
      stale = stale or {}
      stale[#stale + 1] = h[i]
      odd = odd or not b
    else
      used, live = used + tonumber(h[i + 1]), live + 1
      if not newest or b > newest then newest = b end
    end
  end
  return used, live, newest, stale, odd
end

-- buckets_drop deletes the fields of key (nil: none), in chunks: Lua's
-- unpack takes a few thousand values at most.
local function buckets_drop(key, fields)
  if not fields then return end
  for i = 1, #fields, 1000 do
    call('HDEL', key, unpack(fields, i, math.min(i + 999, #fields)))
  end
end

-- buckets_check checks n units of a buckets limit at now and returns free,
-- retry, reset, then what buckets_add takes: whether the hash keeps a sum,
-- its newest bucket (false: none) and the oldest one it counts.
local function buckets_check(key, count, window, prec, n, now)
  local oldest = math.floor((now - window) / prec) -- older buckets have left
  local current, ring = math.floor(now / prec), bucket_ring(window, prec)
  local used, newest, lo, h, summed = 0, nil, oldest, nil, false
  local st, so -- the sum's fields
  if fresh_hint['1'] >= FRESH_AFTER then
    -- keys found missing lately: the hash read whole, in one call instead
    -- of two for a missing key (a hash holds at most a window's buckets
    -- and the sum: MaxBuckets and a few)
    h = call('HGETALL', key)
    for i = 1, #h, 2 do
      local f = h[i]
      if f == 't' then st = h[i + 1] elseif f == 'o' then so = h[i + 1] end
    end
  else
    local sum = call('HMGET', key, 't', 'o')
    st, so = sum[1], sum[2]
  end
  if st and so then
    summed, h, found = true, nil, true
    -- the sum: drop the buckets that left since the last check
    local o = tonumber(so)
    local lo_f = o % ring
    used = tonumber(st)
    newest = bucket_of((o - lo_f) / ring, current, ring)
    lo = bucket_of(lo_f, current, ring)
    if lo < oldest then
      local gone = {}
      for b = lo, math.min(oldest - 1, lo + ring - 1) do gone[#gone + 1] = b % ring end
      local counts = call('HMGET', key, unpack(gone))
      for i = 1, #counts do used = used - (tonumber(counts[i]) or 0) end
      call('HDEL', key, unpack(gone))
      if used > 0 and newest >= oldest then
        call('HSET', key, 't', used, 'o', (newest % ring) * ring + oldest % ring)
      else -- nothing left: not even the sum
        call('DEL', key)
        used, newest = 0, nil
      end
      lo = oldest
    end
  else
    h = h or call('HGETALL', key)
    found = #h > 0
    local live, stale
    used, live, newest, stale = buckets_scan(h, oldest, current, ring)
    buckets_drop(key, stale)
    if live > BUCKETS_SUMMED then
      call('HSET', key, 't', used, 'o', (newest % ring) * ring + oldest % ring)
      summed = true
    end
  end
  local free, retry, reset = math.max(count - used, 0), 0, 0
  if newest then
    reset = (newest + 1) * prec + window - now
  end
  if n > count then
    retry = -1
  elseif used + n > count then
    -- only a denial needs the buckets in order
    retry = buckets_retry(h or call('HGETALL', key), count, window, prec, n, now, used, oldest, current, ring)
  end
  return free, retry, reset, summed, newest or false, lo
end

-- buckets_add records n units in the current bucket. The key expires a
-- window after the newest bucket ends: a time that changes only when a
-- bucket starts, so the TTL is set only then (when the bucket's count is
-- n: its field is new, since a refund that empties a bucket deletes it).
local function buckets_add(key, window, prec, n, now, summed, newest, lo)
  local b = math.floor(now / prec)
  local reset = (b + 1) * prec + window - now
  local ring = bucket_ring(window, prec)
  if call('HINCRBY', key, int_arg(b % ring), int_arg(n)) == n then
    expire_us(key, reset)
  end
  if summed then
    call('HINCRBY', key, 't', int_arg(n))
    if newest ~= b then call('HSET', key, 'o', int_arg((b % ring) * ring + lo % ring)) end
  end
  return reset
end

-- Sliding counter: the counts of the previous and the current fixed window
-- (index now / window). The estimate weighs the previous window by the part
-- of it still inside the sliding window:
--   p * (window - elapsed) / window + c
--
-- The state is one string key holding one integer, which Redis stores in
-- the key's object itself (and, below 10000, as a shared integer: no value
-- allocation at all):
--   ((p * COUNTER_RADIX) + c) * 16 + (index of the current window % 16)
-- The key expires at the end of the window after the current one, so a
-- live key's window is the current one, the previous one, or (within the
-- expiry's rounding to a millisecond) the one before: 4 bits tell them
-- apart. Limits with Count >= COUNTER_RADIX, whose counts do not fit, store
-- "<index> <p> <c>" instead. Every number stays below 2^53, exact in Lua.
local COUNTER_RADIX = 4194304 -- 2^22

-- counter_state reads the counter limit of key at now (its value v when
-- given, read already) and returns the
-- current window's index, the previous and the current window's counts,
-- the µs elapsed in the current window, and whether the key holds the
-- integer form of the current window (so that an add can be an INCRBY).
local function counter_state(key, window, now, v)
  local c = math.floor(now / window)
  v = v or call('GET', key)
  local w, prev, cur
  found = v and true or false
  if not v then
    return c, 0, 0, now - c * window, false
  end
  local n = tonumber(v)
  if n then -- the integer form
    local wm = n % 16
    local pc = (n - wm) / 16
    cur = pc % COUNTER_RADIX
    prev = (pc - cur) / COUNTER_RADIX
    w = c - (c - wm) % 16
  else -- the string form
    local sw, sp, sc = string.match(v, '^(%d+) (%d+) (%d+)$')
    w, prev, cur = tonumber(sw), tonumber(sp) or 0, tonumber(sc) or 0
  end
  if w ~= c then
    if w == c - 1 then prev, cur = cur, 0 else prev, cur = 0, 0 end
    return c, prev, cur, now - c * window, false
  end
  return c, prev, cur, now - c * window, n ~= nil
end

-- counter_check checks n units of a counter limit at now (its value v when
-- given: see counter_state) and returns free,
-- retry, reset, then what counter_add takes: the current window's index
-- and counts, and whether an INCRBY records units (see counter_state).
local function counter_check(key, count, window, n, now, v)
  local c, prev, cur, elapsed, incr = counter_state(key, window, now, v)
  -- all in integers: prev*(window-elapsed) + used*window <= count*window
  local weighted = prev * (window - elapsed)
  local free, retry, reset = math.max(math.floor((count * window - weighted - cur * window) / window), 0), 0, 0
  if cur > 0 then
    reset = (c + 2) * window - now
  elseif prev > 0 then
    reset = (c + 1) * window - now
  end
  if n > count then
    retry = -1
  elseif weighted + (cur + n) * window > count * window then
    if cur + n <= count then
      -- later in this window: prev*(window-e) <= (count-n-cur)*window
      local e = window - math.floor((count - n - cur) * window / prev)
      retry = e - elapsed
    else
      -- in the next window, where this one's count is the previous one
      local e = window - math.floor((count - n) * window / cur)
      retry = (c + 1) * window - now + e
    end
  end
  return free, retry, reset, c, prev, cur, incr
end

-- counter_write stores the counts of window c (prev, cur) for a limit of
-- count, with the TTL the state needs: until the end of the window after
-- the newest unit's. A state with no unit left is deleted. It returns the
-- reset: µs until the limit is back to its full Count.
local function counter_write(key, count, window, c, prev, cur, now)
  local reset
  if cur > 0 then
    reset = (c + 2) * window - now
  elseif prev > 0 then
    reset = (c + 1) * window - now
  else
    call('DEL', key)
    return 0
  end
  local v
  if count < COUNTER_RADIX then
    v = ((prev * COUNTER_RADIX) + cur) * 16 + c % 16
  else
    v = string.format('%d %d %d', c, prev, cur)
  end
  call('SET', key, v, 'PX', px_arg(reset))
  return reset
end

-- counter_add records n units in the current window; c, prev, cur and
-- incr are counter_check's, of the same call. A key that holds the current
-- window's integer form already keeps its TTL (the end of the next
-- window), so the units are added to it where it stands: n * 16 adds n to
-- the current count (see counter_state).
local function counter_add(key, count, window, n, now, c, prev, cur, incr)
  if incr and count < COUNTER_RADIX and cur > 0 then
    call('INCRBY', key, int_arg(n * 16))
    return (c + 2) * window - now
  end
  return counter_write(key, count, window, c, prev, cur + n, now)
end

-- Refunds (Limiter.Refund, Rule.CountIf) give back up to n units recorded
-- within the last window, never going below empty, and return how many
-- they gave back. at > 0 names the time the units were recorded (the time
-- of the decision that took them), so that exactly those units go; at = 0
-- gives back the newest units recorded at or before now. Reservations
-- (units in the future) are never refunded.

local function log_refund(key, window, n, now, at)
  local L = log_open(key, window, now)
  log_trim(L, now - window)
  if at > 0 then
    if at <= now - window or at > now then return 0 end
    return log_remove(L, n, at - 1, at, now)
  end
  return log_remove(L, n, now - window, now, now)
end

local function buckets_refund(key, window, prec, n, now, at)
  local oldest = math.floor((now - window) / prec)
  local current, ring = math.floor(now / prec), bucket_ring(window, prec)
  local live = {} -- {index, field, count}, the newest first
  if at > 0 then
    local b = math.floor(at / prec)
    if b < oldest or b > current then return 0 end
    local c = tonumber(call('HGET', key, b % ring) or 0) or 0
    live[1] = {b, b % ring, c}
  else
    local h = call('HGETALL', key)
    for i = 1, #h, 2 do
      local b = bucket_of(h[i], current, ring)
      if b and b >= oldest then live[#live + 1] = {b, h[i], tonumber(h[i + 1])} end
    end
    table.sort(live, function(x, y) return x[1] > y[1] end)
  end
  local given, emptied = 0, false
  for _, e in ipairs(live) do
    if given == n then break end
    local take = math.min(n - given, e[3])
    if take > 0 then
      if take == e[3] then
        call('HDEL', key, e[2])
        emptied = true
      else
        call('HINCRBY', key, e[2], -take)
      end
      given = given + take
    end
  end
  if given > 0 and call('HEXISTS', key, 't') == 1 then
    if emptied then -- the newest or oldest bucket may have gone: counted anew
      call('HDEL', key, 't', 'o')
    else
      call('HINCRBY', key, 't', -given)
    end
  end
  return given
end

local function counter_refund(key, count, window, n, now, at)
  local c, prev, cur = counter_state(key, window, now)
  local from_cur, from_prev = true, true
  if at > 0 then
    local w = math.floor(at / window)
    from_cur, from_prev = w == c, w == c - 1
  end
  local given = 0
  if from_cur then
    given = math.min(n, cur)
    cur = cur - given
  end
  if from_prev then
    local take = math.min(n - given, prev)
    prev, given = prev - take, given + take
  end
  if given > 0 then counter_write(key, count, window, c, prev, cur, now) end
  return given
end

-- A block (Limiter.Block) makes a key exhausted under any limits until a
-- time: its block key holds that time in µs, and expires with it. A later
-- block never shortens an earlier one.

-- blocked_for returns the µs the key stays blocked at now, 0 when it is not.
local function blocked_for(key, now)
  local v = call('GET', key)
  if not v then return 0 end -- not blocked, nearly always
  local untl = tonumber(v) or 0
  if untl > now then return untl - now end
  return 0
end

-- block blocks the key for d µs from now, unless it is blocked longer
-- already, and returns the µs it stays blocked.
local function block(key, d, now)
  local untl = now + d
  local cur = tonumber(call('GET', key) or 0) or 0
  if cur > untl then untl = cur end
  call('SET', key, untl, 'PX', px(untl - now))
  return untl - now
end

-- penalize counts a denial of a key under its Rule's Penalty and, at the
-- Penalty's number of denials within its time, bans the key: the same
-- block as Limiter.Block. The penalty key holds "<end µs> <denials>": the
-- denials counted since the first one, until end (the first one's time
-- plus within); it expires then. Returns the µs of the ban, 0 when none
-- started.
local function penalize(block_key, penalty_key, denials, within, ban, now)
  local v = call('GET', penalty_key)
  local ends, count = 0, 0
  if v then
    local se, sc = string.match(v, '^(%d+) (%d+)$')
    ends, count = tonumber(se) or 0, tonumber(sc) or 0
  end
  if ends <= now then ends, count = now + within, 0 end
  count = count + 1
  if count < denials then
    call('SET', penalty_key, string.format('%d %d', ends, count), 'PX', px(ends - now))
    return 0
  end
  call('DEL', penalty_key)
  return block(block_key, ban, now)
end

-- spec_of returns the spec of a decision (what it asks but its units and
-- time) from the string raw that holds it, its values separated by spaces:
-- commit ('1' records the units when they fit, '0' only looks), the
-- penalty (denials, 0: none; within µs; ban µs), then 4 values per limit:
-- algorithm ('0' log, '1' buckets, '2' counter), count, window µs,
-- precision µs. Decisions that ask alike share one string, and one spec:
-- specs are kept by their string (up to SPECS_KEPT, then forgotten all at
-- once), so that a spec is converted once, not on every call (strings
-- compare as pointers), and a call takes one argument for all of it (each
-- argument costs the call about 0.2 µs, measured: a lone call's ten took
-- 1.5 µs). A string that is no spec is an error.
local specs, nspecs, SPECS_KEPT = {}, 0, 256
local function spec_of(raw)
  local spec = specs[raw]
  if spec then return spec end
  local v = {}
  for x in string.gmatch(raw, '%S+') do v[#v + 1] = tonumber(x) end
  local nlim = (#v - 4) / 4
  if nlim < 1 or nlim % 1 ~= 0 then error({err = 'ERR ratewindow: not a decision spec: ' .. raw}) end
  spec = {commit = v[1] == 1, denials = v[2], within = v[3], ban = v[4], limits = {}}
  for i = 1, nlim do
    local a = 4 * i
    spec.limits[i] = {alg = string.format('%d', v[a + 1]), count = v[a + 2], window = v[a + 3], prec = v[a + 4]}
  end
  if nspecs >= SPECS_KEPT then specs, nspecs = {}, 0 end
  specs[raw], nspecs = spec, nspecs + 1
  return spec
end

-- read_specs reads the specs of a merged call (allow_batch.lua's ARGV),
-- and returns them and the index of the first decision's arguments.
local batch_specs = {}
local function read_specs(args)
  local m = tonumber(args[2])
  for i = 1, m do batch_specs[i] = spec_of(args[2 + i]) end
  for i = #batch_specs, m + 1, -1 do batch_specs[i] = nil end
  return batch_specs, 3 + m
end

-- The state of each limit during a decision (see decide), reused from
-- decision to decision of one script call: STATE values per limit in st,
-- free, retry, reset, then up to four values of its check for its add; and
-- per log limit, its log's table in logs (see log_open).
local STATE = 7
local st, logs = {}, {}

-- fresh_add records units at now under limit l (alg '0', a log, or '2',
-- a counter) of key, as log_add or counter_add would on a missing key,
-- but only if the key is missing (SET NX), and returns the limit's reset;
-- false when the key holds a value (nothing written) or the units are too
-- many for a fresh log.
local function fresh_add(alg, key, l, units, now)
  local window = l.window
  if alg == '0' then
    local v = fresh_log(now, units)
    return v and call('SET', key, v, 'PX', px_arg(window), 'NX') and window
  end
  local c = math.floor(now / window)
  local reset = (c + 2) * window - now
  local v
  if l.count < COUNTER_RADIX then
    v = int_arg(units * 16 + c % 16)
  else
    v = string.format('%d %d %d', c, 0, units)
  end
  return call('SET', key, v, 'PX', px_arg(reset), 'NX') and reset
end

-- decide decides whether n units fit under every limit of spec (see
-- read_spec) for one key at now and, when they do and the spec commits,
-- records them under every limit: all or none. The decision's keys start
-- at keys[first]: the key's block key, then its penalty key when it has a
-- penalty, then the storage keys of the limits. A blocked key is denied
-- under every limit, with a retry and reset of at least the block's time
-- left, and nothing recorded.
--
-- A committed denial of a key that is not blocked counts towards its
-- penalty; the denial that reaches it bans the key (see penalize), and its
-- retry and reset are the ban's.
--
-- It writes its answer into out, after out[at]: allowed (1 or 0), blocked
-- (0: no, 1: the key is blocked, 2: this denial banned it), now, then per
-- limit: remaining, retry µs, reset µs. remaining counts after the units
-- were recorded; retry is 0 for a limit that admits, -1 for one that never
-- can.
--
-- runs is how many such decisions come one after another (a hot key's in
-- one merged call: the same keys, spec, n >= 1 and now; a spec without
-- penalty). decide answers as many of them as one check can, each as if
-- made alone in turn, and returns the index of its last value and how
-- many it answered:
--   admitted  at the same now, a decision fits iff n <= free under every
--             limit (for every algorithm), and its units lower each free
--             by exactly n; so the first k = min(runs, min free / n) fit,
--             and their k * n units are recorded at once, in one add per
--             limit. The answers differ only in remaining. The decision
--             after them is checked anew (the caller calls again).
--   denied    a denial without penalty writes nothing that a check reads
--             (dropping what has left changes no count), so every
--             decision of the run is denied alike: all are answered.
local function decide(keys, first, n, now, spec, out, at, runs)
  local commit, denials, limits = spec.commit, spec.denials, spec.limits
  local lk = first -- the key of limit i is keys[lk + i]
  if denials > 0 then lk = first + 1 end
  local blocked = blocked_for(keys[first], now)
  local nlim = #limits
  if nlim == 1 and commit and denials == 0 and blocked == 0 then
    local l = limits[1]
    local alg, count = l.alg, l.count
    if alg ~= '1' and fresh_hint[alg] >= FRESH_AFTER and n <= count then
      -- expected missing: on an empty limit the first min(runs, count / n)
      -- decisions fit (see below), their units written with NX
      local k = runs
      if k > 1 then k = math.min(k, math.floor(count / n)) end
      local reset = fresh_add(alg, keys[lk + 1], l, k * n, now)
      if reset then
        local free = count - n
        out[at + 1], out[at + 2], out[at + 3], out[at + 4], out[at + 5], out[at + 6] = 1, 0, now, free, 0, reset
        at = at + 6
        for _ = 2, k do
          free = free - n
          out[at + 1], out[at + 2], out[at + 3], out[at + 4], out[at + 5], out[at + 6] = 1, 0, now, free, 0, reset
          at = at + 6
        end
        return at, k
      end
      -- not missing: decided as any other (which counts it as found)
    end
  end
  local allowed = blocked == 0
  for i = 1, nlim do
    local l, j = limits[i], (i - 1) * STATE
    local key, alg = keys[lk + i], l.alg
    if alg == '0' then
      st[j + 1], st[j + 2], st[j + 3], st[j + 4], st[j + 5] = log_check(key, l.count, l.window, n, now, logs[i])
      logs[i] = st[j + 5]
    elseif alg == '1' then
      st[j + 1], st[j + 2], st[j + 3], st[j + 4], st[j + 5], st[j + 6] = buckets_check(key, l.count, l.window, l.prec, n, now)
    else
      st[j + 1], st[j + 2], st[j + 3], st[j + 4], st[j + 5], st[j + 6], st[j + 7] =
        counter_check(key, l.count, l.window, n, now)
    end
    if st[j + 2] ~= 0 then allowed = false end
  end
  if nlim == 1 then learn(limits[1].alg, found) end

  local status = 0
  if blocked > 0 then
    status = 1
  elseif not allowed and commit and denials > 0 then
    blocked = penalize(keys[first], keys[first + 1], denials, spec.within, spec.ban, now)
    if blocked > 0 then status = 2 end
  end

  -- the decisions answered: k admitted, or all denied (see above)
  local k = runs
  if allowed and commit and runs > 1 then
    for i = 1, #limits do
      local fit = math.floor(st[(i - 1) * STATE + 1] / n)
      if fit < k then k = fit end
    end
    if k < 1 then k = 1 end -- it fits (its check says so)
  end
  local units = k * n -- what an admission records
  local first_at = at
  out[at + 1], out[at + 2], out[at + 3] = allowed and 1 or 0, status, now
  at = at + 3
  for i = 1, #limits do
    local l, j = limits[i], (i - 1) * STATE
    local key, alg = keys[lk + i], l.alg
    local free, retry, reset = st[j + 1], st[j + 2], st[j + 3]
    if allowed and commit then
      if alg == '0' then
        reset = log_add(l.window, units, now, now, st[j + 5], st[j + 4])
      elseif alg == '1' then
        reset = buckets_add(key, l.window, l.prec, units, now, st[j + 4], st[j + 5], st[j + 6])
      else
        reset = counter_add(key, l.count, l.window, units, now, st[j + 4], st[j + 5], st[j + 6], st[j + 7])
      end
      free = free - n
    end
    if blocked > 0 then
      free = 0
      if retry >= 0 and retry < blocked then retry = blocked end
      if reset < blocked then reset = blocked end
    end
    out[at + 1], out[at + 2], out[at + 3] = free, retry, reset
    at = at + 3
  end
  -- the others of the run: the same answer, but for what remains after
  -- each admitted one
  local size = at - first_at
  for d = 2, k do
    for i = 1, size do out[at + i] = out[at + i - size] end
    if allowed and commit then
      for i = 1, #limits do
        local r = at + 3 + 3 * i - 2
        out[r] = out[r] - n
      end
    end
    at = at + size
  end
  return at, k
end

-- allow_lone is allow.lua: one decision, of keys and args (its KEYS and
-- ARGV), whose answer it returns. Its spec and answer are tables kept from
-- call to call (in the function library, which lives on), so that a lone
-- call allocates no table of its own; Redis turns the answer into its
-- reply as the call returns.
local lone_out = {}
local function allow_lone(keys, args, now)
  local last = decide(keys, 1, tonumber(args[2]), now or now_us(args[3]), spec_of(args[1]), lone_out, 0, 1)
  for i = #lone_out, last + 1, -1 do lone_out[i] = nil end
  return lone_out
end

-- allow_one is allow.lua: the usual decision, of one log or counter limit
-- without penalty, made with the least work that answers as allow_lone
-- would (measured: the decision framework's tables, specs and checks cost
-- more than the commands inside the call); any other decision is
-- allow_lone's. Three calls in all: TIME, the reads, the write. While keys
-- are found missing (see fresh_hint) it reads the block key alone and
-- writes the units with NX, as fresh_add; else it reads the block key and
-- the limit's key in one MGET. It hands to allow_lone (with the key's value
-- read, for a log: see pre_key) what it does not take itself: a block key
-- (blocked, or about to expire), a counter in the string form, a log that
-- is not compact (a ring: kept in rings, up to RINGS_KEPT of them, whose
-- decisions then go to allow_lone at once, as those of a paged log, not to
-- read a whole ring again) or holds reservations, and a key that is not a
-- string (MGET answers nil for it: SET NX finds it there). One buckets
-- limit is buckets_one's while keys are found missing, else allow_lone's.
local rings, nrings, RINGS_KEPT = {}, 0, 1024

-- lone_answer returns allow.lua's reply of a decision of one limit that
-- is not blocked (see decide).
local function lone_answer(allowed, now, free, retry, reset)
  local out = lone_out
  out[1], out[2], out[3], out[4], out[5], out[6] = allowed and 1 or 0, 0, now, free, retry, reset
  for i = #out, 7, -1 do out[i] = nil end
  return out
end

-- buckets_one is allow_one for one buckets limit l while keys are found
-- missing lately (see fresh_hint): as buckets_check reads the hash then,
-- whole, and decide then adds, but without the decision framework. A
-- blocked key, and a hash that keeps a sum or would start one (more than
-- BUCKETS_SUMMED live buckets), are allow_lone's.
local function buckets_one(keys, args, l, n, commit, now)
  if call('GET', keys[1]) then return allow_lone(keys, args, now) end
  local key, count, window, prec = keys[2], l.count, l.window, l.prec
  local h = call('HGETALL', key) -- WRONGTYPE for a key that is not a hash, as buckets_check
  local oldest = math.floor((now - window) / prec) -- older buckets have left
  local current, ring = math.floor(now / prec), bucket_ring(window, prec)
  local used, live, newest, stale, odd = buckets_scan(h, oldest, current, ring)
  if odd or live > BUCKETS_SUMMED then return allow_lone(keys, args, now) end -- a sum, or one to start
  learn('1', #h > 0) -- as decide
  buckets_drop(key, stale)
  local free, retry, reset = math.max(count - used, 0), 0, 0
  if newest then reset = (newest + 1) * prec + window - now end
  if n > count then
    retry = -1
  elseif used + n > count then
    retry = buckets_retry(h, count, window, prec, n, now, used, oldest, current, ring)
  end
  if retry == 0 and commit then
    reset = buckets_add(key, window, prec, n, now, false, newest or false, oldest)
    free = free - n
  end
  return lone_answer(retry == 0, now, free, retry, reset)
end

local function allow_one(keys, args)
  local spec, key = spec_of(args[1]), keys[2]
  local l = spec.limits[1]
  local alg, count, window = l.alg, l.count, l.window
  if spec.denials > 0 or spec.limits[2] or key == paged_key or rings[key] or
      (alg == '1' and fresh_hint['1'] < FRESH_AFTER) or (alg == '2' and count >= COUNTER_RADIX) then
    return allow_lone(keys, args)
  end
  local n, commit = tonumber(args[2]), spec.commit
  local now = now_us(args[3])
  if alg == '1' then return buckets_one(keys, args, l, n, commit, now) end
  local v = false
  if fresh_hint[alg] >= FRESH_AFTER and commit and n <= count then
    -- keys found missing lately (see fresh_hint): the block key read
    -- alone (MGET would look the limit's key up twice) and the units
    -- written with NX, as on an empty limit
    if call('GET', keys[1]) then return allow_lone(keys, args, now) end
    local reset = fresh_add(alg, key, l, n, now)
    if reset then
      learn(alg, false)
      return lone_answer(true, now, count - n, 0, reset)
    end
    learn(alg, true)
    -- found: a log is allow_lone's (which reads it as log_open does)
    if alg == '0' then return allow_lone(keys, args, now) end
    v = call('GET', key) -- WRONGTYPE for a key that is not a string, as counter_state
  else
    local r = call('MGET', keys[1], key)
    v = r[2]
    learn(alg, v)
    if r[1] then
      if alg == '0' and v then pre_key, pre_v = key, v end
      return allow_lone(keys, args, now)
    end
    if not v then -- missing, or not a string (SET NX finds it)
      local reset = commit and n <= count and fresh_add(alg, key, l, n, now)
      if not reset then return allow_lone(keys, args, now) end
      return lone_answer(true, now, count - n, 0, reset)
    end
  end
  if alg == '2' then
    local free, retry, reset, c, prev, cur, incr = counter_check(key, count, window, n, now, v)
    if retry == 0 and commit then
      reset = counter_add(key, count, window, n, now, c, prev, cur, incr)
      free = free - n
    end
    return lone_answer(retry == 0, now, free, retry, reset)
  end
  local f, len = byte(v, 1), #v
  local w = (f or 0) % 16
  if len < 8 or w < 1 or w > 7 or f >= 16 or (len - 8) % w ~= 0 then
    if f and f >= 16 and not rings[key] then
      if nrings >= RINGS_KEPT then rings, nrings = {}, 0 end
      rings[key], nrings = true, nrings + 1
    end
    pre_key, pre_v = key, v
    return allow_lone(keys, args, now) -- a ring, or not a log
  end
  -- as log_open, log_trim and log_check on a compact log
  local base, used = uint(v, 2, 7), (len - 8) / w
  local oldest = now - window
  local lo = 1 -- the first unit that counts (see log_trim)
  if used > 0 and base + uint(v, 9, w) <= oldest then
    local gone, live = 1, used + 1
    while live - gone > 1 do
      local m = math.floor((gone + live) / 2)
      if base + uint(v, 9 + (m - 1) * w, w) <= oldest then gone = m else live = m end
    end
    lo = live
  end
  local units = used - lo + 1
  local newest = units > 0 and base + uint(v, 9 + (used - 1) * w, w)
  local free, retry, reset = math.max(count - units, 0), 0, 0
  if newest then reset = newest + window - now end
  local k = count - n + 1
  if k <= 0 then
    retry = -1
  elseif units >= k then
    retry = base + uint(v, 9 + (used - k) * w, w) + window - now
  end
  if retry == 0 and commit then
    local off = now - base
    local nv
    if units == 0 then
      nv = fresh_log(now, n)
    elseif newest > now then -- reservations: nv stays nil
    elseif off < 256 ^ w and 8 + (units + n) * w <= LOG_WHOLE then
      if lo == 1 then
        nv = v .. string.rep(uint_bytes(off, w), n)
      else
        nv = string.sub(v, 1, 8) .. string.sub(v, 9 + (lo - 1) * w) .. string.rep(uint_bytes(off, w), n)
      end
    else -- written anew, as log_store: its oldest unit the base, offsets as narrow as now allows
      local b2 = base + uint(v, 9 + (lo - 1) * w, w)
      local w2 = width(now - b2)
      if 8 + (units + n) * w2 <= LOG_WHOLE then
        local parts = {string.char(w2) .. uint_bytes(b2, 7)}
        for i = 9 + (lo - 1) * w, len, w do parts[#parts + 1] = uint_bytes(base + uint(v, i, w) - b2, w2) end
        parts[#parts + 1] = string.rep(uint_bytes(now - b2, w2), n)
        nv = table.concat(parts)
      end
    end
    if not nv then -- reservations, or too long to be compact
      pre_key, pre_v = key, v
      return allow_lone(keys, args, now)
    end
    call('SET', key, nv, 'PX', px_arg(window))
    free, reset = free - n, window
  end
  return lone_answer(retry == 0, now, free, retry, reset)
end
