package live

import (
	"encoding/json"
	"maps"
	"slices"
)

// ZoneInJSON looks for the HTTP zone name in routes (a module's config not
// provisioned yet, as Caddy holds it: routes of the http app's servers),
// and returns its key template and whether it is a concurrency zone.
func ZoneInJSON(routes any, name string) (key string, concurrency, found bool) {
	var v any
	if raw, err := json.Marshal(routes); err == nil && json.Unmarshal(raw, &v) == nil {
		return findZoneJSON(v, name)
	}
	return "", false, false
}

// findZoneJSON walks a decoded JSON config for a rate_limit handler with the
// zone name, at any depth (subroutes, named routes, error routes).
func findZoneJSON(v any, name string) (key string, concurrency, found bool) {
	children, _ := v.([]any)
	if m, ok := v.(map[string]any); ok {
		if m["handler"] == "rate_limit" {
			if zs, ok := m["rate_limits"].(map[string]any); ok {
				if z, ok := zs[name].(map[string]any); ok {
					key, _ := z["key"].(string)
					n, _ := z["concurrency"].(float64)
					return key, n > 0, true
				}
			}
		}
		children = slices.Collect(maps.Values(m))
	}
	for _, c := range children {
		if key, concurrency, found = findZoneJSON(c, name); found {
			return
		}
	}
	return "", false, false
}
