package ratelimit

import (
	"fmt"

	"github.com/caddy-tally/ratelimit/config"
	"github.com/caddy-tally/ratelimit/internal/adminapi"
	"github.com/caddy-tally/ratelimit/internal/usage"
)

// Budgets in dollars (charge usd; docs/configuration.md, "Budgets in
// dollars"): a usd zone counts whole micro-dollars, in every mode and
// store, as any zone counts its units; charge usd prices each response's
// token usage by model (internal/usage's price table). Amounts are read
// and shown in dollars: the Caddyfile's `<amount> usd`, RateLimit-Policy's
// tally-unit, and the status, admin and CLI views' *_usd fields.

// usdPrices checks a zone's unit against its charge and is its price
// table, nil when it charges no dollars: a usd zone is charged by charge
// usd, and charge usd charges only a usd zone.
func usdPrices(name string, zc *Zone) (*usage.Prices, error) {
	switch {
	case zc.Unit != "" && zc.Unit != config.UnitUSD:
		return nil, fmt.Errorf("zone %s: unit %q is unknown: the one unit is usd (amounts in micro-dollars)", name, zc.Unit)
	case zc.ChargeUSD == nil && zc.Unit == config.UnitUSD:
		return nil, fmt.Errorf("zone %s: a budget in dollars is charged by charge usd { model <pattern> input <$/1M> output <$/1M> }: add it", name)
	case zc.ChargeUSD == nil:
		return nil, nil
	case zc.Unit != config.UnitUSD:
		return nil, fmt.Errorf("zone %s: charge usd counts dollars: give the budget in dollars, e.g. quota 20 usd per month, or events 5 usd with window", name)
	case zc.Charge != "" || zc.ChargeJSON != nil:
		return nil, fmt.Errorf("zone %s: a zone charges one thing: charge usd, or charge with a placeholder or json paths; keep one", name)
	}
	t, err := zc.ChargeUSD.Table()
	if err != nil {
		return nil, fmt.Errorf("zone %s: %v", name, err)
	}
	return t, nil
}

// Why a usd zone's response fell back: its model has no price, and the
// zone no default.
const reasonNoPrice = "no_price"

// unitMicroUSD names what a usd zone's integers count, in the views and
// in RateLimit-Policy's tally-unit.
const unitMicroUSD = "usd-micro"

// usdFieldsOf are the amounts of a zone with the price table prices in
// dollars; none unless it is a usd zone (prices nil).
func usdFieldsOf(prices *usage.Prices, limit, remaining int64, used *int64) adminapi.USDFields {
	if prices == nil {
		return adminapi.USDFields{}
	}
	f := adminapi.USDFields{Unit: unitMicroUSD, LimitUSD: usage.FormatUSD(limit), RemainingUSD: usage.FormatUSD(remaining)}
	if used != nil {
		f.UsedUSD = usage.FormatUSD(*used)
	}
	return f
}
