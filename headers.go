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

// maxSFInteger is the largest Structured Field Integer (RFC 9651 §3.3.1):
// values are clamped so that a header can never be malformed.
const maxSFInteger = 999_999_999_999_999

// setHeaders writes the rate limit headers (docs/headers.md) of the zones
// that applied and, on a denial in every mode, Retry-After; it returns the
// RateLimit field's largest t (seconds). The usual response (one zone, no
// earlier rate_limit handler) comes from the render cache. Either way a
// response allocates only its values' backing array, its own: a later
// handler that edits a value in place (Caddy's header directive does)
// changes no other response's headers.
func (h *Handler) setHeaders(hdr http.Header, tickets []ticket, denied bool, retry time.Duration) (maxT int64) {
	if len(tickets) == 0 {
		return 0
	}
	if h.headers == headersOff {
		if denied {
			var b [20]byte
			hdr["Retry-After"] = []string{h.values.intern(strconv.AppendInt(b[:0], retryAfterSeconds(retry, 0), 10))}
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
		return e.set(hdr)
	}
	var e renderedHeaders
	h.render(&e, hdr, tickets, denied, retry)
	return e.set(hdr)
}

// earlierHeaders: an earlier rate_limit handler wrote headers to merge with.
func (h *Handler) earlierHeaders(hdr http.Header) bool {
	return h.headers != headersLegacy && hdr["Ratelimit"] != nil || h.headers != headersIETF && hdr["Ratelimit-Remaining"] != nil
}

func retryAfterSeconds(retry time.Duration, maxT int64) int64 {
	return max(1, ceilSeconds(retry), maxT)
}

// renderedHeaders are one response's header values, substrings of one
// string, and their names' indices in headerNames; immutable once cached.
type renderedHeaders struct {
	key   renderKey
	vals  [6]string
	names [6]uint8
	n     int
	maxT  int64
}

var headerNames = [6]string{"Ratelimit-Policy", "Ratelimit", "Ratelimit-Limit", "Ratelimit-Remaining", "Ratelimit-Reset", "Retry-After"}

func (e *renderedHeaders) set(hdr http.Header) int64 {
	vals := make([]string, e.n)
	copy(vals, e.vals[:e.n])
	for i, name := range e.names[:e.n] {
		hdr[headerNames[name]] = vals[i : i+1 : i+1]
	}
	return e.maxT
}

// render renders into e the headers of tickets, merged with an earlier
// handler's in hdr, as one interned string.
func (h *Handler) render(e *renderedHeaders, hdr http.Header, tickets []ticket, denied bool, retry time.Duration) {
	var stack [192]byte
	buf := stack[:0]
	var ends [6]int
	end := func(name uint8) {
		ends[e.n], e.names[e.n] = len(buf), name
		e.n++
	}
	if h.headers != headersLegacy {
		prevPolicy, prevState := hdr["Ratelimit-Policy"], hdr["Ratelimit"]
		merge := len(prevState) == 1 && len(prevPolicy) == 1
		if merge {
			buf = append(buf, prevPolicy[0]...)
			buf = append(buf, ", "...)
		}
		for i := range tickets {
			if i > 0 {
				buf = append(buf, ", "...)
			}
			buf = appendPolicy(buf, &tickets[i])
		}
		end(0)
		if merge {
			buf = appendEarlierMembers(buf, prevState[0], denied, &e.maxT)
			buf = append(buf, ", "...)
		}
		for i := range tickets {
			if i > 0 {
				buf = append(buf, ", "...)
			}
			buf = appendState(buf, &tickets[i], denied, &e.maxT)
		}
		end(1)
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
		// Unless an earlier rate_limit handler's zone is more restrictive.
		if prev := hdr["Ratelimit-Remaining"]; len(prev) == 1 {
			if n, err := strconv.ParseInt(prev[0], 10, 64); err == nil && n <= legacy.Decision.Remaining {
				legacy = nil
			}
		}
	}
	if legacy != nil {
		for i, n := range [3]int64{quota(legacy), legacy.Decision.Remaining, ceilSeconds(legacy.Decision.ResetAfter)} {
			buf = strconv.AppendInt(buf, sfInt(n), 10)
			end(uint8(2 + i))
		}
	}
	if denied {
		buf = strconv.AppendInt(buf, retryAfterSeconds(retry, e.maxT), 10)
		end(5)
	}

	all := h.values.intern(buf)
	for i, start := 0, 0; i < e.n; i++ {
		e.vals[i] = all[start:ends[i]]
		start = ends[i]
	}
}

// renderKey is what the headers of one ticket depend on.
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

const renderCacheSize = 256 // a busy zone's responses use a few dozen

// renderCache is a direct-mapped cache of rendered headers, published
// atomically: lookups never lock, a collision only costs a render.
type renderCache struct {
	slots [renderCacheSize]atomic.Pointer[renderedHeaders]
}

func (c *renderCache) slot(k *renderKey) *atomic.Pointer[renderedHeaders] {
	// The zone and plan are compared, not hashed.
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

const valueCacheSize = 512

// valueCache interns rendered header values, direct-mapped and lock-free
// as renderCache, so that responses with the same values share one string.
type valueCache struct {
	seed  maphash.Seed
	slots [valueCacheSize]atomic.Pointer[string]
}

func newValueCache() *valueCache { return &valueCache{seed: maphash.MakeSeed()} }

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

// quota is v's q: in a scope global zone, the region's share of it.
func quota(v *ticket) int64 {
	if r := v.Owner.region; r != nil {
		return int64(float64(v.Quota()) * float64(r.Share(v.Owner.Name, v.Key)) / distributed.ShareScale)
	}
	return v.Quota()
}

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

// appendState appends v as a RateLimit member, raising maxT to its t.
func appendState(buf []byte, v *ticket, denied bool, maxT *int64) []byte {
	buf = append(buf, '"')
	buf = append(buf, v.Owner.Name...)
	buf = append(buf, `";r=`...)
	buf = strconv.AppendInt(buf, sfInt(v.Decision.Remaining), 10)
	t, ok := v.MoreQuotaIn()
	if !ok || (denied && v.Decision.Remaining > 0) {
		return buf
	}
	secs := sfInt(ceilSeconds(t))
	*maxT = max(*maxT, secs)
	buf = append(buf, ";t="...)
	return strconv.AppendInt(buf, secs, 10)
}

// appendEarlierMembers appends an earlier handler's RateLimit members,
// raising maxT to their t; on a denial, members with quota left lose t.
func appendEarlierMembers(buf []byte, prev string, denied bool, maxT *int64) []byte {
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
				*maxT = max(*maxT, n)
			}
		}
		buf = append(buf, m...)
	}
	return buf
}

func sfInt(n int64) int64 { return min(max(n, 0), maxSFInteger) }

// ceilSeconds rounds d up to whole seconds, in integers.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d-1)/time.Second) + 1
}
