-- One GCRA step on one key, atomically: the Lua twin of algorithms.Limit
-- (Decide, Refund, Peek, Charge). tests/store_test.go runs both on the same table of
-- cases and requires identical results, stored TAT and TTL.
--
-- KEYS[1]  the key; its value is the TAT in integer microseconds
-- ARGV[1]  T, emission interval in microseconds (>= 1)
-- ARGV[2]  B, burst in units of cost (>= 1)
-- ARGV[3]  cost
-- ARGV[4]  op: "d" decide, "r" refund, "p" peek, "c" charge (after the
--          response: the TAT moves on by cost*T whatever the burst, and the
--          key is reported as peek would report it afterwards)
-- ARGV[5]  now in microseconds, or "" to use Redis TIME (production: the
--          server's clock is the only clock, so instances need not agree)
--
-- Returns {allowed (0|1), remaining, retry_after_us, reset_after_us}.
--
-- Lua numbers are doubles. Microseconds since the epoch and every sum below
-- stay under 2^53, so all values are exact integers; divisions go through
-- idiv, and numbers are written with '%d' because redis.call would format
-- them with '%.14g' and lose digits.

local function idiv(a, b) -- floor(a / b) for a >= 0, b > 0, exactly
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

local function store(key, tat, now) -- write tat with a TTL of its resetAfter, rounded up to ms
  local ms = idiv(tat - now, 1000)
  if ms * 1000 < tat - now then ms = ms + 1 end
  if ms < 1 then ms = 1 end
  redis.call('SET', key, string.format('%d', tat), 'PX', string.format('%d', ms))
end

local key = KEYS[1]
local T = tonumber(ARGV[1])
local B = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local op = ARGV[4]
local now = tonumber(ARGV[5])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- A value tally did not write (another type, or a string that is not a
-- number) is deleted and reported instead of decided on: left alone it would
-- deny the key forever or, read as 0, admit it forever, with no TTL. The
-- next decision starts the key fresh.
local raw = redis.pcall('GET', key)
local tat = 0
if type(raw) == 'table' and raw.err then
  redis.call('DEL', key)
  return redis.error_reply('TALLYFOREIGN a value of another type was at a tally key; deleted')
elseif raw then
  tat = tonumber(raw)
  if not tat then
    redis.call('DEL', key)
    return redis.error_reply('TALLYFOREIGN a value that is not a TAT was at a tally key; deleted')
  end
end

if op == 'r' then
  tat = tat - cost * T
  if tat <= now then
    redis.call('DEL', key)
    return {1, 0, 0, 0}
  end
  store(key, tat, now)
  return {1, 0, 0, tat - now}
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
  return {0, 0, allowAt - now, tat - now}
end
if op == 'p' then
  return {1, idiv(now - allowAt, T) + 1, 0, tat - now}
end
store(key, newTAT, now)
return {1, idiv(now - allowAt, T), 0, newTAT - now}
