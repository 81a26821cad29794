package ratelimit

import (
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-tally/ratelimit/zones"
)

// The block, as written.
const usdExample = `rate_limit {
	zone spend {
		key {http.request.header.Authorization}
		quota 20 usd per month
		charge usd {
			model gpt-4.1-mini*    input 0.40 cached_input 0.10 output 1.60
			model claude-sonnet-4* input 3.00 cached_input 0.30 output 15.00
			default                input 5.00 output 15.00
		}
	}
	zone team {
		key {http.request.header.X-Team}
		events 0.50 usd
		window 1h
		burst 0.25 usd
		cost 0.001 usd
		charge usd {
			default input 5 output 15
		}
	}
}`

func TestCaddyfileChargeUSDAsWritten(t *testing.T) {
	h, err := parse(t, usdExample)
	if err != nil {
		t.Fatal(err)
	}
	z := h.RateLimits["spend"]
	want := &ChargeUSD{
		Models: []ModelPrice{
			{Model: "gpt-4.1-mini*", TokenPrices: TokenPrices{Input: "0.40", CachedInput: "0.10", Output: "1.60"}},
			{Model: "claude-sonnet-4*", TokenPrices: TokenPrices{Input: "3.00", CachedInput: "0.30", Output: "15.00"}},
		},
		Default: &TokenPrices{Input: "5.00", Output: "15.00"},
	}
	if z.Unit != "usd" || z.Quota == nil || z.Quota.Limit != 20_000_000 || z.Quota.Per != "month" || !reflect.DeepEqual(z.ChargeUSD, want) {
		t.Fatalf("zone spend = %+v, quota %+v, charge %+v", z, z.Quota, z.ChargeUSD)
	}
	if tz := h.RateLimits["team"]; tz.Unit != "usd" || tz.MaxEvents != 500_000 || tz.Burst != 250_000 || tz.Cost != 1000 {
		t.Errorf("zone team = %+v: want events, burst and cost in micro-dollars", tz)
	}

	// The JSON config says the same, prices as exact decimals: numbers
	// or strings.
	b, err := json.Marshal(z)
	if err != nil {
		t.Fatal(err)
	}
	var back Zone
	if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(back.ChargeUSD, want) || back.Unit != "usd" {
		t.Fatalf("JSON %s read back as %+v, %v", b, back.ChargeUSD, err)
	}
	if !strings.Contains(string(b), `"charge_usd":{"models":[{"model":"gpt-4.1-mini*","input":0.40,"cached_input":0.10,"output":1.60}`) {
		t.Errorf("JSON %s", b)
	}

	plan, err := zones.NewPlan(z.Quota.Limit, 31*24*time.Hour, 0)
	if err != nil {
		t.Fatal(err)
	}
	c, err := zoneCosts("spend", z, plan, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	if !c.postCharged() || !c.weighted() || c.body == nil || !strings.HasSuffix(c.params, `;tally-unit="usd-micro"`) {
		t.Errorf("costs %+v: a charge usd zone is post-charged from the body, in micro-dollars", c)
	}
	// 1000 input (600 cached) and 200 output tokens of gpt-4.1-mini:
	// 400·0.40 + 600·0.10 + 200·1.60 dollars per million = 540 µ$.
	if n, ok := c.usd().Cost("gpt-4.1-mini-2025-04-14", 1000, 600, 200); !ok || n != 540 {
		t.Errorf("cost %d, %v; want 540", n, ok)
	}
}

func TestChargeUSDRefusesWhatItCannotCountExactly(t *testing.T) {
	zone := func(body string) string {
		return "rate_limit {\n\tzone z {\n\t\tkey {client_ip}\n" + body + "\n\t}\n}"
	}
	const prices = "\t\tcharge usd {\n\t\t\tdefault input 1 output 2\n\t\t}"
	for _, tc := range []struct {
		name, input string
		line        int
		want        string
	}{
		{"a finer quota", zone("\t\tquota 0.0000001 usd per day\n" + prices), 4, "at most 6 decimals"},
		{"a zero quota", zone("\t\tquota 0 usd per day\n" + prices), 4, "must be from $0.000001"},
		{"a quota over the bound", zone("\t\tquota 1099512 usd per day\n" + prices), 4, "must be from $0.000001 to $1099511.627776"},
		{"a placeholder amount", zone("\t\tquota {plan} usd per day\n" + prices), 4, "an amount in dollars is a number"},
		{"a finer price", zone("\t\tquota 1 usd per day\n\t\tcharge usd {\n\t\t\tdefault input 0.0001 output 1\n\t\t}"), 6, "at most 3 decimals"},
		{"a price without output", zone("\t\tquota 1 usd per day\n\t\tcharge usd {\n\t\t\tmodel gpt-4o input 1\n\t\t}"), 6, "both an input and an output price"},
		{"an unknown price", zone("\t\tquota 1 usd per day\n\t\tcharge usd {\n\t\t\tmodel gpt-4o input 1 output 2 reasoning 3\n\t\t}"), 6, "unknown price \"reasoning\""},
		{"a * inside", zone("\t\tquota 1 usd per day\n\t\tcharge usd {\n\t\t\tmodel gpt-*-mini input 1 output 2\n\t\t}"), 7, "* may only end a pattern"},
		{"a shadowed pattern", zone("\t\tquota 1 usd per day\n\t\tcharge usd {\n\t\t\tmodel gpt-4* input 1 output 2\n\t\t\tmodel gpt-4o input 1 output 2\n\t\t}"), 8, "can never be priced"},
		{"an empty block", zone("\t\tquota 1 usd per day\n\t\tcharge usd {\n\t\t}"), 6, "charge usd needs prices"},
		{"a rate over $1 a second", zone("\t\tevents 120 usd\n\t\twindow 1m\n" + prices), 4, "events 120.000000 usd in 1m0s refills more than $1 a second"},
		{"a burst not in dollars", zone("\t\tevents 1 usd\n\t\twindow 1h\n\t\tburst 5000\n" + prices), 6, "write burst in dollars too"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(t, tc.input)
			if err == nil {
				t.Fatalf("accepted:\n%s", tc.input)
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "Testfile:"+strconv.Itoa(tc.line)) {
				t.Errorf("error %q does not say %q at line %d", err, tc.want, tc.line)
			}
		})
	}

	// The unit and the charge go together, in the Caddyfile as in JSON.
	plan, err := zones.NewPlan(1000, time.Hour, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		zone Zone
		want string
	}{
		{"a usd budget without charge usd", Zone{Unit: "usd", Quota: &Quota{Limit: 1000, Per: "day"}}, "charged by charge usd"},
		{"charge usd in a zone counting requests", Zone{ChargeUSD: &ChargeUSD{Default: &TokenPrices{Input: "1", Output: "1"}}}, "give the budget in dollars"},
		{"charge usd with charge json", Zone{Unit: "usd", ChargeJSON: []string{"usage.total_tokens"}, ChargeUSD: &ChargeUSD{Default: &TokenPrices{Input: "1", Output: "1"}}}, "charges one thing"},
		{"another unit", Zone{Unit: "eur"}, `unit "eur" is unknown`},
		{"charge usd in a concurrency zone", Zone{Unit: "usd", Concurrency: 2, ChargeUSD: &ChargeUSD{Default: &TokenPrices{Input: "1", Output: "1"}}}, "not concurrency zones"},
	} {
		if _, err := zoneCosts("z", &tc.zone, plan, zap.NewNop()); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
	// JSON prices are numbers, or strings holding one, kept as written.
	var z Zone
	if err := json.Unmarshal([]byte(`{"unit":"usd","charge_usd":{"default":{"input":"0.40","output":1.60}}}`), &z); err != nil ||
		z.ChargeUSD.Default.Input != "0.40" || z.ChargeUSD.Default.Output != "1.60" {
		t.Errorf("JSON prices read as %+v, %v", z.ChargeUSD, err)
	}
}
