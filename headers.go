package ratelimit

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
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

// setHeaders writes the rate limit headers for the zones that applied. The
// header values share one allocation, and the canonical keys are assigned
// directly rather than through Header.Set.
func (h *Handler) setHeaders(hdr http.Header, verdicts []verdict) {
	if h.headers == headersOff || len(verdicts) == 0 {
		return
	}
	vals := make([]string, 5)
	if h.headers != headersLegacy {
		var buf [96]byte
		state := buf[:0]
		for i, v := range verdicts {
			if i > 0 {
				state = append(state, ", "...)
			}
			state = append(state, '"')
			state = append(state, v.zone.Name...)
			state = append(state, `";r=`...)
			state = strconv.AppendInt(state, v.d.Remaining, 10)
			state = append(state, ";t="...)
			state = strconv.AppendInt(state, ceilSeconds(v.d.ResetAfter), 10)
		}
		vals[0] = verdicts[0].policy()
		for i := range verdicts[1:] {
			vals[0] += ", " + verdicts[i+1].policy()
		}
		vals[1] = string(state)
		// An earlier rate_limit handler on this route keeps its members.
		if prev := hdr["Ratelimit"]; len(prev) == 1 {
			vals[1] = prev[0] + ", " + vals[1]
			if prev := hdr["Ratelimit-Policy"]; len(prev) == 1 {
				vals[0] = prev[0] + ", " + vals[0]
			}
		}
		hdr["Ratelimit-Policy"] = vals[0:1:1]
		hdr["Ratelimit"] = vals[1:2:2]
	}
	if h.headers != headersIETF {
		// The most restrictive zone: fewest remaining, then longest reset.
		m := &verdicts[0]
		for i := range verdicts[1:] {
			v := &verdicts[i+1]
			if v.d.Remaining < m.d.Remaining || (v.d.Remaining == m.d.Remaining && v.d.ResetAfter > m.d.ResetAfter) {
				m = v
			}
		}
		if prev := hdr["Ratelimit-Remaining"]; len(prev) == 1 {
			// An earlier rate_limit handler's zone is more restrictive.
			if n, err := strconv.ParseInt(prev[0], 10, 64); err == nil && n <= m.d.Remaining {
				return
			}
		}
		vals[2] = m.limitValue()
		vals[3] = strconv.FormatInt(m.d.Remaining, 10)
		vals[4] = strconv.FormatInt(ceilSeconds(m.d.ResetAfter), 10)
		hdr["Ratelimit-Limit"] = vals[2:3:3]
		hdr["Ratelimit-Remaining"] = vals[3:4:4]
		hdr["Ratelimit-Reset"] = vals[4:5:5]
	}
}

// ceilSeconds rounds d up to whole seconds.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64(math.Ceil(d.Seconds()))
}
