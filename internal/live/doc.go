// Package live holds what lives across config reloads and is shared by the
// rate_limit handler (the root package), the listener wrapper and the
// admin API: each zone definition's state; the names each config claims;
// the registry of the running zones with what the root registers of each
// (ZoneView), so that the admin API reads it without importing the root;
// the pooled Redis stores and Regions (stores.go); the snapshots of local
// rate zones (persist.go); each zone name's runtime overrides
// (overrides.go); the metric collectors; and the sampling rule of the
// lines a request or a connection logs.
//
// It stands above zones and distributed (it holds zones' states, zones and
// stores) and below the modules; it imports Caddy's core (its usage pool)
// and none of its apps.
package live
