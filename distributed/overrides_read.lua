-- overrides_read.lua: what changed in a zone's overrides (the hash
-- KEYS[1], see overrides.lua) since an instance's epoch ARGV[1] and
-- version ARGV[2]: {epoch, version} followed by id, stored value ("" when
-- removed) for each override changed since, in the order of the changes;
-- {epoch, version, "all"} when the instance must read the whole hash (it
-- read another epoch, or fell more than the log's 1024 changes behind);
-- {"", "0"} when the store holds none. Numbers are sent as strings.
local h = redis.call('HMGET', KEYS[1], 'e', 'v')
if not h[1] then return {'', '0'} end
local e, v, since = h[1], tonumber(h[2]) or 0, tonumber(ARGV[2])
local all = {e, tostring(v), 'all'}
if e ~= ARGV[1] or since > v or v - since > 1024 then return all end
local out = {e, tostring(v)}
for i = since + 1, v do
  local entry = redis.call('HGET', KEYS[1], 'l:' .. (i % 1024))
  local at, id = string.match(entry or '', '^(%d+)|(.*)$')
  if tonumber(at) ~= i then return all end
  out[#out + 1] = id
  out[#out + 1] = redis.call('HGET', KEYS[1], 'o:' .. id) or ''
end
return out
