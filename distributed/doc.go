// Package distributed is tally's Redis store: the state every Caddy
// instance of a fleet decides against, and the concurrency slots they
// share. A zone uses it through zones.Store and zones.Offers, and applies
// its fail policy to any error the store returns.
//
// A store works in one of two modes:
//   - strict (Strict, Open): every decision is a step of one Lua script in
//     Redis (gcra.lua, the twin of algorithms.Limit, timed by Redis TIME),
//     exact across any number of instances, a round trip per batch of
//     concurrent decisions (per hash slot on a Cluster);
//   - async (Async, OpenAsync): decisions are made in-process from leases
//     reserved in Redis and reconciled every sync interval, with no round
//     trip on the request path. With burst B, emission interval T, lease
//     lifetime L (30 sync intervals) and N instances, the fleet admits over
//     any interval of length d at most B + ⌊(d + L)/T⌋ + (N−1)·max(1, ⌊B/N⌋).
//
// Both hold a link to one Redis setting (standalone, Sentinel or Cluster),
// shared by every handler of a process (Options.Key) across reloads. Every
// call returns within Options.Timeout, queueing included; every key the
// store writes expires on its own (each script's header gives its keys'
// layout). The long story: DESIGN.md §4, docs/distributed.md, docs/async.md.
//
// # Where things are
//
//	store.go            strict mode
//	async*.go           async mode: the store, its records, the sync, the wake
//	link.go             the link both modes hold (client, breakers, batcher,
//	                    heartbeat, resets, slots), and the bans list
//	batch.go            the batcher and the script replies
//	breaker.go          breakers, one per Cluster master
//	heartbeat.go        live instances
//	resets.go           resets through pub/sub
//	concurrency.go      concurrency slots
//	quota.go            strict mode's calendar quotas; quota_async.go async mode's
//	options.go          Options: addresses, TLS, timeouts
//	problems.go         per-key errors (logged sampled) and go-redis's log lines
//	testing_seam.go     what the integration tests (tests/) need beyond that
//	*.lua               the scripts, each with its interface in its header
package distributed
