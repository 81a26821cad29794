package distributed

import (
	"strings"
	"testing"
	"time"
)

func TestOptionsTranslateToGoRedis(t *testing.T) {
	cases := []struct {
		name    string
		opts    Options
		addrs   []string
		user    string
		pass    string
		db      int
		tls     bool
		wantErr string
	}{
		{name: "host:port", opts: Options{Addresses: []string{"127.0.0.1:6379"}}, addrs: []string{"127.0.0.1:6379"}},
		{name: "URL with credentials and db", opts: Options{Addresses: []string{"redis://u:p@10.0.0.1:6380/2"}},
			addrs: []string{"10.0.0.1:6380"}, user: "u", pass: "p", db: 2},
		{name: "rediss turns TLS on", opts: Options{Addresses: []string{"rediss://h:6379"}}, addrs: []string{"h:6379"}, tls: true},
		{name: "fields override the URL", opts: Options{Addresses: []string{"redis://u:p@h:1/2"}, Password: "q", DB: 3},
			addrs: []string{"h:1"}, user: "u", pass: "q", db: 3},
		{name: "cluster seeds", opts: Options{Addresses: []string{"redis://:p@a:1", "redis://:p@b:2", "c:3"}},
			addrs: []string{"a:1", "b:2", "c:3"}, pass: "p"},
		{name: "no address", opts: Options{}, wantErr: "no Redis address"},
		{name: "URLs disagree", opts: Options{Addresses: []string{"redis://:p@a:1", "redis://:other@b:2"}}, wantErr: "disagrees"},
		{name: "cluster has no db", opts: Options{Addresses: []string{"a:1", "b:2"}, DB: 1}, wantErr: "no databases"},
		{name: "bad scheme", opts: Options{Addresses: []string{"http://a:1"}}, wantErr: "invalid URL scheme"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			u, err := c.opts.withDefaults().universalOptions()
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(u.Addrs, ",") != strings.Join(c.addrs, ",") || u.Username != c.user ||
				u.Password != c.pass || u.DB != c.db || (u.TLSConfig != nil) != c.tls {
				t.Errorf("got addrs %v user %q pass %q db %d tls %v", u.Addrs, u.Username, u.Password, u.DB, u.TLSConfig != nil)
			}
			if !u.ContextTimeoutEnabled || u.MaxRetries != -1 || u.ReadTimeout != backgroundTimeout(Options{}.withDefaults()) {
				t.Errorf("timeouts: ContextTimeoutEnabled %v, MaxRetries %d, ReadTimeout %v", u.ContextTimeoutEnabled, u.MaxRetries, u.ReadTimeout)
			}
		})
	}
}

func TestOptionsNeverRevealThePassword(t *testing.T) {
	const secret = "hunter2-secret"
	for _, addr := range []string{
		"redis://user:" + secret + "@h:6379/0",
		"redis://user:" + secret + "@h:notaport/0", // does not parse
		"redis://user:" + secret + "@h:6379/x",     // bad db
		"redis://:" + secret + "@h:6379/0?foo=bar", // unknown option
		"redis://user:" + secret + "@h:6379/0/1",   // bad path
	} {
		o := Options{Addresses: []string{addr}, Password: secret}
		if strings.Contains(o.Redacted(), secret) {
			t.Errorf("Redacted() = %q", o.Redacted())
		}
		if _, err := o.universalOptions(); err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("error for %s reveals the password: %v", redactAddress(addr), err)
		}
	}
}

func TestOptionsKeyTellsSettingsApart(t *testing.T) {
	base := Options{Addresses: []string{"h:1"}}
	same := Options{Addresses: []string{"h:1"}, Timeout: DefaultTimeout, KeyPrefix: DefaultKeyPrefix}
	if base.Key() != same.Key() {
		t.Error("defaults spelled out change the key")
	}
	for _, o := range []Options{
		{Addresses: []string{"h:2"}},
		{Addresses: []string{"h:1"}, Password: "x"},
		{Addresses: []string{"h:1"}, DB: 1},
		{Addresses: []string{"h:1"}, Timeout: time.Second},
		{Addresses: []string{"h:1"}, KeyPrefix: "other:"},
		{Addresses: []string{"h:1"}, TLS: true},
	} {
		if o.Key() == base.Key() {
			t.Errorf("%s shares a key with %s", o.Redacted(), base.Redacted())
		}
	}
}
