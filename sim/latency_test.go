package sim

import (
	"math"
	"sort"
	"testing"
	"time"
)

// The latency distribution, sampled without any clock: quantiles of the
// default model for a 64-token answer match the lognormal-plus-tail maths,
// and land near docs/design.md §24's p50 1.52 s and p95 3.5 s.
func TestLatencyQuantilesFromSamples(t *testing.T) {
	t.Parallel()
	m := latencyModel{cfg: DefaultLatency()}
	r := &rng{s: 42}
	const n = 200000
	xs := make([]float64, n)
	var sum float64
	for i := range xs {
		xs[i] = m.sample(64, r).Seconds()
		sum += xs[i]
	}
	sort.Float64s(xs)
	q := func(p float64) float64 { return xs[int(p*float64(n-1))] }
	cfg := DefaultLatency()
	base := (cfg.TTFT + 64*cfg.PerToken).Seconds()
	// The median is the base (the tail is too rare to move it much).
	within(t, "p50", q(0.5), base, 0.02)
	within(t, "p50 vs origin", q(0.5), 1.52, 0.05)
	within(t, "p95 vs origin", q(0.95), 3.5, 0.08)
	// Mean: lognormal mean plus the tail's.
	wantMean := base*math.Exp(cfg.Sigma*cfg.Sigma/2) + cfg.TailProb*cfg.TailMean.Seconds()
	within(t, "mean", sum/n, wantMean, 0.02)
	// Long tail: p99.9 well above p95.
	if q(0.999) < 2*q(0.95) {
		t.Errorf("p99.9 %.2f s is not a long tail over p95 %.2f s", q(0.999), q(0.95))
	}
	// Deterministic: the same seed gives the same samples.
	a, b := &rng{s: 7}, &rng{s: 7}
	for i := 0; i < 100; i++ {
		if m.sample(10, a) != m.sample(10, b) {
			t.Fatal("same seed, different latency")
		}
	}
}

func TestLatencyScalesWithOutputAndCongestion(t *testing.T) {
	t.Parallel()
	m := latencyModel{cfg: LatencyConfig{TTFT: time.Second, PerToken: 10 * time.Millisecond, CongestionExponent: 1.25}}
	if d := m.sample(100, &rng{}); d != 2*time.Second {
		t.Errorf("no jitter: %v, want 2s", d)
	}
	if f := m.congestion(100, 120); f != 1 {
		t.Errorf("below capacity: factor %v", f)
	}
	within(t, "factor at 800/120", m.congestion(800, 120), math.Pow(800.0/120, 1.25), 1e-9)
	if (latencyModel{cfg: LatencyConfig{Zero: true, TTFT: time.Second}}).sample(100, &rng{}) != 0 {
		t.Error("Zero latency is not zero")
	}
}
