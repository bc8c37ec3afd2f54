package sim

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
)

// calibrationPrompt is Phase 1's fixed ~45-token judge prompt (docs/design.md §24).
func calibrationBody(i int) []byte {
	return []byte(fmt.Sprintf(`{"model":"claude-sonnet-4-5-20250929","max_tokens":64,"messages":[{"role":"user","content":`+
		`"You are judging an answer. Question: what is the capital of France? Answer: Paris. Rate the answer's correctness from 0 to 100 and reply as a JSON object. Item %d."}]}`, i))
}

type closedLoopResult struct {
	rpm, p50, p95 float64 // API-equivalent
}

// closedLoop drives one org with conc workers until n requests are done,
// like Phase 1's sweep (a fixed pool of permits, no retries), and measures
// in API-equivalent time: requests per minute over the wall, and latency
// percentiles as sorted[int(q*(n-1))].
func closedLoop(b *testing.B, run *Running, key string, n, conc int) closedLoopResult {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conc + 50, MaxIdleConns: conc + 50}}
	defer client.CloseIdleConnections()
	k := run.Server.Speed()
	lat := make([]float64, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				req, _ := http.NewRequest("POST", run.URL+"/v1/messages", bytes.NewReader(calibrationBody(i)))
				req.Header.Set("x-api-key", key)
				req.Header.Set("anthropic-version", anthropic.APIVersion)
				t0 := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					b.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Errorf("status %d", resp.StatusCode)
					return
				}
				lat[i] = time.Since(t0).Seconds() * k
			}
		}()
	}
	wg.Wait()
	wall := time.Since(start).Seconds() * k
	sort.Float64s(lat)
	return closedLoopResult{
		rpm: float64(n) / wall * 60,
		p50: lat[int(0.5*float64(n-1))],
		p95: lat[int(0.95*float64(n-1))],
	}
}

// BenchmarkCalibration reproduces docs/design.md §24 Phase 1 against the
// origin-3org high_prio org: n2500 at concurrency 100 (targets 3,070
// requests/min, p50 1.52 s, p95 3.5 s) and n8000 at concurrency 800 (the
// measured run ramped 100→800 and saw latency grow about 10×). Time is
// compressed by K; the metrics are API-equivalent. Run:
//
//	go test ./sim -run XXX -bench BenchmarkCalibration -benchtime 3x
func BenchmarkCalibration(b *testing.B) {
	for _, sc := range []struct {
		name    string
		n, conc int
		speed   float64
	}{
		{"n2500_c100", 2500, 100, 5},
		{"n8000_c800", 8000, 800, 10},
	} {
		b.Run(sc.name, func(b *testing.B) {
			cfg, _ := Preset(PresetOrigin3Org)
			cfg.Orgs = cfg.Orgs[:1]
			cfg.Speed = sc.speed
			run, err := Start(cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer run.Close()
			key := run.Server.Keys()["high_prio"][0]
			var sum closedLoopResult
			iters := 0
			for b.Loop() {
				r := closedLoop(b, run, key, sc.n, sc.conc)
				sum.rpm += r.rpm
				sum.p50 += r.p50
				sum.p95 += r.p95
				iters++
			}
			b.ReportMetric(sum.rpm/float64(iters), "rpm")
			b.ReportMetric(sum.p50/float64(iters), "p50_s")
			b.ReportMetric(sum.p95/float64(iters), "p95_s")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// BenchmarkSimZeroLatency measures the simulator's raw throughput over
// loopback HTTP with no latency: parallel clients on a tuned transport,
// bodies drained. "unlimited" has no buckets; "limited" is origin-3org's
// high_prio with buckets, headers, stats and ledger. Run:
//
//	go test ./sim -run XXX -bench BenchmarkSimZeroLatency -benchtime 100000x
func BenchmarkSimZeroLatency(b *testing.B) {
	for _, unlimited := range []bool{true, false} {
		name := "limited"
		if unlimited {
			name = "unlimited"
		}
		b.Run(name, func(b *testing.B) {
			cfg, _ := Preset(PresetOrigin3Org)
			cfg.Latency = LatencyConfig{Zero: true}
			cfg.Unlimited = unlimited
			cfg.LedgerRetain = -1
			cfg.Speed = 100 // no 429s in the limited run
			run, err := Start(cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer run.Close()
			key := run.Server.Keys()["high_prio"][0]
			tr := &http.Transport{MaxIdleConnsPerHost: 256, MaxIdleConns: 256}
			client := &http.Client{Transport: tr}
			defer client.CloseIdleConnections()
			body := judgeBody(1, 256)
			b.SetParallelism(16)
			b.ResetTimer()
			start := time.Now()
			cpu0 := processCPU()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					req, _ := http.NewRequest("POST", run.URL+"/v1/messages", bytes.NewReader(body))
					req.Header.Set("x-api-key", key)
					req.Header.Set("anthropic-version", anthropic.APIVersion)
					resp, err := client.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						b.Errorf("status %d", resp.StatusCode)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
			// CPU of this process (clients and simulator) per request: less
			// sensitive than req/s to other load on the machine.
			b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(b.N), "cpu_µs/req")
		})
	}
}

// processCPU is the user+system CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkHandler is the handler alone (no network), for allocations:
//
//	go test ./sim -run XXX -bench BenchmarkHandler -benchmem
func BenchmarkHandler(b *testing.B) {
	cfg, _ := Preset(PresetOrigin3Org)
	cfg.Latency = LatencyConfig{Zero: true}
	cfg.LedgerRetain = -1
	cfg.Speed = 1000
	s, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	key := s.Keys()["high_prio"][0]
	body := judgeBody(1, 256)
	b.ReportAllocs()
	cpu0 := processCPU()
	defer func() {
		b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(b.N), "cpu_µs/req")
	}()
	b.RunParallel(func(pb *testing.PB) {
		rec := newRecorder()
		req, _ := http.NewRequest("POST", "/v1/messages", nil)
		req.Header.Set("x-api-key", key)
		req.Header.Set("anthropic-version", anthropic.APIVersion)
		for pb.Next() {
			req.Body = io.NopCloser(bytes.NewReader(body))
			rec.h = http.Header{}
			rec.body.Reset()
			rec.status = 0
			s.ServeHTTP(rec, req)
			if rec.status != 200 {
				b.Fatalf("status %d", rec.status)
			}
		}
	})
}

// BenchmarkParseRequest is request validation alone.
func BenchmarkParseRequest(b *testing.B) {
	body := judgeBody(1, 256)
	b.ReportAllocs()
	for b.Loop() {
		if _, e := parseRequest(body, false, false); e != nil {
			b.Fatal(e.msg)
		}
	}
}
