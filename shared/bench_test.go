package shared

import (
	"context"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/internal/testredis"
	"github.com/apidispatch/apidispatch/org"
)

// BenchmarkSharedAdmissions is the cost of the shared budget per request:
// three processes (budgets) on one key, each admitting and finishing
// requests as fast as it can on its share of a cap of 100. It reports
// admissions per second over all three and Redis round trips per admission.
func BenchmarkSharedAdmissions(b *testing.B) {
	url := testredis.URL(b)
	o := freshOrg("a")
	var gs []gate.Gate
	var bs []*Budget
	for range 3 {
		bd, err := Open(context.Background(), Config{URL: url, Orgs: []org.Org{o}})
		if err != nil {
			b.Fatal(err)
		}
		bd.Start(context.Background())
		defer bd.Close()
		bs = append(bs, bd)
		gs = append(gs, bd.NewGate(gate.LaneConfig{Org: "a", Pool: anthropic.PoolSonnet4, Cap: 100, StartFraction: 1, Speed: 1}))
	}
	time.Sleep(50 * time.Millisecond)
	ok := gate.Feedback{Outcome: anthropic.Outcome{Kind: anthropic.Success, Status: 200}}
	var trips0 int64
	for _, bd := range bs {
		trips0 += bd.trips.Load()
	}
	b.ResetTimer()
	start := time.Now()
	done := make(chan int, 3)
	per := b.N / 3
	for _, g := range gs {
		go func() {
			var held []gate.Permit
			n := 0
			for n < per {
				if p, _, ok := g.TryAdmit(time.Now(), one); ok {
					held = append(held, p)
					n++
					continue
				}
				if len(held) == 0 {
					time.Sleep(time.Millisecond)
					continue
				}
				for _, p := range held {
					g.Done(time.Now(), p, ok)
				}
				held = held[:0]
			}
			for _, p := range held {
				g.Done(time.Now(), p, ok)
			}
			done <- n
		}()
	}
	total := 0
	for range gs {
		total += <-done
	}
	el := time.Since(start)
	var trips int64
	for _, bd := range bs {
		trips += bd.trips.Load()
	}
	b.ReportMetric(float64(total)/el.Seconds(), "admissions/s")
	b.ReportMetric(float64(trips-trips0)/float64(max(total, 1)), "trips/admission")
}
