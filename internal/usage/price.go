package usage

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
)

// Dollars (charge usd): prices per model turn token usage into
// micro-dollars, the unit every usd zone counts in. A price is dollars per
// million tokens with at most three decimals, so a whole number of
// nano-dollars per token, and a cost is exact in nano-dollars, charged
// rounded up to the micro-dollar (so tiny responses are never free).
// Micro-dollars keep every zone kind within its bounds: 2^40 is about
// $1.1 million, and up to $1 per second keeps GCRA's microsecond per unit.

// Scales of the amounts.
const (
	// MicroPerUSD is how many units of a usd zone make a dollar.
	MicroPerUSD = 1_000_000
	// NanoPerMicro is how many nano-dollars make a micro-dollar.
	NanoPerMicro = 1000

	// maxPrice, in nano-dollars per token ($10,000 per million tokens), is
	// far above any model's: a mistyped price is refused, not charged.
	maxPrice = 10_000 * 1000
)

// Price is one model's prices, in nano-dollars per token.
type Price struct {
	Input       int64
	CachedInput int64 // the input price unless given apart
	Output      int64
}

// Prices is a charge usd table: models by pattern (first match wins), then
// the default, a last pattern that fits every model.
type Prices struct {
	models []modelPrice
}

type modelPrice struct {
	pattern string // without its trailing *
	prefix  bool   // the pattern ended in *
	price   Price
}

// AddModel appends a model's price; pattern is a name, or a prefix ending in *.
func (p *Prices) AddModel(pattern string, price Price) error {
	prefix := strings.HasSuffix(pattern, "*")
	name := strings.TrimSuffix(pattern, "*")
	switch {
	case pattern == "":
		return errors.New("a model needs a name or a prefix ending in *, e.g. gpt-4.1-mini*")
	case strings.Contains(name, "*"):
		return fmt.Errorf("model %q: * may only end a pattern (a prefix), e.g. claude-sonnet-4*", pattern)
	}
	for _, m := range p.models {
		if m.pattern == name && m.prefix == prefix {
			return fmt.Errorf("model %q is priced twice: keep one", pattern)
		}
		if m.prefix && strings.HasPrefix(name, m.pattern) {
			return fmt.Errorf("model %q can never be priced: %q comes first and fits every model it fits; put the longer pattern first", pattern, m.pattern+"*")
		}
	}
	p.models = append(p.models, modelPrice{pattern: name, prefix: prefix, price: price})
	return nil
}

// SetDefault sets the price of every model no pattern fits; it comes
// after every AddModel.
func (p *Prices) SetDefault(price Price) {
	p.models = append(p.models, modelPrice{prefix: true, price: price})
}

// Lookup is model's price: the first fitting pattern's, else the default
// (false: none).
func (p *Prices) Lookup(model string) (Price, bool) {
	for i := range p.models {
		m := &p.models[i]
		if model == m.pattern || m.prefix && strings.HasPrefix(model, m.pattern) {
			return m.price, true
		}
	}
	return Price{}, false
}

// Cost is what a response of model costs in micro-dollars, rounded up
// (input includes cached), saturating at math.MaxInt64 (the zone's bound
// caps it); false: no price.
func (p *Prices) Cost(model string, input, cached, output int64) (int64, bool) {
	pr, ok := p.Lookup(model)
	if !ok {
		return 0, false
	}
	input, cached, output = max(input, 0), max(cached, 0), max(output, 0)
	cached = min(cached, input)
	nano := satMul(input-cached, pr.Input)
	nano = satAdd(nano, satMul(cached, pr.CachedInput))
	nano = satAdd(nano, satMul(output, pr.Output))
	if nano == math.MaxInt64 {
		return math.MaxInt64, true
	}
	return (nano + NanoPerMicro - 1) / NanoPerMicro, true
}

// satMul is a·b for a, b >= 0, at most math.MaxInt64.
func satMul(a, b int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(lo)
}

// ParsePrice reads dollars per million tokens ("0.075") as nano-dollars per token.
func ParsePrice(s string) (int64, error) {
	n, err := parseDecimal(s, 3)
	switch {
	case err != nil:
		return 0, fmt.Errorf("price %q: %v; prices are dollars per million tokens with at most 3 decimals, e.g. 0.40", s, err)
	case n > maxPrice:
		return 0, fmt.Errorf("price %q is more than $10000 per million tokens: prices are dollars per million tokens, e.g. 0.40", s)
	}
	return n, nil
}

// ParseUSD reads dollars ("0.000125") as micro-dollars, from one to max.
func ParseUSD(s string, max int64) (int64, error) {
	n, err := parseDecimal(s, 6)
	switch {
	case err != nil:
		return 0, fmt.Errorf("amount %q: %v; amounts are dollars with at most 6 decimals, e.g. 0.50", s, err)
	case n < 1 || n > max:
		return 0, fmt.Errorf("amount %q must be from $0.000001 to $%s", s, FormatUSD(max))
	}
	return n, nil
}

// parseDecimal reads a decimal >= 0 of at most places decimals, exactly, in
// 10^-places units.
func parseDecimal(s string, places int) (int64, error) {
	whole, frac, dot := strings.Cut(s, ".")
	switch {
	case whole == "", dot && frac == "":
		return 0, errors.New("not a decimal number (write 0.5, not .5)")
	case len(frac) > places:
		return 0, fmt.Errorf("more than %d decimals", places)
	case strings.TrimLeft(whole+frac, "0123456789") != "":
		return 0, errors.New("not a decimal number (digits and one dot only, no sign or exponent)")
	}
	digits := strings.TrimLeft(whole+frac+strings.Repeat("0", places-len(frac)), "0")
	if digits == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil {
		return 0, errors.New("too large")
	}
	return n, nil
}

// FormatUSD writes micro-dollars exactly as dollars with six decimals (19.873412).
func FormatUSD(micro int64) string {
	sign := ""
	u := uint64(micro)
	if micro < 0 {
		sign, u = "-", uint64(-(micro+1))+1
	}
	return fmt.Sprintf("%s%d.%06d", sign, u/MicroPerUSD, u%MicroPerUSD)
}
