package tests

// Bans (issue 24) through a real Caddy, local mode: a key a zone denies is
// denied for the ban, escalating, and tells of it.

import (
	"strings"
	"testing"
	"time"
)

// events 3 window 3s ban 5s: 3 allowed, the 4th denied and banned; 2s later
// (when the plain zone would allow 2) still denied with Retry-After 3 ± 1;
// 5.5s after the ban started, 3 allowed again. A ban of 1s on the same
// limit admits nothing the plain zone would not.
func TestLocalBanOutlastsWhatTheRateGivesBack(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, `http:// {
	rate_limit {
		zone banned {
			key {http.request.header.X-API-Key}
			match {
				path /banned
			}
			events 3
			window 3s
			ban 5s
		}
		zone short {
			key {http.request.header.X-API-Key}
			match {
				path /short
			}
			events 3
			window 3s
			ban 1s
		}
		zone plain {
			key {http.request.header.X-API-Key}
			match {
				path /plain
			}
			events 3
			window 3s
		}
		headers ietf
	}
	respond "ok"
}
`)
	r := request{Path: "/banned", Header: map[string]string{"X-API-Key": "k"}}
	start := time.Now()
	if got := c.Send(3, r); got[0] != 200 || got[1] != 200 || got[2] != 200 {
		t.Fatalf("first 3: %v", got)
	}
	res := c.Do(r)
	if res.Status != 429 || retryAfter(t, res) != 5 {
		t.Fatalf("4th: %d Retry-After %q, want 429 and the ban's 5", res.Status, res.Header.Get("Retry-After"))
	}
	var k struct {
		BannedFor float64 `json:"banned_for"`
		BanLevel  int     `json:"ban_level"`
	}
	c.adminJSON(keyPath("banned", "k"), &k)
	if k.BannedFor < 4 || k.BannedFor > 5 || k.BanLevel != 1 {
		t.Errorf("GET of the banned key: banned_for %v level %d, want ~5 and 1", k.BannedFor, k.BanLevel)
	}
	var l struct {
		View string `json:"view"`
		Bans []struct {
			Key string `json:"key"`
		} `json:"bans"`
	}
	c.adminJSON("/rate_limit/zones/banned/bans", &l)
	if l.View != "instance" || len(l.Bans) != 1 || l.Bans[0].Key != "k" {
		t.Errorf("bans list: %+v, want k on this instance", l)
	}
	time.Sleep(time.Until(start.Add(2 * time.Second)))
	res = c.Do(r)
	if ra := retryAfter(t, res); res.Status != 429 || ra < 2 || ra > 4 {
		t.Fatalf("2s later: %d Retry-After %d, want 429 and 3 ± 1", res.Status, ra)
	}
	if got := res.Header.Get("RateLimit"); !strings.Contains(got, "r=0") || !strings.Contains(got, "t="+res.Header.Get("Retry-After")) {
		t.Errorf("RateLimit %q during the ban, want r=0 and t = Retry-After %s", got, res.Header.Get("Retry-After"))
	}
	time.Sleep(time.Until(start.Add(5500 * time.Millisecond)))
	if got := c.Send(3, r); got[0] != 200 || got[1] != 200 || got[2] != 200 {
		t.Fatalf("5.5s after the ban started: %v, want 3 allowed", got)
	}

	// The same requests, every 100ms for 4s, to the 1s-ban zone and the
	// plain one: the ban never has allowed more.
	var short, plain int
	for i := 0; i < 40; i++ {
		if c.Do(request{Path: "/short", Header: map[string]string{"X-API-Key": "s"}}).Status == 200 {
			short++
		}
		if c.Do(request{Path: "/plain", Header: map[string]string{"X-API-Key": "s"}}).Status == 200 {
			plain++
		}
		if short > plain {
			t.Fatalf("after %d rounds the 1s ban allowed %d, the plain zone %d", i+1, short, plain)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// The failed-login limiter, as written: 5 wrong passwords, then the
// right one is denied for the ban; the ban tells of itself (event, one INFO
// line, no key without log_key).
func TestFailedLoginsAreBanned(t *testing.T) {
	t.Parallel()
	c := startCaddyWith(t, "\tlog {\n\t\tlevel DEBUG\n\t}", `http:// {
	rate_limit /login {
		zone failed_logins {
			key {client_ip}
			events 5
			window 15m
			count {
				status 401
			}
			ban 1h              # a key this zone denies is then denied for 1h
		}
		zone scrapers {
			key {client_ip}
			events 100
			window 1m
			ban 10m 24h         # escalating: 10m, 20m, 40m ... at most 24h
		}
	}
	@right header X-Password right
	respond @right "welcome" 200
	respond "wrong password" 401
}
`)
	wrong := request{Path: "/login", Header: map[string]string{"X-Password": "wrong"}}
	if got := c.Send(5, wrong); got[4] != 401 {
		t.Fatalf("5 wrong passwords: %v, want 5 × 401", got)
	}
	res := c.Do(request{Path: "/login", Header: map[string]string{"X-Password": "right"}})
	if ra := retryAfter(t, res); res.Status != 429 || ra < 3599 || ra > 3600 {
		t.Fatalf("the right password after 5 wrong: %d Retry-After %d, want 429 for the 1h ban", res.Status, ra)
	}
	waitFor(t, 10*time.Second, "the rate_limit_banned event and the ban's log line", func() bool {
		out := c.Output()
		return strings.Contains(out, `"name":"rate_limit_banned"`) && strings.Contains(out, `"msg":"rate limit ban started"`)
	})
	out := c.Output()
	if n := strings.Count(out, `"msg":"rate limit ban started"`); n != 1 {
		t.Errorf("%d ban log lines for one ban", n)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "rate_limit_banned") || strings.Contains(line, "ban started") {
			if strings.Contains(line, "127.0.0.1") && strings.Contains(line, `"key"`) {
				t.Errorf("a ban line names the key without log_key: %s", line)
			}
			if strings.Contains(line, "ban started") && !strings.Contains(line, `"zone":"failed_logins"`) {
				t.Errorf("ban line without its zone: %s", line)
			}
		}
	}
}

// ban 1s 4s: bans of 1s, 2s, 4s, 4s (capped); a key not banned for 4s
// starts over at 1s.
func TestBansEscalateAndStartOver(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, `http:// {
	rate_limit {
		zone scrapers {
			key {http.request.header.X-API-Key}
			events 1
			window 100ms
			ban 1s 4s
		}
	}
	respond "ok"
}
`)
	r := withKey("scraper")
	ban := func(want int) {
		t.Helper()
		// Once the last ban is over the key is full again (the rate gave
		// its one request back long ago): one request passes, the next
		// starts the next ban.
		waitFor(t, 10*time.Second, "the last ban to end", func() bool { return c.Do(r).Status == 200 })
		res := c.Do(r)
		if got := retryAfter(t, res); res.Status != 429 || got != want {
			t.Fatalf("ban: %d Retry-After %d, want 429 and %d", res.Status, got, want)
		}
	}
	for _, want := range []int{1, 2, 4, 4} {
		ban(want)
	}
	waitFor(t, 10*time.Second, "the last ban to end", func() bool { return c.Do(r).Status == 200 })
	time.Sleep(4100 * time.Millisecond) // the memory: 4s after the ban's end
	ban(1)
}
