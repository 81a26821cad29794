package admin

import (
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/caddy-tally/ratelimit/internal/adminapi"
	"github.com/caddy-tally/ratelimit/internal/live"
	"github.com/caddy-tally/ratelimit/zones"
)

// serveOverrides answers the override routes of zone z: id "" lists them.
func (a *AdminAPI) serveOverrides(w http.ResponseWriter, r *http.Request, z *zones.Zone, id string) error {
	h := live.View(z).Overrides
	if h == nil {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("zone %s takes no overrides (a connection zone)", z.Name)}
	}
	if id == "" {
		if r.Method != http.MethodGet {
			return methodNotAllowed(w, http.MethodGet)
		}
		list := h.List()
		info := adminapi.OverridesInfo{Zone: z.Name, View: "instance", Overrides: make([]adminapi.Override, 0, len(list))}
		for _, rec := range list {
			info.Overrides = append(info.Overrides, rec.Override)
		}
		if h.Fleet() {
			info.View = "fleet"
		}
		return adminapi.WriteJSON(w, http.StatusOK, info)
	}
	if err := live.CheckOverrideID(id); err != nil {
		return err
	}
	switch r.Method {
	case http.MethodGet:
		for _, rec := range h.List() {
			if rec.ID == id {
				return adminapi.WriteJSON(w, http.StatusOK, rec)
			}
		}
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("zone %s has no override %q", z.Name, id)}
	case http.MethodPut:
		rec, err := live.ParseOverride(z, id, r.RemoteAddr, r.Body, time.Now())
		if err != nil {
			return err
		}
		if err := h.Put(r.Context(), rec); err != nil {
			return err
		}
		overrideChanged(z, "set", rec)
		return adminapi.WriteJSON(w, http.StatusOK, rec)
	case http.MethodDelete:
		found, err := h.Remove(r.Context(), id)
		switch {
		case err != nil:
			return err
		case !found:
			return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("zone %s has no override %q", z.Name, id)}
		}
		overrideChanged(z, "removed", live.OverrideRecord{Override: adminapi.Override{ID: id, SetBy: r.RemoteAddr, SetAt: time.Now().UTC().Format(time.RFC3339)}})
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	return methodNotAllowed(w, http.MethodGet, http.MethodPut, http.MethodDelete)
}

const eventOverrideChanged = "rate_limit_override_changed"

// overrideChanged logs a change made through this instance and emits
// rate_limit_override_changed.
func overrideChanged(z *zones.Zone, change string, rec live.OverrideRecord) {
	fields := []zap.Field{zap.String("zone", z.Name), zap.String("id", rec.ID), zap.String("change", change), zap.String("by", rec.SetBy)}
	if rec.Expires != "" {
		fields = append(fields, zap.String("expires", rec.Expires))
	}
	if rec.Reason != "" {
		fields = append(fields, zap.String("reason", rec.Reason))
	}
	caddy.Log().Named("http.handlers.rate_limit").Info("rate limit override "+change, fields...)
	if emit := live.View(z).Emit; emit != nil {
		emit(eventOverrideChanged, map[string]any{"zone": z.Name, "id": rec.ID, "change": change, "by": rec.SetBy, "expires": rec.Expires, "reason": rec.Reason})
	}
}
