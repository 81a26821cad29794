package upstreammodel

import (
	"net/http"
	"slices"
	"time"
)

// Tally counts a load's requests by priority class (0: the high class, 1:
// the low one) by their answers: what the tests and the benchmarks of load
// shedding read.
type Tally struct {
	Sent      [2]int
	Served    [2]int             // 200
	Shed      [2]int             // 503: an adaptive zone shed it
	Refused   [2]int             // 429: a rate or fixed concurrency zone refused it
	Latencies [2][]time.Duration // of the served ones
	Other     int                // another status
	Errors    int                // no answer (status 0)
}

// Add counts one request of class answered status (0: none) after latency.
func (t *Tally) Add(class, status int, latency time.Duration) {
	t.Sent[class]++
	switch status {
	case http.StatusOK:
		t.Served[class]++
		t.Latencies[class] = append(t.Latencies[class], latency)
	case http.StatusServiceUnavailable:
		t.Shed[class]++
	case http.StatusTooManyRequests:
		t.Refused[class]++
	case 0:
		t.Errors++
	default:
		t.Other++
	}
}

// Merge adds o's counts to t's.
func (t *Tally) Merge(o Tally) {
	for c := range 2 {
		t.Sent[c] += o.Sent[c]
		t.Served[c] += o.Served[c]
		t.Shed[c] += o.Shed[c]
		t.Refused[c] += o.Refused[c]
		t.Latencies[c] = append(t.Latencies[c], o.Latencies[c]...)
	}
	t.Other += o.Other
	t.Errors += o.Errors
}

// Percentile is the p-quantile (nearest rank, rounded down) of the served
// latencies of the classes given, 0 when none was served.
func (t *Tally) Percentile(p float64, classes ...int) time.Duration {
	var d []time.Duration
	for _, c := range classes {
		d = append(d, t.Latencies[c]...)
	}
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[min(len(d)-1, int(float64(len(d))*p))]
}
