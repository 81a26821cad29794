package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-tally/ratelimit/internal/monotime"
	"github.com/caddy-tally/ratelimit/zones"
)

// topInfo is GET /rate_limit/zones/<zone>/top: the keys this instance denied
// most over the last one to two zones.OffendersPeriod, from the zone's
// fixed-size sketch. Each key's true denial count lies in
// [denials-error, denials], and no key missing from the list was denied more
// than floor times (which lets `caddy rate-limit top` merge instances).
type topInfo struct {
	Zone      string         `json:"zone"`
	View      string         `json:"view"`                // "instance": this Caddy's denials only; "merged" by the CLI
	Addresses []string       `json:"addresses,omitempty"` // the admin addresses the CLI merged
	Since     time.Time      `json:"since"`               // start of the window counted
	Denials   uint64         `json:"denials"`             // every denial in the window, all keys
	Floor     uint64         `json:"floor"`               // most denials of a key not listed
	Capacity  int            `json:"capacity"`            // keys tracked per period
	Keys      []offenderInfo `json:"keys"`
}

// offenderInfo is one key of the top list, with its state now.
type offenderInfo struct {
	Key        string  `json:"key"`
	Denials    uint64  `json:"denials"`
	Error      uint64  `json:"error"`
	Limited    bool    `json:"limited"`   // denied if it sent a request now (concurrency zones: no slot free)
	Remaining  int64   `json:"remaining"` // quota left (concurrency zones: free slots)
	RetryAfter float64 `json:"retry_after"`
	ResetAfter float64 `json:"reset_after"`
	StateError string  `json:"state_error,omitempty"` // the store could not be read
}

// defaultTopN is how many keys GET .../top returns without ?n=.
const defaultTopN = 20

func (a *AdminAPI) top(w http.ResponseWriter, r *http.Request, z *zones.Zone) error {
	if r.Method != http.MethodGet {
		return methodNotAllowed(w, http.MethodGet)
	}
	offenders := z.State().Offenders
	n := defaultTopN
	if s := r.URL.Query().Get("n"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n < 1 {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("n=%q: want a positive number of keys (e.g. n=20)", s)}
		}
	}
	now := time.Now()
	sum := offenders.Top(n, now.UnixNano())
	out := topInfo{
		Zone:     z.Name,
		View:     "instance",
		Since:    time.Unix(0, sum.Since).UTC(),
		Denials:  sum.Total,
		Floor:    sum.Floor,
		Capacity: offenders.Capacity(),
		Keys:     make([]offenderInfo, 0, len(sum.Top)),
	}
	for _, e := range sum.Top {
		o := offenderState(r.Context(), z, e.Key, monotime.Now())
		o.Key, o.Denials, o.Error = e.Key, e.Count, e.Error
		out.Keys = append(out.Keys, o)
	}
	return writeJSON(w, out)
}

// offenderState reads key's state now, as GET .../keys/<key> does: a rate
// zone's remaining quota under the key's last plan, or a concurrency zone's
// free slots.
func offenderState(ctx context.Context, z *zones.Zone, key string, now int64) offenderInfo {
	var o offenderInfo
	if z.IsConcurrency() {
		inUse, err := z.SlotsInUse(ctx, key)
		if err != nil {
			o.StateError = err.Error()
			return o
		}
		o.Remaining = max(0, z.Concurrency-inUse)
		o.Limited = o.Remaining == 0
		return o
	}
	d, err := z.Peek(ctx, key, now)
	switch {
	case errors.Is(err, zones.ErrUnknownKey):
		o.Remaining = z.LastPlan(key, now).Burst
	case err != nil:
		o.StateError = err.Error()
	default:
		o.Limited = d.RetryAfter > 0
		o.Remaining = d.Remaining
		o.RetryAfter = d.RetryAfter.Seconds()
		o.ResetAfter = d.ResetAfter.Seconds()
	}
	return o
}
