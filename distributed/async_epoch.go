package distributed

// Async mode's epoch tells that Redis lost its data, instead of trusting a
// blank Redis to be a full one: every async.lua call reads
// <key_prefix>epoch (per hash slot on a Cluster), written when missing; an
// instance that saw another restores its keys to what it last heard
// (docs/async.md).

import (
	"maps"
	"strconv"
	"sync"
)

// epochSlots are the hash tags of the per-slot epoch keys on a Cluster.
var epochSlots struct {
	once sync.Once
	tags [16384]string
}

// epochTag is a short string whose hash slot is slot.
func epochTag(slot int) string {
	epochSlots.once.Do(func() {
		left := len(epochSlots.tags)
		for i := 0; left > 0; i++ {
			s := strconv.Itoa(i)
			if sl := hashSlot(s); epochSlots.tags[sl] == "" {
				epochSlots.tags[sl] = s
				left--
			}
		}
	})
	return epochSlots.tags[slot]
}

// epochKey is the epoch key of slot.
func (a *Async) epochKey(slot int) string {
	if !a.cluster {
		return a.opts.KeyPrefix + "epoch"
	}
	return a.opts.KeyPrefix + "epoch{" + epochTag(slot) + "}"
}

// knownEpoch is the epoch this instance last saw for slot (0: none).
func (a *Async) knownEpoch(slot int) int64 {
	a.epochMu.Lock()
	defer a.epochMu.Unlock()
	return a.epochs[slot]
}

// knownEpochs copies the epochs this instance last saw, by slot.
func (a *Async) knownEpochs() map[int]int64 {
	a.epochMu.Lock()
	defer a.epochMu.Unlock()
	return maps.Clone(a.epochs)
}

// sawEpoch notes the epoch a call reported for slot. A change means Redis
// lost the slot's data: every record of the slot restores its key in its
// next report (the call's own keys it restored already).
func (a *Async) sawEpoch(slot int, epoch int64) {
	a.epochMu.Lock()
	old := a.epochs[slot]
	if epoch == 0 { // missing: the next call writes another, and records restore
		delete(a.epochs, slot)
	} else {
		a.epochs[slot] = epoch
	}
	a.epochMu.Unlock()
	if old == 0 || old == epoch {
		return
	}
	a.logger.Warn("redis lost its data (its epoch changed): async keys are restored from what this instance last heard")
	a.eachShard(func(z *asyncZone, s *asyncShard) {
		for k, r := range s.m {
			if r.reserved && (!a.cluster || hashSlot(a.RedisKey(z.name, k)) == slot) {
				r.restore = true
			}
		}
	})
}
