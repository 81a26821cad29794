package config

import (
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
)

// A timeout written in JSON is checked as the Caddyfile's is: a negative one
// is refused, not read as the default.
func TestStoreOptionsTimeout(t *testing.T) {
	for _, c := range []struct {
		timeout caddy.Duration
		want    time.Duration
		err     string
	}{
		{0, 0, ""},
		{caddy.Duration(20 * time.Millisecond), 20 * time.Millisecond, ""},
		{-1, 0, "distributed: timeout must be a positive duration"},
	} {
		dist := &Distributed{Redis: &Redis{Addresses: []string{"127.0.0.1:6379"}}, Timeout: c.timeout}
		opts, err := dist.StoreOptions(zap.NewNop())
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("timeout %v: err %v, want one saying %q", c.timeout, err, c.err)
			}
			continue
		}
		if err != nil || opts.Timeout != c.want {
			t.Errorf("timeout %v: got %v, %v; want %v", c.timeout, opts.Timeout, err, c.want)
		}
	}
}
