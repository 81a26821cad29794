// Package distributed is tally's Redis store: the state every Caddy
// instance of a fleet decides against, and the concurrency slots they
// share. A zone (package zones) uses a store through zones.Store, one
// operation per zone kind with the step as data, reads once what else the
// store offers (zones.Offers), and applies its fail policy to any error the
// store returns.
//
// A store works in one of two modes:
//   - strict (Strict, Open): every decision is a step of one Lua script in
//     Redis, exact across any number of instances, a round trip per batch
//     of concurrent decisions;
//   - async (Async, OpenAsync): decisions are made in-process from leases
//     reserved in Redis and reconciled every sync interval, with no round
//     trip on the request path and a bound on what the fleet admits beyond
//     the limit.
//
// Both hold the same kind of connection to one Redis setting (standalone,
// Sentinel or Cluster; link.go): the client, the breakers, the batcher,
// the heartbeat that counts live instances, the resets channel and the
// concurrency slots. One store per setting is shared by every handler of
// a Caddy process (Options.Key) and survives reloads.
//
// # Strict mode
//
// Every decision is a step of gcra.lua (the twin of algorithms.Limit),
// atomic in Redis and timed by Redis TIME, so decisions are exact across
// any number of instances; one call decides a whole batch (grouped by hash
// slot on Redis Cluster, which needs no hash tags). The key's value is its
// TAT in microseconds, written with a TTL equal to its resetAfter: every
// key the store writes expires on its own. Its name is
// <key_prefix><zone>:<key>.
//
// Three things keep it fast and safe (in async mode the last two guard the
// syncs):
//   - batching: concurrent decisions share one script call (batch.go), with
//     no added wait when idle;
//   - a deadline: every call returns within Options.Timeout, queueing
//     included, with ErrTimeout if Redis has not answered;
//   - a breaker (breaker.go): 2 consecutive failures are an outage
//     (logged, and shown by Outages); after 5 consecutive failures calls fail at
//     once with ErrUnavailable for a second, then one probe tests Redis.
//     On a Cluster each master has its own, and every call about a key
//     goes through its master's, so a dead master costs only the keys it
//     serves, until the slot map names its promoted replica.
//
// # Async mode
//
// Async mode decides in-process and reconciles with Redis in the
// background. Each instance keeps, per (zone, key), an allowance: tokens it may admit on
// its own. A request is decided against it with no Redis call. A sync
// reports, for a key, the cost the instance admitted that Redis has not
// counted yet and the allowance it did not use, and takes a new lease:
// ⌈spare/N⌉ tokens, reserved in the key's GCRA state (its TAT moves
// forward) before they are spent. N is the number of live instances (heartbeat),
// spare the tokens the fleet has left. One async.lua call syncs up to 100
// keys (one TIME, one dispatch, one reply; on a Cluster, the keys of one
// hash slot), and a sync pipelines its calls.
//
// Redis work follows admissions, not keys: a sync every sync_interval looks
// at every record but sends only those that need it (record.due): a key
// with unreported admissions or charges, a lease running low (less than
// twice what the key used in the last interval), a lease about to reach its
// lifetime L (leaseLifetime sync intervals, less up to a quarter, so that
// keys leased together do not all come due together), and every key whose
// fleet is short of tokens (at its last sync the fleet had less left than
// this instance's lease), whose leases must move to where the traffic is.
// A key far below its limit is thus synced about once per L, whatever its
// traffic.
//
// A key this instance has never synced is decided against a fresh share,
// max(1, ⌊B/N⌋), which Redis does not know about until the first sync; that
// sync counts what it admitted and reserves the rest like a lease. For a
// hold of 2·(sync_interval + a sync's time bound), at least 1s, after a key
// starts an episode (it is written while full), leases leave aside one
// fresh share per live instance that has not reported the key yet, so a
// burst that reaches every instance at once stays within the limit. A record is dropped when Redis says the key is full and the
// instance has no traffic for it, so an instance takes a fresh share at most
// once per key per episode (from full to full again).
//
// A key's record also holds the zone's deny cache for it and, while the
// store cannot decide, its fail_policy local state, whose admissions are
// pending like any other and counted by the first sync that succeeds. A
// Redis that lost its data is told from a full one by an epoch key
// (async_epoch.go): the keys are restored from what the instances last
// heard.
//
// # Async mode: the bound
//
// With burst B, emission interval T, lease lifetime L (30 sync intervals)
// and N instances, the fleet admits over any interval of length d at most
//
//	B + ⌊(d + L)/T⌋ + (N−1)·max(1, ⌊B/N⌋)
//
// Leases are GCRA admissions in Redis, so leases reserved in any window of
// length d+L number at most B + (d+L)/T (strict mode's bound), and a lease is
// spent within L of being reserved: it is renewed (what is left of it handed
// back) by the sync before it reaches L. The last term is the fresh shares
// of instances that first see a key already spent elsewhere after its hold:
// at most one per instance per episode, and none for a burst that reaches
// every instance within one sync interval, which stays within
// B + ⌊(d+I)/T⌋ (its fresh shares are spent within I of the first report).
// Floor and ceiling rounding never add: a lease is reserved before it is
// handed out. Syncing every key every interval gave d + I instead of d + L.
// For keys whose L/T is large (fast limits) the lifetime's extra is capped
// anyway: what the fleet admits in the window from leases reserved before
// it is at most what the instances held when it began, one allowance each
// of at most a fresh share plus ⌈B/N⌉, so the fleet also stays within
// B + ⌊d/T⌋ + N·(⌊B/N⌋ + ⌈B/N⌉) + the fresh-share term: the price of
// syncing a key far below its limit once per L is at most about two bursts
// in the worst case, and (L−I)/T tokens for slow limits, for which the
// lifetime is what keeps the bound near one burst.
//
// Undershoot: where the fleet is short of tokens, an instance with no
// traffic for a key hands its lease back at its next sync and parks at most
// ⌈spare/N²⌉ (at least one token, so that a burst after a quiet spell is not
// denied until the next sync): idle instances together hold at most about
// 1/N of what is left. Where it has room, an idle instance keeps its lease
// until its lifetime: the others lose nothing meanwhile. Traffic
// concentrated on one instance gets ⌈spare/N⌉ per sync, so it reaches what
// is left of the budget over a few syncs, not at once.
//
// Quiet keys: a record with no traffic since its last report at the sync
// that ends its lease (or, where the fleet is short, idle at two syncs in a
// row) hands everything back, takes nothing and goes dormant: no sync looks at it until it has traffic. Its
// next request, if the fleet had tokens at its last sync, syncs it alone on
// the request path (wake: one script call, bounded by the timeout,
// concurrent requests waiting for it); if the key was blocked, it is denied
// locally until the fleet's next token. So a key seen once is reported
// twice (at most three times), not once per interval until it refills, and
// a dormant key's request is never denied for want of a lease. A dormant
// record holds no lease, so the bound is unchanged; it stays (evicted first
// when the zone is full), since a dropped record would take a fresh share
// again.
//
// # Async mode: failures
//
// A sync that cannot list every record within its time bound (a flood of
// keys) is not a failure: see send. A sync that fails leaves the records
// alone: the instance keeps deciding from its stale view, at most its
// current allowance. When the last sync failed and the last successful one
// is older than 2·sync_interval plus the sync's timeout, a decision returns an
// error (ErrUnavailable when the breaker is open, else ErrStale) and the
// zone applies its fail policy; so does a key whose own reports have failed
// for that long. Errors that mean Redis cannot serve (no answer, OOM,
// NOPERM...) fail the sync and count in the breaker, so an outage is logged
// once and Health reports it. On a Cluster each master has its breaker and
// its keys alone go stale: a sync sends the other masters' keys as usual,
// and fails only when no master answered. A sync merely delayed (a starved
// machine) keeps the view: its allowances are leases Redis counts, and the
// fail policy would admit more.
//
// An error about one key (a value tally did not write, which the script
// deletes) fails that key's report only: it is logged (sampled), the key's
// next decision goes to the fail policy (so the metric counts it), and the
// report is sent again, on a fresh key, by the next sync.
//
// A sync that times out after Redis ran its scripts loses their replies.
// Each report carries a sequence number, and Redis keeps, per instance, the
// last one it applied with its lease: the next sync sends the same report
// again and gets the same lease back, so a lost reply is never counted twice.
//
// # Async mode: keys
//
// A key is a hash {t: TAT µs, c: episode start µs, m:<instance>: 1...}
// whose TTL is its resetAfter, set in the same script as every write: every
// key written expires on its own. Its name is <key_prefix><zone>.async:<key>,
// never the name of a strict-mode key (a string), so a reload from one mode
// to the other with the same key_prefix finds no value of the wrong type.
//
// Times kept in-process (records, lastSync, nextSync) are monotonic
// (internal/monotime); Redis TIME times everything in Redis.
//
// # Calendar quotas
//
// A quota zone (zones.Store.Quota) counts units per calendar period. A Lua
// script cannot do time zones, so the zone hands the store the period its
// clock is in and both neighbours (zones.Periods: four instants in µs, one
// string argument made once per period), and the script counts in the one
// that contains Redis TIME: Redis's clock alone decides when a period
// ends, and a zone clock a period or more away from it gets an error for
// that step (the fail policy answers it) carrying Redis's time, which the
// zone follows from then on.
//
// A key's count, in both modes, is a hash {e: the end of the period it
// counts, in µs; u: units} at <key_prefix><zone>.quota:<key>. It expires at
// exactly that end (PEXPIREAT, set by the period's first write): the margin
// is 0, since the period is in the value and a count whose period Redis's
// clock has left reads as 0 whether or not it has expired yet.
//
// Strict mode (quota.go, quota.lua): every step is one quota.lua step,
// batched with the GCRA steps (one call per script per batch, per hash slot
// on Cluster; the script's ARGV has gcra.lua's shape, now and four
// arguments per key). A step is HMGET and, when it counts something,
// HSET: at 256 callers 2.19 Redis µs per decision against GCRA's 2.37 in
// the same run.
//
// Async mode (quota_async.go, quota_async.lua): an instance admits from a
// lease, units reserved for it in the period's count before it spends them
// (field g:<instance>, what it used plus its lease; u is the sum). When a
// lease has too little for a request, the request takes another (one call,
// bounded by the timeout; concurrent requests for the key wait): at most
// the instance's fair share of what is left, ⌈left/N⌉, and ⌈n/(16N)⌉ beyond
// the request. So the fleet admits at most n per period; a post-charged
// zone's charges count from at most the lease, so each instance ends a
// period in debt by at most one charge. The reply says how long the period
// has left on Redis's clock; the instance stops spending the lease that
// long after it sent the call, on the monotonic clock: early by a round
// trip at most, never past the boundary. Every sync interval an idle record
// hands its lease back and is dropped, and a debt or a charge Redis has not
// seen is reported. Reports are absolute (what the instance used in the
// period and keeps), so a report sent again after a lost reply replaces
// what it said instead of adding to it; a record the instance forgot (or a
// new instance) counts what Redis holds for it as used, so forgetting can
// lose units, never admit them twice. An instance that dies leaves its
// lease counted until the period ends.
//
// # Bans
//
// A zone with ban (a rate step with a ban rule, strict mode; store.go, bans.go) sends
// its rule with each step as gcra.lua's op (b<first µs>,<max µs> decides,
// B... checks, P0,0 peeks): the step that denies a key for lack of quota
// bans it, atomically, the key then holding "TAT,ban end,remembered
// until,level" with a TTL that reaches the later of its TAT and the end of
// what is remembered. A banned key's reply is -retry, -(8 + 2·level +
// started); its instance keeps the ban's end in its deny cache and ban
// table, so the key's flood costs nothing and the ban holds through an
// outage. Bans are listed (zones.BanList, either mode) in a sorted set
// <key_prefix><zone>.bans, key → end ms × 64 + level, written only when a
// ban starts or is lifted, at most 1000, expiring with the zone's longest
// ban. Async mode has no ban in the key's state: the list is how the
// instances learn each other's bans, each reading it every sync interval
// (the bound: one sync interval and two round trips). A lift takes the key
// off the list before the reset is published, and a list read a reset
// overtook is dropped, so no instance learns a lifted ban back.
//
// # Concurrency slots
//
// A concurrency zone's slots (zones.Slots, either mode) live in Redis:
// a key's slots are one sorted set, slot id -> the instant its lease ends
// in Redis TIME milliseconds (concurrency.lua), at <key_prefix><zone>:<key>
// in both modes. Acquire is one script call on the request path, batched
// with strict mode's decisions. Everything else is off it, in one
// background loop per store:
//   - renewals: every lease/3 (the shortest lease held), one pipeline renews
//     every slot this instance holds, one script call per key; a slot whose
//     instance died is renewed by nobody and ends within its lease; the
//     period follows the shortest lease the store holds. A slot Redis lost
//     (a restart) is taken again while there is room, so that requests
//     running across an outage are counted again after it;
//   - data loss: an acquisition refuses while the instances set this
//     instance beat into lately is gone, and heartbeat.lua, finding it gone,
//     marks a recovery (slotsRecovery, 3s) during which every acquisition
//     refuses and every instance renews at its next beat: slots Redis lost
//     with its data (FLUSHALL, a restart without it) are taken back before
//     new ones (not on a Cluster, where the set is another node's key);
//   - releases: Release only records the slot and wakes the loop, which
//     removes it with ZREM (pipelined with the other releases pending). A
//     release Redis did not take is retried at the next wake-up, until the
//     slot's lease has ended anyway: an outage leaks no slot past its lease,
//     and a recovery sees none counted twice.
//
// # Instances and resets
//
// Every process beats once a second into <key_prefix>instances
// (heartbeat.go); the live ones are N, by which fail_policy local divides a
// zone's limit and async mode its fresh shares. A process counts once,
// however many stores it has. A reset (the admin API's) deletes the key and
// is published on <key_prefix>resets: every instance forgets the key within
// milliseconds (resets.go).
//
// # Where things are
//
//	store.go            strict mode
//	async*.go           async mode: the store, its records, the sync, the wake
//	link.go             the link to Redis both modes hold
//	batch.go            the batcher and the script replies
//	breaker.go          breakers, one per Cluster master
//	heartbeat.go        live instances
//	resets.go           resets through pub/sub
//	concurrency.go      concurrency slots
//	quota.go            strict mode's calendar quotas; quota_async.go async mode's
//	options.go          Options: addresses, TLS, timeouts
//	problems.go         per-key errors Redis reports, logged sampled
//	logging.go          go-redis's own log lines, sent to Caddy's log
//	testing_seam.go     what the integration tests (tests/) need beyond that
//	*.lua               the scripts, each with its interface in its header
package distributed
