package zones

import (
	"context"
	"testing"
	"time"
)

// A ban is a floor on the key's retry time: a request during a ban shorter
// than the rate's own retry is told the rate's Retry-After, not the ban's
// end. A client that obeys it is admitted at its retry; told the ban's end,
// it comes back while the rate still denies it and is banned again, one
// level up.
func TestBanShorterThanTheRatesRetryReportsTheRatesRetryAfter(t *testing.T) {
	z := banZone(t, 1, time.Minute, 10*time.Second, 10*time.Minute)
	ctx, now := context.Background(), 100*sec
	if d := z.Decide(ctx, "k", now); !d.Allowed {
		t.Fatalf("first request: %+v, want allowed", d)
	}
	d := z.Decide(ctx, "k", now)
	if d.Allowed || !d.Banned || d.BanLevel != 1 || d.RetryAfter != time.Minute {
		t.Fatalf("second request: %+v, want banned (level 1) with the rate's retry of 1m", d)
	}
	// During the 10s ban the rate's retry (59s left) is the later one.
	now += sec
	d = z.Decide(ctx, "k", now)
	if d.Allowed || !d.Banned || d.RetryAfter != 59*time.Second {
		t.Fatalf("1s into a 10s ban, 59s before the rate gives one back: %+v, want denied with Retry-After 59s", d)
	}
	// The obedient client comes back when told.
	now += int64(d.RetryAfter)
	if d := z.Decide(ctx, "k", now); !d.Allowed {
		t.Fatalf("at the Retry-After it was given: %+v, want allowed (not banned again)", d)
	}
	if _, banned := z.BanOf("k", now); banned {
		t.Fatal("the key is banned again after obeying its Retry-After")
	}
}
