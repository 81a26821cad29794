package config

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

func TestChallengeCaddyfileAsWritten(t *testing.T) {
	h, err := parse(t, `rate_limit {
		zone visitors {
			key {client_ip}
			ipv6_prefix 64
			events 30
			window 1m
			challenge {
				difficulty 4 8
				valid 24h
				events 600
				window 1h
			}
		}
	}`)
	if err != nil {
		t.Fatal(err)
	}
	want := Challenge{Difficulty: 4, DifficultyMax: 8, Valid: caddy.Duration(24 * time.Hour), MaxEvents: 600, Window: caddy.Duration(time.Hour)}
	if got := h.RateLimits["visitors"].Challenge; got == nil || *got != want {
		t.Fatalf("challenge = %+v, want %+v", got, want)
	}
	b, _ := json.Marshal(h.RateLimits["visitors"].Challenge)
	if string(b) != `{"difficulty":4,"difficulty_max":8,"valid":86400000000000,"max_events":600,"window":3600000000000}` {
		t.Errorf("JSON %s", b)
	}
}

// Each mistake is refused with its line and the fix.
func TestChallengeCaddyfileErrorsNameLineAndFix(t *testing.T) {
	for _, c := range []struct{ block, want string }{
		{"challenge {\n\t\t\t\tvalid 24h\n\t\t\t}", "events 600 and window 1h in the challenge block, at Testfile:6"},
		{"challenge {\n\t\t\t\tevents 600\n\t\t\t}", "window 1h in the challenge block, at Testfile:6"},
		{"challenge {\n\t\t\t\tdifficulty 0\n\t\t\t}", "challenge difficulty \"0\" must be a whole number of leading zero hex digits from 1 to 10 (4 takes a browser about a second): difficulty 4, or difficulty 4 8, at Testfile:7"},
		{"challenge {\n\t\t\t\tdifficulty 6 4\n\t\t\t\tevents 1\n\t\t\t\twindow 1h\n\t\t\t}", "upper bound must be from the lower bound (6)"},
		{"challenge {\n\t\t\t\tsolve 4\n\t\t\t}", "unknown challenge setting \"solve\": expected difficulty, valid, events or window, at Testfile:7"},
		{"concurrency 4\n\t\t\tchallenge {\n\t\t\t\tevents 1\n\t\t\t\twindow 1h\n\t\t\t}", "challenge is for rate zones (events, window)"},
	} {
		block := c.block
		zone := "zone visitors {\n\t\t\tkey {client_ip}\n\t\t\t" + block + "\n\t\t}"
		if !strings.HasPrefix(c.block, "concurrency") {
			zone = "zone visitors {\n\t\t\tkey {client_ip}\n\t\t\tevents 30\n\t\t\twindow 1m\n\t\t\t" + block + "\n\t\t}"
		}
		_, err := parse(t, "rate_limit {\n\t\t"+zone+"\n\t}")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want one containing %q", c.block, err, c.want)
		}
	}
}

// The JSON config is checked as the Caddyfile is, naming the fix.
func TestChallengeJSONChecked(t *testing.T) {
	for _, c := range []struct {
		ch   Challenge
		want string
	}{
		{Challenge{MaxEvents: 600}, "window 1h in the challenge block"},
		{Challenge{Window: caddy.Duration(time.Hour)}, "events 600 and window 1h"},
		{Challenge{Difficulty: 11, MaxEvents: 1, Window: 1}, "from 1 to 10"},
	} {
		if err := c.ch.Check(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.ch, err, c.want)
		}
	}
}
