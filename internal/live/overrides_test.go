package live

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/caddy-tally/ratelimit/algorithms"
	"github.com/caddy-tally/ratelimit/internal/adminapi"
	"github.com/caddy-tally/ratelimit/zones"
)

func newTestZone(t *testing.T) *zones.Zone {
	t.Helper()
	c := zones.Config{Name: "api", Events: 5, Window: time.Minute}
	state := zones.NewState(c, time.Hour)
	t.Cleanup(func() { _ = state.Destruct() })
	z, err := zones.New(c, state, nil)
	if err != nil {
		t.Fatal(err)
	}
	return z
}

// Overrides put and removed from many goroutines while requests look keys
// up: every lookup sees a whole set, and the storage ends with what the
// holder holds.
func TestOverrideHolderConcurrentPutAndLookup(t *testing.T) {
	z := newTestZone(t)
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	h := &OverrideHolder{name: "api", logger: zap.NewNop(), storage: storage, dir: "tally/overrides/test/api",
		records: map[string]OverrideRecord{}, cfg: z.Config}
	z.UseOverrides(&h.set)
	ctx := context.Background()
	var writers, readers sync.WaitGroup
	stop := make(chan struct{})
	for g := range 4 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("k%d-%d", g, i%20)
				if o := z.Override(key); o != nil && !strings.HasPrefix(key, o.Prefix) && o.Key != key {
					t.Errorf("override %+v for %q", o, key)
					return
				}
				_ = z.LastPlan(key, 0)
			}
		}()
	}
	for g := range 4 {
		writers.Add(1)
		go func() {
			defer writers.Done()
			for i := range 50 {
				id := fmt.Sprintf("o%d-%d", g, i%10)
				rec, err := ParseOverride(z, id, "test", strings.NewReader(fmt.Sprintf(`{"match":{"prefix":"k%d-"},"events":%d,"window":"1m"}`, g, i+1)), time.Now())
				if err != nil {
					t.Error(err)
					return
				}
				if err := h.Put(ctx, rec); err != nil {
					t.Error(err)
					return
				}
				if i%3 == 0 {
					if _, err := h.Remove(ctx, id); err != nil {
						t.Error(err)
						return
					}
				}
				_ = h.List()
			}
		}()
	}
	writers.Wait()
	close(stop)
	readers.Wait()
	// What storage holds is what the holder holds.
	again := &OverrideHolder{name: "api", logger: zap.NewNop(), storage: storage, dir: h.dir, records: map[string]OverrideRecord{}, cfg: z.Config}
	again.load(ctx)
	if got, want := len(again.List()), len(h.List()); got != want || want == 0 {
		t.Errorf("storage holds %d overrides, the holder %d", got, want)
	}
	if got := h.set.Load().Len(); got != len(h.List()) {
		t.Errorf("the set holds %d, the records %d", got, len(h.List()))
	}
}

// A lapsed override is dropped from the set and from storage.
func TestOverrideHolderDropsLapsed(t *testing.T) {
	z := newTestZone(t)
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	h := &OverrideHolder{name: "api", logger: zap.NewNop(), storage: storage, dir: "d", records: map[string]OverrideRecord{}, cfg: z.Config}
	z.UseOverrides(&h.set)
	now := time.Now()
	rec, err := ParseOverride(z, "brief", "test", strings.NewReader(`{"match":{"key":"k"},"deny":true,"expires":"1h"}`), now)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Put(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	if z.Override("k") == nil {
		t.Fatal("the override is not in force")
	}
	h.mu.Lock()
	h.rebuild(now.Add(2 * time.Hour))
	h.mu.Unlock()
	if z.Override("k") != nil || len(h.List()) != 0 || storage.Exists(context.Background(), h.file("brief")) {
		t.Error("a lapsed override is still held")
	}
}

// Each kind of zone takes its own limit in an override, and refuses the
// others', naming the field.
func TestParseOverrideByZoneKind(t *testing.T) {
	mk := func(c zones.Config) *zones.Zone {
		state := zones.NewState(c, time.Hour)
		t.Cleanup(func() { _ = state.Destruct() })
		z, err := zones.New(c, state, nil)
		if err != nil {
			t.Fatal(err)
		}
		return z
	}
	rate := mk(zones.Config{Name: "rate", Events: 5, Window: time.Minute, IPv4Prefix: 24})
	quota := mk(zones.Config{Name: "quota", Quota: 100, Period: 5})
	conc := mk(zones.Config{Name: "conc", Concurrency: 2})
	adaptive := mk(zones.Config{Name: "adaptive", Adaptive: algorithms.AdaptiveLimit{Target: int64(100 * time.Millisecond), Min: 4, Max: 100}})
	for _, tc := range []struct {
		z          *zones.Zone
		body, want string // want: "" accepted, else the field named
	}{
		{rate, `{"match":{"key":"10.1.2.3"},"events":50,"window":"1m","burst":10}`, ""},
		{rate, `{"match":{"key":"k"},"limit":5}`, "events"},
		{rate, `{"match":{"key":"k"},"events":5}`, "events"},
		{rate, `{"match":{"key":"k"},"events":5,"window":"1m","burst":0}`, "burst"},
		{rate, `{"match":{"key":"k"},"events":2000000,"window":"1s"}`, "window"},
		{rate, `{"match":{"prefix":""},"exempt":true}`, "match.prefix"},
		{rate, `{"match":{"key":""},"deny":true}`, "match.key"},
		{rate, `{"match":{"cidr":"10.1.2.3/16"},"exempt":true}`, ""},
		{rate, `{"match":{"key":"k"},"deny":true,"expires":"-1h"}`, "expires"},
		{rate, `{"match":{"key":"k"},"exempt":true,"reason":"` + strings.Repeat("r", 1025) + `"}`, "reason"},
		{quota, `{"match":{"key":"k"},"limit":500}`, ""},
		{quota, `{"match":{"key":"k"},"events":5,"window":"1m"}`, "limit"},
		{quota, `{"match":{"key":"k"},"limit":0}`, "limit"},
		{conc, `{"match":{"key":"k"},"n":10}`, ""},
		{conc, `{"match":{"key":"k"},"limit":10}`, "n"},
		{conc, `{"match":{"key":"k"},"n":-1}`, "n"},
		{adaptive, `{"match":{"key":"k"},"n":10}`, "n"},
		{adaptive, `{"match":{"key":"k"},"exempt":true}`, ""},
		{adaptive, `{"match":{"prefix":"bot-"},"deny":true,"expires":"1h"}`, ""},
	} {
		rec, err := ParseOverride(tc.z, "id", "test", strings.NewReader(tc.body), time.Now())
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s %s: %v", tc.z.Name, tc.body, err)
		case tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.want+":")):
			t.Errorf("%s %s: error %v, want one naming %s", tc.z.Name, tc.body, err, tc.want)
		case tc.want == "":
			if _, err := rec.override(tc.z.Config); err != nil {
				t.Errorf("%s %s: the record does not resolve: %v", tc.z.Name, tc.body, err)
			}
		}
	}
	// An exact key is stored as the zone stores it; a CIDR masked.
	rec, _ := ParseOverride(rate, "id", "t", strings.NewReader(`{"match":{"key":"10.1.2.3"},"exempt":true}`), time.Now())
	if *rec.Match.Key != "10.1.2.0/24" {
		t.Errorf("key stored as %q, want the zone's 10.1.2.0/24", *rec.Match.Key)
	}
	rec, _ = ParseOverride(rate, "id", "t", strings.NewReader(`{"match":{"cidr":"10.1.2.3/16"},"exempt":true}`), time.Now())
	if *rec.Match.CIDR != "10.1.0.0/16" {
		t.Errorf("cidr stored as %q, want 10.1.0.0/16", *rec.Match.CIDR)
	}
}

// One change of a zone holding 10,000 overrides, as an instance applies
// what it read from the store: O(log N), the rest of the set is shared.
func BenchmarkOverrideChangeAt10k(b *testing.B) {
	c := zones.Config{Name: "api", Events: 5, Window: time.Minute}
	h := &OverrideHolder{name: "api", logger: zap.NewNop(), records: map[string]OverrideRecord{}, cfg: c}
	rec := func(i, events int) OverrideRecord {
		prefix := fmt.Sprintf("tenant-%05d-", i)
		return OverrideRecord{Override: adminapi.Override{ID: fmt.Sprintf("o%05d", i), Match: adminapi.OverrideMatch{Prefix: &prefix}, Events: int64(events), Window: "1m"}}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := range zones.MaxOverrides {
		r := rec(i, 10)
		r.version = int64(i)
		overrideChange(h, r)
	}
	if h.set.Load().Len() != zones.MaxOverrides {
		b.Fatalf("the set holds %d", h.set.Load().Len())
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		r := rec(i%zones.MaxOverrides, 10+i%7)
		r.version = int64(zones.MaxOverrides + i)
		overrideChange(h, r)
	}
}

// overrideChange applies one record read from the store; h.mu is held.
func overrideChange(h *OverrideHolder, r OverrideRecord) { h.apply(r.ID, &r) }
