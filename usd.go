package ratelimit

import (
	"fmt"

	"github.com/caddy-tally/ratelimit/config"
	"github.com/caddy-tally/ratelimit/internal/usage"
)

// usdPrices checks a zone's unit against its charge and is its price
// table, nil when it charges no dollars (docs/configuration.md, "Budgets
// in dollars"): a usd zone counts whole micro-dollars and is charged by
// charge usd, which charges only a usd zone.
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

// reasonNoPrice: a usd zone's response whose model has no price.
const reasonNoPrice = "no_price"

// unitMicroUSD names what a usd zone's integers count.
const unitMicroUSD = "usd-micro"
