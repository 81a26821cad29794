package ratelimit

// The handler's side of concurrency zones (zones/concurrency.go): holding
// slots while next runs, ordering, headers, the in-flight gauge and the admin
// view of a key's slots.

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddy-tally/ratelimit/zones"
)

// serveHoldingSlots calls next while the request holds concurrency slots,
// and releases them when next returns, panics included. A client that goes
// away cancels the request's context, which ends next (reverse_proxy returns
// when its upstream call is cancelled); a hijacked connection (WebSocket)
// holds its slot until the handler that hijacked it returns, which
// reverse_proxy does when the connection ends.
func serveHoldingSlots(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, verdicts []verdict) error {
	defer releaseSlots(verdicts)
	return next.ServeHTTP(w, r)
}

func releaseSlots(verdicts []verdict) {
	for i := range verdicts {
		if verdicts[i].slot.Held() {
			releaseSlot(&verdicts[i])
		}
	}
}

// releaseSlot gives v's slot back, and counts it as remaining again for the
// headers of a denial by a later zone.
func releaseSlot(v *verdict) {
	v.zone.Release(v.slot)
	v.slot = zones.Slot{}
	v.d.Remaining = min(v.d.Remaining+1, v.zone.Concurrency)
}

// compareConcurrency orders concurrency zones after rate zones, smallest
// concurrency first: a request a rate zone denies never takes a slot, and a
// slot, unlike a GCRA step, has to be given back.
func compareConcurrency(a, b *zoneHandler) int {
	switch {
	case !a.IsConcurrency():
		return -1
	case !b.IsConcurrency():
		return 1
	case a.Concurrency != b.Concurrency:
		if a.Concurrency < b.Concurrency {
			return -1
		}
		return 1
	}
	return strings.Compare(a.Name, b.Name)
}

// inFlightCollector reports, at scrape time, the requests each live
// concurrency zone has in flight in this process.
type inFlightCollector struct{ desc *prometheus.Desc }

func (c *inFlightCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *inFlightCollector) Collect(ch chan<- prometheus.Metric) {
	for name, z := range liveZones() {
		if z.IsConcurrency() {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(z.InFlight()), name)
		}
	}
}

func newInFlightCollector() *inFlightCollector {
	return &inFlightCollector{desc: prometheus.NewDesc("caddy_rate_limit_in_flight",
		"Requests holding a slot of a concurrency zone in this instance.", []string{"zone"}, nil)}
}

// slotsInfo is a concurrency zone's key as GET /rate_limit/zones/<zone>/keys/<key>
// shows it.
type slotsInfo struct {
	Zone        string `json:"zone"`
	Key         string `json:"key"`
	InUse       int64  `json:"in_use"`
	Concurrency int64  `json:"concurrency"`
	Remaining   int64  `json:"remaining"`
}

// getSlots answers GET for a key of a concurrency zone: the slots it holds,
// fleet-wide with distributed.
func (a *AdminAPI) getSlots(w http.ResponseWriter, r *http.Request, z *zones.Zone, key string) error {
	n, err := z.SlotsInUse(r.Context(), key)
	switch {
	case err != nil:
		return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: fmt.Errorf("reading slots: %v", err)}
	case n == 0:
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("zone %s: key %q holds no slot", z.Name, key)}
	}
	return writeJSON(w, slotsInfo{Zone: z.Name, Key: key, InUse: n, Concurrency: z.Concurrency, Remaining: max(0, z.Concurrency-n)})
}

// errResetSlots refuses DELETE on a concurrency zone's key: its slots belong
// to requests still running, and end with them.
var errResetSlots = errors.New("a concurrency zone's slots cannot be reset: they are freed when their requests end (or, with distributed, when their lease ends)")
