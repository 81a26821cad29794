package algorithms

// Adaptive concurrency: a limit of requests in flight that follows an
// upstream's latency toward a target the operator states, and the priority
// classes that share it. The rules and why they are so are in
// docs/configuration.md (Adaptive concurrency); in short:
//
// A failed request is a sample above every latency. A window closes once it
// has AdaptiveMinSamples samples and lasts at least max(target, 100ms), or
// after four such lengths with any sample. At each close, with p the
// window's 90th percentile, L the limit and peak the most requests that
// wanted to be in flight at once in the window (shed ones included):
//
//	p > target:              L ← L·(1 + max(½, target/p))/2      (decrease)
//	p ≤ target, peak ≥ L/2:  L ← L + max(¼, L·min(target/p − 1, ⅒))  (increase)
//	                         (before the first decrease or failure: L ← 2L, a slow start)
//	otherwise:               L unchanged
//
// then L is kept within [min, max]. A window over the target while L is at
// min sets the unloaded latency U to its p90 (unless that is a failure);
// while U is known the target is max(target, U·9/8); U is forgotten once a
// window meets the target or comes a tenth below U.
//
// Classes share L, class 0 the highest; each class's demand is an
// exponential average of its requests in flight (time constant
// AdaptiveDemandTau). A request of class k is admitted when
//
//	inFlight + round(Σ_{j<k} max(0, demand_j − inFlight_j)) < L + borrow(k)
//	borrow(k) = min(max(1, L/8), Σ_{j>k} inFlight_j)   (0 for the lowest class)

import (
	"math"
	"slices"
)

// AdaptiveLimit is an adaptive concurrency limit's configuration.
type AdaptiveLimit struct {
	Target int64 // the latency the upstream should keep at its p90, in ns
	Min    int64 // the fewest requests in flight allowed (≥ 1)
	Max    int64 // the most (≥ Min)
}

const (
	// AdaptiveSamples is how many latencies a window keeps: its last ones.
	AdaptiveSamples = 64
	// AdaptiveMinSamples is how many a window needs to close in time.
	AdaptiveMinSamples = 10
	// AdaptiveMinWindow is the shortest window, in ns.
	AdaptiveMinWindow = int64(100e6)
	// AdaptiveDemandTau is the time constant of a class's demand, in ns.
	AdaptiveDemandTau = int64(1e9)
)

// Adaptive is one adaptive limit's state, made by NewAdaptive.
type Adaptive struct {
	limit   float64
	start   int64 // the current window's start
	n       int   // latencies seen in the window
	peak    int64 // the most requests in flight wanted in the window
	settled bool  // a decrease or a failure happened: the slow start is over
	failed  bool  // a request of the window failed
	lastP90 int64 // the p90 of the last window closed
	samples [AdaptiveSamples]int64
	// unloaded is the upstream's unloaded latency learned (0: none above
	// the target).
	unloaded int64
}

// NewAdaptive returns a limit at l.Min whose first window starts at now.
func NewAdaptive(l AdaptiveLimit, now int64) Adaptive {
	return Adaptive{limit: float64(l.Min), start: now}
}

// Limit is the number of requests that may be in flight: at least 1.
func (a *Adaptive) Limit() int64 { return max(1, int64(a.limit)) }

// Want records that want requests wanted to be in flight at once (the ones
// in flight and the one arriving), shed or not.
func (a *Adaptive) Want(want int64) { a.peak = max(a.peak, want) }

// failedSample is a failed request's latency: above every one.
const failedSample = math.MaxInt64

// Observe records one request's latency (ns) at now, or its failure, and,
// when that closes the window, moves the limit within l's bounds and
// reports true.
func (a *Adaptive) Observe(l AdaptiveLimit, now, latency int64, failed bool) bool {
	if failed {
		latency, a.failed = failedSample, true
	}
	a.samples[a.n%AdaptiveSamples] = latency
	a.n++
	window := max(l.Target, AdaptiveMinWindow)
	elapsed := now - a.start
	if !(a.n >= AdaptiveMinSamples && elapsed >= window || elapsed >= 4*window) {
		return false
	}
	p, served := a.p90()
	a.lastP90 = served
	a.learn(l, p)
	a.update(l, p, a.failed)
	a.start, a.n, a.peak, a.failed = now, 0, 0, false
	return true
}

// learn updates the unloaded latency U from a window of p90 p.
func (a *Adaptive) learn(l AdaptiveLimit, p int64) {
	switch {
	case p == failedSample:
	case p <= l.Target, float64(p) <= 0.9*float64(a.unloaded):
		a.unloaded = 0
	case a.limit <= float64(l.Min):
		a.unloaded = p
	}
}

// Unloaded is the upstream's unloaded latency learned (ns), 0 for none.
func (a *Adaptive) Unloaded() int64 { return a.unloaded }

// target is the latency the limit follows.
func (a *Adaptive) target(l AdaptiveLimit) float64 {
	return max(float64(l.Target), float64(a.unloaded)*9/8)
}

// update moves the limit after a window of p90 latency p.
func (a *Adaptive) update(l AdaptiveLimit, p int64, failed bool) {
	lim, target := a.limit, a.target(l)
	a.settled = a.settled || failed // a failure ends the slow start, as a loss ends TCP's
	switch {
	case float64(p) > target:
		lim *= (1 + max(0.5, target/float64(p))) / 2
		a.settled = true
	case float64(a.peak) < lim/2:
	case !a.settled:
		lim *= 2
	default:
		gain := 0.1
		if p > 0 {
			gain = min(gain, target/float64(p)-1)
		}
		lim += max(0.25, lim*gain)
	}
	a.limit = min(max(lim, float64(l.Min)), float64(l.Max))
}

// LastP90 is the p90 latency of the last window's served requests (ns).
func (a *Adaptive) LastP90() int64 { return a.lastP90 }

// p90 is the 90th percentile of the window's kept samples (nearest rank, a
// failure above every latency), and that of its served ones alone (0 when
// none was).
func (a *Adaptive) p90() (all, served int64) {
	var buf [AdaptiveSamples]int64
	s := buf[:copy(buf[:], a.samples[:min(a.n, AdaptiveSamples)])]
	slices.Sort(s)
	all = s[(len(s)*9+9)/10-1]
	n := len(s)
	for n > 0 && s[n-1] == failedSample {
		n--
	}
	if n > 0 {
		served = s[(n*9+9)/10-1]
	}
	return all, served
}

// Classes is the requests in flight of each priority class sharing one
// limit, and each class's demand.
type Classes struct {
	inFlight []int64
	demand   []float64
	last     []int64 // when each demand was last brought up to date
}

// NewClasses returns n classes (at least 1) with nothing in flight at now.
func NewClasses(n int, now int64) Classes {
	n = max(n, 1)
	c := Classes{inFlight: make([]int64, n), demand: make([]float64, n), last: make([]int64, n)}
	for i := range c.last {
		c.last[i] = now
	}
	return c
}

// Resize makes n classes (at least 1) at now: new ones start empty, and the
// requests in flight of classes dropped count in the last one kept (where
// Done, which clamps the class, will count them out).
func (c *Classes) Resize(n int, now int64) {
	n = max(n, 1)
	for k := range c.inFlight {
		c.move(k, now, 0)
	}
	for len(c.inFlight) < n {
		c.inFlight, c.demand, c.last = append(c.inFlight, 0), append(c.demand, 0), append(c.last, now)
	}
	for k := n; k < len(c.inFlight); k++ {
		c.inFlight[n-1] += c.inFlight[k]
		c.demand[n-1] += c.demand[k]
	}
	c.inFlight, c.demand, c.last = c.inFlight[:n], c.demand[:n], c.last[:n]
}

// Len is the number of classes.
func (c *Classes) Len() int { return len(c.inFlight) }

// InFlight is the number of requests in flight, of class k or, with k < 0,
// of every class.
func (c *Classes) InFlight(k int) int64 {
	if k >= 0 {
		return c.inFlight[k]
	}
	var n int64
	for _, x := range c.inFlight {
		n += x
	}
	return n
}

// Admit admits one request of class k (clamped to the classes) at now under
// limit, counting it in flight, and reports whether it did.
func (c *Classes) Admit(k int, limit, now int64) bool {
	k = min(max(k, 0), len(c.inFlight)-1)
	total := c.InFlight(-1)
	var unused float64
	for j := range k {
		unused += max(0, c.demandAt(j, now)-float64(c.inFlight[j]))
	}
	var borrow int64
	if k < len(c.inFlight)-1 {
		var lower int64
		for _, x := range c.inFlight[k+1:] {
			lower += x
		}
		borrow = min(max(1, limit/8), lower)
	}
	if total+int64(math.Round(unused)) >= limit+borrow {
		return false
	}
	c.move(k, now, 1)
	return true
}

// Done counts a request of class k out of flight.
func (c *Classes) Done(k int, now int64) {
	c.move(min(max(k, 0), len(c.inFlight)-1), now, -1)
}

func (c *Classes) move(k int, now, by int64) {
	c.demand[k] = c.demandAt(k, now)
	c.last[k] = max(c.last[k], now)
	c.inFlight[k] += by
}

// demandAt is class k's demand brought up to now: the exponential average
// moves toward the count in flight since the last change.
func (c *Classes) demandAt(k int, now int64) float64 {
	dt := now - c.last[k]
	if dt <= 0 {
		return c.demand[k]
	}
	x := float64(c.inFlight[k])
	return x + (c.demand[k]-x)*math.Exp(-float64(dt)/float64(AdaptiveDemandTau))
}
