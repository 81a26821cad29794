package ratelimit

import (
	"cmp"
	"fmt"
	"hash/maphash"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddy-tally/ratelimit/distributed"
)

type headerMode uint8

const (
	headersBoth headerMode = iota
	headersIETF
	headersLegacy
	headersOff
)

func parseHeaderMode(s string) (headerMode, error) {
	if i := slices.Index([]string{"both", "ietf", "legacy", "off"}, cmp.Or(s, "both")); i >= 0 {
		return headerMode(i), nil // the constants' order
	}
	return 0, fmt.Errorf("unknown headers mode %q: use both, ietf, legacy or off", s)
}

// maxSFInteger is the largest Integer a Structured Field may carry (RFC 9651
// §3.3.1: at most 15 digits). Validated limits stay far below it; values are
// clamped so that a header can never be malformed.
const maxSFInteger = 999_999_999_999_999

// setHeaders writes the rate limit headers for the zones that applied and
// returns the largest t (seconds) the RateLimit field now carries. On a
// denial it also writes Retry-After, in every headers mode. The fields and
// their rules (draft-ietf-httpapi-ratelimit-headers-10, RFC 9651) are in
// docs/headers.md.
//
// The usual response (one zone, no earlier rate_limit handler on the route)
// is rendered from the handler's render cache: its values depend only on
// the zone, the plan and a few whole numbers, so the numbers are the cache's
// key and a hit renders nothing. Otherwise all values are written into one
// buffer and become one string (the one in h's value cache when an earlier
// response rendered the same bytes). Either way a response allocates only
// its header values' backing array, its own: a later handler that edits a
// value in place (Caddy's header directive does) changes this response's
// headers and no other's.
func (h *Handler) setHeaders(hdr http.Header, tickets []ticket, denied bool, retry time.Duration) (maxT int64) {
	if len(tickets) == 0 {
		return 0
	}
	if h.headers == headersOff {
		if denied {
			hdr["Retry-After"] = []string{h.values.seconds(retryAfterSeconds(retry, 0))}
		}
		return 0
	}
	if len(tickets) == 1 && h.rendered != nil && !h.earlierHeaders(hdr) {
		k := newRenderKey(&tickets[0], denied, retry)
		e := h.rendered.get(&k)
		if e == nil {
			e = &renderedHeaders{key: k}
			h.render(e, hdr, tickets, denied, retry)
			h.rendered.put(e)
		}
		return e.set(hdr, h.headers)
	}
	var e renderedHeaders
	h.render(&e, hdr, tickets, denied, retry)
	return e.set(hdr, h.headers)
}

// earlierHeaders reports whether an earlier rate_limit handler on the route
// wrote headers this one merges with.
func (h *Handler) earlierHeaders(hdr http.Header) bool {
	switch h.headers {
	case headersIETF:
		return hdr["Ratelimit"] != nil
	case headersLegacy:
		return hdr["Ratelimit-Remaining"] != nil
	}
	return hdr["Ratelimit"] != nil || hdr["Ratelimit-Remaining"] != nil
}

// retryAfterSeconds is Retry-After for a denial whose retry time is retry
// and whose RateLimit field's largest t is maxT.
func retryAfterSeconds(retry time.Duration, maxT int64) int64 {
	return max(1, ceilSeconds(retry), maxT)
}

// renderedHeaders are the header values of one response, as substrings of
// one string, in the order set writes them: RateLimit-Policy and RateLimit
// (not in legacy mode), the legacy trio (when a zone of this handler is the
// most restrictive; not in ietf mode), Retry-After (on a denial). Immutable
// once published in a render cache.
type renderedHeaders struct {
	key    renderKey
	vals   [6]string
	n      int
	legacy bool // the legacy trio is among vals
	denied bool // Retry-After is the last of vals
	maxT   int64
}

// set writes e into hdr under a backing array of the response's own, and
// returns e's largest t.
func (e *renderedHeaders) set(hdr http.Header, mode headerMode) int64 {
	vals := make([]string, e.n)
	copy(vals, e.vals[:e.n])
	i := 0
	if mode != headersLegacy {
		hdr["Ratelimit-Policy"] = vals[0:1:1]
		hdr["Ratelimit"] = vals[1:2:2]
		i = 2
	}
	if e.legacy {
		hdr["Ratelimit-Limit"] = vals[i : i+1 : i+1]
		hdr["Ratelimit-Remaining"] = vals[i+1 : i+2 : i+2]
		hdr["Ratelimit-Reset"] = vals[i+2 : i+3 : i+3]
		i += 3
	}
	if e.denied {
		hdr["Retry-After"] = vals[i : i+1 : i+1]
	}
	return e.maxT
}

// render renders into e the headers of tickets (merged with an earlier
// handler's in hdr), as one string, the one in h's value cache when there
// is one.
func (h *Handler) render(e *renderedHeaders, hdr http.Header, tickets []ticket, denied bool, retry time.Duration) {
	e.denied = denied
	var stack [192]byte
	buf := stack[:0]
	var ends [6]int
	if h.headers != headersLegacy {
		prevPolicy, prevState := hdr["Ratelimit-Policy"], hdr["Ratelimit"]
		if len(prevState) == 1 && len(prevPolicy) == 1 {
			// An earlier rate_limit handler on this route keeps its
			// members.
			buf = append(buf, prevPolicy[0]...)
			buf = append(buf, ", "...)
		}
		for i := range tickets {
			if i > 0 {
				buf = append(buf, ", "...)
			}
			buf = appendPolicy(buf, &tickets[i])
		}
		ends[e.n] = len(buf)
		e.n++
		if len(prevState) == 1 && len(prevPolicy) == 1 {
			var t int64
			buf, t = appendEarlierMembers(buf, prevState[0], denied)
			e.maxT = max(e.maxT, t)
			buf = append(buf, ", "...)
		}
		for i := range tickets {
			if i > 0 {
				buf = append(buf, ", "...)
			}
			var t int64
			buf, t = appendState(buf, &tickets[i], denied)
			e.maxT = max(e.maxT, t)
		}
		ends[e.n] = len(buf)
		e.n++
	}
	var legacy *ticket
	if h.headers != headersIETF {
		// The most restrictive zone: fewest remaining, then longest reset.
		legacy = &tickets[0]
		for i := range tickets[1:] {
			v := &tickets[i+1]
			if v.Decision.Remaining < legacy.Decision.Remaining || (v.Decision.Remaining == legacy.Decision.Remaining && v.Decision.ResetAfter > legacy.Decision.ResetAfter) {
				legacy = v
			}
		}
		if prev := hdr["Ratelimit-Remaining"]; len(prev) == 1 {
			// An earlier rate_limit handler's zone is more restrictive.
			if n, err := strconv.ParseInt(prev[0], 10, 64); err == nil && n <= legacy.Decision.Remaining {
				legacy = nil
			}
		}
	}
	if legacy != nil {
		e.legacy = true
		buf = strconv.AppendInt(buf, sfInt(quota(legacy)), 10)
		ends[e.n] = len(buf)
		buf = strconv.AppendInt(buf, sfInt(legacy.Decision.Remaining), 10)
		ends[e.n+1] = len(buf)
		buf = strconv.AppendInt(buf, sfInt(ceilSeconds(legacy.Decision.ResetAfter)), 10)
		ends[e.n+2] = len(buf)
		e.n += 3
	}
	if denied {
		buf = strconv.AppendInt(buf, retryAfterSeconds(retry, e.maxT), 10)
		ends[e.n] = len(buf)
		e.n++
	}

	all := h.values.intern(buf)
	for i, start := 0, 0; i < e.n; i++ {
		e.vals[i] = all[start:ends[i]]
		start = ends[i]
	}
}

// renderKey is what the headers of one ticket depend on: the zone (its
// name, kind and cost parameters), the plan's q and w, and the numbers the
// response carries. The handler's headers mode is fixed per render cache.
type renderKey struct {
	zone           *httpZone
	events, window int64
	remaining      int64
	t              int64 // the RateLimit member's t in seconds, -1 for none
	reset          int64 // RateLimit-Reset in seconds
	retryAfter     int64 // Retry-After in seconds, 0 for an allowed request
}

func newRenderKey(v *ticket, denied bool, retry time.Duration) renderKey {
	k := renderKey{zone: v.Owner, events: quota(v), window: int64(v.Window()),
		remaining: v.Decision.Remaining, t: -1, reset: ceilSeconds(v.Decision.ResetAfter)}
	if t, ok := v.MoreQuotaIn(); ok && !(denied && v.Decision.Remaining > 0) {
		k.t = sfInt(ceilSeconds(t))
	}
	if denied {
		k.retryAfter = retryAfterSeconds(retry, max(k.t, 0))
	}
	return k
}

// renderCacheSize is how many rendered responses a handler remembers: a
// zone's responses differ by remaining and a few seconds' values, so a
// busy zone uses a few dozen.
const renderCacheSize = 256

// renderCache is a direct-mapped cache of rendered headers, keyed by the
// numbers they render. Entries are immutable and published atomically, so
// lookups never lock; a collision only costs a render.
type renderCache struct {
	slots [renderCacheSize]atomic.Pointer[renderedHeaders]
}

func (c *renderCache) slot(k *renderKey) *atomic.Pointer[renderedHeaders] {
	// The numbers that change between responses of a zone, mixed; the
	// zone and plan are compared, not hashed.
	x := uint64(k.remaining)*0x9e3779b97f4a7c15 ^ uint64(k.t)*0xc2b2ae3d27d4eb4f ^
		uint64(k.reset)*0x165667b19e3779f9 ^ uint64(k.retryAfter)*0x27d4eb2f165667c5 ^ uint64(k.events)
	return &c.slots[(x^x>>29)%renderCacheSize]
}

func (c *renderCache) get(k *renderKey) *renderedHeaders {
	if e := c.slot(k).Load(); e != nil && e.key == *k {
		return e
	}
	return nil
}

func (c *renderCache) put(e *renderedHeaders) { c.slot(&e.key).Store(e) }

// valueCacheSize is how many rendered header values a handler remembers.
const valueCacheSize = 512

// valueCache remembers recently rendered header values so that responses
// with the same values share one string. It is direct-mapped by a hash of
// the bytes and compares the bytes themselves, so a collision only costs a
// miss; entries are immutable strings published atomically, so lookups
// never lock.
type valueCache struct {
	seed  maphash.Seed
	slots [valueCacheSize]atomic.Pointer[string]
}

func newValueCache() *valueCache { return &valueCache{seed: maphash.MakeSeed()} }

// intern returns b as a string, the one already cached when there is one.
// A nil cache allocates every time.
func (c *valueCache) intern(b []byte) string {
	if c == nil {
		return string(b)
	}
	slot := &c.slots[maphash.Bytes(c.seed, b)&(valueCacheSize-1)]
	if p := slot.Load(); p != nil && *p == string(b) {
		return *p
	}
	s := string(b)
	slot.Store(&s)
	return s
}

// seconds returns n in decimal, interned.
func (c *valueCache) seconds(n int64) string {
	var b [20]byte
	return c.intern(strconv.AppendInt(b[:0], n, 10))
}

// quota is v's q: the zone's, or in a scope global zone the region's share
// of it, rounded down: what a client that paces itself by q gets here.
func quota(v *ticket) int64 {
	if r := v.Owner.region; r != nil {
		return int64(float64(v.Quota()) * float64(r.Share(v.Owner.Name, v.Key)) / distributed.ShareScale)
	}
	return v.Quota()
}

// appendPolicy appends v's zone as a RateLimit-Policy list member.
func appendPolicy(buf []byte, v *ticket) []byte {
	buf = append(buf, '"')
	buf = append(buf, v.Owner.Name...) // [A-Za-z0-9_-]: nothing to escape
	buf = append(buf, `";q=`...)
	buf = strconv.AppendInt(buf, sfInt(quota(v)), 10)
	if u := v.QuotaUnit(); u != "" {
		buf = append(buf, `;qu="`...)
		buf = append(buf, u...)
		buf = append(buf, '"')
	}
	if w := v.Window(); w > 0 && w%time.Second == 0 {
		buf = append(buf, ";w="...)
		buf = strconv.AppendInt(buf, sfInt(int64(w/time.Second)), 10)
	}
	return append(buf, v.Owner.costs.params...) // how a weighted or post-charged zone counts
}

// appendState appends v as a RateLimit list member and returns its t, 0
// when it has none.
func appendState(buf []byte, v *ticket, denied bool) ([]byte, int64) {
	buf = append(buf, '"')
	buf = append(buf, v.Owner.Name...)
	buf = append(buf, `";r=`...)
	buf = strconv.AppendInt(buf, sfInt(v.Decision.Remaining), 10)
	t, ok := v.MoreQuotaIn()
	if !ok || (denied && v.Decision.Remaining > 0) {
		return buf, 0
	}
	secs := sfInt(ceilSeconds(t))
	buf = append(buf, ";t="...)
	buf = strconv.AppendInt(buf, secs, 10)
	return buf, secs
}

// appendEarlierMembers appends the RateLimit members an earlier handler on
// the route wrote and returns their largest t. On a denial, the t of members
// that still have quota is dropped, as for this handler's own.
func appendEarlierMembers(buf []byte, prev string, denied bool) ([]byte, int64) {
	var maxT int64
	for i, m := range strings.Split(prev, ",") {
		m = strings.TrimSpace(m)
		if i > 0 {
			buf = append(buf, ", "...)
		}
		if j := strings.Index(m, ";t="); j >= 0 {
			t, rest, more := strings.Cut(m[j+3:], ";")
			if denied && !strings.Contains(m+";", ";r=0;") {
				m = m[:j]
				if more {
					m += ";" + rest
				}
			} else if n, err := strconv.ParseInt(t, 10, 64); err == nil {
				maxT = max(maxT, n)
			}
		}
		buf = append(buf, m...)
	}
	return buf, maxT
}

// sfInt clamps n to what a Structured Field Integer can carry.
func sfInt(n int64) int64 { return min(max(n, 0), maxSFInteger) }

// ceilSeconds rounds d up to whole seconds, exactly (in integers).
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d-1)/time.Second) + 1
}
