package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/soak"
	upstreampkg "github.com/apidispatch/apidispatch/upstream"
)

// timedTransport measures the latency of every upstream attempt (sent to
// the answer read and closed), the same span as the sync engine's
// latency_ms, so both ceilings are Σ cap ÷ the mean latency of the API as
// the sender saw it.
type timedTransport struct {
	rt       http.RoundTripper
	sumNanos atomic.Int64
	n        atomic.Int64
}

func (t *timedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	t0 := time.Now()
	resp, err := t.rt.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	resp.Body = &timedBody{ReadCloser: resp.Body, t: t, t0: t0}
	return resp, nil
}

// mean is the mean attempt latency so far.
func (t *timedTransport) mean() time.Duration {
	if n := t.n.Load(); n > 0 {
		return time.Duration(t.sumNanos.Load() / n)
	}
	return 0
}

type timedBody struct {
	io.ReadCloser
	t    *timedTransport
	t0   time.Time
	once sync.Once
}

func (b *timedBody) Close() error {
	b.once.Do(func() {
		b.t.sumNanos.Add(int64(time.Since(b.t0)))
		b.t.n.Add(1)
	})
	return b.ReadCloser.Close()
}

// judgeBodies reads the Messages bodies (params) of a request file.
func judgeBodies(t testing.TB, path string) [][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out [][]byte
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var v struct {
			Params json.RawMessage `json:"params"`
		}
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatal(err)
		}
		out = append(out, v.Params)
	}
	return out
}

// capRun is one measured load through the gateway.
type capRun struct {
	rate      float64       // completions per second between 20 % and 80 % done
	meanLat   time.Duration // mean upstream attempt latency
	failed    int64
	wall      time.Duration
	inFlight  []float64 // per org: mean of the simulator's per-second peak in flight, over the steady seconds
	maxFlight []int64   // per org: the simulator's max in flight
	used      []int64   // per org: completions
	s429      int64     // 429s the simulator sent (absorbed by the gateway)
	// laneInFlight is the gateway's own count of requests admitted by its
	// lanes (all orgs), sampled every 10 ms between 20 % and 80 % done.
	laneInFlight float64
}

// flightSampler samples the gateway lanes' in-flight total while on.
type flightSampler struct {
	mu     sync.Mutex
	sum, n float64
}

func (f *flightSampler) mean() float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == 0 {
		return 0
	}
	return f.sum / f.n
}

// steadyInFlight is, per org, the mean of the simulator's per-second peak
// in flight over the seconds wholly between from and to (simStart: when
// the simulator started).
func steadyInFlight(run *sim.Running, simStart, from, to time.Time) []float64 {
	a := int64(from.Sub(simStart)/time.Second) + 1
	z := int64(to.Sub(simStart) / time.Second)
	var out []float64
	for _, o := range run.Server.Stats().Orgs {
		var sum, k float64
		for _, p := range o.Series {
			if p.T >= a && p.T < z {
				sum += float64(p.InFlightMax)
				k++
			}
		}
		if k > 0 {
			sum /= k
		}
		out = append(out, sum)
	}
	return out
}

// ceiling is the cap-bound ceiling Σ cap ÷ mean latency, in requests per
// second, as BenchmarkCapBound in package dispatch computes it.
func ceiling(capSum int, meanLat time.Duration) float64 {
	if meanLat <= 0 {
		return 0
	}
	return float64(capSum) / meanLat.Seconds()
}

// loadCapBound sends every body through a gateway in front of run at
// concurrency conc (plain HTTP, so the client itself retries nothing), and
// measures the steady rate, the upstream latency and the simulator's in
// flight per key over time.
func loadCapBound(t testing.TB, run *sim.Running, simStart time.Time, bodies [][]byte, conc int, caps map[string]int) capRun {
	t.Helper()
	tt := &timedTransport{rt: &http.Transport{MaxIdleConnsPerHost: 4096}}
	g, srv := startGW(t, run, func(c *Config) { c.HTTPClient, c.Caps = &http.Client{Transport: tt}, caps })
	var laneFlight flightSampler
	var done atomic.Int64
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	defer func() { close(stop); sampler.Wait() }()
	sampler.Go(func() {
		tk := time.NewTicker(10 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case now := <-tk.C:
				d := done.Load()
				if d*5 < int64(len(bodies)) || d*5 > 4*int64(len(bodies)) {
					continue
				}
				total := 0
				for _, s := range g.lanes.snapshots(now) {
					total += s.InFlight
				}
				laneFlight.mu.Lock()
				laneFlight.sum += float64(total)
				laneFlight.n++
				laneFlight.mu.Unlock()
			}
		}
	})
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conc, MaxConnsPerHost: conc}}
	defer hc.CloseIdleConnections()
	n := len(bodies)
	ends := make([]time.Time, n)
	var next, failed atomic.Int64
	var wg sync.WaitGroup
	t0 := time.Now()
	for range conc {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/messages", bytes.NewReader(bodies[i]))
				req.Header.Set("x-api-key", tokA)
				req.Header.Set("anthropic-version", "2023-06-01")
				req.Header.Set("content-type", "application/json")
				resp, err := hc.Do(req)
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						err = errStatus(resp.StatusCode)
					}
				}
				if err != nil {
					if failed.Add(1) <= 3 {
						t.Errorf("request %d: %v", i, err)
					}
				}
				ends[i] = time.Now()
				done.Add(1)
			}
		})
	}
	wg.Wait()
	r := capRun{wall: time.Since(t0), failed: failed.Load(), meanLat: tt.mean()}
	slices.SortFunc(ends, func(a, b time.Time) int { return a.Compare(b) })
	i20, i80 := n/5, n*4/5
	if d := ends[i80].Sub(ends[i20]); d > 0 {
		r.rate = float64(i80-i20) / d.Seconds()
	}
	r.inFlight = steadyInFlight(run, simStart, ends[i20], ends[i80])
	for _, o := range run.Server.Stats().Orgs {
		r.maxFlight = append(r.maxFlight, o.MaxInFlight)
		r.used = append(r.used, o.Completions)
		r.s429 += o.RateLimited429
	}
	r.laneInFlight = laneFlight.mean()
	return r
}

type errStatus int

func (e errStatus) Error() string { return "status " + strconv.Itoa(int(e)) }

// syncCapBound runs the same requests with the sync engine ('apidispatch
// run') against run and measures it as BenchmarkCapBound does: the rate
// between 20 % and 80 % done, against Σ cap ÷ the mean latency_ms.
func syncCapBound(t testing.TB, run *sim.Running, simStart time.Time, input string, speed float64) (rate float64, meanLat time.Duration, inFlight []float64) {
	t.Helper()
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "run")
	job, err := rundir.OpenJob(ctx, rundir.JobConfig{InputPath: input, RunDir: dir, Prices: cost.Default()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer job.Close()
	eng, err := dispatch.NewForJob(job, dispatch.Config{Orgs: run.Server.Orgs(), BaseURL: run.URL, Speed: speed, Prices: cost.Default(), SampleEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	var t20, t80 time.Time
	var d20, d80 int64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
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
				if t80.IsZero() && p.Done*5 >= 4*p.Total {
					t80, d80 = now, p.Done
				}
			}
		}
	})
	_, err = eng.Run(ctx)
	close(done)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if !t80.IsZero() && t80.After(t20) {
		rate = float64(d80-d20) / t80.Sub(t20).Seconds()
	}
	m, err := soak.MeanLatency(filepath.Join(dir, rundir.ResultsFile))
	if err != nil {
		t.Fatal(err)
	}
	return rate, time.Duration(m * float64(time.Second)), steadyInFlight(run, simStart, t20, t80)
}

// envInt is an integer from the environment, or def.
func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// BenchmarkGatewayCapBound is issue 24's throughput goal: one client
// sends judge requests at concurrency 500 (more than the three keys' caps
// of 100 together) through the gateway to origin-3org; the steady rate
// (20–80 % done) against the cap-bound ceiling Σ cap ÷ mean upstream
// latency, as BenchmarkCapBound in package dispatch defines it. In the
// same run the sync engine ('apidispatch run') sends the same requests to
// a fresh simulator of the same config, so the ratio of the two shows the
// gateway's own share apart from the machine's limit.
//
//	go test ./gateway -run '^$' -bench GatewayCapBound -benchtime 1x
//	APIDISPATCH_GW_SPEED=20 APIDISPATCH_GW_N=12000 go test ./gateway -run '^$' -bench GatewayCapBound -benchtime 1x
func BenchmarkGatewayCapBound(b *testing.B) {
	speed := float64(envInt("APIDISPATCH_GW_SPEED", 10))
	n := envInt("APIDISPATCH_GW_N", 9000)
	conc := envInt("APIDISPATCH_GW_CONC", 500)
	capSum := 3 * upstreampkg.DefaultCaps["sonnet"]
	for range b.N {
		input := simtest.Judge(b, b.TempDir(), n, 1)
		bodies := judgeBodies(b, input)

		run, _ := simtest.Start(b, sim.PresetOrigin3Org, speed, nil)
		start := time.Now()
		gw := loadCapBound(b, run, start, bodies, conc, nil)
		run.Close()
		gwCeil := ceiling(capSum, gw.meanLat)

		run2, _ := simtest.Start(b, sim.PresetOrigin3Org, speed, nil)
		start2 := time.Now()
		srate, slat, sflight := syncCapBound(b, run2, start2, input, speed)
		run2.Close()
		syncCeil := ceiling(capSum, slat)

		b.ReportMetric(gw.rate/gwCeil*100, "gw-%ceiling")
		b.ReportMetric(srate/syncCeil*100, "sync-%ceiling")
		b.ReportMetric((gw.rate/gwCeil)/(srate/syncCeil), "gw/sync")
		b.ReportMetric(gw.rate, "gw-req/s")
		b.ReportMetric(srate, "sync-req/s")
		b.ReportMetric(float64(gw.failed), "gw-failed")
		b.ReportMetric(0, "ns/op")
		b.Logf("speed %.0f, %d requests at concurrency %d", speed, n, conc)
		b.Logf("gateway: %.0f req/s steady, mean upstream latency %v, ceiling %.0f req/s; %d 429s absorbed; per key: steady in flight at the simulator (mean of per-second peaks) %.0f, max %v, completions %v; admitted by the gateway's lanes (all keys, mean) %.0f; wall %v",
			gw.rate, gw.meanLat.Round(time.Millisecond), gwCeil, gw.s429, gw.inFlight, gw.maxFlight, gw.used, gw.laneInFlight, gw.wall.Round(time.Millisecond))
		b.Logf("sync engine: %.0f req/s steady, mean latency %v, ceiling %.0f req/s; per key: steady in flight at the simulator %.0f", srate, slat.Round(time.Millisecond), syncCeil, sflight)
	}
}
