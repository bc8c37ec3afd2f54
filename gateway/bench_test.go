package gateway

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/sim"
)

// benchSim is the simulator with no latency and limits far above the
// load, so that what is measured is HTTP and the gateway, not the API.
func benchSim(b *testing.B) *sim.Running {
	run, _ := simtest.Start(b, sim.PresetOrigin3Org, 1000, func(c *sim.Config) {
		c.Latency = sim.LatencyConfig{Zero: true}
		for i := range c.Orgs {
			c.Orgs[i].Limits = map[anthropic.Pool]sim.Limits{sim.AnyPool: {RPM: 1 << 40, ITPM: 1 << 50, OTPM: 1 << 50}}
			c.Orgs[i].ServiceCapacity = 0
		}
	})
	return run
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

var benchBody = []byte(`{"model":"claude-haiku-4-5","max_tokens":64,"system":"You are a judge. Evaluate the answer.","messages":[{"role":"user","content":"Item 7. Provide your evaluation as a JSON object."}]}`)

// drive sends n requests at concurrency conc to url with key and returns
// every latency sorted, the wall time and the process CPU time used.
func drive(b *testing.B, url, key string, n, conc int) ([]time.Duration, time.Duration, time.Duration) {
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conc, MaxConnsPerHost: conc}}
	lat := make([]time.Duration, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	cpu0, t0 := cpuTime(), time.Now()
	for range conc {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				req, _ := http.NewRequest(http.MethodPost, url+"/v1/messages", bytes.NewReader(benchBody))
				req.Header.Set("x-api-key", key)
				req.Header.Set("anthropic-version", "2023-06-01")
				req.Header.Set("content-type", "application/json")
				s := time.Now()
				resp, err := hc.Do(req)
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
				lat[i] = time.Since(s)
			}
		})
	}
	wg.Wait()
	wall, cpu := time.Since(t0), cpuTime()-cpu0
	hc.CloseIdleConnections()
	slices.Sort(lat)
	return lat, wall, cpu
}

func pct(l []time.Duration, p float64) time.Duration { return l[min(len(l)-1, int(float64(len(l))*p))] }

// BenchmarkGatewayOverhead measures, in one run, the same client (16
// concurrent requests) straight to the simulator and through the gateway:
// the latency the gateway adds at p50 and p99, and the CPU it costs per
// request (the process's CPU per request through it minus straight).
//
//	go test ./gateway -run '^$' -bench GatewayOverhead -benchtime 20000x
func BenchmarkGatewayOverhead(b *testing.B) {
	run := benchSim(b)
	_, srv := startGW(b, run, nil)
	key := run.Server.Orgs()[0].Key.Reveal()
	drive(b, srv.URL, tokA, 2000, 16) // warm the lanes up to their caps
	b.ResetTimer()
	direct, dw, dcpu := drive(b, run.URL, key, b.N, 16)
	via, vw, vcpu := drive(b, srv.URL, tokA, b.N, 16)
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(float64(pct(direct, 0.5).Microseconds()), "direct-p50-µs")
	b.ReportMetric(float64(pct(direct, 0.99).Microseconds()), "direct-p99-µs")
	b.ReportMetric(float64(pct(via, 0.5).Microseconds()), "gw-p50-µs")
	b.ReportMetric(float64(pct(via, 0.99).Microseconds()), "gw-p99-µs")
	b.ReportMetric(float64((pct(via, 0.5) - pct(direct, 0.5)).Microseconds()), "added-p50-µs")
	b.ReportMetric(float64((pct(via, 0.99) - pct(direct, 0.99)).Microseconds()), "added-p99-µs")
	b.ReportMetric(float64((vcpu-dcpu).Microseconds())/n, "gw-cpu-µs/req")
	b.ReportMetric(n/dw.Seconds(), "direct-req/s")
	b.ReportMetric(n/vw.Seconds(), "gw-req/s")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkGatewayThroughput is one gateway's most requests per second,
// at 256 concurrent requests over three orgs (caps 120 each for Haiku).
//
//	go test ./gateway -run '^$' -bench GatewayThroughput -benchtime 30000x
func BenchmarkGatewayThroughput(b *testing.B) {
	run := benchSim(b)
	_, srv := startGW(b, run, nil)
	drive(b, srv.URL, tokA, 2000, 256)
	b.ResetTimer()
	lat, wall, _ := drive(b, srv.URL, tokA, b.N, 256)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/wall.Seconds(), "req/s")
	b.ReportMetric(float64(pct(lat, 0.99).Microseconds()), "p99-µs")
	b.ReportMetric(0, "ns/op")
	_ = fmt.Sprint
}
