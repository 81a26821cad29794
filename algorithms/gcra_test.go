package algorithms

import (
	"math"
	"testing"
)

func TestDecide(t *testing.T) {
	// 10 per 1000 units with burst 10: T = 100.
	l := NewLimit(10, 1000, 0)
	tests := []struct {
		name     string
		limit    Limit
		tat, now int64
		cost     int64
		want     Result
	}{
		{"fresh key gets its full burst minus one", l, 0, 5000, 1,
			Result{Allowed: true, TAT: 5100, Remaining: 9, ResetAfter: 100}},
		{"stale TAT counts as now", l, 4000, 5000, 1,
			Result{Allowed: true, TAT: 5100, Remaining: 9, ResetAfter: 100}},
		{"last of the burst", l, 5900, 5000, 1,
			Result{Allowed: true, TAT: 6000, Remaining: 0, ResetAfter: 1000}},
		{"burst used up: denied until one interval frees", l, 6000, 5000, 1,
			Result{TAT: 6000, RetryAfter: 100, ResetAfter: 1000}},
		{"denied part way through an interval", l, 6000, 5030, 1,
			Result{TAT: 6000, RetryAfter: 70, ResetAfter: 970}},
		{"exactly at allowAt is allowed", l, 6000, 5100, 1,
			Result{Allowed: true, TAT: 6100, Remaining: 0, ResetAfter: 1000}},
		{"cost takes several units", l, 0, 5000, 4,
			Result{Allowed: true, TAT: 5400, Remaining: 6, ResetAfter: 400}},
		{"cost larger than what is left is denied", l, 5800, 5000, 3,
			Result{TAT: 5800, RetryAfter: 100, ResetAfter: 800}},
		{"burst 1 is a smooth rate", NewLimit(10, 1000, 1), 5050, 5000, 1,
			Result{TAT: 5050, RetryAfter: 50, ResetAfter: 50}},
		{"burst larger than events", NewLimit(10, 1000, 20), 6000, 5000, 1,
			Result{Allowed: true, TAT: 6100, Remaining: 9, ResetAfter: 1100}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.limit.Decide(tc.tat, tc.now, tc.cost); got != tc.want {
				t.Errorf("Decide(%d, %d, %d) = %+v, want %+v", tc.tat, tc.now, tc.cost, got, tc.want)
			}
		})
	}
}

func TestFreshKeyAdmitsBurstThenOnePerInterval(t *testing.T) {
	l := NewLimit(5, 1000, 0) // T = 200
	var tat int64
	allowed := 0
	for range 20 {
		r := l.Decide(tat, 0, 1)
		if r.Allowed {
			tat = r.TAT
			allowed++
		}
	}
	if allowed != 5 {
		t.Fatalf("at one instant %d allowed, want the burst of 5", allowed)
	}
	// Then exactly one every T.
	for now := int64(1); now <= 1000; now++ {
		r := l.Decide(tat, now, 1)
		if r.Allowed {
			tat = r.TAT
			allowed++
		}
	}
	if allowed != 10 {
		t.Fatalf("burst plus one second at 5/s admitted %d, want 10 (the 2N-1 bound plus the one at t=W)", allowed)
	}
}

func TestRefundNeverGoesBelowNow(t *testing.T) {
	l := NewLimit(10, 1000, 0)
	if got := l.Refund(5100, 5000, 1); got != 5000 {
		t.Errorf("Refund(5100, 5000, 1) = %d, want 5000", got)
	}
	if got := l.Refund(5050, 5000, 1); got != 5000 {
		t.Errorf("Refund below now = %d, want now (5000)", got)
	}
	if got := l.Refund(6000, 5000, 2); got != 5800 {
		t.Errorf("Refund(6000, 5000, 2) = %d, want 5800", got)
	}
}

func TestAllowedThenRefundedRestoresState(t *testing.T) {
	l := NewLimit(10, 1000, 0)
	before := l.Peek(5500, 5000)
	r := l.Decide(5500, 5000, 1)
	after := l.Peek(l.Refund(r.TAT, 5000, 1), 5000)
	if before != after {
		t.Errorf("state after allow+refund = %+v, want %+v", after, before)
	}
}

func TestPeek(t *testing.T) {
	l := NewLimit(10, 1000, 0)
	if got := l.Peek(0, 5000); got.Remaining != 10 || got.ResetAfter != 0 || !got.Allowed {
		t.Errorf("Peek of an absent key = %+v, want full (10 remaining, reset 0)", got)
	}
	if got := l.Peek(5300, 5000); got.Remaining != 7 || got.ResetAfter != 300 {
		t.Errorf("Peek after 3 = %+v, want 7 remaining, reset 300", got)
	}
	if got := l.Peek(6000, 5000); got.Allowed || got.RetryAfter != 100 {
		t.Errorf("Peek of an exhausted key = %+v, want denied with retry 100", got)
	}
}

// FuzzDecideInvariants drives one key with arbitrary arrivals and checks the
// guarantees the package documents.
func FuzzDecideInvariants(f *testing.F) {
	f.Add(int64(10), int64(1000), int64(0), []byte{0, 0, 0, 5, 200, 1, 1, 3})
	f.Add(int64(1), int64(60), int64(1), []byte{1, 2, 3, 4, 5, 250})
	f.Add(int64(100), int64(1_000_000), int64(3), []byte{255, 0, 0, 0, 0, 0, 0, 0, 9})
	f.Fuzz(func(t *testing.T, events, window, burst int64, gaps []byte) {
		// Every limit zones.Config.Check accepts, and beyond: up to 2^40
		// events and bursts, windows up to 292 years.
		if events < 1 || events > 1<<40 || window < events || burst < 0 || burst > 1<<40 {
			t.Skip()
		}
		l := NewLimit(events, window, burst)
		now := int64(1_800_000_000e9) // ns since the epoch, 2027
		var tat, admitted int64
		start := now
		for i, g := range gaps {
			now = min(now+int64(g)*(l.EmissionInterval/16), math.MaxInt64/2)
			// Mostly small costs, sometimes one beyond any burst.
			cost := int64(1 + i%3)
			if g == 255 {
				cost = math.MaxInt64 / int64(1+i)
			}
			r := l.Decide(tat, now, cost)
			if r.Remaining < 0 || r.Remaining > l.Burst {
				t.Fatalf("remaining %d outside [0, %d]", r.Remaining, l.Burst)
			}
			if r.Allowed {
				if r.RetryAfter != 0 {
					t.Fatalf("allowed with retryAfter %d", r.RetryAfter)
				}
				tat = r.TAT
				admitted += cost
			} else {
				if r.RetryAfter <= 0 {
					t.Fatalf("denied with retryAfter %d, want > 0", r.RetryAfter)
				}
				if r.Remaining != 0 || r.TAT != max(tat, now) {
					t.Fatalf("denied request changed state or reported remaining: %+v", r)
				}
			}
			if r.ResetAfter < 0 {
				t.Fatalf("negative resetAfter %d", r.ResetAfter)
			}
			// Never more than burst + elapsed/T since the key was fresh.
			if bound := l.Burst + (now-start)/l.EmissionInterval; admitted > bound && admitted > 0 {
				t.Fatalf("admitted %d over %d ns, bound %d", admitted, now-start, bound)
			}
		}
	})
}

// The limits that used to wrap (burst × T beyond int64) now saturate: a fresh
// key is allowed and nothing reads negative. Configurations such as these are
// refused before they get here (zones.Config.Check); the arithmetic must still
// not turn them into a denial of every request.
func TestExtremeLimitsSaturateInsteadOfWrapping(t *testing.T) {
	const hour = int64(3600e9)
	now := int64(1_800_000_000e9) // 2027, in ns
	for _, l := range []Limit{
		NewLimit(1, 8760*hour, 1000),      // 1000 years of burst
		NewLimit(10, hour, 1099511627776), // 2^40 bursts of 6 minutes
		{EmissionInterval: math.MaxInt64, Burst: math.MaxInt64},
	} {
		r := l.Decide(0, now, 1)
		if !r.Allowed || r.RetryAfter != 0 || r.Remaining < 0 || r.Remaining > l.Burst || r.ResetAfter < 0 || r.TAT < now {
			t.Errorf("%+v: fresh key got %+v, want allowed with sane values", l, r)
		}
		if l.Burst < math.MaxInt64 {
			if r := l.Decide(0, now, math.MaxInt64); r.Allowed || r.RetryAfter <= 0 || r.TAT != now {
				t.Errorf("%+v: a cost of MaxInt64 got %+v, want denied without wrapping", l, r)
			}
		} else if r := l.Decide(0, now, math.MaxInt64); !r.Allowed || r.Remaining != 0 || r.TAT != math.MaxInt64 {
			t.Errorf("%+v: a cost of the whole burst got %+v, want allowed with TAT saturated", l, r)
		}
		if got := l.Refund(now+hour, now, math.MaxInt64); got != now {
			t.Errorf("%+v: refunding MaxInt64 = %d, want now", l, got)
		}
	}
}

// FuzzDecideNeverWraps runs one step with arbitrary non-negative inputs, up to
// math.MaxInt64: the documented ranges hold and nothing wraps negative.
func FuzzDecideNeverWraps(f *testing.F) {
	f.Add(int64(0), int64(1_800_000_000e9), int64(1), int64(3600e9*8760), int64(1000))
	f.Add(int64(math.MaxInt64), int64(math.MaxInt64), int64(math.MaxInt64), int64(math.MaxInt64), int64(math.MaxInt64))
	f.Add(int64(1<<62), int64(1<<61), int64(3), int64(1<<40), int64(1<<40))
	f.Fuzz(func(t *testing.T, tat, now, cost, interval, burst int64) {
		if tat < 0 || now < 0 || cost < 1 || interval < 1 || burst < 1 {
			t.Skip()
		}
		l := Limit{EmissionInterval: interval, Burst: burst}
		r := l.Decide(tat, now, cost)
		if r.Remaining < 0 || r.Remaining > burst || r.ResetAfter < 0 {
			t.Fatalf("Decide(%d, %d, %d) with %+v = %+v: remaining or reset out of range", tat, now, cost, l, r)
		}
		if r.Allowed && (r.TAT < max(tat, now) || r.RetryAfter != 0) {
			t.Fatalf("allowed with TAT %d below max(tat, now) = %d or retry %d", r.TAT, max(tat, now), r.RetryAfter)
		}
		if !r.Allowed && (r.RetryAfter <= 0 || r.TAT != max(tat, now)) {
			t.Fatalf("denied with retry %d, TAT %d", r.RetryAfter, r.TAT)
		}
		if a := l.DecideAhead(tat, now, cost, interval); a.Allowed && (a.Delay < 0 || a.Delay > interval || a.TAT < max(tat, now) || a.Remaining < 0) {
			t.Fatalf("DecideAhead(%d, %d, %d, %d) with %+v = %+v", tat, now, cost, interval, l, a)
		}
		if got := l.Refund(tat, now, cost); got < now || got > max(tat, now) {
			t.Fatalf("Refund(%d, %d, %d) = %d, outside [now, max(tat, now)]", tat, now, cost, got)
		}
		if p := l.Peek(tat, now); p.Remaining < 0 || p.Remaining > burst || p.ResetAfter < 0 {
			t.Fatalf("Peek(%d, %d) = %+v", tat, now, p)
		}
	})
}

func TestDecideAhead(t *testing.T) {
	// 5 per 1000 with burst 1: T = 200; a request may wait up to 600.
	l := NewLimit(5, 1000, 1)
	tests := []struct {
		name            string
		tat, now, ahead int64
		want            Result
	}{
		{"a fresh key passes at once", 0, 5000, 600,
			Result{Allowed: true, TAT: 5200, ResetAfter: 200}},
		{"the next waits one interval, its slot reserved", 5200, 5000, 600,
			Result{Allowed: true, TAT: 5400, ResetAfter: 400, Delay: 200}},
		{"exactly ahead away is admitted for later", 5600, 5000, 600,
			Result{Allowed: true, TAT: 5800, ResetAfter: 800, Delay: 600}},
		{"one µs further is denied, its retry counting the queue", 5601, 5000, 600,
			Result{TAT: 5601, RetryAfter: 601, ResetAfter: 601}},
		{"ahead 0 is Decide", 5200, 5000, 0,
			Result{TAT: 5200, RetryAfter: 200, ResetAfter: 200}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := l.DecideAhead(tc.tat, tc.now, 1, tc.ahead); got != tc.want {
				t.Errorf("DecideAhead(%d, %d, 1, %d) = %+v, want %+v", tc.tat, tc.now, tc.ahead, got, tc.want)
			}
		})
	}
	if r := l.DecideAhead(0, 5000, 2, 10_000); r.Allowed {
		t.Errorf("a cost over the burst was admitted for later: %+v", r)
	}
}

// TestDecideAheadServesAtMostTheRate admits a burst of requests arriving
// together and checks the times they are served at (now + Delay): spaced by
// T after the burst, never more than B + d/T in any interval d, and the
// ones admitted are exactly those within ahead.
func TestDecideAheadServesAtMostTheRate(t *testing.T) {
	for _, burst := range []int64{1, 3} {
		l := NewLimit(5, 1000, burst) // T = 200
		const ahead = 3000
		var tat int64
		var served []int64
		for i := range 40 {
			now := int64(10_000 + i) // 40 requests within 40 units
			r := l.DecideAhead(tat, now, 1, ahead)
			if !r.Allowed {
				if r.RetryAfter <= ahead {
					t.Fatalf("burst %d: request %d denied with retry %d within ahead", burst, i, r.RetryAfter)
				}
				continue
			}
			tat = r.TAT
			served = append(served, now+r.Delay)
		}
		// Served at once: burst; then one per T for ahead: ⌊ahead/T⌋ more.
		if want := int(burst + ahead/200); len(served) != want {
			t.Errorf("burst %d: %d admitted, want %d", burst, len(served), want)
		}
		for i := range served {
			for j := i + 1; j < len(served); j++ {
				if n, d := int64(j-i+1), served[j]-served[i]; n > burst+d/200 {
					t.Fatalf("burst %d: %d served within %d, more than B + d/T = %d", burst, n, d, burst+d/200)
				}
			}
		}
	}
}
