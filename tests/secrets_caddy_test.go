package tests

import (
	"strings"
	"testing"
	"time"
)

// A Redis URL with its password inline works, and tally warns once that
// Caddy shows it in GET /config/ and its autosave; a password from a
// placeholder gets no warning. tally's own lines never carry the password.
func TestInlineRedisPasswordIsWarnedAboutOnce(t *testing.T) {
	t.Parallel()
	const secret = "hunter2-inline-7f3a"
	r := startRedis(t)
	// Set after start: the harness waits for an unauthenticated PING.
	if err := r.Client().ConfigSet(t.Context(), "requirepass", secret).Err(); err != nil {
		t.Fatal(err)
	}
	handler := func(url string) string {
		return `rate_limit {
		zone api {
			key {http.request.header.X-API-Key}
			events 2
			window 1h
		}
		distributed {
			redis ` + url + `
			timeout 500ms
		}
	}`
	}
	c := startCaddy(t, `http://a.test {
	`+handler("redis://:"+secret+"@"+r.Addr)+`
	respond "ok"
}
http://b.test {
	`+handler("redis://:"+secret+"@"+r.Addr)+`
	respond "ok"
}
`)
	req := withKey("alice")
	req.Header["Host"] = "a.test"
	// The password works: the limit is enforced through Redis.
	if got := c.Send(3, req); got[0] != 200 || got[2] != 429 {
		t.Fatalf("alice through an inline-password Redis: %v, want 200, 200, 429", got)
	}
	waitFor(t, 5*time.Second, "the inline password warning", func() bool {
		return strings.Contains(c.Output(), "carries its password inline")
	})
	if n := strings.Count(c.Output(), "carries its password inline"); n != 1 {
		t.Errorf("the inline password warning appears %d times, want once", n)
	}
	for _, line := range strings.Split(c.Output(), "\n") {
		if strings.Contains(line, "rate_limit") && strings.Contains(line, secret) {
			t.Errorf("a tally log line carries the password: %s", line)
		}
	}
}
