// Package command is `caddy rate-limit`: the CLI that inspects and resets
// the rate limits of a running Caddy through its admin API, printing for
// people unless asked for JSON. It knows the handler only through
// internal/adminapi's types; the root imports it to register the command.
package command

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/caddy-tally/ratelimit/internal/adminapi"
	"github.com/caddy-tally/ratelimit/internal/topk"
	"github.com/caddy-tally/ratelimit/internal/usage"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "rate-limit",
		Usage: "zones|key|top|bans|reset|override [--address <admin>] [--json]",
		Short: "Inspects and resets rate limits in a running Caddy",
		Long: `
Talks to the admin API of a running Caddy (tally's /rate_limit/ routes):

  caddy rate-limit zones                   every zone (connection zones too): limits, mode, keys, Redis health
  caddy rate-limit key <zone> <key>        a key's remaining quota and retry time
  caddy rate-limit top <zone> [-n 20]      the keys this instance denied most lately
  caddy rate-limit bans <zone>             the zone's current bans (fleet-wide when distributed)
  caddy rate-limit reset <zone> <key>      give a key its full limit back
  caddy rate-limit override set <zone> <id> --key|--prefix|--cidr <match> (--events N --window W | --limit N | --n N | --exempt | --deny) [--expires 2h] [--reason …]
  caddy rate-limit override list <zone>    the zone's overrides, who set them and when
  caddy rate-limit override rm <zone> <id> remove one

The admin address is --address, else the one in --config, else Caddy's default
(localhost:2019). top and reset take --address once per instance: top then
merges the instances' lists into the fleet's, reset resets the key on each
(what local mode needs). Output is for people; --json prints JSON.
Keys are personal data: the admin API is the only place they are shown.

Keys are printed in Go's double quotes, with anything a terminal would act
on (control and bidi characters, invalid UTF-8) escaped. A key that is not
valid UTF-8 is also shown as (--base64 <its bytes in base64>): give key and
reset --base64 and that value to name it.
`,
		CobraFunc: func(cmd *cobra.Command) {
			cmd.PersistentFlags().StringArray("address", nil, "The address of Caddy's admin API (default: from --config, else "+caddy.DefaultAdminListen+"); top and reset take several")
			cmd.PersistentFlags().StringP("config", "c", "", "Configuration file to read the admin address from")
			cmd.PersistentFlags().StringP("adapter", "a", "", "Name of config adapter to apply (when --config is used)")
			cmd.PersistentFlags().Bool("json", false, "Print JSON instead of text")

			zones := subcommand("zones", "Lists the zones of the running config", "", 0, cliZones)
			zones.Args = cobra.NoArgs
			top := subcommand("top <zone>", "Shows the keys this instance denied most in the last 5 to 10 minutes", "caddy rate-limit top api_key -n 5", 1, cliTop)
			top.Flags().IntP("n", "n", adminapi.DefaultTopN, "How many keys to show")
			cmd.AddCommand(zones, keyCommand("key", "Shows a key's remaining quota and when it may send again", cliKey), top,
				subcommand("bans <zone>", "Lists a zone's current bans, longest left first (fleet-wide when distributed)", "caddy rate-limit bans failed_logins", 1,
					func(c *cli, args []string) error { return cliBans(c, args[0]) }),
				keyCommand("reset", "Gives a key its full limit back (in Redis too when distributed)", cliReset),
				overrideCommand())
		},
	})
}

func subcommand(use, short, example string, nargs int, run func(c *cli, args []string) error) *cobra.Command {
	return &cobra.Command{Use: use, Short: short, Example: example, Args: cobra.ExactArgs(nargs),
		RunE: func(cmd *cobra.Command, args []string) error { return run(newCLI(cmd), args) }}
}

// keyCommand is subcommand name (key, reset) of a zone and a key (with
// --base64, the key's bytes in base64).
func keyCommand(name, short string, run func(c *cli, zone, key string) error) *cobra.Command {
	example := "caddy rate-limit " + name + " api_key alice\ncaddy rate-limit " + name + " api_key --base64 //4="
	cmd := subcommand(name+" <zone> <key>", short, example, 2, func(c *cli, args []string) error {
		key := args[1]
		if b64, _ := c.cmd.Flags().GetBool("base64"); b64 {
			b, err := base64.StdEncoding.DecodeString(key)
			if err != nil {
				return fmt.Errorf("--base64 %s: not standard base64 (as top shows it, e.g. //4=): %v", printable(key), err)
			}
			key = string(b)
		}
		return run(c, args[0], key)
	})
	cmd.Flags().Bool("base64", false, "<key> is the key's bytes in standard base64, as top shows a key that is not UTF-8")
	return cmd
}

// cli is one run of a rate-limit subcommand.
type cli struct {
	cmd       *cobra.Command
	addresses []string // as given; none = from --config or the default
	address   string   // the one the single-instance subcommands use
	json      bool
	out       io.Writer
	err       error // the first failed write: printf writes nothing after it
}

func newCLI(cmd *cobra.Command) *cli {
	c := &cli{cmd: cmd, out: cmd.OutOrStdout()}
	addresses, _ := cmd.Flags().GetStringArray("address")
	for _, a := range addresses { // once each: top would count an instance's denials twice
		if !slices.Contains(c.addresses, a) {
			c.addresses = append(c.addresses, a)
		}
	}
	if len(c.addresses) > 0 {
		c.address = c.addresses[0]
	}
	c.json, _ = cmd.Flags().GetBool("json")
	return c
}

// quoteKey is a key in Go's double quotes, every character a terminal would
// act on escaped (controls, bidi and format characters, invalid bytes), so
// that a hostile key cannot move the cursor, reorder the line or start a
// row; a key that is not UTF-8 also gets its base64, for --base64.
func quoteKey(key string) string {
	q := strconv.Quote(key)
	if !utf8.ValidString(key) {
		q += " (--base64 " + base64.StdEncoding.EncodeToString([]byte(key)) + ")"
	}
	return q
}

// printable is s (a zone name, an error) escaped as quoteKey escapes a key,
// but unquoted.
func printable(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case unicode.IsPrint(r):
			b.WriteString(s[i : i+n])
		default:
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		}
		i += n
	}
	return b.String()
}

// at is c for the one instance at addr.
func (c *cli) at(addr string) *cli {
	one := *c
	one.address, one.addresses = addr, []string{addr}
	return &one
}

// errNotFound is an admin API 404, with the API's message.
type errNotFound struct{ msg string }

func (e errNotFound) Error() string { return e.msg }

// apiErrorLine picks the status and body out of AdminAPIRequest's error.
var apiErrorLine = regexp.MustCompile(`(?s)caddy responded with error: HTTP (\d+): (.*)$`)

// send sends method path to the admin API with a JSON body (nil: none); a
// change goes to one --address (reset sends to each through at).
func (c *cli) send(method, path string, body []byte) ([]byte, error) {
	if method != http.MethodGet && len(c.addresses) > 1 {
		return nil, fmt.Errorf("%s changes one instance: give --address once (reset takes several)", c.cmd.CommandPath())
	}
	config, _ := c.cmd.Flags().GetString("config")
	adapter, _ := c.cmd.Flags().GetString("adapter")
	addr, err := caddycmd.DetermineAdminAPIAddress(c.address, nil, config, adapter)
	if err != nil {
		return nil, fmt.Errorf("finding the admin address: %v", err)
	}
	var headers http.Header
	var reader io.Reader
	if body != nil {
		headers, reader = http.Header{"Content-Type": {"application/json"}}, bytes.NewReader(body)
	}
	resp, err := caddycmd.AdminAPIRequest(addr, method, path, headers, reader)
	if err != nil {
		m := apiErrorLine.FindStringSubmatch(strings.TrimSpace(err.Error()))
		if m == nil {
			return nil, fmt.Errorf("cannot reach Caddy's admin API at %s (is Caddy running? is --address right?): %s", addr, printable(err.Error()))
		}
		msg := m[2]
		var apiErr struct {
			Error string `json:"error"`
		}
		if json.Unmarshal([]byte(msg), &apiErr) == nil && apiErr.Error != "" {
			msg = apiErr.Error
		}
		switch msg = printable(msg); {
		case m[1] == "404" && strings.HasPrefix(msg, "unknown path"):
			return nil, fmt.Errorf("the Caddy at %s does not have tally's admin routes (%s)", addr, msg)
		case m[1] == "404":
			// An unknown zone's error names the zones there are, as findZone's.
			if quoted, ok := strings.CutPrefix(msg, "unknown zone "); ok {
				if name, err := strconv.Unquote(quoted); err == nil {
					if _, err := c.findZone(name); err != nil {
						msg = err.Error()
					}
				}
			}
			return nil, errNotFound{msg}
		}
		return nil, fmt.Errorf("%s %s: HTTP %s: %s", method, path, m[1], msg)
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("reading the admin API's answer: %v", err)
	}
	return answer, nil
}

// get GETs path from the one --address and decodes it into v; with --json
// it prints the body (indented) instead and leaves v alone.
func (c *cli) get(path string, v any) (printed bool, err error) {
	if len(c.addresses) > 1 {
		return false, fmt.Errorf("%s reads one instance: give --address once (top and reset take several)", c.cmd.Name())
	}
	if !c.json {
		return false, c.fetch(path, v)
	}
	body, err := c.send(http.MethodGet, path, nil)
	if err != nil {
		return false, err
	}
	return true, c.printJSON(body)
}

// fetch GETs path and decodes it into v, whatever --json says.
func (c *cli) fetch(path string, v any) error {
	body, err := c.send(http.MethodGet, path, nil)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("reading the admin API's answer: %v", err)
	}
	return nil
}

// printJSON prints body indented, with the bidi and format characters a
// terminal would act on (JSON escapes only controls) as \u escapes, which
// JSON reads back as the same string.
func (c *cli) printJSON(body []byte) error {
	var b bytes.Buffer
	if err := json.Indent(&b, bytes.TrimSpace(body), "", "  "); err != nil {
		return fmt.Errorf("reading the admin API's answer: %v", err)
	}
	b.WriteByte('\n')
	var e bytes.Buffer
	for out := b.Bytes(); len(out) > 0; {
		r, n := utf8.DecodeRune(out)
		switch {
		case r < utf8.RuneSelf || unicode.IsPrint(r):
			e.Write(out[:n])
		case r == utf8.RuneError && n == 1: // Go's encoder never writes it
			fmt.Fprintf(&e, `\u%04x`, utf8.RuneError)
		case r > 0xFFFF:
			hi, lo := utf16.EncodeRune(r)
			fmt.Fprintf(&e, `\u%04x\u%04x`, hi, lo)
		default:
			fmt.Fprintf(&e, `\u%04x`, r)
		}
		out = out[n:]
	}
	_, err := c.out.Write(e.Bytes())
	return err
}

func zonePath(zone string) string { return "/rate_limit/zones/" + url.PathEscape(zone) }

// keyPath names the key in the query, which holds any key ("", ".", bytes).
func keyPath(zone, key string) string { return zonePath(zone) + "/keys?key=" + url.QueryEscape(key) }

func cliZones(c *cli, _ []string) error {
	var zs []adminapi.ZoneInfo
	if printed, err := c.get("/rate_limit/zones", &zs); printed || err != nil {
		return err
	}
	if len(zs) == 0 {
		return c.printf("no rate_limit zones in the running config\n")
	}
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ZONE\tLIMIT\tBURST\tMODE\tFAIL POLICY\tKEYS\tREDIS")
	for _, z := range zs {
		limit, burst := strconv.FormatInt(z.Events, 10)+"/"+adminapi.ShortDuration(z.Window), strconv.FormatInt(z.Burst, 10)
		switch {
		case z.Concurrency > 0 && z.Layer == "connection":
			limit, burst = strconv.FormatInt(z.Concurrency, 10)+" connections open", "-"
		case z.Concurrency > 0:
			limit, burst = strconv.FormatInt(z.Concurrency, 10)+" in flight", "-"
		case z.Layer == "connection":
			limit += " connections"
		}
		if q := z.Quota; q != nil {
			limit, burst = strconv.FormatInt(q.Limit, 10)+"/"+q.Per, "-"
			if q.TimeZone != "UTC" {
				limit += " " + q.TimeZone
			}
		}
		if z.Delay != "" {
			limit += " delay " + printable(z.Delay)
			if z.Waiting != nil && *z.Waiting > 0 {
				limit += fmt.Sprintf(" (%d waiting)", *z.Waiting)
			}
		}
		if z.DryRun {
			limit += " (dry run)"
		}
		redis := "-"
		if s := z.Store; s != nil {
			redis = fmt.Sprintf("ok, %d instance(s)", s.Instances)
			if !s.OK {
				redis = "UNREACHABLE"
				if s.Failing {
					redis = "FAILING" // calls fail; the breaker is not open yet
				}
				if s.BreakerOpenSince != nil {
					redis += " since " + s.BreakerOpenSince.Local().Format(time.TimeOnly)
				}
			}
		}
		mode := printable(z.Mode)
		if z.Scope == "global" {
			mode += " (global, region " + printable(z.Region) + ")"
		}
		policy := printable(z.FailPolicy)
		if z.Layer == "connection" || policy == "" {
			policy = "-" // local to the instance: no Redis to fail
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", printable(z.Name), limit, burst, mode, policy, z.LocalKeys, redis)
	}
	return tw.Flush()
}

// seconds renders an admin API duration in seconds for people.
func seconds(s float64) string {
	d := time.Duration(s * float64(time.Second))
	if d < 10*time.Second {
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

func cliKey(c *cli, zone, key string) error {
	var k adminapi.KeyInfo
	printed, err := c.get(keyPath(zone, key), &k)
	who := "zone " + printable(zone) + ", key " + quoteKey(key)
	if errors.As(err, new(errNotFound)) {
		// An unknown zone, or a key with no state: the full limit.
		z, err := c.findZone(zone)
		k = adminapi.KeyInfo{Zone: zone, KeyName: adminapi.NewKeyName(key), State: adminapi.State{Remaining: z.Burst}}
		if z.Concurrency > 0 {
			k.Concurrency, k.Remaining = z.Concurrency, z.Concurrency
		}
		switch {
		case err != nil:
			return err
		case c.json:
			return c.printJSONValue(k)
		case z.Concurrency > 0:
			return c.printf("%s: not limited, 0 of %d slots in use\n", who, z.Concurrency)
		}
		return c.printf("%s: not tracked (no state: its next request has the full limit, %d)\n", who, z.Burst)
	}
	if printed || err != nil {
		return err
	}
	stored, state := "", "not limited"
	if k.StoredAs != "" {
		stored = " (stored as " + quoteKey(k.StoredAs) + ")"
	}
	if o := k.Override; o != nil {
		stored += " under override " + printable(o.ID) + " (" + overrideLimitText(*o) + ")"
	}
	if k.Remaining == 0 {
		state = "LIMITED"
	}
	switch {
	case k.Used != nil:
		return c.printf("%s: %s, %s of %s used, %s remaining until %s (in %s)\n",
			who, state, amount(k.USDFields, *k.Used), amount(k.USDFields, k.Quota), amount(k.USDFields, k.Remaining), k.PeriodEnd, seconds(k.ResetAfter))
	case k.InUse != nil:
		return c.printf("%s: %s, %d of %d slots in use\n", who, state, *k.InUse, k.Concurrency)
	case k.BannedFor > 0:
		return c.printf("%s: BANNED for %s (level %d), 0 remaining\n", who, seconds(k.BannedFor), k.BanLevel)
	case k.RetryAfter > 0:
		c.printf("%s%s: LIMITED, 0 remaining, may send again in %s, full again in %s\n", who, stored, seconds(k.RetryAfter), seconds(k.ResetAfter))
	case k.ResetAfter <= 0 && k.Remaining >= k.Burst:
		c.printf("%s%s: at its full limit, %s remaining\n", who, stored, amount(k.USDFields, k.Remaining))
	default:
		c.printf("%s%s: not limited, %s remaining, full again in %s\n", who, stored, amount(k.USDFields, k.Remaining), seconds(k.ResetAfter))
	}
	if c.err != nil || k.Source != "instance" {
		return c.err
	}
	switch { // an async zone's fleet view, under this instance's lease
	case k.FleetError != "":
		return c.printf("  (this instance's lease; fleet-wide: unknown, %s)\n", k.FleetError)
	case k.Fleet != nil && k.Fleet.RetryAfter > 0:
		return c.printf("  (this instance's lease; fleet-wide in Redis, every instance's lease counted as spent: 0 remaining, more in %s)\n", seconds(k.Fleet.RetryAfter))
	case k.Fleet != nil:
		return c.printf("  (this instance's lease; fleet-wide in Redis, every instance's lease counted as spent: %d remaining)\n", k.Fleet.Remaining)
	}
	return nil
}

// printf prints for people, and returns c.err.
func (c *cli) printf(format string, args ...any) error {
	if c.err == nil {
		_, c.err = fmt.Fprintf(c.out, format, args...)
	}
	return c.err
}

// findZone returns zone name, or an error listing the zones there are.
func (c *cli) findZone(name string) (adminapi.ZoneInfo, error) {
	var zs []adminapi.ZoneInfo
	if err := c.fetch("/rate_limit/zones", &zs); err != nil {
		return adminapi.ZoneInfo{}, err
	}
	names := make([]string, 0, len(zs))
	for _, z := range zs {
		if z.Name == name {
			return z, nil
		}
		names = append(names, z.Name)
	}
	has := "no rate_limit zones"
	if len(names) > 0 {
		has = "zones " + strings.Join(names, ", ")
	}
	return adminapi.ZoneInfo{}, fmt.Errorf("unknown zone %s: the running config has %s", strconv.Quote(name), printable(has))
}

// printJSONValue prints v as the admin API writes JSON: not HTML-escaped.
func (c *cli) printJSONValue(v any) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return err
	}
	return c.printJSON(b.Bytes())
}

func cliTop(c *cli, args []string) error {
	zone := args[0]
	n, _ := c.cmd.Flags().GetInt("n")
	if n < 1 {
		return fmt.Errorf("-n %d: want a positive number of keys", n)
	}
	top, err := c.top(zone, n)
	switch {
	case err != nil:
		return err
	case c.json: // one instance's list encodes as the admin API wrote it
		return c.printJSONValue(top)
	}
	where := "on this instance"
	if len(top.Addresses) > 1 {
		where = fmt.Sprintf("on %d instances", len(top.Addresses))
	}
	what, column := "denials", "DENIALS"
	if top.DryRun { // nothing was denied: these are the zone's would-be denials
		what, column = "would-be denials (dry run)", "WOULD DENY"
	}
	fmt.Fprintf(c.out, "zone %s: %d %s %s since %s\n", printable(top.Zone), top.Denials, what, where, top.Since.Local().Format(time.TimeOnly))
	if len(top.Keys) == 0 {
		return c.printf("no key was denied\n")
	}
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\t"+column+"\tSTATE")
	for _, k := range top.Keys {
		denials := strconv.FormatUint(k.Denials, 10)
		if k.Error > 0 {
			denials += " (±" + strconv.FormatUint(k.Error, 10) + ")"
		}
		state := fmt.Sprintf("ok, %d remaining", k.Remaining)
		switch {
		case k.Limited && k.RetryAfter > 0:
			state = "LIMITED for " + seconds(k.RetryAfter)
		case k.Limited: // a concurrency zone: until a request ends
			state = "LIMITED"
		case k.StateError != "":
			state = "unknown: " + printable(k.StateError)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", quoteKey(k.Raw()), denials, state)
	}
	return tw.Flush()
}

// top is the zone's top n keys: the one instance's list, or every
// --address's list added up, keeping the error bounds (topk.Merge), each
// asked for more keys than shown to tighten them. A key's state is the
// strictest any instance reports.
func (c *cli) top(zone string, n int) (adminapi.TopInfo, error) {
	if len(c.addresses) <= 1 {
		return c.instanceTop(zone, n)
	}
	var (
		sums  []topk.Summary
		state = map[string]adminapi.OffenderInfo{}
		out   = adminapi.TopInfo{Zone: zone, View: "merged", Addresses: c.addresses}
	)
	for _, addr := range c.addresses {
		t, err := c.at(addr).instanceTop(zone, max(2*n, 40))
		if err != nil {
			return out, fmt.Errorf("%s: %w", addr, err)
		}
		sum := topk.Summary{Since: t.Since.UnixNano(), Total: t.Denials, Floor: t.Floor}
		for _, k := range t.Keys {
			key := k.Raw() // keys that are not UTF-8 are told apart by their bytes
			sum.Top = append(sum.Top, topk.Entry{Key: key, Count: k.Denials, Error: k.Error})
			if s, seen := state[key]; !seen || k.StateError == "" && (s.StateError != "" || k.Limited && (!s.Limited || k.RetryAfter > s.RetryAfter)) {
				state[key] = k
			}
		}
		sums = append(sums, sum)
		out.Capacity, out.DryRun = t.Capacity, out.DryRun || t.DryRun
	}
	fleet := topk.Merge(n, sums...)
	out.Since, out.Denials, out.Floor = time.Unix(0, fleet.Since), fleet.Total, fleet.Floor
	out.Keys = make([]adminapi.OffenderInfo, 0, len(fleet.Top))
	for _, e := range fleet.Top {
		k := state[e.Key]
		k.Denials, k.Error = e.Count, e.Error
		out.Keys = append(out.Keys, k)
	}
	return out, nil
}

// instanceTop is the zone's top n keys on c's one instance. A 404 is an
// unknown zone: the error names the zones there are, unless the zone is
// there when they are asked for (a reload registered it meanwhile); then
// top is asked again, so that its answer, not an empty list, is printed.
func (c *cli) instanceTop(zone string, n int) (adminapi.TopInfo, error) {
	var t adminapi.TopInfo
	path := zonePath(zone) + "/top?n=" + strconv.Itoa(n)
	err := c.fetch(path, &t)
	if errors.As(err, new(errNotFound)) {
		if _, err = c.findZone(zone); err == nil {
			err = c.fetch(path, &t)
		}
	}
	return t, err
}

func cliBans(c *cli, zone string) error {
	var b adminapi.BansInfo
	printed, err := c.get(zonePath(zone)+"/bans", &b)
	if printed || err != nil {
		return err
	}
	c.printf("zone %s: %d banned %s\n", printable(zone), len(b.Bans), where(b.View))
	for _, ban := range b.Bans {
		level := ""
		if ban.BanLevel > 0 {
			level = fmt.Sprintf(" (level %d)", ban.BanLevel)
		}
		c.printf("  %s  banned for %s%s\n", quoteKey(ban.Key), seconds(ban.BannedFor), level)
	}
	return c.err
}

// where says whose state an admin API view holds.
func where(view string) string {
	if view == "fleet" {
		return "fleet-wide"
	}
	return "on this instance"
}

// resetOutcome is what one instance answered to a reset.
type resetOutcome struct {
	Address string `json:"address"`
	Outcome string `json:"outcome"` // "reset", "not tracked" or "failed"
	Error   string `json:"error,omitempty"`
}

// cliReset resets the key on each --address. With several, it prints each
// one's outcome and fails when one failed or none tracked the key (one
// that does not gives it its full limit already: most, in local mode).
func cliReset(c *cli, zone, key string) error {
	var outcomes []resetOutcome
	var failed []string
	reset, many := 0, len(c.addresses) > 1
	if !many {
		if err := resetOn(c, zone, key); err != nil {
			return err
		}
		reset = 1
	} else {
		for _, addr := range c.addresses {
			o := resetOutcome{Address: addr, Outcome: "reset"}
			switch err := resetOn(c.at(addr), zone, key); {
			case errors.As(err, new(errNotTracked)):
				o.Outcome = "not tracked"
			case err != nil:
				o.Outcome, o.Error = "failed", err.Error()
				failed = append(failed, addr)
			default:
				reset++
			}
			outcomes = append(outcomes, o)
		}
	}
	switch {
	case c.json:
		err := c.printJSONValue(struct {
			Zone string `json:"zone"`
			adminapi.KeyName
			Reset     bool           `json:"reset"`
			Instances int            `json:"instances"`
			Addresses []resetOutcome `json:"addresses,omitempty"`
		}{zone, adminapi.NewKeyName(key), reset > 0, reset, outcomes})
		if err != nil {
			return err
		}
	case !many:
		return c.printf("zone %s, key %s: reset to its full limit\n", printable(zone), quoteKey(key))
	default:
		on := fmt.Sprintf("%d instances", reset)
		if reset < len(c.addresses) {
			on = fmt.Sprintf("%d of %d instances", reset, len(c.addresses))
		}
		fmt.Fprintf(c.out, "zone %s, key %s: reset to its full limit on %s\n", printable(zone), quoteKey(key), on)
		for _, o := range outcomes {
			if o.Error != "" {
				o.Outcome = "FAILED: " + printable(o.Error)
			}
			c.printf("  %s: %s\n", printable(o.Address), o.Outcome)
		}
	}
	switch {
	case c.err != nil:
		return c.err
	case len(failed) > 0:
		return fmt.Errorf("the reset failed on %d of %d instances (%s): run it again for them", len(failed), len(c.addresses), printable(strings.Join(failed, ", ")))
	case reset == 0:
		return fmt.Errorf("zone %s: key not tracked on any of the %d instances, nothing to reset", printable(zone), len(c.addresses))
	}
	return nil
}

// resetOn resets the key on c's one instance (errNotTracked: it has none).
func resetOn(c *cli, zone, key string) error {
	_, err := c.send(http.MethodDelete, keyPath(zone, key), nil)
	var nf errNotFound
	if errors.As(err, &nf) {
		if _, zerr := c.findZone(zone); zerr != nil {
			return zerr
		}
		return errNotTracked{nf}
	}
	return err
}

// errNotTracked is the 404 of a key the zone has no state for.
type errNotTracked struct{ errNotFound }

// amount is n as the CLI writes it: in dollars ("$0.009870") in a usd zone.
func amount(f adminapi.USDFields, n int64) string {
	if f.Unit == "" {
		return strconv.FormatInt(n, 10)
	}
	return "$" + usage.FormatUSD(n)
}

// overrideCommand is `caddy rate-limit override set|list|rm`: the admin
// API's overrides, for people.
func overrideCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "override set|list|rm",
		Short: "Sets, lists and removes runtime overrides of a zone's limit",
	}
	set := subcommand("set <zone> <id>", "Sets (or replaces) override <id> of a zone: a limit, exempt or deny for a key, a prefix or a CIDR",
		"caddy rate-limit override set api_key acme --prefix acme- --events 500 --window 1m --expires 720h --reason \"paid plan\"\n"+
			"caddy rate-limit override set login_ip lab --cidr 10.1.0.0/16 --exempt\n"+
			"caddy rate-limit override set api_key abuser --key sk-live-4f9a --deny --expires 2h",
		2, func(c *cli, args []string) error { return cliOverrideSet(c, args[0], args[1]) })
	f := set.Flags()
	f.String("key", "", "The key the override covers (as requests carry it)")
	f.String("prefix", "", "Every key that starts with this")
	f.String("cidr", "", "Every IP-shaped key in this CIDR")
	f.Int64("events", 0, "A rate zone's events per --window")
	f.String("window", "", "A rate zone's window, e.g. 1m")
	f.Int64("burst", 0, "A rate zone's burst (default: --events)")
	f.Int64("limit", 0, "A quota zone's limit per period")
	f.Int64("n", 0, "A concurrency zone's requests in flight")
	f.Bool("exempt", false, "Never limited by this zone")
	f.Bool("deny", false, "Always denied by this zone (Retry-After: until the override expires)")
	f.String("expires", "", "When the override lapses: a duration (2h) or an RFC 3339 time; default never")
	f.String("reason", "", "Why, for the list")
	cmd.AddCommand(set,
		subcommand("list <zone>", "Lists a zone's overrides, who set them and when", "caddy rate-limit override list api_key", 1,
			func(c *cli, args []string) error { return cliOverrideList(c, args[0]) }),
		subcommand("rm <zone> <id>", "Removes a zone's override <id>: its keys are back under the zone's limit (their state carried)", "caddy rate-limit override rm api_key acme", 2,
			func(c *cli, args []string) error {
				if _, err := c.send(http.MethodDelete, overridePath(args[0], args[1]), nil); err != nil {
					return err
				}
				if c.json {
					return c.printJSONValue(map[string]string{"zone": args[0], "id": args[1], "outcome": "removed"})
				}
				return c.printf("zone %s: override %s removed\n", printable(args[0]), printable(args[1]))
			}))
	return cmd
}

func overridePath(zone, id string) string {
	return zonePath(zone) + "/overrides/" + url.PathEscape(id)
}

// cliOverrideSet PUTs the override the flags describe.
func cliOverrideSet(c *cli, zone, id string) error {
	f := c.cmd.Flags()
	match := map[string]string{}
	for _, name := range []string{"key", "prefix", "cidr"} {
		if f.Changed(name) {
			match[name] = f.Lookup(name).Value.String()
		}
	}
	if len(match) != 1 {
		return errors.New("give one of --key, --prefix and --cidr")
	}
	body := map[string]any{"match": match}
	for _, name := range []string{"events", "burst", "limit", "n", "window", "expires", "reason", "exempt", "deny"} {
		switch fl := f.Lookup(name); {
		case !fl.Changed:
		case fl.Value.Type() == "int64":
			body[name], _ = f.GetInt64(name)
		case fl.Value.Type() != "bool":
			body[name] = fl.Value.String()
		case fl.Value.String() == "true":
			body[name] = true
		}
	}
	data, _ := json.Marshal(body) // strings, int64s and bools only: it cannot fail
	answer, err := c.send(http.MethodPut, overridePath(zone, id), data)
	if err != nil {
		return err
	}
	if c.json {
		return c.printJSON(answer)
	}
	var rec adminapi.Override
	if err := json.Unmarshal(answer, &rec); err != nil {
		return fmt.Errorf("reading the admin API's answer: %v", err)
	}
	return c.printf("zone %s: override %s set: %s %s, expires %s\n", printable(zone), printable(rec.ID), overrideMatchText(rec.Match), overrideLimitText(rec), orNever(rec.Expires))
}

func cliOverrideList(c *cli, zone string) error {
	var l adminapi.OverridesInfo
	printed, err := c.get(zonePath(zone)+"/overrides", &l)
	if printed || err != nil {
		return err
	}
	if err := c.printf("zone %s: %d override(s) %s\n", printable(zone), len(l.Overrides), where(l.View)); err != nil || len(l.Overrides) == 0 {
		return err
	}
	tw := tabwriter.NewWriter(c.out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tMATCH\tLIMIT\tEXPIRES\tSET BY\tSET AT\tREASON")
	for _, r := range l.Overrides {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", printable(r.ID), overrideMatchText(r.Match), overrideLimitText(r), orNever(r.Expires), printable(r.SetBy), r.SetAt, quoteKey(r.Reason))
	}
	return tw.Flush()
}

func overrideMatchText(m adminapi.OverrideMatch) string {
	switch {
	case m.Key != nil:
		return "key " + quoteKey(*m.Key)
	case m.Prefix != nil:
		return "prefix " + quoteKey(*m.Prefix)
	case m.CIDR != nil:
		return "cidr " + printable(*m.CIDR)
	}
	return "?"
}

func overrideLimitText(r adminapi.Override) string {
	switch {
	case r.Exempt:
		return "exempt"
	case r.Deny:
		return "deny"
	case r.N > 0:
		return fmt.Sprintf("%d in flight", r.N)
	case r.Limit > 0:
		return fmt.Sprintf("quota %d", r.Limit)
	case r.Burst > 0:
		return fmt.Sprintf("%d/%s burst %d", r.Events, r.Window, r.Burst)
	}
	return fmt.Sprintf("%d/%s", r.Events, r.Window)
}

func orNever(s string) string {
	if s == "" {
		return "never"
	}
	return s
}
