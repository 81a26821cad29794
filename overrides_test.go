package ratelimit

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

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
	h := &overrideHolder{name: "api", logger: zap.NewNop(), storage: storage, dir: "tally/overrides/test/api",
		records: map[string]overrideRecord{}, cfg: z.Config}
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
				rec, err := parseOverride(z, id, "test", strings.NewReader(fmt.Sprintf(`{"match":{"prefix":"k%d-"},"events":%d,"window":"1m"}`, g, i+1)), time.Now())
				if err != nil {
					t.Error(err)
					return
				}
				if err := h.put(ctx, rec); err != nil {
					t.Error(err)
					return
				}
				if i%3 == 0 {
					if _, err := h.remove(ctx, id); err != nil {
						t.Error(err)
						return
					}
				}
				_ = h.list()
			}
		}()
	}
	writers.Wait()
	close(stop)
	readers.Wait()
	// What storage holds is what the holder holds.
	again := &overrideHolder{name: "api", logger: zap.NewNop(), storage: storage, dir: h.dir, records: map[string]overrideRecord{}, cfg: z.Config}
	again.load(ctx)
	if got, want := len(again.list()), len(h.list()); got != want || want == 0 {
		t.Errorf("storage holds %d overrides, the holder %d", got, want)
	}
	if got := h.set.Load().Len(); got != len(h.list()) {
		t.Errorf("the set holds %d, the records %d", got, len(h.list()))
	}
}

// A lapsed override is dropped from the set and from storage.
func TestOverrideHolderDropsLapsed(t *testing.T) {
	z := newTestZone(t)
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	h := &overrideHolder{name: "api", logger: zap.NewNop(), storage: storage, dir: "d", records: map[string]overrideRecord{}, cfg: z.Config}
	z.UseOverrides(&h.set)
	now := time.Now()
	rec, err := parseOverride(z, "brief", "test", strings.NewReader(`{"match":{"key":"k"},"deny":true,"expires":"1h"}`), now)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.put(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	if z.Override("k") == nil {
		t.Fatal("the override is not in force")
	}
	h.mu.Lock()
	h.rebuild(now.Add(2 * time.Hour))
	h.mu.Unlock()
	if z.Override("k") != nil || len(h.list()) != 0 || storage.Exists(context.Background(), h.file("brief")) {
		t.Error("a lapsed override is still held")
	}
}
