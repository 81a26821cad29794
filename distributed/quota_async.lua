-- Async mode's calendar quota, one instance and one key, atomically: the
-- instance reports what it used of the period and takes a lease, units it
-- may then admit on its own (docs/async.md). Its count is quota.lua's, in
-- the period chosen the same way.
--
-- KEYS[1]  the key: a hash {e = the period's end in µs, u = units counted
--          in it: what instances used plus the leases they hold,
--          g:<instance> = what one instance holds: its used and its lease}
-- ARGV[1]  now in µs, or "" for Redis TIME
-- ARGV[2]  bounds "b0 b1 b2 b3" (see quota.lua)
-- ARGV[3]  limit: units per period
-- ARGV[4]  the instance id
-- ARGV[5]  the end (µs) of the period the report is about: a report about
--          another period than now's counts nothing of what it says
-- ARGV[6]  used: units the instance admitted in that period, or -1 when it
--          does not know (a new record, or one it forgot): then what Redis
--          holds for it counts as used, leases included, so that forgetting
--          a record can only lose units, never admit them twice
-- ARGV[7]  extra: units to add to that -1's used (charges counted before
--          the instance knew its use)
-- ARGV[8]  keep: the lease the instance keeps spending while this call is
--          in flight (what it counts on is never taken away)
-- ARGV[9]  want: units more it asks for; it gets at most its fair share of
--          what is left, ⌈left/N⌉, and nothing beyond the limit. 0 hands
--          back all but keep.
-- ARGV[10] N, live instances (>= 1)
--
-- Returns {held, used, counted, to_end_us, period}: what Redis now counts
-- for the instance (used + its lease), the used it took, the units counted
-- for the period fleet-wide, and the period (0, 1, 2) of the bounds. As in
-- quota.lua, period -1 is a now outside the bounds (to_end_us is then
-- now), -2 and -3 a value tally did not write, deleted.
--
-- Per-report figures are absolute, not deltas: a report whose reply was
-- lost and that is sent again (or superseded) replaces what the instance
-- holds instead of adding to it, so no sequence numbers are needed.

local floor, format, find, sub, tonumber = math.floor, string.format, string.find, string.sub, tonumber

local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local key, b = KEYS[1], ARGV[2]
local p1 = find(b, ' ', 1, true)
local p2 = find(b, ' ', p1 + 1, true)
local p3 = find(b, ' ', p2 + 1, true)
local e1, e2, e3 = sub(b, p1 + 1, p2 - 1), sub(b, p2 + 1, p3 - 1), sub(b, p3 + 1)
local period, ends
if now < tonumber(sub(b, 1, p1 - 1)) or now >= tonumber(e3) then
  return {0, 0, 0, now, -1}
elseif now < tonumber(e1) then
  period, ends = 0, e1
elseif now < tonumber(e2) then
  period, ends = 1, e2
else
  period, ends = 2, e3
end
local endAt = tonumber(ends)

local L, mine = tonumber(ARGV[3]), 'g:' .. ARGV[4]
local h = redis.pcall('HMGET', key, 'e', 'u', mine)
if h.err then
  redis.call('DEL', key)
  return {0, 0, 0, 0, -2}
end
local counted, old = 0, 0
local same = h[1] == ends
if same then
  counted, old = tonumber(h[2]), tonumber(h[3] or '0')
  if not counted or not old then
    redis.call('DEL', key)
    return {0, 0, 0, 0, -3}
  end
elseif h[1] and not tonumber(h[1]) then
  redis.call('DEL', key)
  return {0, 0, 0, 0, -3}
end

local used, keep = tonumber(ARGV[6]), tonumber(ARGV[8])
if ARGV[5] ~= ends then
  used, keep = old, 0 -- about another period: nothing of it counts here
elseif used < 0 then
  used = old + tonumber(ARGV[7])
end
local others = counted - old
local base = used + keep
local room = L - others - base
local grant, want, N = 0, tonumber(ARGV[9]), tonumber(ARGV[10])
if want > 0 and room > 0 then
  local fair = floor((room + N - 1) / N) -- ⌈room/N⌉, exactly:
  if fair * N < room then fair = fair + 1 elseif (fair - 1) * N >= room then fair = fair - 1 end
  grant = math.min(want, fair, room)
end
local held = base + grant
counted = others + held

if not same then
  if h[1] then redis.call('DEL', key) end -- an earlier period's count and leases
  if held > 0 then
    redis.call('HSET', key, 'e', ends, 'u', format('%d', counted), mine, format('%d', held))
    redis.call('PEXPIREAT', key, format('%d', floor(endAt / 1000)))
  end
elseif held ~= old then
  if held > 0 then
    redis.call('HSET', key, 'u', format('%d', counted), mine, format('%d', held))
  else
    redis.call('HSET', key, 'u', format('%d', counted))
    redis.call('HDEL', key, mine)
  end
end
return {held, used, counted, endAt - now, period}
