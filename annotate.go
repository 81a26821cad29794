package ratelimit

import (
	"net/http"
	"strings"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"
)

// limitedPlaceholder names the zones that denied a request or, in dry run,
// would have: it lets a dry-run zone annotate a request instead.
const limitedPlaceholder = "http.rate_limit.limited"

// annotate gives an allowed request of a handler with a dry-run zone its
// {http.rate_limit.limited}; other handlers leave it to a denial's
// provider. Nothing limited costs one static provider, which allocates
// nothing. A would-be denial's names are Set, which the replacer consults
// before any provider, so that a second handler on the request adds its
// names to the first's.
func (h *Handler) annotate(r *http.Request, tickets []ticket) {
	if !h.annotates {
		return
	}
	repl := requestReplacer(r)
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

// limitedOnDenial is the placeholder's value on a denial by zone denied,
// for deny's provider; when an earlier handler annotated the request, the
// names are joined to its and Set: its Set would hide a provider.
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

// annotatingHandlers counts the provisioned handlers with a dry-run zone.
var annotatingHandlers atomic.Int64

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

// notLimited captures nothing: registering it allocates nothing.
func notLimited(placeholder string) (any, bool) {
	if placeholder == limitedPlaceholder {
		return "", true
	}
	return nil, false
}

// limitedNames is the dry-run zones that would have denied, then denied
// (the denying zone, or ""); without any, denied itself, allocating nothing.
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
