package zones

import (
	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/internal/keytable"
)

// Table maps keys to one int64 each, a TAT or the instant a cached denial
// ends: an entry whose value is <= now carries nothing and may go at any
// time, so memory is bounded by the active keys, and by maxKeys. In a
// keytable: under 100 bytes per 16-byte key at 1M keys, and no allocation
// per request on an existing key.
type Table struct {
	kt *keytable.Table
}

// NewTable returns a table of at most maxKeys keys (at least 1).
func NewTable(maxKeys int) *Table {
	return &Table{kt: keytable.New(maxKeys)}
}

// Decide runs one GCRA step for key at now, storing the TAT it admits,
// admitting for later up to ahead (see algorithms.Limit.DecideAhead).
func (t *Table) Decide(key string, now int64, l algorithms.Limit, cost, ahead int64) (r algorithms.Result) {
	t.kt.Update(key, now, func(tat int64, _ bool) (int64, keytable.Op) {
		if r = l.DecideAhead(tat, now, cost, ahead); r.Allowed {
			return r.TAT, keytable.Store
		}
		return 0, keytable.Keep
	})
	return r
}

// Charge adds cost to key at now (see algorithms.Limit.Charge).
func (t *Table) Charge(key string, now int64, l algorithms.Limit, cost int64) (r algorithms.Result) {
	t.kt.Update(key, now, func(tat int64, _ bool) (int64, keytable.Op) {
		if r = l.Charge(tat, now, cost); r.TAT <= now {
			return 0, keytable.Delete
		}
		return r.TAT, keytable.Store
	})
	return r
}

// Peek reports key's state at now without consuming anything.
func (t *Table) Peek(key string, now int64, l algorithms.Limit) algorithms.Result {
	tat, _ := t.kt.Get(key)
	return l.Peek(tat, now)
}

// Refund gives back cost for key (see algorithms.Limit.Refund).
func (t *Table) Refund(key string, now int64, l algorithms.Limit, cost int64) {
	t.kt.Update(key, now, func(tat int64, found bool) (int64, keytable.Op) {
		if !found {
			return 0, keytable.Keep
		}
		if tat = l.Refund(tat, now, cost); tat <= now {
			return 0, keytable.Delete
		}
		return tat, keytable.Store
	})
}

// Get returns key's value when it is still in force (> now).
func (t *Table) Get(key string, now int64) (int64, bool) {
	v, ok := t.kt.Get(key)
	return v, ok && v > now
}

func (t *Table) Set(key string, value, now int64) {
	t.kt.Update(key, now, func(int64, bool) (int64, keytable.Op) { return value, keytable.Store })
}

func (t *Table) Delete(key string) { t.kt.Delete(key) }

func (t *Table) Clear() { t.kt.Clear() }

// Sweep deletes every entry whose value is <= now and returns how many keys
// remain, rebuilding mostly empty shards smaller (keytable.Table.Sweep).
func (t *Table) Sweep(now int64) int { return t.kt.Sweep(now) }

// Shrink gives memory back as Sweep does, deleting nothing: for tables of counts.
func (t *Table) Shrink() { t.kt.Shrink() }

// Len returns the number of keys held, expired ones included.
func (t *Table) Len() int { return t.kt.Len() }
