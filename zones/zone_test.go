package zones

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/internal/monotime"
)

const hour = int64(time.Hour)

func TestTableAdmitsExactlyTheBurstUnderConcurrency(t *testing.T) {
	tab := NewTable(1000)
	l := algorithms.NewLimit(50, hour, 0)
	now := monotime.Now()
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for g := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				key := "shared"
				if i%2 == 1 {
					key = fmt.Sprintf("own-%d", g) // other keys contend for the same shards
				}
				if tab.Decide(key, now, l, 1, 0).Allowed && key == "shared" {
					allowed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if got := allowed.Load(); got != 50 {
		t.Fatalf("%d requests allowed for one key, want exactly 50", got)
	}
}

func TestTableNeverHoldsMoreThanMaxKeys(t *testing.T) {
	for _, maxKeys := range []int{1, 10, 1000, 100_000} {
		tab := NewTable(maxKeys)
		l := algorithms.NewLimit(10, hour, 0)
		for i := range maxKeys * 3 {
			tab.Decide(fmt.Sprintf("k%d", i), 1, l, 1, 0)
		}
		if n := tab.Len(); n > maxKeys {
			t.Errorf("max_keys %d: table holds %d keys", maxKeys, n)
		}
	}
}

func TestTableEvictsExpiredKeysBeforeActiveOnes(t *testing.T) {
	tab := NewTable(10) // one shard of 10
	l := algorithms.NewLimit(1, 1000, 0)
	for i := range 9 {
		tab.Decide(fmt.Sprintf("old%d", i), 0, l, 1, 0) // TAT 1000: expired at 5000
	}
	tab.Decide("active", 4500, l, 1, 0) // TAT 5500
	for i := range 9 {
		tab.Decide(fmt.Sprintf("new%d", i), 5000, l, 1, 0)
	}
	if _, ok := tab.Get("active", 5000); !ok {
		t.Fatal("an active key was evicted while expired keys were left to evict")
	}
}

func TestTableSweepDropsOnlyExpiredKeys(t *testing.T) {
	tab := NewTable(1000)
	l := algorithms.NewLimit(1, 1000, 0)
	tab.Decide("expired", 0, l, 1, 0)   // TAT 1000
	tab.Decide("active", 4500, l, 1, 0) // TAT 5500
	if n := tab.Sweep(5000); n != 1 {
		t.Fatalf("after sweep %d keys remain, want 1", n)
	}
	if _, ok := tab.Get("active", 5000); !ok {
		t.Fatal("sweep dropped an active key")
	}
}

func TestKey(t *testing.T) {
	long := strings.Repeat("a", MaxKeyLength+1)
	tests := []struct {
		name string
		cfg  Config
		raw  string
		want string
	}{
		{"plain key unchanged", Config{}, "alice", "alice"},
		{"IP unchanged without prefix", Config{}, "203.0.113.7", "203.0.113.7"},
		{"IPv4 masked", Config{IPv4Prefix: 24}, "203.0.113.7", "203.0.113.0/24"},
		{"IPv6 masked", Config{IPv6Prefix: 64}, "2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"},
		{"IPv4 prefix leaves IPv6 alone", Config{IPv4Prefix: 24}, "2001:db8::1", "2001:db8::1"},
		{"IPv4-mapped IPv6 uses the IPv4 prefix", Config{IPv4Prefix: 16}, "::ffff:203.0.113.7", "203.0.0.0/16"},
		{"non-IP key with prefix unchanged", Config{IPv4Prefix: 24}, "bob", "bob"},
		{"key at the limit kept", Config{}, long[:MaxKeyLength], long[:MaxKeyLength]},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.cfg.Key(tc.raw); got != tc.want {
				t.Errorf("Key(%q) = %q, want %q", tc.raw, got, tc.want)
			}
		})
	}
	t.Run("long keys are hashed to a bounded size", func(t *testing.T) {
		a, b := Config{}.Key(long), Config{}.Key(long+"b")
		// The SHA-256 of the whole key, in hex: not a raw prefix, not
		// some other digest.
		sum := sha256.Sum256([]byte(long))
		if want := "sha256:" + hex.EncodeToString(sum[:]); a != want {
			t.Errorf("Key(257 bytes) = %q, want %q", a, want)
		}
		if a == b {
			t.Errorf("hashed keys of two long keys are both %q", a)
		}
	})
	t.Run("a short key cannot alias a hashed long one", func(t *testing.T) {
		hashed := Config{}.Key(long)
		if got := (Config{}).Key(hashed); got == hashed || !strings.HasPrefix(got, "sha256:") || len(got) != len(hashed) {
			t.Errorf("the literal key %q maps to %q: it must not share the long key's bucket", hashed, got)
		}
		if got := (Config{}).Key("sha256:"); got == "sha256:" {
			t.Errorf("the literal key \"sha256:\" kept as is")
		}
	})
	t.Run("IP prefixes mask exactly their bits", func(t *testing.T) {
		for bits, want := range map[int]string{8: "10.0.0.0/8", 16: "10.1.0.0/16", 24: "10.1.2.0/24", 31: "10.1.2.2/31", 32: "10.1.2.3/32"} {
			if got := (Config{IPv4Prefix: bits}).Key("10.1.2.3"); got != want {
				t.Errorf("ipv4_prefix %d: Key(10.1.2.3) = %q, want %q", bits, got, want)
			}
		}
		for bits, want := range map[int]string{32: "2001:db8::/32", 48: "2001:db8:1::/48", 56: "2001:db8:1:200::/56", 64: "2001:db8:1:2ff::/64"} {
			if got := (Config{IPv6Prefix: bits}).Key("2001:db8:1:2ff:3:4:5:6"); got != want {
				t.Errorf("ipv6_prefix %d: Key = %q, want %q", bits, got, want)
			}
		}
	})
}

func TestConfigValidateNamesTheFix(t *testing.T) {
	good := Config{Name: "api", Events: 10, Window: time.Minute}
	if err := good.Validate(); err != nil {
		t.Fatalf("valid config rejected: %v", err)
	}
	for _, tc := range []struct {
		mutate func(*Config)
		want   string
	}{
		{func(c *Config) { c.Name = "a b" }, "letters, digits"},
		{func(c *Config) { c.Name = "" }, "letters, digits"},
		{func(c *Config) { c.Events = 0 }, "events must be"},
		{func(c *Config) { c.Window = 0 }, "window must be"},
		{func(c *Config) { c.IPv4Prefix = 33 }, "ipv4_prefix"},
	} {
		c := good
		tc.mutate(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want an error containing %q", c, err, tc.want)
		}
	}
}

func newTestState(t *testing.T, c Config) *State {
	s := NewState(c, time.Hour)
	t.Cleanup(func() { s.Destruct() })
	return s
}

func TestLocalZoneDeniesAfterBurstAndDeniedConsumesNothing(t *testing.T) {
	c := Config{Name: "z", Events: 3, Window: time.Hour}
	z := mustNew(c, newTestState(t, c), nil)
	now := monotime.Now()
	for i := range 3 {
		if d := z.Decide(context.Background(), "k", now); !d.Allowed || d.Remaining != int64(2-i) {
			t.Fatalf("request %d: %+v, want allowed with %d remaining", i, d, 2-i)
		}
	}
	d := z.Decide(context.Background(), "k", now)
	if d.Allowed || d.RetryAfter != 20*time.Minute {
		t.Fatalf("4th request: %+v, want denied with retry 20m", d)
	}
	// One emission interval later exactly one more is allowed.
	later := now + int64(20*time.Minute)
	if d := z.Decide(context.Background(), "k", later); !d.Allowed {
		t.Fatalf("after one interval: %+v, want allowed", d)
	}
	if d := z.Decide(context.Background(), "k", later); d.Allowed {
		t.Fatal("two allowed after one interval")
	}
}

// faultStore is a Store whose answers the test dictates: it exists only to
// inject errors and count calls; real Redis behaviour is tested in tests/.
type faultStore struct {
	err       error
	allowed   bool
	instances int
	calls     atomic.Int64
	refunds   atomic.Int64
}

func (f *faultStore) Rate(ctx context.Context, zone, key string, s RateStep) (RateReply, error) {
	switch s.Op {
	case OpDecide, OpCheck:
		r, err := f.decide(s.Limit)
		return RateReply{Result: r}, err
	case OpCharge:
		f.calls.Add(1)
		return RateReply{Result: algorithms.Result{Allowed: f.allowed}}, f.err
	case OpRefund:
		f.refunds.Add(1)
	}
	return RateReply{}, f.err
}

func (f *faultStore) Quota(context.Context, string, string, QuotaStep) (QuotaResult, error) {
	return QuotaResult{}, f.err
}

func (f *faultStore) Offers() Offers { return Offers{Mode: "strict"} }

func (f *faultStore) decide(l algorithms.Limit) (algorithms.Result, error) {
	f.calls.Add(1)
	if f.err != nil {
		return algorithms.Result{}, f.err
	}
	if f.allowed {
		return algorithms.Result{Allowed: true, Remaining: 1, ResetAfter: l.EmissionInterval}, nil
	}
	return algorithms.Result{RetryAfter: 30 * int64(time.Second), ResetAfter: hour}, nil
}

func (f *faultStore) Instances() int { return f.instances }

func TestStoreDenialIsCachedSoAFloodMakesNoStoreCalls(t *testing.T) {
	c := Config{Name: "z", Events: 3, Window: time.Hour}
	st := &faultStore{}
	z := mustNew(c, newTestState(t, c), st)
	now := monotime.Now()
	for i := range 1000 {
		d := z.Decide(context.Background(), "blocked", now+int64(i))
		if d.Allowed || d.RetryAfter <= 0 {
			t.Fatalf("request %d: %+v, want denied with a retry", i, d)
		}
	}
	if n := st.calls.Load(); n != 1 {
		t.Fatalf("store called %d times for a blocked key, want 1", n)
	}
	// Once the denial ends the store decides again.
	z.Decide(context.Background(), "blocked", now+int64(31*time.Second))
	if n := st.calls.Load(); n != 2 {
		t.Fatalf("store called %d times after the denial ended, want 2", n)
	}
}

func TestFailPolicies(t *testing.T) {
	outage := errors.New("redis: connection refused")
	now := monotime.Now()
	t.Run("open allows everything", func(t *testing.T) {
		c := Config{Name: "z", Events: 2, Window: time.Hour, FailPolicy: FailOpen}
		z := mustNew(c, newTestState(t, c), &faultStore{err: outage})
		for range 10 {
			if d := z.Decide(context.Background(), "k", now); !d.Allowed || d.Source != SourceFailOpen || d.Err == nil {
				t.Fatalf("%+v, want allowed by fail-open with the error", d)
			}
		}
	})
	t.Run("closed denies with a short retry", func(t *testing.T) {
		c := Config{Name: "z", Events: 100, Window: time.Hour, FailPolicy: FailClosed}
		z := mustNew(c, newTestState(t, c), &faultStore{err: outage})
		if d := z.Decide(context.Background(), "k", now); d.Allowed || d.RetryAfter != FailClosedRetryAfter {
			t.Fatalf("%+v, want denied with retry %v", d, FailClosedRetryAfter)
		}
	})
	t.Run("local enforces this instance's part", func(t *testing.T) {
		c := Config{Name: "z", Events: 30, Window: time.Hour, FailPolicy: FailLocal}
		z := mustNew(c, newTestState(t, c), &faultStore{err: outage, instances: 3})
		allowed := 0
		for range 100 {
			if d := z.Decide(context.Background(), "k", now); d.Allowed {
				allowed++
			}
		}
		if allowed != 10 {
			t.Fatalf("%d allowed with 3 instances and events 30, want 10", allowed)
		}
	})
	t.Run("local never goes below one", func(t *testing.T) {
		c := Config{Name: "z", Events: 2, Window: time.Hour, FailPolicy: FailLocal}
		z := mustNew(c, newTestState(t, c), &faultStore{err: outage, instances: 5})
		if d := z.Decide(context.Background(), "k", now); !d.Allowed {
			t.Fatalf("%+v, want the first request allowed (share at least 1)", d)
		}
	})
}

func TestRefundGoesToWhoeverDecided(t *testing.T) {
	c := Config{Name: "z", Events: 1, Window: time.Hour}
	now := monotime.Now()
	local := mustNew(c, newTestState(t, c), nil)
	d := local.Decide(context.Background(), "k", now)
	if d, _ = local.RefundWith(context.Background(), "k", now, d, &local.plan, 1); d.Remaining != 1 || d.ResetAfter != 0 {
		t.Fatalf("decision after refund = %+v, want the key back to full", d)
	}
	if d := local.Decide(context.Background(), "k", now); !d.Allowed {
		t.Fatal("refunded local request still counted")
	}

	st := &faultStore{allowed: true}
	remote := mustNew(c, newTestState(t, c), st)
	d = remote.Decide(context.Background(), "k", now)
	remote.RefundWith(context.Background(), "k", now, d, &remote.plan, 1) //nolint:errcheck // the fault store returns no error here
	if st.refunds.Load() != 1 {
		t.Fatal("a store decision was not refunded in the store")
	}
}

// mustNew is New for a zone the test knows its store accepts.
func mustNew(c Config, s *State, store Store) *Zone {
	z, err := New(c, s, store)
	if err != nil {
		panic(err)
	}
	return z
}

// A store says once what it offers; a zone whose kind needs what its store
// lacks is refused when it is made, never decided "without" it.
func TestNewRefusesAZoneItsStoreCannotServe(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    Config
		want string
	}{
		{"quota", Config{Name: "q", Quota: 10, Period: algorithms.Day}, "cannot keep calendar quotas"},
		{"concurrency", Config{Name: "c", Concurrency: 3}, "cannot hold concurrency slots"},
	} {
		if err := tc.c.Validate(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		s := NewState(tc.c, time.Hour)
		_, err := New(tc.c, s, &faultStore{})
		_ = s.Destruct()
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "zone "+tc.c.Name) {
			t.Errorf("%s zone over a store that offers neither: %v, want an error naming the zone and %q", tc.name, err, tc.want)
		}
	}
	c := Config{Name: "r", Events: 5, Window: time.Minute}
	if _, err := New(c, nil, &faultStore{}); err != nil {
		t.Errorf("a rate zone over a plain store: %v", err)
	}
}

func TestFailPolicyReadsAndWritesEachName(t *testing.T) {
	for _, c := range []struct {
		name string
		want FailPolicy
	}{{"", FailLocal}, {"local", FailLocal}, {"open", FailOpen}, {"closed", FailClosed}} {
		p, err := ParseFailPolicy(c.name)
		if err != nil || p != c.want {
			t.Errorf("ParseFailPolicy(%q) = %v, %v; want %v", c.name, p, err, c.want)
		}
		if c.name != "" && p.String() != c.name {
			t.Errorf("%v.String() = %q, want %q", p, p.String(), c.name)
		}
	}
	if _, err := ParseFailPolicy("shut"); err == nil || !strings.Contains(err.Error(), "use open, closed or local") {
		t.Errorf("ParseFailPolicy(shut): %v, want an error naming the choices", err)
	}
}
