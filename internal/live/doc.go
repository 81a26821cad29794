// Package live holds what lives across config reloads and is shared by the
// rate_limit handler (the root package), the listener wrapper (package
// listener) and the admin API (package admin): each zone definition's
// state, kept while a loaded config defines it; the names each config
// claims; the registry of the running config's zones, which the admin API
// and the metrics read, with what the root registers of each HTTP zone
// beyond zones.Zone (ZoneView: its store, overrides, events, dollar
// amounts), so that the admin API reads it without importing the root; the
// Redis stores and the Regions, pooled by setting and closed by the last
// handler to let go (stores.go); the snapshots of local rate zones to Caddy's
// storage (persist.go); each zone name's runtime overrides, parsed from the
// admin API's body, kept in Redis or Caddy's storage and followed across
// instances and reloads (overrides.go); the collectors registered into each
// config's metrics registry; and the one sampling rule of the lines a
// request or a connection logs.
//
// It stands above zones and distributed (it holds zones' states, zones and
// stores) and below the modules; it imports Caddy's core (its usage pool)
// and none of its apps.
package live
