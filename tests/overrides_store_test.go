package tests

import (
	"context"
	"fmt"
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
