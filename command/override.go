package command

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/caddy-tally/ratelimit/internal/adminapi"
)

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
