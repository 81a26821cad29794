-- GCRA steps on any number of keys, atomically: the Lua twin of
-- algorithms.Limit (Decide, Refund, Peek, Charge). tests/store_test.go runs
-- both on the same table of cases, one key per call and all in one call, and
-- requires identical results, stored TAT and TTL.
--
-- One call decides a whole batch: one dispatch, one TIME, one reply. On
-- Redis Cluster every key of a call is in one hash slot (the batcher groups
-- them so). A key may appear more than once; its steps apply in order.
--
-- KEYS[i]        the i-th key; its value is the TAT in integer microseconds
-- ARGV[1]        now in microseconds, or "" to use Redis TIME (production:
--                the server's clock is the only clock, so instances need
--                not agree)
-- ARGV[4i-2..4i+1]  the i-th key's step:
--   T     emission interval in microseconds (>= 1)
--   B     burst in units of cost (>= 1)
--   cost
--   op    "d" decide, "r" refund, "p" peek, "c" charge (after the
--         response: the TAT moves on by cost*T whatever the burst, and the
--         key is reported as peek would report it afterwards)
--
-- Returns 4 integers per key, flat: {allowed (0|1), remaining,
-- retry_after_us, reset_after_us}. allowed is -1 when the key held a value
-- of another type and -2 when it held a string that is not a TAT: a value
-- tally did not write, deleted instead of decided on (left alone it would
-- deny the key forever or, read as 0, admit it forever, with no TTL). The
-- next step starts the key fresh. Reporting it per key keeps one planted
-- value from failing the other keys of the batch.
--
-- Lua numbers are doubles. Microseconds since the epoch and every sum below
-- stay under 2^53, so all values are exact integers; divisions go through
-- idiv, and numbers are written with '%d' because redis.call would format
-- them with '%.14g' and lose digits.

local floor, format, tonumber = math.floor, string.format, tonumber

local function idiv(a, b) -- floor(a / b) for a >= 0, b > 0, exactly
  local q = floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

local function store(key, tat, now) -- write tat with a TTL of its resetAfter, rounded up to ms
  local ms = idiv(tat - now, 1000)
  if ms * 1000 < tat - now then ms = ms + 1 end
  if ms < 1 then ms = 1 end
  redis.call('SET', key, format('%d', tat), 'PX', format('%d', ms))
end

-- step returns the four reply values of one key's step.
local function step(key, T, B, cost, op, now)
  local raw = redis.pcall('GET', key)
  local tat = 0
  if type(raw) == 'table' then -- an error: WRONGTYPE
    redis.call('DEL', key)
    return -1, 0, 0, 0
  elseif raw then
    tat = tonumber(raw)
    if not tat then
      redis.call('DEL', key)
      return -2, 0, 0, 0
    end
  end

  if op == 'r' then
    tat = tat - cost * T
    if tat <= now then
      redis.call('DEL', key)
      return 1, 0, 0, 0
    end
    store(key, tat, now)
    return 1, 0, 0, tat - now
  end

  if tat < now then tat = now end
  if op == 'c' then
    local cap = now + 2 * B * T -- the debt cap of algorithms.Limit.Charge
    if tat > cap then cap = tat end
    tat = tat + cost * T
    if tat > cap then tat = cap end
    if tat > now then store(key, tat, now) else redis.call('DEL', key) end
    op = 'p'
  end
  if op == 'p' then cost = 1 end
  local newTAT = tat + cost * T
  local allowAt = newTAT - B * T
  if allowAt > now then
    return 0, 0, allowAt - now, tat - now
  end
  if op == 'p' then
    return 1, idiv(now - allowAt, T) + 1, 0, tat - now
  end
  store(key, newTAT, now)
  return 1, idiv(now - allowAt, T), 0, newTAT - now
end

local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local out = {}
for i = 1, #KEYS do
  local a, j = 4 * i - 2, 4 * i - 3
  out[j], out[j + 1], out[j + 2], out[j + 3] =
    step(KEYS[i], tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), ARGV[a + 3], now)
end
return out
