// Package adminapi is the admin API's wire: the JSON package admin answers
// and `caddy rate-limit` reads back. The standard library only: the CLI
// links it without the handler.
package adminapi

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"
)

// ZoneInfo is a zone in GET /rate_limit/zones, without the fields its kind
// lacks (rate for concurrency and quota zones, fail_policy for connection).
type ZoneInfo struct {
	Name string `json:"name"`
	Rate
	Mode       string     `json:"mode"`
	FailPolicy string     `json:"fail_policy,omitempty"`
	DryRun     bool       `json:"dry_run"`
	LocalKeys  int        `json:"local_keys"`
	Store      *StoreInfo `json:"store,omitempty"`

	Concurrency int64      `json:"concurrency,omitempty"` // concurrency zones only
	Quota       *QuotaInfo `json:"quota,omitempty"`       // quota zones only
	Delay       string     `json:"delay,omitempty"`       // zones with delay, with queue and waiting
	Queue       int64      `json:"queue,omitempty"`
	Waiting     *int64     `json:"waiting,omitempty"`
	Layer       string     `json:"layer,omitempty"`  // "connection" for a listener wrapper's zone
	Scope       string     `json:"scope,omitempty"`  // "global" (with Region) or "region" when distributed
	Region      string     `json:"region,omitempty"` // this instance's
}

// QuotaInfo is a quota zone's limit and its period on this instance's clock.
type QuotaInfo struct {
	Limit int64 `json:"limit"`
	Period
}

// Rate is a zone's rate limit, or a key's plan.
type Rate struct {
	Events        int64   `json:"events,omitempty"`
	Window        string  `json:"window,omitempty"`
	WindowSeconds float64 `json:"window_seconds,omitempty"`
	Burst         int64   `json:"burst,omitempty"`
}

// Period is a quota's period, in RFC 3339 with the zone's offset.
type Period struct {
	Per         string `json:"per,omitempty"`
	TimeZone    string `json:"time_zone,omitempty"`
	PeriodStart string `json:"period_start,omitempty"`
	PeriodEnd   string `json:"period_end,omitempty"`
}

// State is what a key's next request gets, durations in seconds.
type State struct {
	Remaining  int64   `json:"remaining"` // concurrency zones: free slots
	RetryAfter float64 `json:"retry_after"`
	ResetAfter float64 `json:"reset_after"`
}

// StoreInfo is a distributed zone's Redis in GET /rate_limit/zones.
type StoreInfo struct {
	OK bool `json:"ok"`
	// Failing: calls fail (twice in a row or more) but the breaker lets
	// them through. BreakerOpenSince is when the outage began.
	Failing          bool       `json:"failing,omitempty"`
	BreakerOpenSince *time.Time `json:"breaker_open_since,omitempty"`
	Instances        int        `json:"instances"`
	// The last error Redis gave about one key, and when.
	LastProblem   string     `json:"last_problem,omitempty"`
	LastProblemAt *time.Time `json:"last_problem_at,omitempty"`
	// On a Redis Cluster, the masters the store cannot reach now.
	Unreachable []NodeOutage `json:"unreachable_nodes,omitempty"`
}

// NodeOutage is one unreachable Redis Cluster master.
type NodeOutage struct {
	Node  string    `json:"node"`
	Since time.Time `json:"since"`
}

// KeyInfo is GET /rate_limit/zones/<zone>/keys/<key>: the key's state now
// (as rate_limit_status reports it) and the limit it is under.
type KeyInfo struct {
	Zone string `json:"zone"`
	KeyName
	StoredAs string `json:"stored_as,omitempty"` // as stored (masked, hashed), if not the key given
	State
	Rate // rate zones: the limit the key is under (its plan)
	// Quota zones: the units used this period, of quota, and the period.
	Used  *int64 `json:"used,omitempty"`
	Quota int64  `json:"quota,omitempty"`
	Period
	// Concurrency zones: the key's requests in flight (fleet-wide when
	// distributed), of its limit.
	InUse       *int64 `json:"in_use,omitempty"`
	Concurrency int64  `json:"concurrency,omitempty"`
	// "local", "redis" or, in async mode, "instance": this instance's
	// lease of the key, with Redis's view in Fleet (or FleetError).
	Source     string  `json:"source"`
	Fleet      *State  `json:"fleet,omitempty"`
	FleetError string  `json:"fleet_error,omitempty"`
	BannedFor  float64 `json:"banned_for,omitempty"` // zones with ban
	BanLevel   int     `json:"ban_level,omitempty"`
	// Scope global zones: this region's share of the key's limit (0 to
	// 1), which remaining, events and burst are scaled to.
	Share    *float64  `json:"share,omitempty"`
	Region   string    `json:"region,omitempty"`
	Override *Override `json:"override,omitempty"` // the override covering the key, whose limit is above
	// usd zones: remaining, quota or burst, and used in dollars.
	USDFields
}

// KeyName names a key in the answers: "key" as text, where JSON turns a byte
// that is not UTF-8 into U+FFFD, so such a key also has "key_base64", which
// GET and DELETE take as ?key_base64= and `caddy rate-limit key|reset` as
// --base64.
type KeyName struct {
	Key       string `json:"key"`
	KeyBase64 string `json:"key_base64,omitempty"`
}

func NewKeyName(key string) KeyName {
	if utf8.ValidString(key) {
		return KeyName{Key: key}
	}
	return KeyName{Key: strings.ToValidUTF8(key, "\uFFFD"), KeyBase64: base64.StdEncoding.EncodeToString([]byte(key))}
}

func (k KeyName) Raw() string {
	if k.KeyBase64 != "" {
		if b, err := base64.StdEncoding.DecodeString(k.KeyBase64); err == nil {
			return string(b)
		}
	}
	return k.Key
}

// DecodeKeyBase64 reads a key given as ?key_base64=, a '+' that reached
// us unescaped (a space) taken back.
func DecodeKeyBase64(s string) (string, error) {
	b, err := base64.StdEncoding.DecodeString(strings.ReplaceAll(s, " ", "+"))
	if err != nil {
		return "", fmt.Errorf("key_base64=%q is not standard base64 (RFC 4648 §4, padded, query-escaped): %v", s, err)
	}
	return string(b), nil
}

// BansInfo is GET /rate_limit/zones/<zone>/bans: the zone's current bans,
// longest left first, at most 1000 (those ending last).
type BansInfo struct {
	Zone string    `json:"zone"`
	View string    `json:"view"` // "fleet": every instance's, from Redis; "instance": this one's (local mode)
	Bans []BanInfo `json:"bans"`
}

// BanInfo is one banned key of BansInfo.
type BanInfo struct {
	KeyName
	BannedFor float64 `json:"banned_for"`          // seconds left
	BanLevel  int     `json:"ban_level,omitempty"` // when known
}

// PartialReset answers a DELETE that Redis did not confirm.
type PartialReset struct {
	Error       string   `json:"error"`
	Reset       []string `json:"reset"`
	Unconfirmed []string `json:"unconfirmed"`
}

// DefaultTopN is how many keys GET .../top returns without ?n=, and how
// many `caddy rate-limit top` shows without -n.
const DefaultTopN = 20

// TopInfo is GET /rate_limit/zones/<zone>/top: the keys this instance denied
// most over the last one to two zones.OffendersPeriod, from a fixed-size
// sketch. A key's true count lies in [denials-error, denials], and no key
// unlisted was denied more than floor times (so the CLI can merge them).
type TopInfo struct {
	Zone      string         `json:"zone"`
	View      string         `json:"view"`                // "instance": this Caddy's denials only; "merged" by the CLI
	Addresses []string       `json:"addresses,omitempty"` // the admin addresses the CLI merged
	Since     time.Time      `json:"since"`               // start of the window counted
	Denials   uint64         `json:"denials"`             // every denial in the window, all keys
	Floor     uint64         `json:"floor"`               // most denials of a key not listed
	Capacity  int            `json:"capacity"`            // keys tracked per period
	DryRun    bool           `json:"dry_run,omitempty"`   // the denials are a dry run's would-be denials
	Keys      []OffenderInfo `json:"keys"`
}

// OffenderInfo is one key of the top list, with its state now.
type OffenderInfo struct {
	KeyName
	Denials uint64 `json:"denials"`
	Error   uint64 `json:"error"`
	Limited bool   `json:"limited"` // denied if it sent a request now (concurrency zones: no slot free)
	State
	BannedFor  float64 `json:"banned_for,omitempty"`  // zones with ban: the seconds its ban has left
	StateError string  `json:"state_error,omitempty"` // the store could not be read
}

// OverrideMatch says which keys an override covers: exactly one field.
type OverrideMatch struct {
	Key    *string `json:"key,omitempty"`
	Prefix *string `json:"prefix,omitempty"`
	CIDR   *string `json:"cidr,omitempty"`
}

// Override is an override as shown and stored (in Redis or Caddy's storage).
type Override struct {
	ID      string        `json:"id"`
	Match   OverrideMatch `json:"match"`
	Events  int64         `json:"events,omitempty"`
	Window  string        `json:"window,omitempty"`
	Burst   int64         `json:"burst,omitempty"`
	Limit   int64         `json:"limit,omitempty"` // quota zones
	N       int64         `json:"n,omitempty"`     // concurrency zones
	Exempt  bool          `json:"exempt,omitempty"`
	Deny    bool          `json:"deny,omitempty"`
	Expires string        `json:"expires,omitempty"` // RFC 3339, "" for never
	Reason  string        `json:"reason,omitempty"`
	SetBy   string        `json:"set_by"` // the admin request's remote address
	SetAt   string        `json:"set_at"` // RFC 3339, to the nanosecond
}

// OverridesInfo is GET /rate_limit/zones/<zone>/overrides.
type OverridesInfo struct {
	Zone      string     `json:"zone"`
	View      string     `json:"view"` // "fleet" (Redis) or "instance" (local zones)
	Overrides []Override `json:"overrides"`
}

// USDFields are a usd zone's amounts in dollars beside the integers (in
// micro-dollars): exact decimal strings such as "19.873412".
type USDFields struct {
	Unit         string `json:"unit,omitempty"` // "usd-micro" in a usd zone
	LimitUSD     string `json:"limit_usd,omitempty"`
	RemainingUSD string `json:"remaining_usd,omitempty"`
	UsedUSD      string `json:"used_usd,omitempty"` // quota zones
}

// ShortDuration turns Go's "1h0m0s" into "1h".
func ShortDuration(s string) string {
	if d, err := time.ParseDuration(s); err == nil {
		s = d.String()
		if strings.HasSuffix(s, "m0s") {
			s = s[:len(s)-2]
		}
		if strings.HasSuffix(s, "h0m") {
			s = s[:len(s)-2]
		}
	}
	return s
}

// WriteJSON writes v with status as JSON, not HTML-escaped: the answers
// are no web page.
func WriteJSON(w http.ResponseWriter, status int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}
