package listener

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// TestMain gives the tests a Caddy data directory of their own (storage:
// local overrides, snapshots, the challenge secret; the instance id), so
// that they neither read nor write the one of a Caddy run on this machine.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "tally-test-data-")
	if err != nil {
		panic(err)
	}
	_ = os.Setenv("XDG_DATA_HOME", dir)
	caddy.DefaultStorage.Path = filepath.Join(dir, "caddy")
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}
