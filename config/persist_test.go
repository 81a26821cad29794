package config

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// The syntax, as written, gives the JSON it documents.
func TestCaddyfilePersistBlock(t *testing.T) {
	// The /login matcher is httpcaddyfile's, tested with Caddy in tests/.
	h, err := parse(t, `rate_limit {
		zone login_ip {
			key {client_ip}
			events 5
			window 15m
		}
		persist {
			interval 30s        # periodic snapshot; default 30s
			max_age  24h        # a snapshot older than this is ignored
		}
	}`)
	if err != nil {
		t.Fatal(err)
	}
	if h.Persist == nil || time.Duration(h.Persist.Interval) != 30*time.Second || time.Duration(h.Persist.MaxAge) != 24*time.Hour {
		t.Fatalf("persist = %+v, want interval 30s, max_age 24h", h.Persist)
	}
	b, _ := json.Marshal(h.Persist)
	if string(b) != `{"interval":30000000000,"max_age":86400000000000}` {
		t.Errorf("JSON %s", b)
	}
	if h, err := parse(t, "rate_limit {\nzone a {\nkey {client_ip}\nevents 1\nwindow 1m\n}\npersist\n}"); err != nil || h.Persist == nil || *h.Persist != (Persist{}) {
		t.Errorf("a bare persist: %+v, %v; want the defaults", h.Persist, err)
	}
	for input, want := range map[string]string{
		"persist {\ninterval 100ms\n}":           "at least 1s",
		"persist {\ninterval 1s\ninterval 2s\n}": "given twice",
		"persist {\nmax_age 0\n}":                "positive duration",
		"persist {\nkeep 1\n}":                   "expected interval or max_age",
		"persist 30s":                            "wrong argument count",
	} {
		_, err := parse(t, "rate_limit {\nzone a {\nkey {client_ip}\nevents 1\nwindow 1m\n}\n"+input+"\n}")
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error saying %q", input, err, want)
		}
	}
}
