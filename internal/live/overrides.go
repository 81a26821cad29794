package live

// Overrides: an operator's runtime exceptions to a zone's limit, set through
// the admin API. Distributed zones keep them in Redis, every instance
// following the changes; local zones per instance in Caddy's storage.

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/http"
	"net/netip"
	"path"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/caddy-tally/ratelimit/internal/adminapi"
	"github.com/caddy-tally/ratelimit/zones"
)

// Bounds on an override's fields.
const (
	maxOverrideBody   = 16 << 10
	maxOverrideID     = 128
	maxOverrideReason = 1024
	maxOverrideExpiry = 100 * 365 * 24 * time.Hour
	// overridePoll is how often a holder reads the store's changes and drops
	// lapsed overrides: it bounds the wait when a change's message is lost.
	overridePoll = 250 * time.Millisecond
	// overridesCall bounds one call to the store about a zone's overrides.
	overridesCall = 2 * time.Second
	// overrideDir keeps local zones' overrides in Caddy's storage, a file per
	// override so that a change writes one: <dir>/<instance id>/<zone>/<id>.json.
	overrideDir = "tally/overrides"
)

// OverrideRecord is an override as shown and stored (adminapi.Override's
// JSON) with its version, which orders the changes: the store's, or set_at.
type OverrideRecord struct {
	adminapi.Override
	version int64
}

// overrideBody is PUT's body; expires may also be a duration from now.
type overrideBody struct {
	Match   *adminapi.OverrideMatch `json:"match"`
	Events  *int64                  `json:"events"`
	Window  *string                 `json:"window"`
	Burst   *int64                  `json:"burst"`
	Limit   *int64                  `json:"limit"`
	N       *int64                  `json:"n"`
	Exempt  bool                    `json:"exempt"`
	Deny    bool                    `json:"deny"`
	Expires string                  `json:"expires"`
	Reason  string                  `json:"reason"`
}

func fieldError(field, why string, args ...any) error {
	return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("%s: %s", field, fmt.Sprintf(why, args...))}
}

func checkText(field, s string, maxLen int) error {
	switch {
	case len(s) > maxLen:
		return fieldError(field, "longer than %d bytes", maxLen)
	case strings.ContainsRune(s, utf8.RuneError): // JSON's decoder's stand-in for bytes that are not UTF-8
		return fieldError(field, "holds U+FFFD, which a JSON body carries for bytes that are not UTF-8: give UTF-8 text")
	case strings.IndexFunc(s, unicode.IsControl) >= 0:
		return fieldError(field, "holds a control character")
	}
	return nil
}

// CheckOverrideID reports what is wrong with an override id: 1 to 128 of
// letters, digits, '.', '_' and '-', not "." or "..".
func CheckOverrideID(id string) error {
	bad := func(c rune) bool {
		return !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.')
	}
	if id == "" || len(id) > maxOverrideID || id == "." || id == ".." || strings.IndexFunc(id, bad) >= 0 {
		return fieldError("id", "%q must be 1 to %d letters, digits, '.', '_' or '-' (not . or ..)", strings.ToValidUTF8(id, "?"), maxOverrideID)
	}
	return nil
}

// ParseOverride reads a PUT body of zone z's override id (which
// CheckOverrideID passed), set by from at now; a bad body is a 400 naming
// the field.
func ParseOverride(z *zones.Zone, id, from string, body io.Reader, now time.Time) (OverrideRecord, error) {
	raw, err := io.ReadAll(io.LimitReader(body, maxOverrideBody+1))
	if err != nil {
		return OverrideRecord{}, caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("reading the body: %v", err)}
	}
	if len(raw) > maxOverrideBody {
		return OverrideRecord{}, caddy.APIError{HTTPStatus: http.StatusRequestEntityTooLarge, Err: fmt.Errorf("body: larger than %d bytes", maxOverrideBody)}
	}
	var b overrideBody
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		return OverrideRecord{}, fieldError("body", "not a JSON object of an override (match, events, window, burst, limit, n, exempt, deny, expires, reason): %v", err)
	}
	if dec.More() {
		return OverrideRecord{}, fieldError("body", "more than one JSON value")
	}
	rec := OverrideRecord{Override: adminapi.Override{ID: id, Exempt: b.Exempt, Deny: b.Deny, Reason: b.Reason, SetBy: from, SetAt: now.UTC().Format(time.RFC3339Nano)}}
	if err := checkText("reason", b.Reason, maxOverrideReason); err != nil {
		return rec, err
	}
	if rec.Match, err = checkMatch(z, b.Match); err != nil {
		return rec, err
	}
	if rec.Expires, err = parseExpires(b.Expires, now); err != nil {
		return rec, err
	}
	limits := b.Events != nil || b.Window != nil || b.Burst != nil || b.Limit != nil || b.N != nil
	switch {
	case b.Exempt && b.Deny:
		return rec, fieldError("exempt", "an override is exempt or deny, not both")
	case (b.Exempt || b.Deny) && limits:
		return rec, fieldError("exempt", "exempt and deny take no limit: remove events, window, burst, limit and n")
	case b.Exempt || b.Deny:
		return rec, nil
	}
	switch {
	case z.IsAdaptive():
		return rec, fieldError("n", "an adaptive zone's limit follows the upstream: its override is exempt or deny")
	case z.IsConcurrency(), z.IsQuota():
		field, v, dst, takes := "n", b.N, &rec.N, "a concurrency zone's override takes n, the requests in flight per key"
		if z.IsQuota() {
			field, v, dst, takes = "limit", b.Limit, &rec.Limit, fmt.Sprintf("a quota zone's override takes limit, the units per %s", z.Period)
		}
		// v is one of n and limit: the other must be absent too
		if v == nil || b.Events != nil || b.Window != nil || b.Burst != nil || b.N != nil && b.Limit != nil {
			return rec, fieldError(field, "%s (or exempt or deny)", takes)
		}
		if *v < 1 || *v > zones.MaxEvents {
			return rec, fieldError(field, "must be a whole number from 1 to 2^40")
		}
		*dst = *v
	default:
		if b.Limit != nil || b.N != nil {
			return rec, fieldError("events", "a rate zone's override takes events and window (and burst), not limit or n")
		}
		if b.Events == nil || b.Window == nil {
			return rec, fieldError("events", "a rate zone's override needs events and window (e.g. \"events\": 50, \"window\": \"1m\"), or exempt or deny")
		}
		var burst int64
		if b.Burst != nil {
			if burst = *b.Burst; burst < 1 {
				return rec, fieldError("burst", "must be a whole number from 1 to 2^40")
			}
		}
		w, err := caddy.ParseDuration(*b.Window)
		if err != nil {
			return rec, fieldError("window", "%q is not a duration such as 1m", *b.Window)
		}
		if _, err := zones.NewPlan(*b.Events, w, burst); err != nil {
			field := "events"
			switch {
			case errors.Is(err, zones.ErrWindow):
				field = "window"
			case errors.Is(err, zones.ErrBurst), errors.Is(err, zones.ErrSpan):
				field = "burst"
			}
			return rec, fieldError(field, "%v", err)
		}
		rec.Events, rec.Window, rec.Burst = *b.Events, adminapi.ShortDuration(w.String()), burst
	}
	return rec, nil
}

// checkMatch returns m as stored: an exact key as zone z stores it
// (masked, hashed), a CIDR masked.
func checkMatch(z *zones.Zone, m *adminapi.OverrideMatch) (adminapi.OverrideMatch, error) {
	if m == nil {
		return adminapi.OverrideMatch{}, fieldError("match", "required: {\"key\": …}, {\"prefix\": …} or {\"cidr\": …}")
	}
	n := 0
	for _, p := range []*string{m.Key, m.Prefix, m.CIDR} {
		if p != nil {
			n++
		}
	}
	if n != 1 {
		return adminapi.OverrideMatch{}, fieldError("match", "give exactly one of key, prefix and cidr")
	}
	switch {
	case m.Key != nil:
		if *m.Key == "" {
			// zones.Override tells a key match by a key that is not empty
			return adminapi.OverrideMatch{}, fieldError("match.key",
				"empty: it is the bucket of requests whose key expanded to nothing (answer those before rate_limit, with a matcher)")
		}
		if err := checkText("match.key", *m.Key, zones.MaxKeyLength); err != nil {
			return adminapi.OverrideMatch{}, err
		}
		k := *m.Key
		if a, err := netip.ParseAddr(k); err == nil {
			k = a.Unmap().String() // as requests carry it: 2001:DB8::5 is 2001:db8::5
		}
		k = z.Config.Key(k)
		return adminapi.OverrideMatch{Key: &k}, nil
	case m.Prefix != nil:
		if *m.Prefix == "" {
			return adminapi.OverrideMatch{}, fieldError("match.prefix", "empty: it would cover every key (set the zone's limit instead)")
		}
		return *m, checkText("match.prefix", *m.Prefix, zones.MaxKeyLength)
	}
	p, err := netip.ParsePrefix(*m.CIDR)
	if err != nil {
		return adminapi.OverrideMatch{}, fieldError("match.cidr", "%q is not a CIDR such as 203.0.113.0/24", strings.ToValidUTF8(*m.CIDR, "?"))
	}
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		// Keys are stored unmapped: a mapped CIDR covers them as IPv4.
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	family, zoneBits := "ipv6_prefix", z.IPv6Prefix
	if p.Addr().Is4() {
		family, zoneBits = "ipv4_prefix", z.IPv4Prefix
	}
	switch {
	case p.Bits() == 0:
		return adminapi.OverrideMatch{}, fieldError("match.cidr", "%s covers every address (set the zone's limit instead)", p)
	case zoneBits > 0 && p.Bits() > zoneBits:
		return adminapi.OverrideMatch{}, fieldError("match.cidr", "%s is narrower than the zone's %s %d: every key of the zone is a /%d, so it would cover none (use /%d or wider)",
			p, family, zoneBits, zoneBits, zoneBits)
	}
	s := p.Masked().String()
	return adminapi.OverrideMatch{CIDR: &s}, nil
}

// parseExpires reads expires: "" (never), a duration from now, or an RFC
// 3339 time in the future; it returns RFC 3339.
func parseExpires(s string, now time.Time) (string, error) {
	if s == "" {
		return "", nil
	}
	var at time.Time
	if d, err := caddy.ParseDuration(s); err == nil {
		if d <= 0 || d > maxOverrideExpiry {
			return "", fieldError("expires", "%q must be a positive duration of at most 100 years", s)
		}
		at = now.Add(d)
	} else if at, err = time.Parse(time.RFC3339Nano, s); err != nil {
		return "", fieldError("expires", "%q is neither a duration such as 2h nor an RFC 3339 time", strings.ToValidUTF8(s, "?"))
	} else if !at.After(now) || at.Sub(now) > maxOverrideExpiry {
		return "", fieldError("expires", "%q must be in the future, within 100 years", s)
	}
	return at.UTC().Format(time.RFC3339Nano), nil
}

func (r OverrideRecord) setAt() int64 {
	t, _ := time.Parse(time.RFC3339Nano, r.SetAt)
	return t.UnixNano()
}

// expiresAt is zero for never.
func (r OverrideRecord) expiresAt() time.Time {
	t, _ := time.Parse(time.RFC3339Nano, r.Expires)
	return t
}

func (r OverrideRecord) inForce(now time.Time) bool {
	return r.expiresAt().IsZero() || now.Before(r.expiresAt())
}

// override is the record as zone c resolves it, or an error when it does
// not fit c's kind (the zone changed kind since it was set); a record
// without a match is zones.OverrideSet.With's to refuse.
func (r OverrideRecord) override(c zones.Config) (*zones.Override, error) {
	o := &zones.Override{ID: r.ID, Exempt: r.Exempt, Deny: r.Deny}
	if t := r.expiresAt(); !t.IsZero() {
		o.Expires = t.UnixNano()
	}
	switch m := r.Match; {
	case m.Key != nil:
		o.Key = *m.Key
	case m.Prefix != nil:
		o.Prefix = *m.Prefix
	case m.CIDR != nil:
		p, err := netip.ParsePrefix(*m.CIDR)
		if err != nil {
			return nil, err
		}
		o.CIDR = p
	}
	if r.Exempt || r.Deny {
		return o, nil
	}
	var err error
	switch {
	case c.IsConcurrency() && r.N > 0:
		o.Plan = zones.ConcurrencyPlan(r.N)
	case c.IsQuota() && r.Limit > 0:
		o.Plan = zones.QuotaPlan(r.Limit)
	case !c.IsConcurrency() && !c.IsQuota() && r.Events > 0:
		var w time.Duration
		if w, err = caddy.ParseDuration(r.Window); err == nil {
			o.Plan, err = zones.NewPlan(r.Events, w, r.Burst)
		}
	default:
		err = errors.New("its limit does not fit the zone's kind")
	}
	return o, err
}

func (r OverrideRecord) stored() zones.StoredOverride {
	data, _ := json.Marshal(r)
	return zones.StoredOverride{ID: r.ID, Expires: r.expiresAt(), Record: data}
}

// storedInOrder is records in the order of their changes, which Restore
// versions them by: of two overrides of one match, the latest stays.
func storedInOrder(records []OverrideRecord) []zones.StoredOverride {
	slices.SortStableFunc(records, func(a, b OverrideRecord) int { return cmp.Compare(a.version, b.version) })
	stored := make([]zones.StoredOverride, 0, len(records))
	for _, r := range records {
		stored = append(stored, r.stored())
	}
	return stored
}

// overrideHolders pools the holders by store and zone name.
var overrideHolders = caddy.NewUsagePool()

// OverrideHolder is one zone name's overrides on one store (or this
// instance's storage), pooled so that a reload never drops them: the
// records, the set requests read, and the loop that follows changes.
type OverrideHolder struct {
	name    string
	set     zones.Overrides
	logger  *zap.Logger
	remote  *zones.OverrideStore // distributed zones, else nil
	storage certmagic.Storage    // local zones
	dir     string               // local zones: the records' folder in storage, a file per override ("": none stored yet, no instance id)

	follows sync.Mutex        // distributed: serialises reads of the store, so that they apply in order
	at      zones.OverridesAt // distributed: the point of the store last read; h.follows is held
	mu      sync.Mutex        // serialises changes, loads and rebuilds
	records map[string]OverrideRecord
	cfg     zones.Config // the zone's latest definition, which records resolve under
	next    time.Time    // the earliest expiry among the records, zero if none

	stop, done chan struct{}
	moved      chan struct{} // distributed: another instance changed them
	unlisten   func()
}

// LoadOverrideHolder returns the holder of zone cfg's overrides on remote
// (nil: in ctx's storage) and its pool key. A new holder of a name another
// holder serves (the zone changed mode) starts with its overrides.
func LoadOverrideHolder(ctx caddy.Context, cfg zones.Config, remote *zones.OverrideStore, storeKey string, logger *zap.Logger) (*OverrideHolder, string, error) {
	key := "local\x00" + cfg.Name
	if remote != nil {
		key = storeKey + "\x00" + cfg.Name
	}
	v, _, err := overrideHolders.LoadOrNew(key, func() (caddy.Destructor, error) {
		h := &OverrideHolder{name: cfg.Name, logger: logger.Named("overrides"), remote: remote, records: map[string]OverrideRecord{},
			cfg: cfg, stop: make(chan struct{}), done: make(chan struct{})}
		if remote != nil {
			h.moved = make(chan struct{}, 1)
			h.unlisten = remote.Moved(cfg.Name, h.moved)
		} else {
			// The instance id is read, not created: an instance without one
			// has stored no override, and `caddy validate` writes nothing.
			h.storage = ctx.Storage()
			if instance, ok := InstanceID(); ok {
				h.dir = path.Join(overrideDir, instance, cfg.Name)
			}
		}
		if old := View(Lookup(cfg.Name, true)).Overrides; old != nil {
			h.carry(old.List())
		}
		h.load(context.Background())
		go h.loop()
		return h, nil
	})
	if err != nil {
		return nil, "", err
	}
	h := v.(*OverrideHolder)
	h.mu.Lock()
	if h.cfg != cfg {
		h.cfg = cfg
		h.rebuild(time.Now()) // the records resolve again under the new definition
	}
	h.mu.Unlock()
	return h, key, nil
}

// carry makes list, the overrides on the store the zone leaves, h's: a
// store keeps those it holds (another instance moved first), a local
// zone's storage takes list as it is.
func (h *OverrideHolder) carry(list []OverrideRecord) {
	if h.remote != nil {
		ctx, cancel := context.WithTimeout(context.Background(), overridesCall)
		defer cancel()
		if _, err := h.remote.Restore(ctx, h.name, storedInOrder(list)); err != nil {
			h.logger.Warn("carrying the zone's overrides to its new store", zap.String("zone", h.name), zap.Error(err))
		}
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.loadStorage(context.Background())
	for _, r := range list {
		delete(h.records, r.ID)
		if err := h.write(r.ID, &r); err != nil {
			h.logger.Warn("carrying an override to the instance's storage", zap.String("zone", h.name), zap.String("id", r.ID), zap.Error(err))
		}
	}
	for id := range h.records {
		if err := h.write(id, nil); err != nil {
			h.logger.Warn("removing an override the zone no longer holds from storage", zap.String("zone", h.name), zap.String("id", id), zap.Error(err))
		}
	}
}

func (h *OverrideHolder) Destruct() error {
	if h.unlisten != nil {
		h.unlisten()
	}
	close(h.stop)
	<-h.done
	return nil
}

func (h *OverrideHolder) loop() {
	defer close(h.done)
	tick := time.NewTicker(overridePoll)
	defer tick.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-tick.C:
		case <-h.moved: // nil for a local zone
		}
		if h.remote != nil {
			h.load(context.Background())
		}
		h.mu.Lock()
		h.sweep(time.Now())
		h.mu.Unlock()
	}
}

// load reads the records from storage, or the store's changes, into the
// set. A store that lost what this instance read (a new epoch, or none)
// gets its copies back, with a WARN from the instance that restored them:
// an emptied store never reads as every override removed.
func (h *OverrideHolder) load(ctx context.Context) {
	if h.remote == nil {
		h.mu.Lock()
		h.loadStorage(ctx)
		h.rebuild(time.Now())
		h.mu.Unlock()
		forgetDenials(h.name)
		return
	}
	h.follows.Lock()
	defer h.follows.Unlock()
	ctx, cancel := context.WithTimeout(ctx, overridesCall)
	defer cancel()
	read, err := h.remote.Read(ctx, h.name, h.at)
	if err != nil {
		if h.at.Epoch == "" {
			h.logger.Warn("reading the zone's overrides from Redis", zap.String("zone", h.name), zap.Error(err))
		}
		return
	}
	if h.at.Epoch != "" && read.At.Epoch != h.at.Epoch {
		if copies := h.List(); len(copies) > 0 {
			n, err := h.remote.Restore(ctx, h.name, storedInOrder(copies))
			if err != nil {
				h.logger.Warn("Redis lost the zone's overrides and restoring them failed; this instance keeps its copies and retries", zap.String("zone", h.name), zap.Error(err))
				return
			}
			if n > 0 {
				h.logger.Warn("Redis lost the zone's overrides: restored from this instance's copies", zap.String("zone", h.name), zap.Int("restored", n))
			}
			if read, err = h.remote.Read(ctx, h.name, zones.OverridesAt{}); err != nil {
				return
			}
		}
	}
	if read.At == h.at && len(read.Changes) == 0 {
		return
	}
	h.mu.Lock()
	// The set changes once, every change applied: a read of the whole set
	// never passes through an empty one, which would lift a deny.
	set := h.set.Load()
	if read.All {
		h.records = map[string]OverrideRecord{}
		set = nil
	}
	for _, s := range read.Changes {
		var r *OverrideRecord
		if s.Record != nil {
			r = &OverrideRecord{version: s.Version}
			if json.Unmarshal(s.Record, r) != nil || r.ID != s.ID {
				continue
			}
		}
		set = h.applyTo(set, s.ID, r)
	}
	h.set.Store(set)
	h.at = read.At
	h.mu.Unlock()
	forgetDenials(h.name)
}

// loadStorage: h.mu is held.
func (h *OverrideHolder) loadStorage(ctx context.Context) {
	h.records = map[string]OverrideRecord{}
	if h.dir == "" {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, RestoreTimeout)
	defer cancel()
	files, err := h.storage.List(ctx, h.dir, false)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		h.logger.Warn("reading the zone's overrides from storage", zap.String("zone", h.name), zap.Error(err))
	}
	for _, f := range files {
		data, err := h.storage.Load(ctx, f)
		var r OverrideRecord
		if err == nil {
			err = json.Unmarshal(data, &r)
		}
		if err != nil || path.Base(f) != r.ID+".json" {
			h.logger.Warn("an override in storage is unreadable; skipped", zap.String("zone", h.name), zap.String("file", f), zap.Error(err))
			continue
		}
		r.version = r.setAt()
		h.records[r.ID] = r
	}
}

func (h *OverrideHolder) apply(id string, r *OverrideRecord) {
	h.set.Store(h.applyTo(h.set.Load(), id, r))
}

// applyTo is set and the records with r in place of id (nil: without), in
// O(log N); h.mu is held. A lapsed record stays until a rebuild, and
// lookups pass it over.
func (h *OverrideHolder) applyTo(set *zones.OverrideSet, id string, r *OverrideRecord) *zones.OverrideSet {
	set = set.Without(id)
	delete(h.records, id)
	if r != nil {
		set = h.add(set, *r)
		h.records[id] = *r
	}
	return set
}

// add returns set with r resolved, noting r's expiry; h.mu is held.
func (h *OverrideHolder) add(set *zones.OverrideSet, r OverrideRecord) *zones.OverrideSet {
	if exp := r.expiresAt(); !exp.IsZero() && (h.next.IsZero() || exp.Before(h.next)) {
		h.next = exp
	}
	o, err := r.override(h.cfg)
	if err == nil {
		var with *zones.OverrideSet
		if with, err = set.With(o, r.version); err == nil {
			return with
		}
	}
	h.logger.Warn("an override does not fit the zone; ignored", zap.String("zone", h.name), zap.String("id", r.ID), zap.Error(err))
	return set
}

// sweep rebuilds the set when an override lapsed; h.mu is held.
func (h *OverrideHolder) sweep(now time.Time) {
	if !h.next.IsZero() && !now.Before(h.next) {
		h.rebuild(now)
	}
}

// rebuild drops lapsed records (from storage too) and makes the set anew;
// h.mu is held. It is O(N): only when the definition changes or one lapses.
func (h *OverrideHolder) rebuild(now time.Time) {
	h.next = time.Time{}
	var set *zones.OverrideSet
	for id, r := range h.records {
		if !r.inForce(now) {
			delete(h.records, id)
			if err := h.write(id, nil); err != nil {
				h.logger.Warn("removing a lapsed override from storage", zap.String("zone", h.name), zap.String("id", id), zap.Error(err))
			}
			continue
		}
		set = h.add(set, r)
	}
	h.set.Store(set)
}

func (h *OverrideHolder) file(id string) string { return path.Join(h.dir, id+".json") }

// write stores r as id's file, or deletes the file (r nil), creating
// Caddy's instance id on the first record; h.mu is held.
func (h *OverrideHolder) write(id string, r *OverrideRecord) error {
	if r == nil && h.dir == "" {
		return nil // nothing was stored (a distributed zone's holder stores none)
	}
	if h.dir == "" {
		instance, err := CreateInstanceID()
		if err != nil {
			return fmt.Errorf("reading the instance id: %v", err)
		}
		h.dir = path.Join(overrideDir, instance, h.name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), SnapshotTimeout)
	defer cancel()
	if r == nil {
		if err := h.storage.Delete(ctx, h.file(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	}
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return h.storage.Store(ctx, h.file(id), data)
}

var errTooManyOverrides = caddy.APIError{HTTPStatus: http.StatusConflict,
	Err: fmt.Errorf("the zone holds %d overrides, the most it can: remove some (DELETE …/overrides/<id>) first", zones.MaxOverrides)}

// Put stores rec, replacing the override of its id.
func (h *OverrideHolder) Put(ctx context.Context, rec OverrideRecord) error {
	if h.remote != nil {
		if _, err := h.remote.Put(ctx, h.name, rec.stored()); err != nil {
			if errors.Is(err, zones.ErrTooManyOverrides) {
				return errTooManyOverrides
			}
			return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: fmt.Errorf("storing the override in Redis: %v", err)}
		}
		h.load(ctx)
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sweep(time.Now()) // lapsed ones do not count
	if _, had := h.records[rec.ID]; !had && len(h.records) >= zones.MaxOverrides {
		return errTooManyOverrides
	}
	if err := h.write(rec.ID, &rec); err != nil {
		return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: fmt.Errorf("storing the override in Caddy's storage: %v", err)}
	}
	rec.version = rec.setAt()
	h.apply(rec.ID, &rec)
	forgetDenials(h.name)
	return nil
}

// Remove deletes the override id; false when there is none.
func (h *OverrideHolder) Remove(ctx context.Context, id string) (bool, error) {
	if h.remote != nil {
		found, err := h.remote.Delete(ctx, h.name, id)
		if err != nil {
			return false, caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: fmt.Errorf("removing the override from Redis: %v", err)}
		}
		h.load(ctx)
		return found, nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.records[id]; !ok {
		return false, nil
	}
	if err := h.write(id, nil); err != nil {
		return false, caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: fmt.Errorf("removing the override from Caddy's storage: %v", err)}
	}
	h.apply(id, nil)
	forgetDenials(h.name)
	return true, nil
}

// List is the overrides in force, by id.
func (h *OverrideHolder) List() []OverrideRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	now, out := time.Now(), make([]OverrideRecord, 0, len(h.records))
	for _, id := range slices.Sorted(maps.Keys(h.records)) {
		if r := h.records[id]; r.inForce(now) {
			out = append(out, r)
		}
	}
	return out
}

// Record is the override id, unless it lapsed.
func (h *OverrideHolder) Record(id string) (OverrideRecord, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r, ok := h.records[id]
	return r, ok && r.inForce(time.Now())
}

// forgetDenials: a denial cached under the old limit must not outlive it.
func forgetDenials(name string) {
	for _, z := range Registered(name) {
		z.ForgetDenials()
	}
}

// Set is the zone's overrides as requests read them (zones.Zone.UseOverrides).
func (h *OverrideHolder) Set() *zones.Overrides { return &h.set }

// Fleet reports whether the overrides are the fleet's (in Redis), not this
// instance's (in Caddy's storage).
func (h *OverrideHolder) Fleet() bool { return h.remote != nil }

// ReleaseOverrideHolder gives back a LoadOverrideHolder; the last stops it.
func ReleaseOverrideHolder(key string) { _, _ = overrideHolders.Delete(key) }
