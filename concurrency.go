package ratelimit

// The request path of concurrency zones (zones/concurrency.go takes and
// gives back the slots): a request holds its slots while next runs, and a
// denial by a later zone gives them back. Their order among zones is in
// zoneconfig.go, their headers in headers.go, their gauge in metrics.go and the
// admin view of a key's slots in admin.go.

import (
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
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
		if verdicts[i].Holds() {
			verdicts[i].Release()
		}
	}
}
