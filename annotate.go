package ratelimit

import (
	"net/http"
	"strings"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"
)

// limitedPlaceholder names the zones that denied a request or, in dry run,
// would have: comma-separated, tightest first, "" when none. It lets a
// dry-run zone annotate a request (request_header, header_up) instead of
// refusing it.
const limitedPlaceholder = "http.rate_limit.limited"

// annotate gives an allowed request of a handler with a dry-run zone its
// {http.rate_limit.limited}. Handlers without one never look the replacer
// up for it: an allowed request of theirs was limited by none of their
// zones, and a denial's provider (deny) names the denying zone.
func (h *Handler) annotate(r *http.Request, tickets []ticket) {
	if h.annotates {
		annotateWouldDeny(requestReplacer(r), tickets)
	}
}

// annotateWouldDeny sets the placeholder for an allowed request. Nothing
// limited (the common case) costs one static provider, which allocates
// nothing and is only called when some placeholder is read. A would-be
// denial is rare: its names are built and Set, which the replacer consults
// before any provider, so that a second rate_limit handler on the request
// adds its names to the first's rather than being hidden by its provider.
func annotateWouldDeny(repl *caddy.Replacer, tickets []ticket) {
	names := limitedNames(tickets, "")
	if names == "" {
		repl.Map(notLimited)
		return
	}
	if prev, _ := repl.GetString(limitedPlaceholder); prev != "" {
		names = prev + "," + names
	}
	repl.Set(limitedPlaceholder, names)
}

// limitedOnDenial is the placeholder's value on a denial of tickets'
// last zone, named denied, which deny's provider gives. A provider is
// consulted after those of the handlers before it on the request, so when
// one of them annotated (only possible while some handler has a dry-run
// zone) the names are joined to theirs and Set instead.
func limitedOnDenial(repl *caddy.Replacer, tickets []ticket, denied string) string {
	names := limitedNames(tickets, denied)
	if annotatingHandlers.Load() > 0 {
		if prev, known := repl.GetString(limitedPlaceholder); known {
			if prev != "" {
				names = prev + "," + names
			}
			repl.Set(limitedPlaceholder, names)
		}
	}
	return names
}

// annotatingHandlers counts the provisioned handlers with a dry-run zone,
// those that set the placeholder on allowed requests.
var annotatingHandlers atomic.Int64

// countAnnotating counts h among annotatingHandlers while it is
// provisioned; Cleanup calls it with false.
func (h *Handler) countAnnotating(on bool) {
	if on == h.counted {
		return
	}
	h.counted = on
	if on {
		annotatingHandlers.Add(1)
	} else {
		annotatingHandlers.Add(-1)
	}
}

// notLimited is the placeholder's provider when no zone limited the
// request. A function without captures: registering it allocates nothing.
func notLimited(placeholder string) (any, bool) {
	if placeholder == limitedPlaceholder {
		return "", true
	}
	return nil, false
}

// limitedNames is the placeholder's value: the dry-run zones of tickets
// that would have denied, then denied (the denying zone's name, or "").
// Without a would-be denial it is denied itself, allocating nothing.
func limitedNames(tickets []ticket, denied string) string {
	var b strings.Builder
	for i := range tickets {
		v := &tickets[i]
		if !v.Owner.dryRun || v.Decision.Allowed {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(v.Owner.Name)
	}
	if b.Len() == 0 {
		return denied
	}
	if denied != "" {
		b.WriteByte(',')
		b.WriteString(denied)
	}
	return b.String()
}
