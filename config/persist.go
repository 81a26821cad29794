package config

import (
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// Persist snapshots the handler's local rate zones to Caddy's storage so
// that they resume after a restart: a key denied before it is denied after,
// with the same Retry-After. Snapshots are written when Caddy stops (`caddy
// stop`, SIGINT, SIGTERM), every interval, and when a zone's state is
// dropped; Caddy writes nothing on SIGKILL, on a second SIGINT or on
// SIGQUIT, so there the last periodic snapshot is what survives. The keys
// stored are personal data (IP addresses, API keys). Distributed zones keep
// their state in Redis and concurrency and quota zones are not snapshot.
type Persist struct {
	// How often each zone's snapshot is written while Caddy runs: what a
	// kill that leaves no time to clean up can lose. At least 1s. Default:
	// 30s.
	Interval caddy.Duration `json:"interval,omitempty"`

	// A snapshot older than this when Caddy starts is ignored. Default: 24h.
	MaxAge caddy.Duration `json:"max_age,omitempty"`
}

// Defaults and bounds of persist.
const (
	DefaultPersistInterval = 30 * time.Second
	DefaultPersistMaxAge   = 24 * time.Hour
	MinPersistInterval     = time.Second
)

// Validate refuses an interval below MinPersistInterval and a negative max_age.
func (p *Persist) Validate() error {
	if p.Interval != 0 && time.Duration(p.Interval) < MinPersistInterval {
		return fmt.Errorf("persist: interval must be at least %v, not %v", MinPersistInterval, time.Duration(p.Interval))
	}
	if p.MaxAge < 0 {
		return fmt.Errorf("persist: max_age must be positive, not %v", time.Duration(p.MaxAge))
	}
	return nil
}
