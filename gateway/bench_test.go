package gateway

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
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
	return driveBodies(b, url, key, n, conc, func(int64) []byte { return benchBody })
}

// driveBodies is drive with request i's body body(i).
func driveBodies(b *testing.B, url, key string, n, conc int, body func(i int64) []byte) ([]time.Duration, time.Duration, time.Duration) {
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
				req, _ := http.NewRequest(http.MethodPost, url+"/v1/messages", bytes.NewReader(body(i)))
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
}

// cannedAPI is a trivial HTTP server that answers every request with one
// answer the simulator gave (status, headers, body), reading the request
// body first: the least an upstream can cost.
func cannedAPI(b *testing.B, run *sim.Running) *httptest.Server {
	req, _ := http.NewRequest(http.MethodPost, run.URL+"/v1/messages", bytes.NewReader(benchBody))
	req.Header.Set("x-api-key", run.Server.Orgs()[0].Key.Reveal())
	req.Header.Set("anthropic-version", "2023-06-01")
	req.Header.Set("content-type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	hdr := resp.Header.Clone()
	hdr.Del("Content-Length")
	hdr.Del("Date")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		h := w.Header()
		for k, v := range hdr {
			h[k] = v
		}
		h.Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(resp.StatusCode)
		w.Write(body)
	}))
	b.Cleanup(srv.Close)
	return srv
}

// BenchmarkGatewayCeiling puts the gateway's rate beside this machine's
// bare-HTTP ceiling, all in one run with the same client at the same
// concurrency: (1) the client straight to a trivial server answering the
// simulator's bytes (one hop: the most requests/s net/http does here);
// (2) through a reverse proxy of net/http alone (httputil.ReverseProxy:
// two hops, nothing else); (3) through the gateway to the same trivial
// server; (4) through the gateway to the simulator. gw/proxy is the share
// of the two-hop ceiling the gateway keeps; the CPU figures are the
// process's CPU per request (client and servers included).
//
//	go test ./gateway -run '^$' -bench GatewayCeiling -benchtime 20000x
func BenchmarkGatewayCeiling(b *testing.B) {
	const conc = 256
	run := benchSim(b)
	canned := cannedAPI(b, run)
	target, _ := url.Parse(canned.URL)
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = &http.Transport{MaxIdleConns: 4096, MaxIdleConnsPerHost: 4096}
	proxy := httptest.NewServer(rp)
	b.Cleanup(proxy.Close)
	_, gwCanned := startGW(b, run, func(c *Config) { c.BaseURL = canned.URL })
	_, gwSim := startGW(b, run, nil)
	key := run.Server.Orgs()[0].Key.Reveal()
	type leg struct {
		name, url, key string
	}
	legs := []leg{
		{"bare", canned.URL, key},
		{"proxy", proxy.URL, key},
		{"gw", gwCanned.URL, tokA},
		{"gw-sim", gwSim.URL, tokA},
	}
	for _, l := range legs {
		drive(b, l.url, l.key, 2000, conc) // warm up connections and lanes
	}
	b.ResetTimer()
	rates := map[string]float64{}
	for _, l := range legs {
		lat, wall, cpu := drive(b, l.url, l.key, b.N, conc)
		rates[l.name] = float64(b.N) / wall.Seconds()
		b.ReportMetric(rates[l.name], l.name+"-req/s")
		b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), l.name+"-cpu-µs/req")
		b.ReportMetric(float64(pct(lat, 0.99).Microseconds()), l.name+"-p99-µs")
	}
	b.StopTimer()
	b.ReportMetric(rates["gw"]/rates["proxy"], "gw/proxy")
	b.ReportMetric(rates["gw"]/rates["bare"], "gw/bare")
	b.ReportMetric(0, "ns/op")
}

// driveAt sends n requests to url at a steady rate per second, open loop
// (each at its time, whatever the earlier ones are doing), and returns
// every latency sorted and the process CPU time used.
func driveAt(b *testing.B, url, key string, n int, rate float64) ([]time.Duration, time.Duration) {
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024}}
	defer hc.CloseIdleConnections()
	lat := make([]time.Duration, n)
	var wg sync.WaitGroup
	cpu0, t0 := cpuTime(), time.Now()
	for i := range n {
		if d := time.Until(t0.Add(time.Duration(float64(i) / rate * float64(time.Second)))); d > 0 {
			time.Sleep(d)
		}
		wg.Go(func() {
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
			}
			lat[i] = time.Since(s)
		})
	}
	wg.Wait()
	cpu := cpuTime() - cpu0
	slices.Sort(lat)
	return lat, cpu
}

// BenchmarkGatewayOverheadAtRate is issue 24's latency goal: at a steady
// 1,000 requests/s (open loop; APIDISPATCH_GW_RATE to change it), the
// same client straight to the zero-latency simulator, through a reverse
// proxy of net/http alone (the least a second hop adds on this machine)
// and through the gateway, in one run: p50 and p99 added, and the CPU per
// request each path costs the process beyond the straight one.
//
//	go test ./gateway -run '^$' -bench GatewayOverheadAtRate -benchtime 10000x
func BenchmarkGatewayOverheadAtRate(b *testing.B) {
	rate := float64(envInt("APIDISPATCH_GW_RATE", 1000))
	run := benchSim(b)
	target, _ := url.Parse(run.URL)
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = &http.Transport{MaxIdleConns: 4096, MaxIdleConnsPerHost: 4096}
	proxy := httptest.NewServer(rp)
	b.Cleanup(proxy.Close)
	_, srv := startGW(b, run, nil)
	key := run.Server.Orgs()[0].Key.Reveal()
	driveAt(b, srv.URL, tokA, 1000, rate)
	driveAt(b, proxy.URL, key, 1000, rate)
	b.ResetTimer()
	direct, dcpu := driveAt(b, run.URL, key, b.N, rate)
	viaProxy, pcpu := driveAt(b, proxy.URL, key, b.N, rate)
	via, vcpu := driveAt(b, srv.URL, tokA, b.N, rate)
	b.StopTimer()
	n := float64(b.N)
	us := func(d time.Duration) float64 { return float64(d.Microseconds()) }
	b.ReportMetric(us(pct(direct, 0.5)), "direct-p50-µs")
	b.ReportMetric(us(pct(direct, 0.99)), "direct-p99-µs")
	b.ReportMetric(us(pct(viaProxy, 0.5)-pct(direct, 0.5)), "proxy-added-p50-µs")
	b.ReportMetric(us(pct(viaProxy, 0.99)-pct(direct, 0.99)), "proxy-added-p99-µs")
	b.ReportMetric(us(pct(via, 0.5)-pct(direct, 0.5)), "gw-added-p50-µs")
	b.ReportMetric(us(pct(via, 0.99)-pct(direct, 0.99)), "gw-added-p99-µs")
	b.ReportMetric(float64((pcpu-dcpu).Microseconds())/n, "proxy-cpu-µs/req")
	b.ReportMetric(float64((vcpu-dcpu).Microseconds())/n, "gw-cpu-µs/req")
	b.ReportMetric(0, "ns/op")
}
