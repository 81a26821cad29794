-- Calendar quota steps on any number of keys, atomically: the Lua twin of
-- algorithms.Quota (Decide, Refund, Check, Charge), in the period that
-- contains now; tests/store_test.go requires identical results, counts and
-- TTLs of both. One call decides a batch, of one hash slot on a Cluster; a
-- key's steps apply in order. Lua cannot do time zones: the caller sends
-- its clock's period and both neighbours, and the script picks the one
-- that contains now, so Redis TIME alone decides when a period ends.
--
-- KEYS[i]   the i-th key: a hash {e = the end of the period it counts, in
--           µs, u = units used in it}; async mode's leases (quota_async.lua)
--           add fields g:<instance>. It expires at the period's end
--           (PEXPIREAT, set when the period's count starts): the period in
--           the value, not the TTL, says what it counts.
-- ARGV[1]   now in microseconds, or "" to use Redis TIME (production)
-- ARGV[4i-2..4i+1]  the i-th key's step:
--   bounds  "b0 b1 b2 b3", µs: the previous period [b0, b1), the current
--           [b1, b2) and the next [b2, b3)
--   limit   units per period (>= 0)
--   cost
--   op      "d" decide, "r" refund, "p" check (also the admin API's
--           read), "c" charge (after the response: counted from at most the
--           limit, so a key ends a period in debt by at most one charge)
--
-- Returns 3 integers per key, flat: {u, to_end_us, period}. u >= 0: allowed,
-- u units used after the step; u < 0: denied, -u - 1 used. period is 0, 1
-- or 2, the bounds' period now is in; -1 when now is in none of them, an
-- error for that key that counts nothing (to_end_us is then now, for the
-- caller to follow Redis's clock); -2 when the key held a value of another
-- type and -3 a hash tally did not write: deleted instead of decided on.
--
-- Shaped as gcra.lua: a step is HMGET and, when it counts something, HSET;
-- a period's first write also DELs a stale count (and its leases) and sets
-- the expiry.

local floor, format, find, sub, tonumber = math.floor, string.format, string.find, string.sub, tonumber

local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local out = {0, 0, 0}
local sBounds, period, ends, endAt, pexpire -- the last bounds parsed: now's period, its end (string, number), PEXPIREAT
local sL, L, sC, cost
for i = 1, #KEYS do
  local key, a, j = KEYS[i], 4 * i - 2, 3 * i - 2
  local b = ARGV[a]
  if b ~= sBounds then
    sBounds = b
    local p1 = find(b, ' ', 1, true)
    local p2 = find(b, ' ', p1 + 1, true)
    local p3 = find(b, ' ', p2 + 1, true)
    local e1, e2, e3 = sub(b, p1 + 1, p2 - 1), sub(b, p2 + 1, p3 - 1), sub(b, p3 + 1)
    if now < tonumber(sub(b, 1, p1 - 1)) or now >= tonumber(e3) then
      period = -1
    elseif now < tonumber(e1) then
      period, ends = 0, e1
    elseif now < tonumber(e2) then
      period, ends = 1, e2
    else
      period, ends = 2, e3
    end
    if period >= 0 then
      endAt = tonumber(ends)
      pexpire = format('%d', floor(endAt / 1000)) -- bounds are whole seconds: exact
    end
  end
  if ARGV[a + 1] ~= sL then sL = ARGV[a + 1]; L = tonumber(sL) end
  if ARGV[a + 2] ~= sC then sC = ARGV[a + 2]; cost = tonumber(sC) end
  local op = ARGV[a + 3]
  if period < 0 then
    out[j], out[j + 1], out[j + 2] = 0, now, -1
  else
    local h = redis.pcall('HMGET', key, 'e', 'u')
    local used, fresh, bad = 0, true, nil
    if h.err then
      bad = -2
    elseif h[1] == ends then
      used, fresh = tonumber(h[2]), false
      if not used then bad = -3 end
    elseif h[1] and not tonumber(h[1]) then
      bad = -3
    end
    if bad then
      redis.call('DEL', key)
      out[j], out[j + 1], out[j + 2] = 0, 0, bad
    else
      local r, write -- the reply's u (negative: denied), the count to store
      if op == 'd' then
        local n = used + cost
        if n <= L then
          r = n
          if n ~= used then write = n end
        else
          r = -used - 1
        end
      elseif op == 'c' then
        local n = used
        if n > L then n = L end
        n = n + cost
        if n ~= used then write = n end
        if n < L then r = n else r = -n - 1 end
      elseif op == 'r' then
        local n = used - cost
        if n < 0 then n = 0 end
        r = n
        if n ~= used then write = n end
      else
        if used < L then r = used else r = -used - 1 end
      end
      if write then
        if fresh then
          if h[1] then redis.call('DEL', key) end -- an earlier period's count
          redis.call('HSET', key, 'e', ends, 'u', format('%d', write))
          redis.call('PEXPIREAT', key, pexpire)
        else
          redis.call('HSET', key, 'u', format('%d', write))
        end
      end
      out[j], out[j + 1], out[j + 2] = r, endAt - now, period
    end
  end
end
return out
