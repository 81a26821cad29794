-- A region's own record of its global shares, in the regional Redis (see
-- region.go). Every key carries the hash tag {r}: one slot on Cluster.
-- KEYS[1] meta (version, contact), KEYS[2] the coordinator lock, then per
-- zone its demand hash and its shares hash.
-- ARGV[1] op:
--   "poll"    every instance: ARGV 2 known version, 3 demand TTL ms, 4
--             number of zones, then per zone n and n quadruples key,
--             admitted, denied, span (µs; 0: the zone's). Adds the counts,
--             keeps the longest span; replies {now ms, contact ms or -1,
--             version, then, when the version moved, per zone n, key, share...}.
--   "lock"    ARGV 2 instance id, 3 lock TTL ms: the fencing token (Redis
--             TIME µs when the lock was taken) or 0 when another holds it.
--   "collect" the coordinator: ARGV 2 id|token; per zone n, key, admitted,
--             denied, span..., clearing the demand; {-1} when not the holder.
--   "publish" ARGV 2 id|token, 3 contact age ms (-1: keep), 4 TTL ms, 5
--             full (1: replace), 6 number of zones, then per zone n and n
--             pairs key, share (-1: back to the weight). {-1} when not the
--             holder.
local op = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local nz = #KEYS - 2

if op == 'lock' then
	local v = redis.call('GET', KEYS[2])
	if v then
		local id, tok = string.match(v, '^(.*)|(%d+)$')
		if id ~= ARGV[2] then return 0 end
		redis.call('PEXPIRE', KEYS[2], ARGV[3])
		return tonumber(tok)
	end
	local tok = t[1] .. string.format('%06d', tonumber(t[2]))
	redis.call('SET', KEYS[2], ARGV[2] .. '|' .. tok, 'PX', ARGV[3])
	return tonumber(tok)
end

if op == 'poll' then
	local ttl, i = ARGV[3], 5
	for z = 1, nz / 2 do
		local dk = KEYS[1 + 2 * z]
		local n = tonumber(ARGV[i])
		i = i + 1
		for _ = 1, n do
			redis.call('HINCRBY', dk, ARGV[i] .. '\0a', ARGV[i + 1])
			if ARGV[i + 2] ~= '0' then redis.call('HINCRBY', dk, ARGV[i] .. '\0d', ARGV[i + 2]) end
			if ARGV[i + 3] ~= '0' then
				local f = ARGV[i] .. '\0s'
				local cur = tonumber(redis.call('HGET', dk, f))
				if not cur or tonumber(ARGV[i + 3]) > cur then redis.call('HSET', dk, f, ARGV[i + 3]) end
			end
			i = i + 4
		end
		if n > 0 then redis.call('PEXPIRE', dk, ttl) end
	end
	local m = redis.call('HMGET', KEYS[1], 'version', 'contact')
	local version = m[1] or '0'
	local out = {now, tonumber(m[2]) or -1, version}
	if version ~= ARGV[2] then
		for z = 1, nz / 2 do
			local s = redis.call('HGETALL', KEYS[2 + 2 * z])
			out[#out + 1] = #s / 2
			for _, v in ipairs(s) do out[#out + 1] = v end
		end
	end
	return out
end

if redis.call('GET', KEYS[2]) ~= ARGV[2] then return {-1} end

if op == 'collect' then
	local out = {}
	for z = 1, nz / 2 do
		local dk = KEYS[1 + 2 * z]
		local raw = redis.call('HGETALL', dk)
		redis.call('DEL', dk)
		local acc, order = {}, {}
		for j = 1, #raw, 2 do
			local key, kind = string.match(raw[j], '^(.*)%z(.)$')
			if key then
				if not acc[key] then acc[key] = {0, 0, 0}; order[#order + 1] = key end
				acc[key][kind == 'a' and 1 or kind == 'd' and 2 or 3] = tonumber(raw[j + 1])
			end
		end
		out[#out + 1] = #order
		for _, key in ipairs(order) do
			local n = #out
			out[n + 1], out[n + 2], out[n + 3], out[n + 4] = key, acc[key][1], acc[key][2], acc[key][3]
		end
	end
	return out
end

if op == 'publish' then
	local ttl, full, i = ARGV[4], ARGV[5] == '1', 7
	local changed = full
	for z = 1, nz / 2 do
		local sk = KEYS[2 + 2 * z]
		if full then redis.call('DEL', sk) end
		local n = tonumber(ARGV[i])
		i = i + 1
		for _ = 1, n do
			if ARGV[i + 1] == '-1' then
				redis.call('HDEL', sk, ARGV[i])
			else
				redis.call('HSET', sk, ARGV[i], ARGV[i + 1])
			end
			changed = true
			i = i + 2
		end
		redis.call('PEXPIRE', sk, ttl)
	end
	if changed then redis.call('HINCRBY', KEYS[1], 'version', 1) end
	if ARGV[3] ~= '-1' then redis.call('HSET', KEYS[1], 'contact', now - tonumber(ARGV[3])) end
	redis.call('PEXPIRE', KEYS[1], ttl)
	return {1}
end
return redis.error_reply('TALLYBADOP')
