package tests

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/distributed"
	"github.com/caddy-tally/ratelimit/zones"
)

// A change of a zone's overrides on one store is heard at once by every
// store sharing the Redis that listens to that zone, and by no listener of
// another zone; listeners come and go under -race while changes flow.
func TestOverridesMovedReachesEveryListener(t *testing.T) {
	rs := startRedis(t)
	a := openStore(t, distributed.Options{Addresses: []string{rs.Addr}}, nil)
	b := openStore(t, distributed.Options{Addresses: []string{rs.Addr}}, nil)
	api, other := make(chan struct{}, 1), make(chan struct{}, 1)
	ov := b.Offers().Overrides
	defer ov.Moved("api", api)()
	defer ov.Moved("other", other)()
	ctx := context.Background()
	// The subscription is up once a change is heard: retry the first.
	deadline := time.Now().Add(10 * time.Second)
	for heard := false; !heard; {
		if _, err := a.Offers().Overrides.Put(ctx, "api", zones.StoredOverride{ID: "vip", Record: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
		select {
		case <-api:
			heard = true
		case <-time.After(100 * time.Millisecond):
			if time.Now().After(deadline) {
				t.Fatal("no change heard in 10 s")
			}
		}
	}
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			ch := make(chan struct{}, 1)
			for j := range 20 {
				remove := ov.Moved(fmt.Sprint("z", i%4), ch)
				if j%2 == 0 {
					_, _ = a.Offers().Overrides.Put(ctx, fmt.Sprint("z", i%4), zones.StoredOverride{ID: fmt.Sprint("o", i), Record: []byte(`{}`), Expires: time.Now().Add(time.Minute)})
				}
				remove()
			}
		})
	}
	wg.Wait()
	select {
	case <-api: // a late message of a retried first change
	default:
	}
	start := time.Now()
	if _, err := a.Offers().Overrides.Delete(ctx, "api", "vip"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-api:
	case <-time.After(time.Second):
		t.Fatalf("the delete was not heard within 1 s")
	}
	t.Logf("heard in %v", time.Since(start))
	select {
	case <-other:
		t.Error("a listener of another zone heard of the change")
	default:
	}
}

// fillOverrides stores n overrides in zone through s, in batches.
func fillOverrides(t testing.TB, s *distributed.Strict, zone string, n int) {
	t.Helper()
	ctx := context.Background()
	for i := 0; i < n; i += 500 {
		batch := make([]zones.StoredOverride, 0, 500)
		for j := i; j < min(n, i+500); j++ {
			batch = append(batch, zones.StoredOverride{ID: fmt.Sprint("o", j),
				Record: fmt.Appendf(nil, `{"id":"o%d","match":{"prefix":"t%05d-"},"exempt":true,"set_by":"test","set_at":"2026-01-01T00:00:00Z"}`, j, j)})
		}
		if _, err := s.Offers().Overrides.Restore(ctx, zone, batch); err != nil {
			t.Fatal(err)
		}
	}
}

// At 10,000 overrides a change is one record for each instance to read:
// an instance at the previous version reads the one change, never the
// whole set; one that fell behind or whose store lost the hash (a new
// epoch) reads everything.
func TestOverrideChangeReadsOneRecordAtTenThousand(t *testing.T) {
	rs := startRedis(t)
	// The first read carries all 10,000 records (about 1.3 MB): a second,
	// not the 50ms default, so that a loaded machine does not fail it.
	a := openStore(t, distributed.Options{Addresses: []string{rs.Addr}, Timeout: time.Second}, nil)
	b := openStore(t, distributed.Options{Addresses: []string{rs.Addr}, Timeout: time.Second}, nil)
	fillOverrides(t, a, "api", zones.MaxOverrides)
	ctx := context.Background()
	ov := b.Offers().Overrides
	all, err := ov.Read(ctx, "api", zones.OverridesAt{})
	if err != nil {
		t.Fatal(err)
	}
	if !all.All || len(all.Changes) != zones.MaxOverrides {
		t.Fatalf("the first read: all %v, %d overrides; want the whole 10,000", all.All, len(all.Changes))
	}
	for i, id := range []string{"o42", "o43", "o42"} {
		v, err := a.Offers().Overrides.Put(ctx, "api", zones.StoredOverride{ID: id, Record: []byte(`{"id":"` + id + `"}`)})
		if err != nil {
			t.Fatal(err)
		}
		r, err := ov.Read(ctx, "api", all.At)
		if err != nil {
			t.Fatal(err)
		}
		if r.All || len(r.Changes) != 1 || r.Changes[0].ID != id || r.Changes[0].Version != v || r.At.Version != v {
			t.Fatalf("change %d: read all %v, %d changes (%+v); want the one change of %s at version %d", i, r.All, len(r.Changes), r.At, id, v)
		}
		all.At = r.At
	}
	if found, err := a.Offers().Overrides.Delete(ctx, "api", "o7"); err != nil || !found {
		t.Fatalf("DELETE o7: found %v, %v", found, err)
	}
	if found, _ := a.Offers().Overrides.Delete(ctx, "api", "never-set"); found {
		t.Fatal("deleting an id never set found it")
	}
	r, err := ov.Read(ctx, "api", all.At)
	if err != nil || r.All || len(r.Changes) != 1 || r.Changes[0].Record != nil {
		t.Fatalf("after a delete: %+v, %v; want the one removal", r, err)
	}
	if err := rs.Client().FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if r, err = ov.Read(ctx, "api", r.At); err != nil || r.At.Epoch != "" || len(r.Changes) != 0 {
		t.Fatalf("after FLUSHALL: %+v, %v; want no epoch (the instance restores, never reads it as deleted)", r.At, err)
	}
}

// redisUsec is the Redis CPU spent in every command since the last CONFIG
// RESETSTAT (INFO commandstats).
func redisUsec(t testing.TB, rs *redisServer) int64 {
	t.Helper()
	info, err := rs.Client().Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var usec int64
	for line := range strings.SplitSeq(info, "\n") {
		_, rest, ok := strings.Cut(strings.TrimSpace(line), "usec=")
		if !ok || !strings.HasPrefix(line, "cmdstat_") {
			continue
		}
		n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
		usec += n
	}
	return usec
}

// The cost of one change of a zone holding 10,000 overrides: the PUT's
// script and one other instance reading it back. Reports Redis CPU µs per
// change (INFO commandstats, every command).
//
//	cd tests && go test -run '^$' -bench BenchmarkOverrideChangeAtTenThousand -benchtime 2000x .
func BenchmarkOverrideChangeAtTenThousand(b *testing.B) {
	rs := startRedis(b)
	w := openStore(b, distributed.Options{Addresses: []string{rs.Addr}}, nil)
	r := openStore(b, distributed.Options{Addresses: []string{rs.Addr}}, nil)
	fillOverrides(b, w, "api", zones.MaxOverrides-1)
	ctx := context.Background()
	at, err := r.Offers().Overrides.Read(ctx, "api", zones.OverridesAt{})
	if err != nil {
		b.Fatal(err)
	}
	if err := rs.Client().ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := range b.N {
		id := fmt.Sprint("o", i%zones.MaxOverrides)
		if _, err := w.Offers().Overrides.Put(ctx, "api", zones.StoredOverride{ID: id, Record: []byte(`{"id":"` + id + `","exempt":true}`)}); err != nil {
			b.Fatal(err)
		}
		read, err := r.Offers().Overrides.Read(ctx, "api", at.At)
		if err != nil || read.All {
			b.Fatalf("read: all %v, %v", read.All, err)
		}
		at = read
	}
	b.StopTimer()
	b.ReportMetric(float64(redisUsec(b, rs))/float64(b.N), "redis-µs/change")
}
