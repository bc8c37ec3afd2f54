package dispatch_test

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/sim"
)

// steady measures a run's completion rate between 20% and 80% done, away
// from warm-up and tail, by sampling the engine's progress.
type steady struct {
	rate     float64 // completions per wall second
	meanLatS float64 // mean attempt latency seen by the client, wall seconds
	res      *dispatch.Result
}

func measureSteady(b testing.TB, h *harness, mod func(*dispatch.Config)) steady {
	ctx := context.Background()
	job, err := dispatch.OpenJob(ctx, dispatch.JobConfig{InputPath: h.input, RunDir: h.dir, Prices: costDefault()}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer job.Close()
	cfg := dispatch.Config{Orgs: h.orgs, BaseURL: h.sim.URL, Speed: h.speed, Prices: costDefault(), SampleEvery: -1}
	if mod != nil {
		mod(&cfg)
	}
	eng, err := job.Engine(cfg)
	if err != nil {
		b.Fatal(err)
	}
	var t20, t80 time.Time
	var d20, d80 int64
	done := make(chan struct{})
	go func() {
		tk := time.NewTicker(5 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-done:
				return
			case now := <-tk.C:
				p := eng.Progress()
				if p.Total == 0 {
					continue
				}
				if t20.IsZero() && p.Done*5 >= p.Total {
					t20, d20 = now, p.Done
				}
				if t80.IsZero() && p.Done*5 >= p.Total*4 {
					t80, d80 = now, p.Done
				}
			}
		}
	}()
	res, err := eng.Run(ctx)
	close(done)
	if err != nil {
		b.Fatal(err)
	}
	st := steady{res: res}
	if !t80.IsZero() && t80.After(t20) {
		st.rate = float64(d80-d20) / t80.Sub(t20).Seconds()
	}
	st.meanLatS = meanLatency(b, filepath.Join(h.dir, dispatch.ResultsFile))
	return st
}

func meanLatency(b testing.TB, path string) float64 {
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	var sum float64
	var n int
	for sc.Scan() {
		var v struct {
			Dispatch struct {
				LatencyMs float64 `json:"latency_ms"`
			} `json:"dispatch"`
		}
		if json.Unmarshal(sc.Bytes(), &v) == nil {
			sum += v.Dispatch.LatencyMs
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return sum / float64(n) / 1000
}

// BenchmarkCapBound is issue 3's first target: on origin-3org with Sonnet
// caps of 100, steady-state throughput against the cap-bound ceiling
// Σ cap ÷ mean latency, and the 429s we caused.
func BenchmarkCapBound(b *testing.B) {
	for range b.N {
		h := newHarness(b, sim.PresetOrigin3Org, 40, 12000, nil)
		st := measureSteady(b, h, nil)
		ceiling := 300 / st.meanLatS
		b.ReportMetric(st.rate/ceiling*100, "%ceiling")
		b.ReportMetric(float64(st.res.Summary.RateLimited429), "429s")
		b.ReportMetric(st.rate*60/40, "api-rpm")
		b.ReportMetric(st.meanLatS*40, "api-lat-s")
		b.Logf("lanes %+v", st.res.Summary.Lanes)
	}
}
