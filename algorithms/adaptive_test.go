package algorithms

import (
	"math"
	"testing"
)

const ms = int64(1e6)

var target100 = AdaptiveLimit{Target: 100 * ms, Min: 4, Max: 2000}

func TestAdaptiveWindowUpdate(t *testing.T) {
	tests := []struct {
		name    string
		limit   float64
		settled bool
		peak    int64
		p90     int64
		l       AdaptiveLimit
		want    float64
	}{
		{"over target: down halfway to limit·target/p", 20, true, 20, 125 * ms, target100, 18},
		{"far over target: a quarter off at most", 20, true, 20, 1000 * ms, target100, 15},
		{"within target and in use: a tenth up", 30, true, 30, 50 * ms, target100, 33},
		{"just within target: at least a quarter place up", 20, true, 20, 99 * ms, target100, 20.25},
		{"gain is target/p − 1 below a tenth", 100, true, 100, 95 * ms, target100, 100 + 100*(100.0/95-1)},
		{"limit not in use: unchanged", 20, true, 9, 50 * ms, target100, 20},
		{"half in use counts as in use", 20, true, 10, 50 * ms, target100, 22},
		{"slow start doubles", 8, false, 8, 90 * ms, target100, 16},
		{"never below min", 5, true, 5, 1000 * ms, target100, 4},
		{"never above max", 1990, true, 2000, 10 * ms, target100, 2000},
		{"exactly at target is within it", 20, true, 20, 100 * ms, target100, 20.25},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := Adaptive{limit: tc.limit, settled: tc.settled, peak: tc.peak}
			a.update(tc.l, tc.p90, false)
			if math.Abs(a.limit-tc.want) > 1e-9 {
				t.Errorf("limit %v after p90 %v, peak %d: %v, want %v", tc.limit, tc.p90, tc.peak, a.limit, tc.want)
			}
		})
	}
}

func TestAdaptiveDecreaseEndsSlowStart(t *testing.T) {
	a := Adaptive{limit: 40, peak: 40}
	a.update(target100, 200*ms, false)
	a.peak = 40
	a.update(target100, 50*ms, false)
	if a.limit != 30*1.1 {
		t.Fatalf("after a decrease an increase is a tenth, got limit %v, want %v", a.limit, 30*1.1)
	}
}

func TestAdaptiveP90IsNearestRank(t *testing.T) {
	tests := []struct {
		name    string
		samples []int64
		want    int64
	}{
		{"one sample", []int64{7}, 7},
		{"ten samples: the ninth", []int64{10, 1, 9, 2, 8, 3, 7, 4, 6, 5}, 9},
		{"twenty samples: the eighteenth", []int64{20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1}, 18},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var a Adaptive
			for _, s := range tc.samples {
				a.samples[a.n%AdaptiveSamples] = s
				a.n++
			}
			if got, _ := a.p90(); got != tc.want {
				t.Errorf("p90 of %v = %d, want %d", tc.samples, got, tc.want)
			}
		})
	}
}

// A failed request is a sample of overload whatever its time: a fast
// failure never raises the limit, and more than a tenth of failures in a
// window lowers it by the most a window may; the latency reported is the
// served requests'.
func TestAdaptiveFailuresNeverRaiseTheLimit(t *testing.T) {
	tests := []struct {
		name     string
		settled  bool
		failures int // of ten samples at 1ms, the last ones
		want     float64
		wantP90  int64
	}{
		{"no failure: up", true, 0, 22, 1 * ms},
		{"one in ten: the p90 is still served", true, 1, 22, 1 * ms},
		{"two in ten: a quarter down", true, 2, 15, 1 * ms},
		{"two in ten in slow start: a quarter down, not doubled", false, 2, 15, 1 * ms},
		{"all failed: a quarter down, no latency", true, 10, 15, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := Adaptive{limit: 20, settled: tc.settled}
			a.Want(20)
			for i := range 10 {
				a.Observe(target100, AdaptiveMinWindow, 1*ms, i >= 10-tc.failures)
			}
			if a.limit != tc.want || a.LastP90() != tc.wantP90 {
				t.Errorf("limit 20 after %d failures in 10: %v, p90 %d; want %v, p90 %d", tc.failures, a.limit, a.LastP90(), tc.want, tc.wantP90)
			}
		})
	}
}

func TestAdaptiveWindowCloses(t *testing.T) {
	tests := []struct {
		name    string
		samples int
		at      int64 // when the last sample comes, from the window's start
		closes  bool
	}{
		{"enough samples, window long enough", AdaptiveMinSamples, 100 * ms, true},
		{"enough samples, window too short", AdaptiveMinSamples, 99 * ms, false},
		{"too few samples in time", AdaptiveMinSamples - 1, 399 * ms, false},
		{"any sample after four windows", 1, 400 * ms, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := NewAdaptive(AdaptiveLimit{Target: 50 * ms, Min: 4, Max: 100}, 1000)
			var closed bool
			for i := range tc.samples {
				now := int64(1000)
				if i == tc.samples-1 {
					now += tc.at
				}
				closed = a.Observe(AdaptiveLimit{Target: 50 * ms, Min: 4, Max: 100}, now, 10*ms, false)
			}
			if closed != tc.closes {
				t.Errorf("window closed: %v, want %v", closed, tc.closes)
			}
		})
	}
}

// An upstream of c places serving each request in s, in front of which the
// limit is always full (overload): each window it sees latency s·L/c once
// L > c. The limit settles where the latency crosses the target.
func TestAdaptiveSettlesAtTargetUnderOverload(t *testing.T) {
	const c, s = 20, 90 * ms
	l := target100
	a := NewAdaptive(l, 0)
	now := int64(0)
	var seen []int64
	for w := range 200 {
		lim := a.Limit()
		lat := s
		if lim > c {
			lat = s * lim / c
		}
		for !a.Observe(l, now, lat, false) {
			a.Want(lim + 1)
			now += 10 * ms
		}
		if w >= 100 {
			seen = append(seen, a.Limit())
		}
		if c2 := int64(c); w == 150 && lim < c2 {
			t.Fatalf("window %d: limit %d below the upstream's %d places", w, lim, c2)
		}
	}
	for _, lim := range seen {
		if lim < c || float64(lim) > 1.2*c {
			t.Fatalf("limit settled at %v, want within [%d, %v] (C·target/S ≈ 22)", seen, c, 1.2*c)
		}
	}
}

func TestClassesAdmit(t *testing.T) {
	type class struct {
		inFlight int64
		demand   float64
	}
	tests := []struct {
		name    string
		classes []class
		k       int
		limit   int64
		want    bool
	}{
		{"one class: below the limit", []class{{9, 0}}, 0, 10, true},
		{"one class: at the limit", []class{{10, 0}}, 0, 10, false},
		{"lowest class keeps the higher class's unused demand free", []class{{2, 5}, {5, 5}}, 1, 10, false},
		{"lowest class gets what the higher class leaves", []class{{2, 5}, {2, 5}}, 1, 10, true},
		{"the reserve is the higher class's average", []class{{3, 4}, {6, 6}}, 1, 10, false},
		{"the reserve is rounded to the nearest place", []class{{2, 3.6}, {6, 6}}, 1, 10, false},
		{"a reserve under half a place keeps none", []class{{2, 2.4}, {7, 6}}, 1, 10, true},
		{"a higher class idle for long leaves no reserve", []class{{0, 0}, {9, 9}}, 1, 10, true},
		{"higher class borrows a lower class's place", []class{{5, 5}, {5, 5}}, 0, 10, true},
		{"borrowing is bounded by an eighth (at least one)", []class{{6, 5}, {5, 5}}, 0, 10, false},
		{"borrowing an eighth of a large limit", []class{{50, 50}, {61, 61}}, 0, 100, true},
		{"no more than an eighth", []class{{50, 50}, {62, 62}}, 0, 100, false},
		{"borrowing only what lower classes hold", []class{{10, 10}, {0, 0}}, 0, 10, false},
		{"after the limit fell: the lowest class is shed", []class{{0, 0}, {11, 11}}, 1, 10, false},
		{"unknown class is the lowest", []class{{2, 5}, {5, 5}}, 7, 10, false},
		{"middle class: reserve above, borrow below", []class{{1, 2}, {4, 4}, {4, 4}}, 1, 10, true},
		{"middle class: reserve above binds", []class{{0, 3}, {4, 4}, {4, 4}}, 1, 10, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := NewClasses(len(tc.classes), 0)
			for i, cl := range tc.classes {
				c.inFlight[i], c.demand[i] = cl.inFlight, cl.demand
			}
			before := c.InFlight(-1)
			got := c.Admit(tc.k, tc.limit, 0)
			if got != tc.want {
				t.Fatalf("Admit(class %d) under %d with %+v = %v, want %v", tc.k, tc.limit, tc.classes, got, tc.want)
			}
			if after := c.InFlight(-1); (after == before+1) != got {
				t.Fatalf("in flight %d → %d, admitted %v", before, after, got)
			}
		})
	}
}

func TestClassDemandIsTimeAverage(t *testing.T) {
	c := NewClasses(2, 0)
	for range 4 {
		c.Admit(0, 100, 0)
	}
	tau := AdaptiveDemandTau
	if d := c.demandAt(0, tau); math.Abs(d-4*(1-math.Exp(-1))) > 1e-9 {
		t.Fatalf("demand after one time constant at 4 in flight: %v, want %v", d, 4*(1-math.Exp(-1)))
	}
	for range 4 {
		c.Done(0, 10*tau)
	}
	if d := c.demandAt(0, 20*tau); d > 4*math.Exp(-9) {
		t.Fatalf("demand ten time constants after the class left: %v, want about 0", d)
	}
	if c.InFlight(0) != 0 || c.InFlight(-1) != 0 {
		t.Fatalf("in flight %d, want 0", c.InFlight(-1))
	}
}

// overloadWindows runs windows in front of an upstream of c places serving
// each request in s, the limit always full: latency s·L/c once L > c. It
// returns the limits of the last half of the windows.
func overloadWindows(a *Adaptive, l AdaptiveLimit, now *int64, windows int, c, s int64) []int64 {
	var seen []int64
	for w := range windows {
		lim := a.Limit()
		lat := s * max(lim, c) / c
		for !a.Observe(l, *now, lat, false) {
			a.Want(lim + 1)
			*now += 10 * ms
		}
		if w >= windows/2 {
			seen = append(seen, a.Limit())
		}
	}
	return seen
}

// A service time that doubles past the target with no queueing: the
// latency stays over the target at min, so the controller learns it as
// the upstream's own and keeps the upstream's places in use; a queue (a
// halved C) is still held at the target; a faster upstream again brings
// the target back.
func TestAdaptiveTellsQueueingFromServiceTime(t *testing.T) {
	const c = 10
	l := target100
	a := NewAdaptive(l, 0)
	now := int64(0)
	within := func(phase string, seen []int64, lo, hi float64, unloaded int64) {
		t.Helper()
		for _, lim := range seen {
			if float64(lim) < lo || float64(lim) > hi {
				t.Fatalf("%s: limit settled at %v, want within [%v, %v]", phase, seen, lo, hi)
			}
		}
		if a.Unloaded() != unloaded {
			t.Fatalf("%s: unloaded latency %d, want %d", phase, a.Unloaded(), unloaded)
		}
	}
	within("S = 90ms", overloadWindows(&a, l, &now, 100, c, 90*ms), c, 1.2*c, 0)
	within("S = 180ms", overloadWindows(&a, l, &now, 100, c, 180*ms), c, 1.2*c, 180*ms)
	within("S = 90ms again", overloadWindows(&a, l, &now, 100, c, 90*ms), c, 1.2*c, 0)
	within("C halved", overloadWindows(&a, l, &now, 100, c/2, 90*ms), c/2, 1.4*c/2, 0) // 7 of 5 places: a whole place is 20%
}

func TestAdaptiveLearnsUnloadedLatency(t *testing.T) {
	tests := []struct {
		name     string
		limit    float64
		unloaded int64
		p        int64
		want     int64
	}{
		{"at min: in-flight cannot fall further", 4, 0, 180 * ms, 180 * ms},
		{"over the target above min: a queue, nothing learned", 5, 0, 180 * ms, 0},
		{"within the target: forgotten", 8, 180 * ms, 90 * ms, 0},
		{"a tenth faster: forgotten", 12, 200 * ms, 180 * ms, 0},
		{"slower but not at min: kept", 12, 180 * ms, 210 * ms, 180 * ms},
		{"a failure teaches nothing", 4, 180 * ms, failedSample, 180 * ms},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := Adaptive{limit: tc.limit, unloaded: tc.unloaded}
			a.learn(target100, tc.p)
			if a.Unloaded() != tc.want {
				t.Errorf("unloaded %d, want %d", a.Unloaded(), tc.want)
			}
		})
	}
}

// A window with a failure ends the slow start, as a loss ends TCP's: the
// limit grows by a tenth at most, not twice, and keeps to that after.
func TestAdaptiveFailureEndsTheSlowStart(t *testing.T) {
	l := AdaptiveLimit{Target: 100e6, Min: 4, Max: 1000}
	a := Adaptive{limit: 8, peak: 8}
	a.update(l, 90e6, true)
	if want := 8.8; math.Abs(a.limit-want) > 1e-9 || !a.settled {
		t.Fatalf("after a window with a failure under the target: limit %v, settled %v; want %v, settled", a.limit, a.settled, want)
	}
	a.peak = 9
	a.update(l, 90e6, false)
	if want := 8.8 * 1.1; math.Abs(a.limit-want) > 1e-9 {
		t.Fatalf("the next window: limit %v, want %v (no more doubling)", a.limit, want)
	}
}
