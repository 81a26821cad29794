package tests

// DESIGN.md §1's import arrows, checked on what `go list` says the shipped
// module's packages depend on (transitively, test files left out): the pure
// core stays pure however the code moves.

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const modulePath = "github.com/caddy-tally/ratelimit"

// An arrowRule forbids the packages that from matches, but for those
// except matches, to depend on what forbid matches. Patterns are
// module-relative ("zones", "" for the root package, "internal/..." for a
// tree, "..." for every package but the root), or an import path prefix
// ending in "/..." outside the module.
type arrowRule struct {
	from   []string
	forbid []string
	why    string
	except []string
}

var importArrows = []arrowRule{
	{[]string{"algorithms"}, []string{"", "..."},
		"algorithms is pure maths: it imports nothing of the project", nil},
	{[]string{"algorithms", "zones", "distributed", "internal/..."}, []string{"github.com/caddyserver/..."},
		"zones, distributed, algorithms and internal/* import no Caddy", []string{"internal/live"}},
	{[]string{"internal/live"}, []string{"github.com/caddyserver/caddy/v2/modules/...", "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"},
		"internal/live holds what lives across reloads with Caddy's core (its usage pool), and none of Caddy's apps or its Caddyfile", nil},
	{[]string{"internal/live"}, []string{"", "listener"},
		"internal/live is below the handler (root) and the listener wrapper: they share state through it", nil},
	{[]string{"listener"}, []string{""},
		"the listener wrapper shares zones with the handler through internal/live and zones, never by importing the handler", nil},
	{[]string{"distributed"}, []string{"zones/..."},
		"distributed implements the capabilities zones declares, and may name them, but does not reach into zones' internals", nil},
	{[]string{"zones"}, []string{"distributed"},
		"the arrows point one way: zones declares the store capabilities, distributed implements them", nil},
	{[]string{"internal/..."}, []string{"", "zones", "distributed"},
		"internal/* is below zones and distributed: they import it, never the other way", []string{"internal/live"}},
	{[]string{"config"}, []string{"", "listener", "internal/live", "challenge"},
		"config is what a user writes, checked from the config alone: Caddy's core, its Caddyfile and caddyhttp (matchers), zones, algorithms, internal/usage, and distributed (a Redis address is shown redacted as the store shows it); never the handler, the listener wrapper (which imports config), what lives across reloads or the challenge, which a running handler provisions", nil},
	{[]string{"challenge"}, []string{"", "..."},
		"challenge is the proof of work alone: it imports nothing of the project (the root wires it into zones)", nil},
	{[]string{"..."}, []string{""},
		"nothing imports the root package", nil},
	{[]string{"internal/adminapi"}, []string{"", "...", "github.com/..."},
		"internal/adminapi is the admin API's wire alone: the standard library, nothing of the project, no Caddy", nil},
	{[]string{"command"}, []string{"", "zones", "distributed", "listener", "internal/live", "github.com/caddyserver/caddy/v2/modules/..."},
		"command is the CLI: it reads a running Caddy's admin API (internal/adminapi), never the handler, its zones and stores, or Caddy's apps", nil},
	{[]string{"admin"}, []string{"", "listener", "command", "github.com/caddyserver/caddy/v2/modules/...", "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"},
		"admin is the admin API module: it reads the running zones and their views through internal/live, over Caddy's core admin server, never the handler, the listener wrapper, the CLI or Caddy's apps", nil},
}

// listedPackage is what `go list -json` says of a package, the fields read here.
type listedPackage struct {
	ImportPath string
	Deps       []string
}

// matches reports whether pkg (an import path) matches a pattern of arrowRule.
func matches(pattern, pkg string) bool {
	if !strings.HasPrefix(pattern, "github.com/") {
		rel, ok := strings.CutPrefix(pkg, modulePath)
		if !ok || (rel != "" && rel[0] != '/') {
			return false
		}
		rel = strings.TrimPrefix(rel, "/")
		switch {
		case pattern == "...":
			return rel != ""
		case strings.HasSuffix(pattern, "/..."):
			return strings.HasPrefix(rel, strings.TrimSuffix(pattern, "..."))
		default:
			return rel == pattern
		}
	}
	return strings.HasPrefix(pkg, strings.TrimSuffix(pattern, "..."))
}

// arrowViolations lists every dependency of pkgs that a rule forbids, and
// every rule whose from matches no package (renamed away: it would guard
// nothing).
func arrowViolations(pkgs []listedPackage, rules []arrowRule) []string {
	var out []string
	for _, r := range rules {
		for _, from := range r.from {
			seen := false
			for _, p := range pkgs {
				if !matches(from, p.ImportPath) || slices.ContainsFunc(r.except, func(e string) bool { return matches(e, p.ImportPath) }) {
					continue
				}
				seen = true
				var bad []string
				for _, dep := range p.Deps {
					for _, forbid := range r.forbid {
						if matches(forbid, dep) {
							bad = append(bad, dep)
						}
					}
				}
				if len(bad) > 0 {
					// The shortest is most likely the one imported.
					first := slices.MinFunc(bad, func(a, b string) int { return cmp.Compare(len(a), len(b)) })
					more := ""
					if len(bad) > 1 {
						more = fmt.Sprintf(" (and %d more forbidden packages)", len(bad)-1)
					}
					out = append(out, p.ImportPath+" depends on "+first+more+": "+r.why)
				}
			}
			if !seen {
				out = append(out, "no package matches "+from+" (renamed?): update importArrows and DESIGN.md §1 ("+r.why+")")
			}
		}
	}
	return out
}

func TestImportArrows(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("go", "list", "-json=ImportPath,Deps", "./...")
	cmd.Dir = ".."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list ./... in the shipped module: %v\n%s", err, stderr.String())
	}
	var pkgs []listedPackage
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		var p listedPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 5 {
		t.Fatalf("go list found %d packages in the shipped module: %+v", len(pkgs), pkgs)
	}
	for _, v := range arrowViolations(pkgs, importArrows) {
		t.Error(v)
	}
}

// Each rule catches the dependency it forbids, and only that.
func TestImportArrowsCatchEachBreach(t *testing.T) {
	t.Parallel()
	m := func(rel string) string {
		if rel == "" {
			return modulePath
		}
		return modulePath + "/" + rel
	}
	const caddy = "github.com/caddyserver/caddy/v2"
	good := []listedPackage{
		{m(""), []string{m("zones"), m("distributed"), m("algorithms"), m("internal/topk"), caddy}},
		{m("zones"), []string{m("algorithms"), m("internal/keytable"), "strings"}},
		{m("distributed"), []string{m("zones"), m("algorithms"), m("internal/monotime"), "github.com/redis/go-redis/v9"}},
		{m("algorithms"), []string{"math"}},
		{m("internal/keytable"), []string{m("internal/monotime")}},
		{m("internal/monotime"), []string{"time"}},
		{m("internal/live"), []string{m("zones"), m("distributed"), m("algorithms"), m("internal/monotime"), m("internal/adminapi"), caddy}},
		{m("listener"), []string{m("config"), m("internal/live"), m("zones"), caddy, caddy + "/modules/caddyhttp"}},
		{m("config"), []string{m("zones"), m("algorithms"), m("distributed"), m("internal/usage"), caddy, caddy + "/caddyconfig/caddyfile", caddy + "/modules/caddyhttp"}},
		{m("challenge"), []string{"crypto/sha256"}},
		{m("internal/adminapi"), []string{"encoding/base64", "time"}},
		{m("command"), []string{m("internal/adminapi"), m("internal/topk"), m("internal/usage"), caddy, caddy + "/cmd", "github.com/spf13/cobra"}},
		{m("admin"), []string{m("internal/live"), m("internal/adminapi"), m("internal/monotime"), m("zones"), m("distributed"), caddy, "go.uber.org/zap"}},
	}
	if v := arrowViolations(good, importArrows); len(v) != 0 {
		t.Fatalf("the layout DESIGN.md draws breaks the rules: %v", v)
	}
	for _, c := range []struct{ pkg, dep, rule string }{
		{"algorithms", m("internal/monotime"), "imports nothing of the project"},
		{"algorithms", m(""), "imports nothing of the project"},
		{"zones", caddy + "/modules/caddyhttp", "import no Caddy"},
		{"distributed", caddy, "import no Caddy"},
		{"internal/keytable", caddy, "import no Caddy"},
		{"distributed", m("zones/internal/table"), "zones' internals"},
		{"zones", m("distributed"), "point one way"},
		{"internal/monotime", m("zones"), "internal/* is below"},
		{"distributed", m(""), "nothing imports the root"},
		{"internal/keytable", m("zones"), "internal/* is below"},
		{"internal/live", caddy + "/modules/caddyhttp", "none of Caddy's apps"},
		{"internal/live", caddy + "/caddyconfig/caddyfile", "none of Caddy's apps"},
		{"internal/live", m(""), "below the handler (root) and the listener"},
		{"internal/live", m("listener"), "below the handler (root) and the listener"},
		{"listener", m(""), "never by importing the handler"},
		{"challenge", m("zones"), "the proof of work alone"},
		{"internal/adminapi", m("internal/topk"), "the admin API's wire alone"},
		{"internal/adminapi", "github.com/spf13/cobra", "the admin API's wire alone"},
		{"command", m("zones"), "command is the CLI"},
		{"command", m("internal/live"), "command is the CLI"},
		{"command", caddy + "/modules/caddyhttp", "command is the CLI"},
		{"config", m("internal/live"), "config is what a user writes"},
		{"config", m("listener"), "config is what a user writes"},
		{"config", m(""), "config is what a user writes"},
		{"admin", m(""), "admin is the admin API module"},
		{"admin", m("listener"), "admin is the admin API module"},
		{"admin", m("command"), "admin is the admin API module"},
		{"admin", caddy + "/modules/caddyhttp", "admin is the admin API module"},
	} {
		pkgs := make([]listedPackage, len(good))
		for i, p := range good {
			pkgs[i] = listedPackage{p.ImportPath, append([]string(nil), p.Deps...)}
			if p.ImportPath == m(c.pkg) {
				pkgs[i].Deps = append(pkgs[i].Deps, c.dep)
			}
		}
		v := arrowViolations(pkgs, importArrows)
		if len(v) == 0 || !strings.Contains(strings.Join(v, "\n"), c.rule) {
			t.Errorf("%s depending on %s: violations %q, want one saying %q", c.pkg, c.dep, v, c.rule)
		}
	}
}
