package dispatch_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/sim"
)

// poison rewrites every tenth request of the input so the API refuses it
// with a 400 (max_tokens above the model's maximum): terminal errors mixed in.
func poison(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	n := 0
	for i := range lines {
		if i%10 == 3 {
			lines[i] = bytes.Replace(lines[i], []byte(`"max_tokens":256`), []byte(`"max_tokens":9999999`), 1)
			n++
		}
	}
	if err := os.WriteFile(path, append(bytes.Join(lines, []byte("\n")), '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	return n
}

type faultCase struct {
	name   string
	faults []sim.Fault
	poison bool
	mod    func(*dispatch.Config)
	// complete: the run must end complete (false: it may stop incomplete,
	// e.g. when every org's key is revoked).
	complete bool
	// hit proves the fault struck; a fault that never fired proves nothing.
	hit func(s *rundir.Summary) bool
}

func rateLimited(s *rundir.Summary) bool { return s.RateLimited429 > 0 }
func overloaded(s *rundir.Summary) bool  { return s.Overloaded529 > 0 }
func retried(s *rundir.Summary) bool     { return s.OtherRetries > 0 }
func maybeBilled(s *rundir.Summary) bool { return s.PossibleDuplicateBilling > 0 }
func errored(s *rundir.Summary) bool     { return s.Errored > 0 }
func laneStopped(s *rundir.Summary) bool {
	for _, l := range s.Lanes {
		if l.Disabled != "" {
			return true
		}
	}
	return false
}

func faultCases() []faultCase {
	p := func(kind sim.FaultKind, prob float64) sim.Fault {
		return sim.Fault{Kind: kind, Probability: prob, Start: time.Second, Duration: 10 * time.Minute}
	}
	// For the whole run (about 27 minutes of server time): a CI run under
	// load sent so few requests in the first ten minutes that the 3 % of
	// 529s never struck.
	whole := func(kind sim.FaultKind, prob float64) sim.Fault {
		return sim.Fault{Kind: kind, Probability: prob, Start: time.Second, Duration: 2 * time.Hour}
	}
	all := []sim.Fault{
		// From the start, as the storm cases (at 20 s for 30 s of server
		// time, a loaded machine's run began after it: no 429), and for
		// ten minutes of server time: each key's first requests wait for
		// its organisation to be learnt, and under CI's load that took
		// more than the three minutes (1.8 s) it lasted before.
		{Kind: sim.FaultRateLimitStorm, Duration: 10 * time.Minute, RetryAfter: 3 * time.Second},
		whole(sim.FaultOverloaded, 0.03), whole(sim.FaultServerError, 0.02), whole(sim.FaultServerErrorHTML, 0.02),
		whole(sim.FaultConnectionReset, 0.02), whole(sim.FaultTruncatedBody, 0.02),
		{Kind: sim.FaultSlow, Probability: 0.01, ExtraLatency: 20 * time.Minute},
		{Kind: sim.FaultKeyRevoked, Org: "low_prio", Start: 15 * time.Second},
		{Kind: sim.FaultSpendCap, Org: "batch", Start: 25 * time.Second},
		{Kind: sim.FaultAcceleration},
	}
	// One second of wall time is 100 s of server time at K=100: far above
	// a normal answer, far below the slow fault's 20 minutes.
	timeout := func(c *dispatch.Config) { c.Timeout = time.Second }
	return []faultCase{
		// Storms from the run's start for six minutes of server time
		// (3.6 s of wall time at K=100: the keys' first requests come after
		// their organisation is learnt, later on a loaded machine).
		{name: "storm with retry-after", faults: []sim.Fault{{Kind: sim.FaultRateLimitStorm, Duration: 6 * time.Minute, RetryAfter: 5 * time.Second}}, complete: true, hit: rateLimited},
		{name: "storm without retry-after", faults: []sim.Fault{{Kind: sim.FaultRateLimitStorm, Duration: 6 * time.Minute}}, complete: true, hit: rateLimited},
		{name: "529 bursts", faults: []sim.Fault{p(sim.FaultOverloaded, 0.2)}, complete: true, hit: overloaded},
		{name: "500 json", faults: []sim.Fault{p(sim.FaultServerError, 0.1)}, complete: true, hit: retried},
		{name: "500 html", faults: []sim.Fault{p(sim.FaultServerErrorHTML, 0.1)}, complete: true, hit: retried},
		{name: "reset after billing", faults: []sim.Fault{p(sim.FaultConnectionReset, 0.05)}, complete: true, hit: maybeBilled},
		{name: "truncated body", faults: []sim.Fault{p(sim.FaultTruncatedBody, 0.05)}, complete: true, hit: maybeBilled},
		{name: "slower than the client timeout", faults: []sim.Fault{{Kind: sim.FaultSlow, Probability: 0.05, ExtraLatency: 20 * time.Minute}}, mod: timeout, complete: true, hit: retried},
		{name: "key revoked mid-run", faults: []sim.Fault{{Kind: sim.FaultKeyRevoked, Org: "high_prio", Start: 5 * time.Second}}, complete: true, hit: laneStopped},
		{name: "spend cap on one org", faults: []sim.Fault{{Kind: sim.FaultSpendCap, Org: "batch", Start: 3 * time.Second}}, complete: true, hit: laneStopped},
		{name: "acceleration at start", faults: []sim.Fault{{Kind: sim.FaultAcceleration, FloorRPM: 100, Factor: 2}}, complete: true, hit: rateLimited},
		{name: "invalid requests mixed in", poison: true, complete: true, hit: errored},
		{name: "everything at once", faults: all, poison: true, mod: timeout, complete: true, hit: func(s *rundir.Summary) bool {
			return rateLimited(s) && overloaded(s) && retried(s) && maybeBilled(s) && errored(s) && laneStopped(s)
		}},
		{name: "every key revoked", faults: []sim.Fault{{Kind: sim.FaultKeyRevoked, Start: 5 * time.Second}}, hit: laneStopped},
	}
}

// faultMatrix runs the dispatcher through each of cases (TestFaultMatrix:
// each fault alone, then all together): every item ends with exactly one
// result line or stays pending; no retryable cause ends errored; terminal
// errors carry the API's error; requests billed twice never exceed the
// attempts that may have been billed.
func faultMatrix(t *testing.T, cases []faultCase) {
	t.Parallel()
	const n = 800
	for _, fc := range cases {
		t.Run(fc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, sim.PresetOrigin3Org, 100, n, nil)
			h.faults = fc.faults
			bad := 0
			if fc.poison {
				bad = poison(t, h.input)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			res, err := h.run(ctx, fc.mod)
			if err != nil && !errors.Is(err, dispatch.ErrIncomplete) {
				t.Fatal(err)
			}
			s := res.Summary
			if fc.complete && !res.Complete {
				t.Fatalf("incomplete: %s (%+v)", res.StopReason, s.DataLoss)
			}
			if !fc.complete && (res.Complete || !strings.Contains(res.StopReason, "no usable lane")) {
				t.Fatalf("want an incomplete run stopped for want of a lane, got complete=%v reason %q", res.Complete, res.StopReason)
			}
			if !fc.hit(s) {
				t.Fatalf("the fault never struck: the case proves nothing (%+v)", s)
			}
			if !s.DataLoss.Passed || s.DataLoss.RetryableMarkedTerminal != 0 {
				t.Fatalf("data loss: %+v", s.DataLoss)
			}
			if s.Succeeded+s.Errored+s.Unfinished != n {
				t.Fatalf("%d+%d+%d != %d", s.Succeeded, s.Errored, s.Unfinished, n)
			}
			if s.Errored != int64(bad) && fc.complete {
				t.Fatalf("errored %d, want exactly the %d invalid requests (%v)", s.Errored, bad, s.ErroredByType)
			}
			ids := h.resultIDs()
			if int64(len(ids)) != s.Succeeded+s.Errored {
				t.Fatalf("%d result lines for %d outcomes", len(ids), s.Succeeded+s.Errored)
			}
			for id, k := range ids {
				if k != 1 {
					t.Fatalf("%s has %d result lines", id, k)
				}
			}
			checkErroredLines(t, filepath.Join(h.dir, rundir.ResultsFile))
			led := h.sim.Server.LedgerTotals()
			if led.Duplicates > s.PossibleDuplicateBilling {
				t.Fatalf("the ledger billed %d requests twice; the summary allows for %d", led.Duplicates, s.PossibleDuplicateBilling)
			}
			t.Logf("succeeded %d errored %d unfinished %d; attempts %d, 429s %d, 529s %d, other retries %d; billed twice %d (summary: possible %d)",
				s.Succeeded, s.Errored, s.Unfinished, s.Attempts, s.RateLimited429, s.Overloaded529, s.OtherRetries, led.Duplicates, s.PossibleDuplicateBilling)
		})
	}
}

// checkErroredLines: every errored result carries an API error envelope
// with a terminal type.
func checkErroredLines(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var v struct {
			Result struct {
				Type  string                   `json:"type"`
				Error *anthropic.ErrorEnvelope `json:"error"`
			} `json:"result"`
		}
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatal(err)
		}
		if v.Result.Type != "errored" {
			continue
		}
		if v.Result.Error == nil || v.Result.Error.Type != "error" || v.Result.Error.Error.Message == "" {
			t.Fatalf("errored line without the API's error: %s", sc.Text())
		}
		if anthropic.IsRetryableType(v.Result.Error.Error.Type) {
			t.Fatalf("retryable cause written as an error: %s", sc.Text())
		}
	}
}
