package sim

import (
	"math"
	"time"
)

// rng is a splitmix64 stream: tiny, seeded, and a fresh one per request, so
// no lock is shared between requests. Not safe for concurrent use.
type rng struct{ s uint64 }

func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

func (r *rng) next() uint64 {
	r.s += 0x9e3779b97f4a7c15
	return mix64(r.s)
}

// float returns a uniform number in (0, 1).
func (r *rng) float() float64 {
	return (float64(r.next()>>11) + 0.5) / (1 << 53)
}

// normal returns a standard normal number (inverse CDF of one uniform).
func (r *rng) normal() float64 {
	return math.Sqrt2 * math.Erfinv(2*r.float()-1)
}

// latencyModel turns LatencyConfig into API-equivalent durations.
type latencyModel struct {
	cfg LatencyConfig
}

// sample returns the API-equivalent latency of a request producing out
// output tokens, before congestion. It draws exactly three numbers from r.
func (m latencyModel) sample(out int64, r *rng) time.Duration {
	if m.cfg.Zero {
		return 0
	}
	base := float64(m.cfg.TTFT) + float64(out)*float64(m.cfg.PerToken)
	d := base * math.Exp(m.cfg.Sigma*r.normal())
	u := r.float()
	t := r.float()
	if u < m.cfg.TailProb {
		d += -math.Log(t) * float64(m.cfg.TailMean)
	}
	return time.Duration(d)
}

// congestion is the slowdown factor with n requests of an org in flight
// against a service capacity c (0: unlimited).
func (m latencyModel) congestion(n int64, c int) float64 {
	if c <= 0 || n <= int64(c) {
		return 1
	}
	e := m.cfg.CongestionExponent
	if e == 0 {
		e = 1
	}
	return math.Pow(float64(n)/float64(c), e)
}
