package algorithms

import (
	"testing"
	"time"
)

// BenchmarkDecide measures one GCRA step, the arithmetic every local
// decision runs under its shard lock. Requests arrive at twice the limit, so
// about half are allowed and half denied and both branches are measured.
// Target: <= 30 ns/op and 0 allocs/op.
func BenchmarkDecide(b *testing.B) {
	l := NewLimit(100, int64(time.Minute), 10)
	step := l.EmissionInterval / 2
	var tat, now int64
	allowed := 0
	b.ReportAllocs()
	for b.Loop() {
		now += step
		r := l.Decide(tat, now, 1)
		if r.Allowed {
			tat = r.TAT
			allowed++
		}
	}
	if allowed == 0 {
		b.Fatal("nothing was allowed: the benchmark is not measuring the allowed branch")
	}
}
