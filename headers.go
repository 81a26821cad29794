package ratelimit

import (
	"fmt"
	"hash/maphash"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

type headerMode uint8

const (
	headersBoth headerMode = iota
	headersIETF
	headersLegacy
	headersOff
)

func parseHeaderMode(s string) (headerMode, error) {
	switch s {
	case "", "both":
		return headersBoth, nil
	case "ietf":
		return headersIETF, nil
	case "legacy":
		return headersLegacy, nil
	case "off":
		return headersOff, nil
	}
	return 0, fmt.Errorf("unknown headers mode %q: use both, ietf, legacy or off", s)
}

// maxSFInteger is the largest Integer a Structured Field may carry (RFC 9651
// §3.3.1: at most 15 digits). Validated limits stay far below it; values are
// clamped so that a header can never be malformed.
const maxSFInteger = 999_999_999_999_999

// setHeaders writes the rate limit headers for the zones that applied and
// returns the largest t (seconds) the RateLimit field now carries, which a
// denial's Retry-After must not undercut (draft-ietf-httpapi-ratelimit-
// headers-10 §6). denied says whether the response is a denial.
//
// The fields follow draft-10 and RFC 9651:
//
//	RateLimit-Policy: "<zone>";q=<events>;w=<window seconds>
//	RateLimit:        "<zone>";r=<remaining>;t=<seconds until more quota>
//
// and, for a concurrency zone, "<zone>";q=<n>;qu="concurrent-requests", with
// a t only on a denial (its retry time): when a slot frees is not known.
//
// t is the time until at least one more unit of quota is available, rounded
// up: within one emission interval while below the burst, the retry time of a
// zone with none left. It is omitted when the key is at its full burst (no
// more quota can become available), and, on a denial, for zones that still
// have quota, whose t would only push Retry-After later than the request
// could succeed. w is omitted for a window that is not whole seconds, which
// the draft cannot express.
//
// All values are written into one buffer and become one string, which the
// header values are slices of; the string comes from h's value cache when an
// earlier response rendered the same bytes (the usual case: the values
// depend on the zone, remaining and whole seconds only), so a response
// allocates only its header slice. The numbers
// come from each verdict's plan and decision, so a limit read from the
// request renders like a literal one.
func (h *Handler) setHeaders(hdr http.Header, verdicts []verdict, denied bool) (maxT int64) {
	if h.headers == headersOff || len(verdicts) == 0 {
		return 0
	}
	var stack [192]byte
	buf := stack[:0]
	var policyEnd, stateEnd int
	if h.headers != headersLegacy {
		prevPolicy, prevState := hdr["Ratelimit-Policy"], hdr["Ratelimit"]
		if len(prevState) == 1 && len(prevPolicy) == 1 {
			// An earlier rate_limit handler on this route keeps its
			// members.
			buf = append(buf, prevPolicy[0]...)
			buf = append(buf, ", "...)
		}
		for i := range verdicts {
			if i > 0 {
				buf = append(buf, ", "...)
			}
			buf = appendPolicy(buf, &verdicts[i])
		}
		policyEnd = len(buf)
		if len(prevState) == 1 && len(prevPolicy) == 1 {
			var t int64
			buf, t = appendEarlierMembers(buf, prevState[0], denied)
			maxT = max(maxT, t)
			buf = append(buf, ", "...)
		}
		for i := range verdicts {
			if i > 0 {
				buf = append(buf, ", "...)
			}
			var t int64
			buf, t = appendState(buf, &verdicts[i], denied)
			maxT = max(maxT, t)
		}
		stateEnd = len(buf)
	}
	var legacy *verdict
	if h.headers != headersIETF {
		// The most restrictive zone: fewest remaining, then longest reset.
		legacy = &verdicts[0]
		for i := range verdicts[1:] {
			v := &verdicts[i+1]
			if v.d.Remaining < legacy.d.Remaining || (v.d.Remaining == legacy.d.Remaining && v.d.ResetAfter > legacy.d.ResetAfter) {
				legacy = v
			}
		}
		if prev := hdr["Ratelimit-Remaining"]; len(prev) == 1 {
			// An earlier rate_limit handler's zone is more restrictive.
			if n, err := strconv.ParseInt(prev[0], 10, 64); err == nil && n <= legacy.d.Remaining {
				legacy = nil
			}
		}
	}
	var limitEnd, remainingEnd int
	if legacy != nil {
		buf = strconv.AppendInt(buf, sfInt(legacy.quota()), 10)
		limitEnd = len(buf)
		buf = strconv.AppendInt(buf, sfInt(legacy.d.Remaining), 10)
		remainingEnd = len(buf)
		buf = strconv.AppendInt(buf, sfInt(ceilSeconds(legacy.d.ResetAfter)), 10)
	}

	all := h.values.intern(buf)
	var vals []string // one backing array for every header's value
	switch {
	case h.headers == headersLegacy:
		vals = make([]string, 0, 3)
	case legacy == nil:
		vals = make([]string, 0, 2)
	default:
		vals = make([]string, 0, 5)
	}
	if h.headers != headersLegacy {
		vals = append(vals, all[:policyEnd], all[policyEnd:stateEnd])
		hdr["Ratelimit-Policy"] = vals[0:1:1]
		hdr["Ratelimit"] = vals[1:2:2]
	}
	if legacy != nil {
		n := len(vals)
		vals = append(vals, all[stateEnd:limitEnd], all[limitEnd:remainingEnd], all[remainingEnd:])
		hdr["Ratelimit-Limit"] = vals[n : n+1 : n+1]
		hdr["Ratelimit-Remaining"] = vals[n+1 : n+2 : n+2]
		hdr["Ratelimit-Reset"] = vals[n+2 : n+3 : n+3]
	}
	return maxT
}

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

// appendPolicy appends v's zone as a RateLimit-Policy list member.
func appendPolicy(buf []byte, v *verdict) []byte {
	buf = append(buf, '"')
	buf = append(buf, v.zone.Name...) // [A-Za-z0-9_-]: nothing to escape
	buf = append(buf, `";q=`...)
	if v.zone.IsConcurrency() {
		// A quota of requests in flight: it has no window.
		buf = strconv.AppendInt(buf, sfInt(v.zone.Concurrency), 10)
		return append(buf, `;qu="concurrent-requests"`...)
	}
	buf = strconv.AppendInt(buf, sfInt(v.plan.Events), 10)
	if w := v.plan.Window; w%time.Second == 0 {
		buf = append(buf, ";w="...)
		buf = strconv.AppendInt(buf, sfInt(int64(w/time.Second)), 10)
	}
	return append(buf, v.zone.costs.params...) // how a weighted or post-charged zone counts
}

// appendState appends v as a RateLimit list member and returns its t, 0
// when it has none.
func appendState(buf []byte, v *verdict, denied bool) ([]byte, int64) {
	buf = append(buf, '"')
	buf = append(buf, v.zone.Name...)
	buf = append(buf, `";r=`...)
	buf = strconv.AppendInt(buf, sfInt(v.d.Remaining), 10)
	t, ok := moreQuotaIn(v)
	if !ok || (denied && v.d.Remaining > 0) {
		return buf, 0
	}
	secs := sfInt(ceilSeconds(t))
	buf = append(buf, ";t="...)
	buf = strconv.AppendInt(buf, secs, 10)
	return buf, secs
}

// moreQuotaIn is how long until v's key has at least one more unit of quota
// than the verdict reports: the retry time when it has none, else the time
// until the next emission interval frees; false when the key is at its full
// burst and no more quota can become available.
func moreQuotaIn(v *verdict) (time.Duration, bool) {
	switch {
	case v.d.RetryAfter > 0: // denied: none left until then
		return v.d.RetryAfter, true
	case v.d.ResetAfter <= 0 || v.zone.IsConcurrency():
		// At its full burst, or slots that free when requests end.
		return 0, false
	}
	// One more unit frees each time resetAfter drops past a multiple of
	// the emission interval.
	return (v.d.ResetAfter-1)%v.emissionInterval() + 1, true
}

// quota is the q of v's zone: the events of the plan the request was
// decided under, or a concurrency zone's limit of requests in flight.
func (v *verdict) quota() int64 {
	if v.zone.IsConcurrency() {
		return v.zone.Concurrency
	}
	return v.plan.Events
}

// emissionInterval is the interval at which v's key frees one unit, under
// the plan the request was decided with.
func (v *verdict) emissionInterval() time.Duration {
	return time.Duration(v.plan.Limit().EmissionInterval)
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
		if denied && !strings.Contains(m+";", ";r=0;") {
			if j := strings.Index(m, ";t="); j >= 0 {
				end := strings.IndexByte(m[j+1:], ';')
				if end < 0 {
					m = m[:j]
				} else {
					m = m[:j] + m[j+1+end:]
				}
			}
		}
		if j := strings.Index(m, ";t="); j >= 0 {
			s := m[j+3:]
			if end := strings.IndexByte(s, ';'); end >= 0 {
				s = s[:end]
			}
			if n, err := strconv.ParseInt(s, 10, 64); err == nil {
				maxT = max(maxT, n)
			}
		}
		buf = append(buf, m...)
	}
	return buf, maxT
}

// sfInt clamps n to what a Structured Field Integer can carry.
func sfInt(n int64) int64 { return min(max(n, 0), maxSFInteger) }

// ceilSeconds rounds d up to whole seconds.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64(math.Ceil(d.Seconds()))
}
