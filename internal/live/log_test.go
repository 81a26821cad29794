package live

import (
	"testing"
	"time"
)

// The denial log lets through the first 10 denials of each second, then one
// in 1000, as zap's sampler configured that way would.
func TestDenialLogSampling(t *testing.T) {
	var s Sampler
	const second = int64(time.Second)
	start := 42 * second
	logged := 0
	for i := range 10_010 {
		if s.allow(start + int64(i)) {
			logged++
		}
	}
	if logged != 10+10 {
		t.Fatalf("%d of 10010 denials in one second logged, want the first 10 and one in each 1000 after", logged)
	}
	if !s.allow(start+second) || !s.allow(start+second+1) {
		t.Fatal("the next second does not start again with its first 10")
	}
}
