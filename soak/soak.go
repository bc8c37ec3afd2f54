// Package soak holds what a soak of the dispatcher needs besides the
// dispatcher and the simulator: the mix of faults switched on at random
// during a long run (Mix, Schedule) and the check that a run lost nothing
// (Check).
//
// The soak itself is TestSoak in cmd/apidispatch: it runs 'apidispatch run'
// as a child process against the simulator's limit-bound preset, once
// without faults and once with Schedule's faults, and compares the two.
//
// Everything here is safe for concurrent use; nothing keeps state.
package soak

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"time"

	"github.com/apidispatch/apidispatch/sim"
)

// Mix is the faults of a soak. Probabilities are per request to
// POST /v1/messages, over the whole run; times are API-equivalent (at speed
// K they pass K times faster). The zero Mix has no faults; DefaultMix is the
// one the soak uses.
type Mix struct {
	Overloaded529      float64 // 529 overloaded_error
	ServerError500     float64 // 500 api_error with the JSON envelope
	ServerError500HTML float64 // 500 with a proxy's HTML page
	ConnectionReset    float64 // billed, then the connection is reset
	TruncatedBody      float64 // billed, then half the body and a close

	// StormEvery is the mean time between two 429 storms (0: none). Each
	// storm hits one org drawn at random, every request of it, for a time
	// drawn from [StormMin, StormMax], with a retry-after drawn from
	// StormRetryAfter (0 means the storm sends none).
	StormEvery       time.Duration
	StormMin         time.Duration
	StormMax         time.Duration
	StormRetryAfter  []time.Duration
	StormProbability float64 // fraction of the org's requests a storm answers 429 (0: all)

	// SpendCapAt, when positive, is the fraction of the run's requests
	// billed after which one org drawn at random hits its monthly spend
	// cap, for good: its lanes stop and the other orgs finish its work.
	// Schedule names the org; the caller adds Plan.CapFault at that point
	// (AddWhenBilled), since when it comes depends on the run.
	SpendCapAt float64
}

// DefaultMix is the soak's fault mix:
//
//   - 529 overloaded on 1% of requests;
//   - 500 on 1% (0.5% with the JSON envelope, 0.5% with an HTML page);
//   - connection reset after billing on 0.3%, truncated body on 0.3%
//     (both billed: their retries are the requests billed twice);
//   - a 429 storm on one random org every 90 API-seconds on average, each
//     answering every request of that org with a 429 for 2 to 10
//     API-seconds, with retry-after 0 (none), 1, 2 or 5 s;
//   - one random org's monthly spend cap hit once 95% of the items have
//     been billed: its lanes stop for good and the other orgs finish its
//     work.
func DefaultMix() Mix {
	return Mix{
		Overloaded529:      0.01,
		ServerError500:     0.005,
		ServerError500HTML: 0.005,
		ConnectionReset:    0.003,
		TruncatedBody:      0.003,
		StormEvery:         90 * time.Second,
		StormMin:           2 * time.Second,
		StormMax:           10 * time.Second,
		StormRetryAfter:    []time.Duration{0, time.Second, 2 * time.Second, 5 * time.Second},
		SpendCapAt:         0.95,
	}
}

// Plan is the faults Schedule drew for one run.
type Plan struct {
	// Faults are on from the start (the probabilistic ones).
	Faults []sim.Fault
	// Storms are timed from when they are added (FromNow): add them when
	// the run's first request is billed (AddWhenBilled), so that a slow
	// start does not let their windows pass before the run sends.
	Storms []sim.Fault
	// CapOrg is the org whose spend cap is hit once CapAfter of the run's
	// requests are billed ("" when the mix has none).
	CapOrg   string
	CapAfter float64
}

// CapFault is the spend-cap fault of the plan, to add from now on.
func (p Plan) CapFault() sim.Fault {
	return sim.Fault{ID: "spend_cap", Kind: sim.FaultSpendCap, Org: p.CapOrg, FromNow: true}
}

// Schedule draws the faults of a run expected to last span (API time) over
// orgs, from seed: the same arguments give the same plan. Storms start
// within the first 90% of span, the first of them within StormEvery.
func (m Mix) Schedule(seed uint64, orgs []string, span time.Duration) (Plan, error) {
	if len(orgs) == 0 {
		return Plan{}, fmt.Errorf("soak: no orgs")
	}
	rng := rand.New(rand.NewPCG(seed, 0x50a4))
	var p Plan
	always := func(kind sim.FaultKind, prob float64) {
		if prob > 0 {
			p.Faults = append(p.Faults, sim.Fault{ID: string(kind), Kind: kind, Probability: prob})
		}
	}
	always(sim.FaultOverloaded, m.Overloaded529)
	always(sim.FaultServerError, m.ServerError500)
	always(sim.FaultServerErrorHTML, m.ServerError500HTML)
	always(sim.FaultConnectionReset, m.ConnectionReset)
	always(sim.FaultTruncatedBody, m.TruncatedBody)

	if m.StormEvery > 0 && span > 0 {
		if m.StormMin <= 0 || m.StormMax < m.StormMin {
			return Plan{}, fmt.Errorf("soak: storm length [%v, %v] is not a range", m.StormMin, m.StormMax)
		}
		end := span * 9 / 10
		// The first storm comes within StormEvery (so even a short run has
		// one), the next after exponential gaps, as a Poisson process.
		first := time.Duration(rng.Float64() * float64(min(m.StormEvery, end)))
		for at := first; at < end; at += time.Duration(rng.ExpFloat64() * float64(m.StormEvery)) {
			f := sim.Fault{
				ID:          fmt.Sprintf("storm%d", len(p.Storms)+1),
				Kind:        sim.FaultRateLimitStorm,
				Org:         orgs[rng.IntN(len(orgs))],
				Start:       at,
				FromNow:     true,
				Duration:    m.StormMin + time.Duration(rng.Int64N(int64(m.StormMax-m.StormMin)+1)),
				Probability: m.StormProbability,
			}
			if len(m.StormRetryAfter) > 0 {
				f.RetryAfter = m.StormRetryAfter[rng.IntN(len(m.StormRetryAfter))]
			}
			p.Storms = append(p.Storms, f)
		}
	}

	if m.SpendCapAt > 0 {
		p.CapOrg = orgs[rng.IntN(len(orgs))]
		p.CapAfter = m.SpendCapAt
	}
	return p, nil
}

// AddWhenBilled adds faults to s as soon as s has billed at least n
// requests, looking every tick, and reports whether it did; it gives up
// when ctx is done. Run it in a goroutine beside the run and cancel ctx
// when the run ends.
func AddWhenBilled(ctx context.Context, s *sim.Server, n int64, tick time.Duration, faults ...sim.Fault) (bool, error) {
	t := time.NewTicker(tick)
	defer t.Stop()
	for s.LedgerTotals().Requests < n {
		select {
		case <-ctx.Done():
			return false, nil
		case <-t.C:
		}
	}
	if len(faults) == 0 {
		return true, nil
	}
	_, err := s.AddFault(faults...)
	return err == nil, err
}

// Check is what a results file holds against its input.
type Check struct {
	Inputs    int64 // request lines of the input
	Lines     int64 // result lines
	Succeeded int64
	Errored   int64
	// Missing counts inputs with no result line; Repeated, custom_ids with
	// more than one; Unknown, result lines whose custom_id is not an input's.
	Missing  int64
	Repeated int64
	Unknown  int64
	// ErroredByType counts errored lines by the API's error type.
	ErroredByType map[string]int64
	// Examples names a few offending custom_ids, for the failure message.
	Examples []string
}

// Lost reports whether any input lacks exactly one result line.
func (c Check) Lost() bool { return c.Missing+c.Repeated+c.Unknown > 0 || c.Lines != c.Inputs }

// CheckResults reads the custom_ids of the request file input and of the
// results file results, and counts what is missing, repeated or unknown.
// Memory is one map entry per input.
func CheckResults(input, results string) (Check, error) {
	c := Check{ErroredByType: map[string]int64{}}
	seen := map[string]int32{}
	err := eachLine(input, func(b []byte) error {
		var v struct {
			CustomID string `json:"custom_id"`
		}
		if err := json.Unmarshal(b, &v); err != nil {
			return err
		}
		seen[v.CustomID] = 0
		c.Inputs++
		return nil
	})
	if err != nil {
		return c, err
	}
	example := func(id string) {
		if len(c.Examples) < 5 {
			c.Examples = append(c.Examples, id)
		}
	}
	err = eachLine(results, func(b []byte) error {
		var v struct {
			CustomID string `json:"custom_id"`
			Result   struct {
				Type  string `json:"type"`
				Error struct {
					Error struct {
						Type string `json:"type"`
					} `json:"error"`
				} `json:"error"`
			} `json:"result"`
		}
		if err := json.Unmarshal(b, &v); err != nil {
			return err
		}
		c.Lines++
		switch v.Result.Type {
		case "succeeded":
			c.Succeeded++
		case "errored":
			c.Errored++
			c.ErroredByType[v.Result.Error.Error.Type]++
		}
		n, ok := seen[v.CustomID]
		switch {
		case !ok:
			c.Unknown++
			example(v.CustomID)
		case n == 1:
			c.Repeated++
			example(v.CustomID)
		}
		if ok {
			seen[v.CustomID] = n + 1
		}
		return nil
	})
	if err != nil {
		return c, err
	}
	var missing []string
	for id, n := range seen {
		if n == 0 {
			c.Missing++
			if len(missing) < 5 {
				missing = append(missing, id)
			}
		}
	}
	slices.Sort(missing)
	for _, id := range missing {
		example(id)
	}
	return c, nil
}

// eachLine calls fn with every non-blank line of path (without its line
// ending); the slice is valid only during the call.
func eachLine(path string, fn func([]byte) error) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	n := 0
	for sc.Scan() {
		n++
		b := sc.Bytes()
		if len(b) > 0 && b[len(b)-1] == '\r' {
			b = b[:len(b)-1]
		}
		if len(b) == 0 {
			continue
		}
		if err := fn(b); err != nil {
			return fmt.Errorf("%s:%d: %w", path, n, err)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// MeanLatency is the mean of dispatch.latency_ms over the result lines of
// the files at paths, in seconds (0 with no lines).
func MeanLatency(paths ...string) (float64, error) {
	var sum float64
	var n int
	for _, path := range paths {
		f, err := os.Open(path)
		if err != nil {
			return 0, err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<24)
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
		err = sc.Err()
		f.Close()
		if err != nil {
			return 0, err
		}
	}
	if n == 0 {
		return 0, nil
	}
	return sum / float64(n) / 1000, nil
}
