package monotime

import (
	"strings"
	"testing"
	"time"
)

// The clock must come from the monotonic reading: a time.Time stripped of
// it (Round(0), UnixNano) would follow wall-clock steps.
func TestClockIsMonotonic(t *testing.T) {
	if !strings.Contains(start.String(), "m=") {
		t.Fatalf("start %v has no monotonic reading", start)
	}
	a := Now()
	time.Sleep(2 * time.Millisecond)
	b := Now()
	if d := time.Duration(b - a); d < 2*time.Millisecond || d > time.Second {
		t.Fatalf("2ms apart, the clock moved %v", d)
	}
	if d := time.Since(Time(a)); d < 2*time.Millisecond || d > time.Second {
		t.Fatalf("Time(a) is %v ago, want about 2ms", d)
	}
}
