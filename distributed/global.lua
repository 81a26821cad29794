-- The global store's allocation of `scope global` keys between regions, one
-- call per coordinator sync (region_sync.go); not Cluster: the script names
-- its own keys. Shares are in parts per million of a key's limit.
-- ARGV: 1 region, 2 fencing token, 3 epoch the region knows ("" none),
-- 4 full (1: the region reports every holding and wants every grant),
-- 5 lease ms, 6 demand TTL ms (how long a key's reported demand counts
-- unless the region reports it again), 7 regions "name:weight,...",
-- 8 global key prefix, 9 number of zones, then per zone:
-- name, n, and n triples key, wants (ppm, -1 none), held (ppm).
--
-- Reply: {"OK", epoch, learning, waiting, zone, n, key, grant, ..., zone,
-- ...}, waiting 1 when a reported key is below its fair share only because
-- another region has not confirmed its cut yet; {"EPOCH", epoch} (the region
-- must report in full first) or {"FENCED"}.
-- Safety: a raise comes only from C - sum over the others of
-- max(acknowledged, granted), and a cut moves capacity only once its region
-- acknowledged it: the holdings sum to at most C at every instant.
local C = 1000000
local region, token, known, full = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4] == '1'
local lease, dttl, prefix = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[8]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = 4 * lease

local names, weight, floor, wsum = {}, {}, {}, 0
for name, w in string.gmatch(ARGV[7], '([^:,]+):(%d+)') do
	names[#names + 1] = name
	weight[name] = tonumber(w)
	wsum = wsum + tonumber(w)
end
-- weights and floors (ppm), field names: once per call
local gf, af, df, xf = {}, {}, {}, {}
for _, n in ipairs(names) do
	weight[n] = math.floor(weight[n] * C / wsum)
	floor[n] = math.floor(weight[n] / 10)
	gf[n], af[n], df[n], xf[n] = 'g.' .. n, 'a.' .. n, 'd.' .. n, 'x.' .. n
end

-- the epoch: a global store that lost its state has a new one
local ekey, regs = prefix .. 'g.epoch', prefix .. 'g.regions'
local registered = prefix .. 'g.registered'
local epoch = redis.call('GET', ekey)
if not epoch then
	epoch = now .. '-' .. t[2]
	redis.call('SET', ekey, epoch, 'PX', ttl)
	redis.call('DEL', regs, registered)
else
	redis.call('PEXPIRE', ekey, ttl)
end
if known ~= epoch and not full then return {'EPOCH', epoch} end
local born = tonumber(string.match(epoch, '^(%d+)'))

-- fencing: a coordinator with an older token than the region's last is stale
local seen = redis.call('HGET', regs, region .. '.tok')
if seen and token < tonumber(seen) then return {'FENCED'} end
redis.call('HSET', regs, region .. '.tok', token, region .. '.seen', now)
redis.call('PEXPIRE', regs, ttl)
if full then
	redis.call('SADD', registered, region)
	redis.call('PEXPIRE', registered, ttl)
end

-- learning: a fresh store grants nothing beyond what regions hold until
-- every region re-registered or one lease passed; live: heard from within
-- 2 x lease (one silent longer is at its floor)
local learning, live = false, {}
for _, n in ipairs(names) do
	if now - born < lease and redis.call('SISMEMBER', registered, n) == 0 then learning = true end
	local s = tonumber(redis.call('HGET', regs, n .. '.seen'))
	live[n] = s ~= nil and now - s <= 2 * lease
end
local dem, waiting
local function byDemand(a, b) return dem[a] * weight[b] < dem[b] * weight[a] end

local function target(demand)
	-- weighted water-filling among regions with demand, idle ones at their floor
	local tg, want, left, wl = {}, {}, C, 0
	for _, n in ipairs(names) do
		if demand[n] > floor[n] then
			want[#want + 1] = n
			wl = wl + weight[n]
		else
			tg[n] = floor[n]
			left = left - floor[n]
		end
	end
	if #want == 0 then
		for _, n in ipairs(names) do tg[n] = weight[n] end
		return tg, false
	end
	dem = demand
	table.sort(want, byDemand)
	local wd = wl
	for i, n in ipairs(want) do
		local fair = math.floor(left * weight[n] / wl)
		if demand[n] <= fair then
			tg[n] = demand[n]
			left, wl = left - demand[n], wl - weight[n]
		else
			for j = i, #want do tg[want[j]] = math.floor(left * weight[want[j]] / wl) end
			return tg, true
		end
	end
	-- every demand met: the rest goes to the demanding regions by weight
	for _, n in ipairs(want) do tg[n] = tg[n] + math.floor(left * weight[n] / wd) end
	return tg, true
end

-- sets written once per call, in chunks (Lua's stack bounds unpack)
local adds, rems = {}, {}
local function later(set, t, key)
	local l = t[set]
	if not l then l = {}; t[set] = l end
	l[#l + 1] = key
end
local function flush()
	for _, op in ipairs({{'SADD', adds}, {'SREM', rems}}) do
		for set, l in pairs(op[2]) do
			for j = 1, #l, 1000 do
				redis.call(op[1], set, unpack(l, j, math.min(#l, j + 999)))
			end
			if op[1] == 'SADD' then redis.call('PEXPIRE', set, ttl) end
		end
	end
end

-- allocate one reported key (record zp .. key), returning the region's
-- grant; a field is written only where it changed, the TTL once a lease (e).
local function allocate(zp, zone, key, wants, held)
	local rk = zp .. key
	local raw = redis.call('HGETALL', rk)
	if #raw == 0 and wants < 0 and held == weight[region] then
		return held -- a default holding no region pushes against
	end
	local h = {}
	for i = 1, #raw, 2 do h[raw[i]] = raw[i + 1] end
	local g, a, d, g0, a0 = {}, {}, {}, {}, {}
	for _, n in ipairs(names) do
		g0[n], a0[n] = tonumber(h[gf[n]]), tonumber(h[af[n]])
		local silent = not live[n] and not learning -- at its floor
		g[n] = silent and floor[n] or g0[n] or weight[n]
		a[n] = silent and floor[n] or a0[n] or weight[n]
		-- x: when the region's demand lapses unless reported again
		local dx = tonumber(h[xf[n]])
		d[n] = 0
		if dx and now <= dx then d[n] = tonumber(h[df[n]]) or 0 end
	end
	a[region] = held
	local fields = {}
	local function put(f, v) fields[#fields + 1] = f; fields[#fields + 1] = v end
	if wants >= 0 then
		d[region] = math.min(C, wants)
		if tonumber(h[df[region]]) ~= d[region] then put(df[region], d[region]) end
		put(xf[region], now + dttl)
	else
		d[region] = 0
		if h[xf[region]] then redis.call('HDEL', rk, df[region], xf[region]) end
	end
	local tg, demanded = target(d)
	if learning then -- nothing beyond what each region holds
		for _, n in ipairs(names) do tg[n] = math.min(tg[n], a[n]) end
	end
	for _, n in ipairs(names) do
		if tg[n] < g[n] then
			-- another region holds what it was granted until it reports
			if n ~= region then
				a[n] = math.max(a[n], g[n])
				later(prefix .. 'g.p:' .. zone .. ':' .. n, adds, key)
			end
			g[n] = tg[n]
		end
	end
	for _, n in ipairs(names) do
		if tg[n] > g[n] then
			local others = 0
			for _, m in ipairs(names) do
				if m ~= n then others = others + math.max(a[m], g[m]) end
			end
			local raised = math.min(tg[n], math.max(g[n], C - others))
			if raised > g[n] then
				g[n] = raised
				if n ~= region then later(prefix .. 'g.p:' .. zone .. ':' .. n, adds, key) end
			end
		end
	end
	waiting = waiting or g[region] < tg[region]
	local default = not demanded
	for _, n in ipairs(names) do
		if g[n] ~= weight[n] or a[n] ~= weight[n] then default = false end
	end
	if default then
		redis.call('DEL', rk)
		later(prefix .. 'g.zk:' .. zone, rems, key)
		return g[region]
	end
	for _, n in ipairs(names) do
		if g[n] ~= g0[n] then put(gf[n], g[n]) end
		if a[n] ~= a0[n] then put(af[n], a[n]) end
	end
	local e = tonumber(h.e)
	local renew = not e or now - e >= lease
	if renew then put('e', now) end
	if #fields > 0 then redis.call('HSET', rk, unpack(fields)) end
	if renew then redis.call('PEXPIRE', rk, ttl) end
	if #raw == 0 then later(prefix .. 'g.zk:' .. zone, adds, key) end
	return g[region]
end

local out = {'OK', epoch, learning and 1 or 0, 0}
local i = 10
for _ = 1, tonumber(ARGV[9]) do
	local zone, n = ARGV[i], tonumber(ARGV[i + 1])
	i = i + 2
	local reported, at = {}, #out + 2
	out[at - 1], out[at] = zone, 0 -- then the grants' count
	local zp = prefix .. 'g.z:' .. zone .. ':'
	for _ = 1, n do
		local key = ARGV[i]
		reported[key] = true
		out[#out + 1] = key
		out[#out + 1] = allocate(zp, zone, key, tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]))
		i = i + 3
	end
	flush()
	adds, rems = {}, {}
	redis.call('PEXPIRE', prefix .. 'g.zk:' .. zone, ttl)
	-- what moved for this region since it last heard (or, in full, every
	-- record): the region's grant, its weight where the record is gone
	local p = prefix .. 'g.p:' .. zone .. ':' .. region
	local extra = redis.call('SMEMBERS', p)
	redis.call('DEL', p)
	if full then extra = redis.call('SMEMBERS', prefix .. 'g.zk:' .. zone) end
	for _, key in ipairs(extra) do
		if not reported[key] then
			reported[key] = true
			local m = redis.call('HMGET', zp .. key, gf[region], xf[region])
			if full and m[2] then
				-- a full report is complete: no demand of this key
				redis.call('HDEL', zp .. key, df[region], xf[region])
			end
			out[#out + 1] = key
			out[#out + 1] = tonumber(m[1]) or weight[region]
		end
	end
	out[at] = (#out - at) / 2
end
if waiting then out[4] = 1 end
return out
