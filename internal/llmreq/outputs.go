package llmreq

import (
	"math"
	"sync"

	"github.com/caddy-tally/ratelimit/internal/usage"
)

// Outputs learns, per model, the 95th percentile of a zone's responses' output
// tokens: the estimate of a request that sets no maximum. Its memory is bounded:
// at most maxModels fixed-size histograms whose counts halve every halfLife
// responses; a new model beyond takes the least seen one's place, and a model
// not learned gets the percentile of all the zone's responses.
type Outputs struct {
	mu     sync.Mutex
	models map[string]*sketch
	all    sketch
}

const (
	maxModels = 64
	halfLife  = 512
	// buckets, each 2^(1/4) wider, from 1 token to 2^(buckets/4) = 2^24,
	// beyond any output.
	buckets = 96
)

// sketch is one model's decaying histogram of output tokens.
type sketch struct {
	n     [buckets]float32
	total float32
	seen  int // responses since the counts last halved
}

func (s *sketch) add(tokens int64) {
	if s.seen++; s.seen > halfLife {
		s.seen, s.total = 0, s.total/2
		for i := range s.n {
			s.n[i] /= 2
		}
	}
	b := 0
	if tokens > 1 {
		b = min(int(math.Ceil(4*math.Log2(float64(tokens)))), buckets-1)
	}
	s.n[b]++
	s.total++
}

// p95 is the upper bound of the 95th percentile's bucket (at most 19%
// over), false if none seen.
func (s *sketch) p95() (int64, bool) {
	if s.total == 0 {
		return 0, false
	}
	want, sum := 0.95*s.total, float32(0)
	for i, n := range s.n {
		if sum += n; sum >= want {
			return int64(math.Ceil(math.Exp2(float64(i) / 4))), true
		}
	}
	return int64(math.Exp2(float64(buckets-1) / 4)), true
}

// Observe records a response of model with output tokens.
func (o *Outputs) Observe(model string, tokens int64) {
	if tokens < 0 {
		return
	}
	if len(model) > usage.MaxModel {
		model = model[:usage.MaxModel]
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.all.add(tokens)
	if model == "" {
		return
	}
	s := o.models[model]
	if s == nil {
		if o.models == nil {
			o.models = make(map[string]*sketch, maxModels)
		}
		if len(o.models) >= maxModels {
			least := ""
			for m, s := range o.models {
				if least == "" || s.total < o.models[least].total {
					least = m
				}
			}
			delete(o.models, least)
		}
		s = new(sketch)
		o.models[model] = s
	}
	s.add(tokens)
}

// P95 is the 95th percentile of model's output tokens (all models' if model
// is unseen); false when the zone has seen no response.
func (o *Outputs) P95(model string) (int64, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if s := o.models[model]; s != nil {
		return s.p95()
	}
	return o.all.p95()
}
