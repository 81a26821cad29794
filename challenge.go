package ratelimit

import (
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddy-tally/ratelimit/challenge"
	"github.com/caddy-tally/ratelimit/internal/live"
	"github.com/caddy-tally/ratelimit/internal/monotime"
	"github.com/caddy-tally/ratelimit/zones"
)

// challengeTTL is how long a challenge of difficulty d may take: 5 minutes
// + 4 × a browser's.
func challengeTTL(d int) time.Duration {
	return 5*time.Minute + time.Duration(4*challenge.ExpectedHashes(d)/challenge.BrowserHashRate*float64(time.Second))
}

// usedPrefix starts a solved challenge's key: the replay guard is one step of the
// zone's store, one per challenge lifetime (with distributed, fleet-wide).
const usedPrefix = "challenge-used:"

type zoneChallenge struct {
	cfg         *Challenge
	secrets     *challenge.Secrets
	pressure    challenge.Pressure
	plan        zones.Plan // a cookie identity's limit
	used        zones.Plan // the replay guard's: one use per challenge lifetime
	cookie      string     // the cookie's name
	identityVar string     // the placeholder the identity is given in
	identities  challenge.Identities
	issued      prometheus.Counter
	solved      prometheus.Counter
	failed      map[challenge.Reason]prometheus.Counter
	solveTime   prometheus.Observer
}

var (
	challengeOutcomesVec = counterVec("challenges_total", "Challenges a zone issued (a page instead of a denial) and solved (a cookie set), by outcome: issued, solved.", "outcome")
	challengeFailuresVec = counterVec("challenge_failures_total", "Challenge submissions and cookies a zone refused, by reason: bad_nonce, expired, replayed, wrong_key (issued to another client key), forged, malformed, forged_cookie (a request whose cookie did not verify, then decided under its key).", "reason")
	challengeSolveVec    = histogramVec("challenge_solve_seconds", "How long solved challenges took, as the page reports it.", .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300)
)

func init() {
	gauge("challenge_identities", "Solved cookies' identities a zone with a challenge decided on this instance within the block's window (at most 100000 counted).", func(z *zones.Zone, _ int64) (float64, bool) {
		zh := httpZoneOf(z)
		if zh == nil || zh.challenge == nil {
			return 0, false
		}
		return float64(zh.challenge.identities.InUse(time.Now(), time.Duration(zh.challenge.cfg.Window))), true
	})
}

// provisionChallenge checks a challenge block and loads the secret; nothing
// needs releasing.
func provisionChallenge(ctx caddy.Context, c *Challenge, name string, zc *Zone, metrics bool) (*zoneChallenge, error) {
	if zc.Concurrency > 0 || zc.Quota != nil || zc.Adaptive != nil {
		return nil, fmt.Errorf("zone %s: challenge is for rate zones (events, window): a challenge gives a solved cookie a rate of its own; remove challenge, or put it in a rate zone", name)
	}
	if len(name) > challenge.MaxZoneLen {
		return nil, fmt.Errorf("zone %s: a zone with a challenge has a name of at most %d characters (every challenge token carries it); shorten the zone's name", name, challenge.MaxZoneLen)
	}
	if k := zc.Key; strings.Contains(k, "{http.request.uri") || strings.Contains(k, "{http.request.method") || strings.Contains(k, "{http.request.orig_") {
		return nil, fmt.Errorf("zone %s: a challenge binds its solution to the zone's key, which the submission to %s must share: use a key of the client ({client_ip}, a header, a cookie), not of the request's path, query or method (%s)", name, challenge.VerifyPath, k)
	}
	if err := c.Check(); err != nil {
		return nil, fmt.Errorf("zone %s: %v", name, err)
	}
	zc2 := &zoneChallenge{cfg: c, pressure: challenge.Pressure{Min: c.Difficulty, Max: c.DifficultyMax},
		cookie: challenge.CookiePrefix + name, identityVar: "http.rate_limit." + name + ".identity"}
	var err error
	zc2.plan, err = zones.NewPlan(c.MaxEvents, time.Duration(c.Window), 0)
	if err == nil {
		zc2.used, err = zones.NewPlan(1, challengeTTL(max(c.Difficulty, c.DifficultyMax)), 1)
	}
	if err == nil {
		zc2.secrets, err = challenge.LoadSecrets(ctx, ctx.Storage(), 2*time.Duration(c.Valid))
	}
	if err != nil {
		return nil, fmt.Errorf("zone %s: challenge: %v", name, err)
	}
	if metrics {
		zc2.issued, zc2.solved = challengeOutcomesVec.WithLabelValues(name, "issued"), challengeOutcomesVec.WithLabelValues(name, "solved")
		zc2.solveTime = challengeSolveVec.WithLabelValues(name)
		zc2.failed = make(map[challenge.Reason]prometheus.Counter, len(challenge.Reasons))
		for _, r := range challenge.Reasons {
			zc2.failed[r] = challengeFailuresVec.WithLabelValues(name, string(r))
		}
	}
	return zc2, nil
}

// identify decides a request with a valid cookie under its identity (given in
// {http.rate_limit.<zone>.identity}) and budget; an invalid one is counted.
func (c *zoneChallenge) identify(r *http.Request, v *ticket) {
	now := time.Now()
	// Every cookie of the name: a browser may send a stale or a parent
	// domain's one beside the valid one, in any order.
	for _, ck := range r.CookiesNamed(c.cookie) {
		id, ok, bad := c.secrets.Identity(v.Owner.Name, ck.Value, now)
		if bad {
			add(c.failed[challenge.ForgedCookie], 1)
		}
		if ok {
			v.Key, v.Raw, v.Plan = id, id, c.plan
			c.identities.Seen(id, now)
			requestReplacer(r).Set(c.identityVar, id)
			return
		}
	}
}

// challenge answers a denied browser navigation (GET or HEAD accepting text/html)
// with the page, unless an override denied it; it reports whether it did.
func (c *zoneChallenge) challenge(w http.ResponseWriter, r *http.Request, v *ticket, retry time.Duration) bool {
	if r.Method != http.MethodGet && r.Method != http.MethodHead || !strings.Contains(r.Header.Get("Accept"), "text/html") ||
		v.Override != nil && v.Override.Deny {
		return false
	}
	z := v.Owner
	// The client's key, not a spent cookie's identity: verify keys so.
	key := z.Config.Key(z.expandKey(r, requestReplacer(r)))
	now := time.Now()
	d := c.pressure.Next(key, now)
	page := challenge.Page(c.secrets.Issue(z.Name, key, d, now, challengeTTL(d)), d, retry)
	hdr := w.Header()
	hdr.Set("Content-Type", "text/html; charset=utf-8")
	hdr.Set("Cache-Control", "no-store")
	hdr.Set("Content-Length", strconv.Itoa(len(page)))
	w.WriteHeader(z.status)
	if r.Method == http.MethodGet {
		_, _ = w.Write(page)
	}
	add(c.issued, 1)
	return true
}

const maxSubmission = 4 << 10 // a challenge submission's body

// verifyChallenge answers a submission to challenge.VerifyPath, a zone having a
// challenge; one for another handler's zone goes on to next, which has it. A
// solution sets the cookie and redirects (303) back; a failure is a 400 or
// 403, never a 5xx. It costs one HMAC, one SHA-256 and, once solved, one step
// of the zone's store (the replay guard).
func (h *Handler) verifyChallenge(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	first := h.challengeZone("")
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return refuse(w, http.StatusMethodNotAllowed, "challenge solutions are POSTed", nil)
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxSubmission)
	// ParseForm reads no other body, and returns no error for it.
	if ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); ct != "application/x-www-form-urlencoded" || r.ParseForm() != nil {
		return refuse(w, http.StatusBadRequest, "challenge refused: malformed", first.challenge.failed[challenge.Malformed])
	}
	token := r.PostForm.Get("challenge")
	z := first
	if name, ok := challenge.Zone(token); ok {
		if z = h.challengeZone(name); z == nil {
			if zh := httpZoneOf(live.Lookup(name, true)); zh != nil && zh.challenge != nil {
				return next.ServeHTTP(w, r) // another rate_limit handler's: it answers, further on
			}
			// a token of another site or config
			return refuse(w, http.StatusForbidden, "challenge refused: forged", first.challenge.failed[challenge.Forged])
		}
	}
	c := z.challenge
	key := z.Config.Key(z.expandKey(r, requestReplacer(r)))
	now := time.Now()
	solved, reason := c.secrets.Verify(token, key, r.PostForm.Get("nonce"), now)
	if reason == "" {
		mono := monotime.Now()
		ctx, cancel := h.storeContext(r, mono, false)
		// In a zone with delay, a replay whose turn is near is admitted for
		// later, with a queue place: the guard never waits.
		if d := z.DecideWith(ctx, usedPrefix+solved.ID, mono, &c.used, 1); !d.Allowed || d.Delay > 0 {
			if d.Delay > 0 {
				z.EndWait()
			}
			reason = challenge.Replayed
		}
		cancel()
	}
	if reason != "" {
		return refuse(w, http.StatusForbidden, "challenge refused: "+string(reason), c.failed[reason])
	}
	value, _ := c.secrets.Mint(z.Name, now.Add(time.Duration(c.cfg.Valid)))
	http.SetCookie(w, &http.Cookie{Name: c.cookie, Value: value, Path: "/", MaxAge: int(time.Duration(c.cfg.Valid) / time.Second),
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteLaxMode})
	add(c.solved, 1)
	if ms, err := strconv.ParseInt(r.PostForm.Get("elapsed_ms"), 10, 64); err == nil && ms >= 0 && c.solveTime != nil {
		c.solveTime.Observe(float64(ms) / 1000)
	}
	w.Header().Set("Location", sameSiteReturn(r.PostForm.Get("return")))
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusSeeOther)
	return nil
}

// challengeZone is the handler's zone name ("": the first) with a
// challenge, or nil.
func (h *Handler) challengeZone(name string) *httpZone {
	for _, z := range h.zones {
		if z.challenge != nil && (name == "" || z.Name == name) {
			return z
		}
	}
	return nil
}

// sameSiteReturn is ret when it is a path of this site, else "/".
func sameSiteReturn(ret string) string {
	u, err := url.Parse(ret)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || !strings.HasPrefix(ret, "/") ||
		strings.HasPrefix(ret, "//") || strings.ContainsAny(ret, "\\\r\n\t") {
		return "/"
	}
	return ret
}

// refuse answers a submission with msg, counted in failed.
func refuse(w http.ResponseWriter, status int, msg string, failed prometheus.Counter) error {
	add(failed, 1)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(msg + "\n"))
	return nil
}
