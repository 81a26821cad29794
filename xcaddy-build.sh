#!/usr/bin/env bash
# Builds ./caddy with tally from this working tree, the way users build it:
#   xcaddy build --with github.com/caddy-tally/ratelimit
set -euo pipefail
cd "$(dirname "$0")"
CADDY_VERSION="${CADDY_VERSION:-v2.11.9}"
# xcaddy asks the module proxy for tally before it applies the local
# replacement. Where the proxy answers that lookup with an error other than
# "not found", fall through to "off", which Go treats as "not found" and so
# uses the working tree, as intended.
proxy="$(go env GOPROXY)"
case "$proxy" in
*off*) ;;
*) export GOPROXY="${proxy%,direct}|off" ;;
esac
go run github.com/caddyserver/xcaddy/cmd/xcaddy@v0.4.5 build "$CADDY_VERSION" \
	--output ./caddy \
	--with github.com/caddy-tally/ratelimit=.
