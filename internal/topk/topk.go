// Package topk finds the keys a zone denies most often in fixed memory: a
// Space-Saving sketch (Metwally, Agrawal, El Abbadi, 2005), and Recent, two
// of them rotating so that the view covers a recent window.
//
// Guarantee: a sketch of capacity k that counted N events holds every key
// whose true count is more than N/k, with a Count and an Error <= N/k such
// that the true count lies in [Count-Error, Count]. Other keys may be listed
// with a large Error; their rank means nothing. Counting a tracked key
// allocates nothing; a new key costs one copy of it.
package topk

import (
	"cmp"
	"container/heap"
	"slices"
	"strings"
	"sync"
)

// DefaultCapacity is how many keys a sketch tracks unless told otherwise:
// every key with more than 1/128 of the denials is found.
const DefaultCapacity = 128

// Sketch is a Space-Saving sketch, not safe for concurrent use (Recent is).
// The min-heap orders slot numbers, so moving a counter touches no map.
type Sketch struct {
	index map[string]int32 // key -> its slot
	slots []counter        // the tracked keys, len = tracked, cap = capacity
	heap  []int32          // slot numbers, a min-heap by count: heap[0] is the least counted
	total uint64           // events counted
}

type counter struct {
	key   string
	count uint64 // upper bound of the key's true count
	err   uint64 // how much of count may belong to keys it replaced
	pos   int32  // where the slot is in heap
}

// NewSketch returns a sketch tracking at most capacity keys (at least 1).
func NewSketch(capacity int) *Sketch {
	capacity = max(1, capacity)
	return &Sketch{
		index: make(map[string]int32, capacity),
		slots: make([]counter, 0, capacity),
		heap:  make([]int32, 0, capacity),
	}
}

// Add counts one event for key.
func (s *Sketch) Add(key string) {
	s.total++
	if slot, ok := s.index[key]; ok {
		s.slots[slot].count++
		heap.Fix((*byCount)(s), int(s.slots[slot].pos))
		return
	}
	if len(s.slots) < cap(s.slots) {
		slot := int32(len(s.slots))
		s.slots = append(s.slots, counter{key: strings.Clone(key), count: 1, pos: int32(len(s.heap))})
		s.heap = append(s.heap, slot)
		s.index[s.slots[slot].key] = slot
		heap.Fix((*byCount)(s), len(s.heap)-1)
		return
	}
	// Full: the new key takes the least counted key's counter, whose count
	// becomes its possible overestimate.
	slot := s.heap[0]
	least := &s.slots[slot]
	delete(s.index, least.key)
	*least = counter{key: strings.Clone(key), count: least.count + 1, err: least.count, pos: 0}
	s.index[least.key] = slot
	heap.Fix((*byCount)(s), 0)
}

// Reset empties the sketch, keeping its memory.
func (s *Sketch) Reset() {
	clear(s.index)
	clear(s.slots) // drop the keys so they can be collected
	s.slots = s.slots[:0]
	s.heap = s.heap[:0]
	s.total = 0
}

// floor is the most an untracked key may have been counted: the least count
// when the sketch is full (it may have been evicted), else 0 (it never came).
func (s *Sketch) floor() uint64 {
	if len(s.slots) < cap(s.slots) {
		return 0
	}
	return s.slots[s.heap[0]].count
}

// byCount is the sketch's heap for container/heap, which only Fixes it: the
// sketch appends and replaces slots itself, so Push and Pop are never called.
type byCount Sketch

func (h *byCount) Len() int           { return len(h.heap) }
func (h *byCount) Less(i, j int) bool { return h.slots[h.heap[i]].count < h.slots[h.heap[j]].count }
func (h *byCount) Push(any)           {}
func (h *byCount) Pop() any           { return nil }

func (h *byCount) Swap(i, j int) {
	h.heap[i], h.heap[j] = h.heap[j], h.heap[i]
	h.slots[h.heap[i]].pos = int32(i)
	h.slots[h.heap[j]].pos = int32(j)
}

// Entry is one key of a top list: its true count lies in
// [Count-Error, Count].
type Entry struct {
	Key   string
	Count uint64
	Error uint64
}

// Recent counts events in two sketches that take turns each period: the
// current one counts, the previous one holds the period before. Top sums
// both, so it covers between one and two periods.
type Recent struct {
	mu       sync.Mutex
	period   int64 // nanoseconds
	curStart int64 // start of the current period, a multiple of period
	cur      *Sketch
	prev     *Sketch
}

// NewRecent returns a Recent of two sketches of capacity keys each,
// rotating every period nanoseconds.
func NewRecent(capacity int, period int64) *Recent {
	return &Recent{period: max(1, period), cur: NewSketch(capacity), prev: NewSketch(capacity)}
}

// Record counts an event for key at now (Unix nanoseconds).
func (r *Recent) Record(key string, now int64) {
	r.mu.Lock()
	r.rotate(now)
	r.cur.Add(key)
	r.mu.Unlock()
}

func (r *Recent) rotate(now int64) {
	start := now - now%r.period
	switch {
	case start <= r.curStart:
		return
	case start == r.curStart+r.period:
		r.cur, r.prev = r.prev, r.cur
		r.cur.Reset()
	default: // idle for more than a period: both are out of date
		r.cur.Reset()
		r.prev.Reset()
	}
	r.curStart = start
}

// Summary is what Recent counted over its window.
type Summary struct {
	Top   []Entry // highest count first
	Since int64   // start of the window, Unix nanoseconds
	Total uint64  // events counted in the window, all keys
	Floor uint64  // no key missing from Top was counted more often; Merge uses it
}

// Top returns up to n keys (all tracked when n < 0) with the highest counts
// over the recent window at now.
func (r *Recent) Top(n int, now int64) Summary {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rotate(now)
	// Both sketches summed as Merge sums instances, with the same bounds.
	since := r.curStart - r.period
	return Merge(n, r.cur.summary(since), r.prev.summary(since))
}

func (s *Sketch) summary(since int64) Summary {
	top := make([]Entry, 0, len(s.slots))
	for _, c := range s.slots {
		top = append(top, Entry{Key: c.key, Count: c.count, Error: c.err})
	}
	return Summary{Top: top, Since: since, Total: s.total, Floor: s.floor()}
}

// Merge adds up the summaries of several instances into one of up to n keys,
// keeping the bounds: a key an instance does not list may have been counted
// up to that instance's Floor there.
func Merge(n int, summaries ...Summary) Summary {
	type bounds struct{ upper, lower uint64 }
	merged := map[string]bounds{}
	var out Summary
	for i, s := range summaries {
		if i == 0 || s.Since < out.Since {
			out.Since = s.Since
		}
		out.Total += s.Total
		out.Floor += s.Floor
		for _, e := range s.Top {
			// A key's upper bound is every instance's Floor, its count
			// instead where it is listed: the Floor taken back here
			// (modulo 2^64, exact in the sum) and every Floor added below.
			b := merged[e.Key]
			b.upper += e.Count - s.Floor
			b.lower += e.Count - e.Error
			merged[e.Key] = b
		}
	}
	out.Top = make([]Entry, 0, len(merged))
	for k, b := range merged {
		upper := b.upper + out.Floor
		out.Top = append(out.Top, Entry{Key: k, Count: upper, Error: upper - b.lower})
	}
	slices.SortFunc(out.Top, func(a, b Entry) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(b.Count-b.Error, a.Count-a.Error), strings.Compare(a.Key, b.Key))
	})
	if n >= 0 && len(out.Top) > n {
		out.Floor = max(out.Floor, out.Top[max(n, 1)-1].Count)
		out.Top = out.Top[:n]
	}
	return out
}

// Capacity is how many keys each of the two sketches tracks.
func (r *Recent) Capacity() int { return cap(r.cur.slots) }
