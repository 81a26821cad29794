// Command tally-caddy is Caddy with the standard modules and tally, built from
// the working tree (tests/go.mod replaces the module with ../..). The tests
// and benchmarks run this binary; xcaddy-build.sh builds the same thing for
// users.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/caddy-tally/ratelimit"
)

func main() {
	caddycmd.Main()
}
