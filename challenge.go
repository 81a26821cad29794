package ratelimit

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddy-tally/ratelimit/challenge"
	"github.com/caddy-tally/ratelimit/internal/monotime"
	"github.com/caddy-tally/ratelimit/zones"
)

// Challenge makes a rate zone answer a browser's navigation it would deny
// with a proof-of-work page instead of its denial. Solving it sets a
// cookie whose own identity the zone then limits under events per window,
// instead of the client's key (docs/challenges.md).
type Challenge struct {
	// The leading zero hex digits the page must find in SHA-256(challenge
	// + nonce): each digit is 16 times the work. Default: 4.
	Difficulty int `json:"difficulty,omitempty"`
	// When set (above difficulty), the difficulty rises toward it with
	// the rate of challenges issued to the same network (the zone's key),
	// one digit per 16-fold rate, and falls back when it calms.
	DifficultyMax int `json:"difficulty_max,omitempty"`
	// How long a solved challenge's cookie lasts. Default: 24h.
	Valid caddy.Duration `json:"valid,omitempty"`
	// How many requests a solved cookie's identity may make per window,
	// instead of the client's key. Required.
	MaxEvents int64 `json:"max_events,omitempty"`
	// The window of a solved cookie's budget. Required.
	Window caddy.Duration `json:"window,omitempty"`
}

// MaxDifficulty is the most leading zero digits a challenge may ask for.
const MaxDifficulty = 10

// challengeTTL is how long a challenge may be solved and submitted at
// difficulty d: a few minutes plus four times what the page expects it to
// take in a browser.
func challengeTTL(d int) time.Duration {
	return 5*time.Minute + time.Duration(4*challenge.ExpectedHashes(d)/challenge.BrowserHashRate*float64(time.Second))
}

// usedPrefix starts the key of a solved challenge in its zone: the replay
// guard is one step of the zone's store under a limit of one per
// challenge's lifetime, so a challenge id is held until its expiry, in
// the zone's table (bounded by max_keys) or, with distributed, in Redis
// for the whole fleet.
const usedPrefix = "challenge-used:"

// zoneChallenge is a provisioned challenge block.
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

var challengeCollectors struct {
	outcomes, failures *prometheus.CounterVec
	solveTime          *prometheus.HistogramVec
}

func init() {
	c := &challengeCollectors
	c.outcomes = counterVec("challenges_total", "Challenges a zone issued (a page instead of a denial) and solved (a cookie set), by outcome: issued, solved.", "outcome")
	c.failures = counterVec("challenge_failures_total", "Challenge submissions and cookies a zone refused, by reason: bad_nonce, expired, replayed, wrong_key (issued to another client key), forged, malformed, forged_cookie (a request whose cookie did not verify, then decided under its key).", "reason")
	c.solveTime = histogramVec("challenge_solve_seconds", "How long solved challenges took, as the page reports it.", .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300)
	gauge("challenge_identities", "Solved cookies' identities a zone with a challenge decided on this instance within the block's window (at most 100000 counted).", func(z *zones.Zone, _ int64) (float64, bool) {
		zh := handlerOf(z)
		if zh == nil || zh.challenge == nil {
			return 0, false
		}
		return float64(zh.challenge.identities.InUse(time.Now(), time.Duration(zh.challenge.cfg.Window))), true
	})
}

// provision checks the block of zone name, a rate zone, and loads the
// secret from Caddy's storage. It takes nothing that needs releasing.
func (c *Challenge) provision(ctx caddy.Context, name string, zc *Zone, metrics bool) (*zoneChallenge, error) {
	if zc.Concurrency > 0 || zc.Quota != nil || zc.Adaptive != nil {
		return nil, fmt.Errorf("zone %s: challenge is for rate zones (events, window): a challenge gives a solved cookie a rate of its own; remove challenge, or put it in a rate zone", name)
	}
	if err := c.check(); err != nil {
		return nil, fmt.Errorf("zone %s: %v", name, err)
	}
	plan, err := zones.NewPlan(c.MaxEvents, time.Duration(c.Window), 0)
	if err != nil {
		return nil, fmt.Errorf("zone %s: challenge: %v", name, err)
	}
	used, err := zones.NewPlan(1, challengeTTL(max(c.Difficulty, c.DifficultyMax)), 1)
	if err != nil {
		return nil, fmt.Errorf("zone %s: challenge: %v", name, err)
	}
	secrets, err := challenge.LoadSecrets(ctx, ctx.Storage(), 2*time.Duration(c.Valid))
	if err != nil {
		return nil, fmt.Errorf("zone %s: challenge: %v", name, err)
	}
	zc2 := &zoneChallenge{cfg: c, secrets: secrets, pressure: challenge.Pressure{Min: c.Difficulty, Max: c.DifficultyMax},
		plan: plan, used: used, cookie: challenge.CookiePrefix + name, identityVar: "http.rate_limit." + name + ".identity"}
	if metrics {
		co := &challengeCollectors
		zc2.issued, zc2.solved = co.outcomes.WithLabelValues(name, "issued"), co.outcomes.WithLabelValues(name, "solved")
		zc2.solveTime = co.solveTime.WithLabelValues(name)
		zc2.failed = make(map[challenge.Reason]prometheus.Counter, len(challenge.Reasons))
		for _, r := range challenge.Reasons {
			zc2.failed[r] = co.failures.WithLabelValues(name, string(r))
		}
	}
	return zc2, nil
}

// check fills in the defaults and refuses what cannot work, naming the
// fix.
func (c *Challenge) check() error {
	if c.Difficulty == 0 {
		c.Difficulty = 4
	}
	if c.Valid == 0 {
		c.Valid = caddy.Duration(24 * time.Hour)
	}
	switch {
	case c.Difficulty < 1 || c.Difficulty > MaxDifficulty:
		return fmt.Errorf("challenge difficulty must be from 1 to %d leading zero hex digits (each is 16 times the work; 4 takes a browser about a second), not %d", MaxDifficulty, c.Difficulty)
	case c.DifficultyMax != 0 && (c.DifficultyMax < c.Difficulty || c.DifficultyMax > MaxDifficulty):
		return fmt.Errorf("challenge difficulty's upper bound must be from the lower bound (%d) to %d, not %d: difficulty 4 8", c.Difficulty, MaxDifficulty, c.DifficultyMax)
	case c.Valid < 0:
		return fmt.Errorf("challenge valid must be a positive duration, how long a solved cookie lasts: valid 24h")
	case c.MaxEvents <= 0:
		return fmt.Errorf("challenge needs the budget of a solved cookie: events 600 and window 1h in the challenge block")
	case c.Window <= 0:
		return fmt.Errorf("challenge needs the window of a solved cookie's budget: window 1h in the challenge block")
	}
	return nil
}

// unmarshalChallenge reads a zone's challenge block.
func unmarshalChallenge(d *caddyfile.Dispenser) (*Challenge, error) {
	c := new(Challenge)
	line := d.Line()
	err := subdirectives(d, nil, "challenge: ", func(sub string) (err error) {
		switch sub {
		case "difficulty":
			args := d.RemainingArgs()
			if len(args) < 1 || len(args) > 2 {
				return d.Err("challenge difficulty takes the leading zero hex digits, or a lower and an upper bound: difficulty 4, or difficulty 4 8")
			}
			if c.Difficulty, err = parseDifficulty(d, args[0]); err == nil && len(args) == 2 {
				c.DifficultyMax, err = parseDifficulty(d, args[1])
			}
		case "valid":
			c.Valid, err = durationArg(d)
		case "events":
			c.MaxEvents, err = intArg[int64](d, 1, zones.MaxEvents)
		case "window":
			c.Window, err = durationArg(d)
		default:
			err = d.Errf("unknown challenge setting %q: expected difficulty, valid, events or window", sub)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	if err := c.check(); err != nil {
		return nil, fmt.Errorf("%v, at %s:%d", err, d.File(), line)
	}
	return c, nil
}

func parseDifficulty(d *caddyfile.Dispenser, s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > MaxDifficulty {
		return 0, d.Errf("challenge difficulty %q must be a whole number of leading zero hex digits from 1 to %d (4 takes a browser about a second): difficulty 4, or difficulty 4 8", s, MaxDifficulty)
	}
	return n, nil
}

// identify decides the request under its cookie's identity and budget
// when it carries a valid cookie of the zone: the identity is the ticket's
// key (bans, overrides, top and the admin API see it as any key) and the
// placeholder {http.rate_limit.<zone>.identity} gives it to later
// handlers. A forged, truncated or foreign cookie is counted and the
// request is decided under its key, as one without.
func (c *zoneChallenge) identify(r *http.Request, v *verdict) {
	ck, err := r.Cookie(c.cookie)
	if err != nil {
		return
	}
	now := time.Now()
	id, ok, bad := c.secrets.Identity(v.Owner.Name, ck.Value, now)
	if bad {
		add(c.failed[challenge.ForgedCookie], 1)
	}
	if !ok {
		return
	}
	v.Key, v.Raw, v.Plan = id, id, c.plan
	c.identities.Seen(id, now)
	requestReplacer(r).Set(c.identityVar, id)
}

// challenge answers a request v denied with the challenge page when it is
// a browser's navigation (GET or HEAD accepting text/html) and the denial
// is the limit's, not an override's deny; it reports whether it did. The
// page has the zone's denial status and headers (Retry-After: when a
// client without JavaScript may try again) and is never cached.
func (c *zoneChallenge) challenge(w http.ResponseWriter, r *http.Request, v *verdict, retry time.Duration) bool {
	if r.Method != http.MethodGet && r.Method != http.MethodHead || !strings.Contains(r.Header.Get("Accept"), "text/html") ||
		v.Override != nil && v.Override.Deny {
		return false
	}
	z := v.Owner
	// The client's key, also when it was decided under a spent cookie's
	// identity: the verify request is keyed the same way.
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

// maxSubmission bounds a challenge submission's body.
const maxSubmission = 4 << 10

// verifyChallenge answers a submission to challenge.VerifyPath when one of
// the handler's zones has a challenge, and reports whether it did. A
// solution sets the zone's cookie and redirects (303) to the page the
// challenge came from (a path of this site, else /); any failure is a 400
// (not a form) or 403 with a short text body, never a 5xx. A submission
// costs one HMAC, one SHA-256 and, once solved, one step of the zone's
// store (the replay guard).
func (h *Handler) verifyChallenge(w http.ResponseWriter, r *http.Request) bool {
	var first *zoneHandler
	for _, z := range h.zones {
		if z.challenge != nil {
			first = z
			break
		}
	}
	if first == nil {
		return false
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		refuse(w, http.StatusMethodNotAllowed, "challenge solutions are POSTed")
		return true
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxSubmission)
	if err := r.ParseForm(); err != nil {
		add(first.challenge.failed[challenge.Malformed], 1)
		refuse(w, http.StatusBadRequest, "challenge refused: malformed")
		return true
	}
	token := r.PostForm.Get("challenge")
	z := first
	if name, ok := challenge.Zone(token); ok {
		z = nil
		for _, zh := range h.zones {
			if zh.Name == name && zh.challenge != nil {
				z = zh
			}
		}
		if z == nil { // a token of another site or config
			add(first.challenge.failed[challenge.Forged], 1)
			refuse(w, http.StatusForbidden, "challenge refused: forged")
			return true
		}
	}
	c := z.challenge
	key := z.Config.Key(z.expandKey(r, requestReplacer(r)))
	now := time.Now()
	solved, reason := c.secrets.Verify(token, key, r.PostForm.Get("nonce"), now)
	if reason == "" {
		mono := monotime.Now()
		ctx, cancel := h.storeContext(r, mono)
		if !z.DecideWith(ctx, usedPrefix+solved.ID, mono, &c.used, 1).Allowed {
			reason = challenge.Replayed
		}
		cancel()
	}
	if reason != "" {
		add(c.failed[reason], 1)
		refuse(w, http.StatusForbidden, "challenge refused: "+string(reason))
		return true
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
	return true
}

// sameSiteReturn is where a solved challenge sends the browser back: ret
// when it is a path of this site (with its query), else "/".
func sameSiteReturn(ret string) string {
	u, err := url.Parse(ret)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || !strings.HasPrefix(ret, "/") ||
		strings.HasPrefix(ret, "//") || strings.ContainsAny(ret, "\\\r\n\t") {
		return "/"
	}
	return ret
}

func refuse(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(msg + "\n"))
}
