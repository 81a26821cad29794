package tests

import (
	"strings"
	"testing"
)

// A zone's name is in every challenge token it issues: a zone with a
// challenge whose name is longer than a token can carry is refused at its
// load, naming the bound, rather than loaded with a challenge no solution
// can pass.
func TestChallengeZoneNameTooLongForItsTokensIsRefused(t *testing.T) {
	long := strings.Repeat("z", 200)
	c := newCaddyInstance(t)
	err := c.startProcess(c.Caddyfile("", `http:// {
	rate_limit {
		zone `+long+` {
			key {client_ip}
			events 1
			window 1m
			challenge {
				difficulty 1
				events 5
				window 1h
			}
		}
	}
	respond "ok"
}
`), "caddyfile")
	if err == nil || !strings.Contains(c.stderr.String(), "128") {
		t.Fatalf("a challenge zone named with 200 characters: started (%v), want a load error naming the 128-character bound; stderr %q", err, tail(c.stderr.String(), 5))
	}
}
