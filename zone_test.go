package ratelimit

import (
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// warnings provisions zone z as a handler with the given store would and
// returns the WARN lines it logged about it.
func warnings(t *testing.T, zc Zone, distributed bool) []string {
	t.Helper()
	core, logs := observer.New(zap.WarnLevel)
	zc.warn("z", distributed, zap.New(core))
	var out []string
	for _, e := range logs.All() {
		out = append(out, e.Message)
	}
	return out
}

func TestFailPolicyWithoutDistributedIsWarnedAbout(t *testing.T) {
	rate := Zone{Key: "{client_ip}", MaxEvents: 5, Window: caddy.Duration(time.Minute)}
	for _, tc := range []struct {
		policy      string
		distributed bool
		warned      bool
	}{
		{"closed", false, true},
		{"open", false, true},
		{"local", false, false},
		{"", false, false},
		{"closed", true, false},
		{"open", true, false},
	} {
		zc := rate
		zc.FailPolicy = tc.policy
		got := warnings(t, zc, tc.distributed)
		warned := len(got) == 1 && strings.Contains(got[0], "fail_policy has no effect without distributed")
		if warned != tc.warned || len(got) > 1 {
			t.Errorf("fail_policy %q, distributed %v: warnings %q, want warned %v", tc.policy, tc.distributed, got, tc.warned)
		}
	}
}
