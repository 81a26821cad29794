package usage

import (
	"math"
	"strings"
	"testing"
)

func mustPrice(t *testing.T, in, cached, out string) Price {
	t.Helper()
	var p Price
	var err error
	if p.Input, err = ParsePrice(in); err != nil {
		t.Fatal(err)
	}
	p.CachedInput = p.Input
	if cached != "" {
		if p.CachedInput, err = ParsePrice(cached); err != nil {
			t.Fatal(err)
		}
	}
	if p.Output, err = ParsePrice(out); err != nil {
		t.Fatal(err)
	}
	return p
}

// issueTable is the table of the issue's example.
func issueTable(t *testing.T) *Prices {
	var p Prices
	for _, m := range []struct{ pattern, in, cached, out string }{
		{"gpt-4.1-mini*", "0.40", "0.10", "1.60"},
		{"claude-sonnet-4*", "3.00", "0.30", "15.00"},
	} {
		if err := p.AddModel(m.pattern, mustPrice(t, m.in, m.cached, m.out)); err != nil {
			t.Fatal(err)
		}
	}
	p.SetDefault(mustPrice(t, "5.00", "", "15.00"))
	return &p
}

func TestParsePriceIsExactNanoDollarsPerToken(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
	}{
		{"0.40", 400}, {"15", 15000}, {"15.00", 15000}, {"0.075", 75}, {"0.001", 1}, {"0", 0}, {"0.5", 500}, {"10000", 10_000_000},
	} {
		if got, err := ParsePrice(c.in); err != nil || got != c.want {
			t.Errorf("ParsePrice(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"0.0001", "-1", "1e3", "", ".", ".5", "1.", "0x10", "1,5", "10000.001", "+1", "99999999999999999999"} {
		if got, err := ParsePrice(bad); err == nil {
			t.Errorf("ParsePrice(%q) = %d, want an error", bad, got)
		}
	}
	if _, err := ParsePrice("0.0005"); err == nil || !strings.Contains(err.Error(), "3 decimals") {
		t.Errorf("a finer price's error %v does not say how many decimals", err)
	}
}

func TestParseUSDIsExactMicroDollars(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
	}{
		{"20", 20_000_000}, {"0.50", 500_000}, {"0.01", 10_000}, {"0.000001", 1}, {"1099511.627776", 1 << 40},
	} {
		if got, err := ParseUSD(c.in, 1<<40); err != nil || got != c.want {
			t.Errorf("ParseUSD(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"0", "0.0000001", "1099511.627777", "-5", "5usd"} {
		if got, err := ParseUSD(bad, 1<<40); err == nil {
			t.Errorf("ParseUSD(%q) = %d, want an error", bad, got)
		}
	}
}

func TestFormatUSD(t *testing.T) {
	for _, c := range []struct {
		in   int64
		want string
	}{
		{19_873_412, "19.873412"}, {0, "0.000000"}, {1, "0.000001"}, {-1_500_000, "-1.500000"},
		{math.MinInt64, "-9223372036854.775808"}, {math.MaxInt64, "9223372036854.775807"},
	} {
		if got := FormatUSD(c.in); got != c.want {
			t.Errorf("FormatUSD(%d) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestPricesFirstPatternWinsAndDefault(t *testing.T) {
	p := issueTable(t)
	for _, c := range []struct {
		model string
		want  int64 // input price, nano-dollars per token
	}{
		{"gpt-4.1-mini", 400}, {"gpt-4.1-mini-2025-04-14", 400}, {"claude-sonnet-4-20250514", 3000},
		{"gpt-4.1", 5000}, {"", 5000}, {"GPT-4.1-MINI", 5000}, {"xgpt-4.1-mini", 5000},
	} {
		if got, ok := p.Lookup(c.model); !ok || got.Input != c.want {
			t.Errorf("Lookup(%q) = %+v, %v; want input %d", c.model, got, ok, c.want)
		}
	}
	var exact Prices
	if err := exact.AddModel("gpt-4o", mustPrice(t, "2.50", "", "10")); err != nil {
		t.Fatal(err)
	}
	if _, ok := exact.Lookup("gpt-4o-mini"); ok {
		t.Error("a pattern without * priced a longer name")
	}
	if _, ok := exact.Lookup("gpt-4o"); !ok {
		t.Error("an exact pattern did not price its model")
	}
}

func TestPricesRefuseUnusablePatterns(t *testing.T) {
	pr := Price{Input: 1, CachedInput: 1, Output: 1}
	for _, c := range []struct {
		first, second, want string
	}{
		{"gpt-4*", "gpt-4.1-mini*", "never be priced"},
		{"gpt-4*", "gpt-4o", "never be priced"},
		{"gpt-4o", "gpt-4o", "twice"},
		{"gpt-*-mini", "", "only end"},
		{"", "", "needs a name"},
	} {
		var p Prices
		err := p.AddModel(c.first, pr)
		if err == nil && c.second != "" {
			err = p.AddModel(c.second, pr)
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q then %q: %v, want an error saying %q", c.first, c.second, err, c.want)
		}
	}
	var p Prices
	if err := p.AddModel("gpt-4.1-mini*", pr); err != nil {
		t.Fatal(err)
	}
	if err := p.AddModel("gpt-4*", pr); err != nil {
		t.Errorf("a shorter prefix after a longer one was refused: %v", err)
	}
}

func TestCostIsExactNanoDollarsRoundedUpToMicro(t *testing.T) {
	p := issueTable(t)
	for _, c := range []struct {
		model                 string
		input, cached, output int64
		want                  int64
	}{
		// 1000 input at 0.40 = 400,000 nano; 200 output at 1.60 = 320,000 nano.
		{"gpt-4.1-mini", 1000, 0, 200, 720},
		// 600 of the input cached at 0.10: 400·400 + 600·100 + 320,000 nano.
		{"gpt-4.1-mini", 1000, 600, 200, 540},
		// 1 input token at 0.40: 400 nano, a micro-dollar rounded up.
		{"gpt-4.1-mini", 1, 0, 0, 1},
		{"gpt-4.1-mini", 0, 0, 0, 0},
		// 1234 at 3.00 + 567 at 15.00 = 3,702,000 + 8,505,000 nano.
		{"claude-sonnet-4-5", 1234, 0, 567, 12207},
		// Without a cached_input price, cached input costs the input price.
		{"llama3", 100, 50, 10, 650},
		// Cached beyond input (a malformed usage) is capped at the input.
		{"gpt-4.1-mini", 10, 50, 0, 1},
		{"gpt-4.1-mini", math.MaxInt64, 0, math.MaxInt64, math.MaxInt64},
	} {
		got, ok := p.Cost(c.model, c.input, c.cached, c.output)
		if !ok || got != c.want {
			t.Errorf("Cost(%q, %d, %d, %d) = %d, %v; want %d", c.model, c.input, c.cached, c.output, got, ok, c.want)
		}
	}
	var none Prices
	if err := none.AddModel("gpt-4o", Price{Input: 1}); err != nil {
		t.Fatal(err)
	}
	if _, ok := none.Cost("claude-3", 10, 0, 10); ok {
		t.Error("a model with no price and no default was priced")
	}
}
