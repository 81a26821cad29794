-- overrides.lua: puts (or, with ARGV[2] = "", deletes) one override of a
-- zone in its hash KEYS[1], atomically with the zone's bound, the purge of
-- expired overrides, the version and the TTL.
--
-- The hash holds "v", the version (Redis TIME in microseconds, strictly
-- increasing), and "o:<id>" = "<expires Unix ms, 0 for never>|<record>".
-- ARGV: id, record ("" deletes), expires ms, the most overrides a zone
-- holds, the TTL (ms) of a hash whose overrides never expire.
-- Reply: the new version; -1 when the zone is full; 0 when a delete found
-- nothing.
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)
local field = 'o:' .. ARGV[1]
local all = redis.call('HGETALL', KEYS[1])
local n, latest, forever, found = 0, 0, false, false
for i = 1, #all, 2 do
  local f = all[i]
  if string.sub(f, 1, 2) == 'o:' then
    local e = tonumber(string.match(all[i + 1], '^(%d+)|')) or 0
    if e > 0 and e <= now then
      redis.call('HDEL', KEYS[1], f)
    elseif f == field then
      found = true
    else
      n = n + 1
      if e == 0 then forever = true elseif e > latest then latest = e end
    end
  end
end
if ARGV[2] == '' then
  if not found then return 0 end
  redis.call('HDEL', KEYS[1], field)
else
  if n >= tonumber(ARGV[4]) then return -1 end
  redis.call('HSET', KEYS[1], field, ARGV[3] .. '|' .. ARGV[2])
  n = n + 1
  local e = tonumber(ARGV[3])
  if e == 0 then forever = true elseif e > latest then latest = e end
end
local v = math.max(now_us, (tonumber(redis.call('HGET', KEYS[1], 'v')) or 0) + 1)
redis.call('HSET', KEYS[1], 'v', v)
if n == 0 then
  redis.call('PEXPIRE', KEYS[1], 60000) -- the version outlives the last override a while
elseif forever then
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
else
  redis.call('PEXPIREAT', KEYS[1], latest + 60000)
end
return v
