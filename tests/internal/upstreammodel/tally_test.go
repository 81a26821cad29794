package upstreammodel

import (
	"testing"
	"time"
)

func TestTallyCountsEachAnswerOnceByClass(t *testing.T) {
	var a, b Tally
	for i, status := range []int{200, 200, 503, 429, 0, 500} {
		a.Add(0, status, time.Duration(i+1)*time.Millisecond)
	}
	b.Add(1, 200, 10*time.Millisecond)
	b.Add(1, 503, 0)
	a.Merge(b)
	if a.Sent != [2]int{6, 2} || a.Served != [2]int{2, 1} || a.Shed != [2]int{1, 1} || a.Refused != [2]int{1, 0} || a.Errors != 1 || a.Other != 1 {
		t.Errorf("%+v", a)
	}
	if p := a.Percentile(.5, 0); p != 2*time.Millisecond {
		t.Errorf("p50 of class 0: %v, want 2ms", p)
	}
	if p := a.Percentile(.99, 0, 1); p != 10*time.Millisecond {
		t.Errorf("p99 of both: %v, want 10ms", p)
	}
	if p := (&Tally{}).Percentile(.9, 0); p != 0 {
		t.Errorf("p90 of none: %v", p)
	}
}
