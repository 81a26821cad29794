-- overrides.lua: one change of a zone's overrides in its hash KEYS[1]:
-- put one, delete one, or restore an instance's copies of those the store
-- lost. A change writes one record and one entry of the change log, so
-- that each instance reads back only what changed (overrides_read.lua).
--
-- The hash holds "e", its epoch (Redis TIME in µs when it was created: a
-- new epoch tells the instances that the store lost what they read), "v",
-- the version (one more per change), "n", the number of overrides,
-- "o:<id>" = "<expires Unix ms, 0 for never>|<version>|<record>", and the
-- change log, a ring of 1024 entries "l:<version % 1024>" = "<version>|<id>".
--
-- ARGV: op ("put", "del" or "restore"), the most overrides a zone holds,
-- the TTL (ms) of a hash whose overrides never expire, then for put and
-- restore triples of id, expires ms, record (del: the id).
-- Reply: put: the new version, -1 when the zone is full; del: the new
-- version, 0 when it found nothing; restore: how many it wrote.
local key, op, most, forever = KEYS[1], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)
if op ~= 'del' and redis.call('EXISTS', key) == 0 then
  redis.call('HSET', key, 'e', now_us, 'v', 0, 'n', 0)
end

-- logged records the change of id and returns its version.
local function logged(id)
  local v = redis.call('HINCRBY', key, 'v', 1)
  redis.call('HSET', key, 'l:' .. (v % 1024), v .. '|' .. id)
  return v
end

-- last renews the hash's TTL to outlive an override expiring at e (ms).
local function last(e)
  local want = forever
  if e > 0 then want = e - now + 60000 end
  if redis.call('PTTL', key) < want then redis.call('PEXPIRE', key, want) end
end

-- purge drops the lapsed overrides and recounts: only a full zone pays
-- for a scan.
local function purge()
  local all, n = redis.call('HGETALL', key), 0
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 2) == 'o:' then
      local e = tonumber(string.match(all[i + 1], '^(%d+)|')) or 0
      if e > 0 and e <= now then redis.call('HDEL', key, all[i]) else n = n + 1 end
    end
  end
  redis.call('HSET', key, 'n', n)
  return n
end

-- put writes id's record (when absent, unless replace) and returns its
-- version, 0 when it wrote nothing, -1 when the zone is full.
local function put(id, e, rec, replace)
  local field = 'o:' .. id
  local had = redis.call('HEXISTS', key, field) == 1
  if had and not replace then return 0 end
  if not had and tonumber(redis.call('HGET', key, 'n') or 0) >= most and purge() >= most then return -1 end
  local v = logged(id)
  redis.call('HSET', key, field, e .. '|' .. v .. '|' .. rec)
  if not had then redis.call('HINCRBY', key, 'n', 1) end
  last(tonumber(e))
  return v
end

if op == 'del' then
  if redis.call('HDEL', key, 'o:' .. ARGV[4]) == 0 then return 0 end
  redis.call('HINCRBY', key, 'n', -1)
  return logged(ARGV[4])
elseif op == 'put' then
  return put(ARGV[4], ARGV[5], ARGV[6], true)
end
local wrote = 0
for i = 4, #ARGV, 3 do
  if put(ARGV[i], ARGV[i + 1], ARGV[i + 2], false) > 0 then wrote = wrote + 1 end
end
return wrote
