package tests

import (
	"strings"
	"testing"
	"time"
)

// A denial emits the Caddy event rate_limit_exceeded (visible to event
// subscribers and, as here, in Caddy's debug log), and a flood of denials
// produces a handful of tally log lines, not one per request.
func TestDenialsEmitTheEventAndTheirLogIsSampled(t *testing.T) {
	t.Parallel()
	c := startCaddyWith(t, "\tlog {\n\t\tlevel DEBUG\n\t}", `http:// {
	rate_limit {
		zone z {
			key {http.request.header.X-API-Key}
			events 1
			window 1h
		}
	}
	respond "ok"
}
`)
	start := time.Now()
	statuses := countStatuses(c.Send(301, withKey("flood")))
	// At most 10 lines in each second the flood touched (the sampler's
	// rule): under load the 300 denials may span a few seconds.
	sample := 10 * (int(time.Since(start).Seconds()) + 2)
	if statuses[200] != 1 || statuses[429] != 300 {
		t.Fatalf("statuses %v, want 1 × 200 and 300 × 429", statuses)
	}
	var events, denialLogs int
	// Caddy's log reaches us through a pipe: poll until all 300 are in.
	waitFor(t, 10e9, "one rate_limit_exceeded event per denial (300) in Caddy's debug log", func() bool {
		out := c.Output()
		events = strings.Count(out, `"name":"rate_limit_exceeded"`)
		denialLogs = strings.Count(out, `"msg":"rate limit exceeded"`)
		return events >= 300
	})
	if denialLogs == 0 || denialLogs > min(sample, 100) {
		t.Errorf("%d denial log lines for 300 denials, want a sample of at most %d (10 in each second they took)", denialLogs, min(sample, 100))
	}
	for _, line := range strings.Split(c.Output(), "\n") {
		if strings.Contains(line, `"msg":"rate limit exceeded"`) && strings.Contains(line, "flood") {
			t.Errorf("a denial log line names the key without log_key: %s", line)
		}
	}
}
