package config

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-tally/ratelimit/internal/usage"
	"github.com/caddy-tally/ratelimit/zones"
)

// UnitUSD is Zone.Unit of a zone whose amounts are micro-dollars.
const UnitUSD = "usd"

// ChargeUSD prices a response's token usage in dollars: a usd zone's charge.
type ChargeUSD struct {
	// Prices by model, matched against the response's model in order: the
	// first that fits is used.
	Models []ModelPrice `json:"models,omitempty"`
	// The price of every model no pattern fits. Without it, a response of
	// such a model (or with no model) charges the zone's fallback, counted
	// with the reason no_price.
	Default *TokenPrices `json:"default,omitempty"`
}

// ModelPrice is one model's prices.
type ModelPrice struct {
	// A model name, or a prefix ending in * (the only place * may be), such
	// as gpt-4.1-mini*.
	Model string `json:"model,omitempty"`
	TokenPrices
}

// TokenPrices are dollars per million tokens, as providers publish them:
// decimal numbers (JSON numbers, or strings holding one) with at most 3
// decimals, kept exactly.
type TokenPrices struct {
	// Input tokens' price (cached ones' too, unless cached_input is given).
	// Required.
	Input json.Number `json:"input,omitempty"`
	// Cached input tokens' price; the input price when not given.
	CachedInput json.Number `json:"cached_input,omitempty"`
	// Output tokens' price (reasoning tokens included). Required.
	Output json.Number `json:"output,omitempty"`
}

// price reads p.
func (p TokenPrices) price() (usage.Price, error) {
	var pr usage.Price
	if p.Input == "" || p.Output == "" {
		return pr, fmt.Errorf("give both an input and an output price, e.g. input 0.40 output 1.60")
	}
	var err error
	if pr.Input, err = usage.ParsePrice(string(p.Input)); err != nil {
		return pr, err
	}
	if pr.Output, err = usage.ParsePrice(string(p.Output)); err != nil {
		return pr, err
	}
	pr.CachedInput, err = usage.ParsePrice(string(cmp.Or(p.CachedInput, p.Input)))
	return pr, err
}

// Table reads c's prices.
func (c *ChargeUSD) Table() (*usage.Prices, error) {
	if len(c.Models) == 0 && c.Default == nil {
		return nil, fmt.Errorf("charge usd needs prices: model <pattern> input <$/1M> output <$/1M>, or default input <$/1M> output <$/1M>")
	}
	var t usage.Prices
	for _, m := range c.Models {
		pr, err := m.price()
		if err == nil {
			err = t.AddModel(m.Model, pr)
		}
		if err != nil {
			return nil, fmt.Errorf("charge usd: model %s: %v", m.Model, err)
		}
	}
	if c.Default != nil {
		pr, err := c.Default.price()
		if err != nil {
			return nil, fmt.Errorf("charge usd: default: %v", err)
		}
		t.SetDefault(pr)
	}
	return &t, nil
}

// parseChargeUSD reads charge usd's block, d on `usd`.
func parseChargeUSD(d *caddyfile.Dispenser, z *Zone) error {
	const example = "model gpt-4.1-mini* input 0.40 cached_input 0.10 output 1.60, or default input 5.00 output 15.00"
	if d.NextArg() {
		return d.Errf("charge usd takes its prices in a block: charge usd { %s }", example)
	}
	c := new(ChargeUSD)
	for nest := d.Nesting(); d.NextBlock(nest); {
		var model string
		switch d.Val() {
		case "model":
			if !d.NextArg() {
				return d.Errf("model needs a name or a prefix ending in *: %s", example)
			}
			model = d.Val()
		case "default":
			if c.Default != nil {
				return d.Err("charge usd: default is given twice: keep one")
			}
		default:
			return d.Errf("charge usd: unknown line %q: %s", d.Val(), example)
		}
		var p TokenPrices
		kinds := map[string]*json.Number{"input": &p.Input, "cached_input": &p.CachedInput, "output": &p.Output}
		args := d.RemainingArgs()
		if len(args)%2 == 1 {
			return d.Errf("charge usd: prices come in pairs, a kind and dollars per million tokens: %s", example)
		}
		for ; len(args) > 0; args = args[2:] {
			switch dst := kinds[args[0]]; {
			case dst == nil:
				return d.Errf("charge usd: unknown price %q: input, cached_input or output", args[0])
			case *dst != "":
				return d.Errf("charge usd: %s is given twice: keep one", args[0])
			default:
				*dst = json.Number(args[1])
			}
		}
		if _, err := p.price(); err != nil {
			return d.Errf("charge usd: %v", err)
		}
		if model == "" {
			c.Default = &p
		} else {
			c.Models = append(c.Models, ModelPrice{Model: model, TokenPrices: p})
		}
	}
	if _, err := c.Table(); err != nil {
		return d.Err(err.Error())
	}
	z.ChargeUSD = c
	return nil
}

// usdAmounts are the settings that may give an amount in dollars.
var usdAmounts = []string{"events", "burst", "quota", "cost"}

// usdAmount reads `<setting> <amount> usd ...`, d on the setting: it marks
// z a usd zone and returns a dispenser of the same line with the amount in
// micro-dollars and usd left out, which the setting's own parser reads; any
// other line, d itself.
func usdAmount(d *caddyfile.Dispenser, z *Zone, sub string, lines map[string]int) (*caddyfile.Dispenser, error) {
	if !slices.Contains(usdAmounts, sub) {
		return d, nil
	}
	toks := []caddyfile.Token{d.Token()}
	for d.NextArg() {
		toks = append(toks, d.Token())
	}
	if len(toks) < 3 || toks[2].Text != UnitUSD {
		for range toks[1:] {
			d.Prev()
		}
		return d, nil
	}
	if strings.HasPrefix(toks[1].Text, "{") {
		return nil, d.Errf("%s: an amount in dollars is a number, such as %s 0.50 usd", sub, sub)
	}
	n, err := usage.ParseUSD(toks[1].Text, zones.MaxEvents)
	if err != nil {
		return nil, d.Errf("%s: %v", sub, err)
	}
	z.Unit = UnitUSD
	lines[sub+" usd"] = lines[sub]
	toks[1].Text = strconv.FormatInt(n, 10)
	nd := caddyfile.NewDispenser(slices.Delete(toks, 2, 3))
	nd.Next()
	return nd, nil
}

// usdUnits refuses a usd zone with an amount not given in dollars, which
// would be read as micro-dollars.
func usdUnits(name string, d *caddyfile.Dispenser, z *Zone, lines map[string]int) error {
	if z.Unit != UnitUSD {
		return nil
	}
	for _, sub := range usdAmounts {
		if line, ok := lines[sub]; ok && (sub != "cost" || z.CostPlaceholder == "") {
			if _, usd := lines[sub+" usd"]; !usd {
				return fmt.Errorf("zone %s: the zone's budget is in dollars: write %s in dollars too, e.g. %s 0.50 usd, at %s:%d", name, sub, sub, d.File(), line)
			}
		}
	}
	if w := time.Duration(z.Window); z.MaxEvents > 0 && w > 0 && w/time.Duration(z.MaxEvents) < zones.MinEmissionInterval {
		// GCRA's bound of one microsecond per unit, said in dollars.
		return fmt.Errorf("zone %s: events %s usd in %v refills more than $1 a second, the most a rate in dollars can: lengthen the window (e.g. events %s usd with window %v) or use a calendar quota, at %s:%d",
			name, usage.FormatUSD(z.MaxEvents), w, usage.FormatUSD(z.MaxEvents), time.Duration(z.MaxEvents/usage.MicroPerUSD+1)*time.Second, d.File(), lines["events"])
	}
	return nil
}
