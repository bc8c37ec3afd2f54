package ab

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/internal/numfmt"
	"github.com/apidispatch/apidispatch/rundir"
)

// Markers around the A/B section of a status file. Everything between
// them (markers included) is replaced on every run; the rest of the file
// is never touched.
const (
	StatusStart = "<!-- apidispatch:ab:start -->"
	StatusEnd   = "<!-- apidispatch:ab:end -->"
)

// ErrStatusMarkers is returned by WriteStatusSection for a file whose
// markers are unbalanced (a start without an end after it, or the
// reverse): replacing a guessed range could destroy the user's text.
var ErrStatusMarkers = errors.New("ab: status file has unbalanced apidispatch:ab markers")

// ReplaceSection returns doc with the marked section replaced by section
// (which must carry the markers itself), or with section appended (after a
// blank line) when doc has no markers. Text outside the markers is kept
// byte for byte.
func ReplaceSection(doc, section []byte) ([]byte, error) {
	i := bytes.Index(doc, []byte(StatusStart))
	j := bytes.Index(doc, []byte(StatusEnd))
	switch {
	case i < 0 && j < 0:
		out := bytes.Clone(doc)
		if len(out) > 0 && !bytes.HasSuffix(out, []byte("\n")) {
			out = append(out, '\n')
		}
		if len(out) > 0 {
			out = append(out, '\n')
		}
		out = append(out, section...)
		if !bytes.HasSuffix(out, []byte("\n")) {
			out = append(out, '\n')
		}
		return out, nil
	case i < 0 || j < 0 || j < i:
		return nil, ErrStatusMarkers
	}
	end := j + len(StatusEnd)
	out := make([]byte, 0, len(doc)-end+i+len(section))
	out = append(out, doc[:i]...)
	out = append(out, bytes.TrimRight(section, "\n")...)
	out = append(out, doc[end:]...)
	if end == len(doc) {
		out = append(out, '\n')
	}
	return out, nil
}

// WriteStatusSection writes section into the status file at path between
// the markers (see ReplaceSection), creating the file if it is missing.
// The file is replaced atomically.
func WriteStatusSection(path string, section []byte) error {
	doc, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	out, err := ReplaceSection(doc, section)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	perm := os.FileMode(0o644)
	if st, err := os.Stat(path); err == nil {
		perm = st.Mode().Perm()
	}
	return rundir.WriteFileAtomic(path, out, perm)
}

// StatusSection renders the markdown status section of a result, markers
// included: the verdict, the headline table and where the files are.
func StatusSection(r *Result, dir string) []byte {
	var b strings.Builder
	b.WriteString(StatusStart + "\n")
	title := "LIVE API"
	if r.Simulated {
		title = fmt.Sprintf("SIMULATION (embedded simulator, speed factor K = %g)", r.SpeedFactor)
		if r.Config.SimPreset == "" {
			title = fmt.Sprintf("SIMULATION (simulator at %s, speed factor K = %g)", r.Config.BaseURL, r.SpeedFactor)
		}
	}
	vs := "dispatcher"
	if r.Arms.Batch != nil {
		vs = "dispatcher vs batch"
	}
	fmt.Fprintf(&b, "## A/B validation: legacy single-org vs %s — %s\n\n", vs, title)
	fmt.Fprintf(&b, "%s\n\n", r.Headline)
	fmt.Fprintf(&b, "N = %s per arm, model `%s`, max_tokens %d, order %s, finished %s.\n\n",
		numfmt.Commas(r.Config.N), r.Config.Model, r.Config.MaxTokens, r.Config.Order, r.FinishedAt.Format("2006-01-02 15:04:05 MST"))
	b.WriteString(HeadlineTable(r))
	b.WriteString("\n")
	if len(r.Rounds) > 1 {
		for _, rd := range r.Rounds {
			fmt.Fprintf(&b, "- round %d (%s): speed-up %.2f×", rd.Round, rd.Order, rd.Speedup)
			if rd.Batch != nil {
				fmt.Fprintf(&b, "; batch ÷ dispatcher cost %.3f×, wall %.2f×", rd.BatchCostRatio, rd.BatchVsDispatcherWall)
			}
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "- mean speed-up %.2f×\n\n", r.Speedup)
	}
	batchProj := ""
	if r.Arms.Batch != nil {
		batchProj = fmt.Sprintf(" (batch arm %s at batch prices)", usdF(r.ProjectedCostUSD.BatchArm))
	}
	fmt.Fprintf(&b, "Projected cost %s per arm%s, %s total; actual from usage %s (%.1f%% of the projection).\n",
		usdF(r.ProjectedCostUSD.PerArm), batchProj, usdF(r.ProjectedCostUSD.Total), usdF(r.ProjectedVsActual.ActualTotalUSD), r.ProjectedVsActual.ActualOverProjected*100)
	fmt.Fprintf(&b, "Storm self-test: %s (%s).\n", passFail(r.StormSelfTest.Passed), r.StormSelfTest.Reason)
	if len(r.Problems) > 0 {
		b.WriteString("\nProblems:\n")
		for _, p := range r.Problems {
			fmt.Fprintf(&b, "- %s\n", p)
		}
	}
	if r.Arms.Batch != nil {
		fmt.Fprintf(&b, "\nResult JSON `%s/%s`; run directories `%s/%s/`, `%s/%s/` and `%s/%s/`.\n", dir, ResultFile, dir, ArmBaseline, dir, ArmDispatcher, dir, ArmBatch)
	} else {
		fmt.Fprintf(&b, "\nResult JSON `%s/%s`; run directories `%s/%s/` and `%s/%s/`.\n", dir, ResultFile, dir, ArmBaseline, dir, ArmDispatcher)
	}
	b.WriteString(StatusEnd + "\n")
	return []byte(b.String())
}

// HeadlineTable is the markdown table comparing the arms: baseline and
// dispatcher, and the batch arm's column when it ran.
func HeadlineTable(r *Result) string {
	a, d, c := r.Arms.Baseline, r.Arms.Dispatcher, r.Arms.Batch
	if a == nil || d == nil {
		return "(an arm did not run)\n"
	}
	arms := []*ArmResult{a, d}
	if c != nil {
		arms = append(arms, c)
	}
	var b strings.Builder
	row := func(name string, f func(*ArmResult) string) {
		fmt.Fprintf(&b, "| %s |", name)
		for _, x := range arms {
			fmt.Fprintf(&b, " %s |", f(x))
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "| | baseline (legacy: %s, concurrency %d) | dispatcher (%d orgs) |", r.Config.BaselineOrg, r.Config.BaselineConcurrency, len(r.Config.Orgs))
	if c != nil {
		fmt.Fprintf(&b, " batch (Message Batches, %d orgs) |", len(c.Orgs))
	}
	b.WriteString("\n|---|---|---|")
	if c != nil {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	row("wall-clock, measured", func(x *ArmResult) string { return fmt.Sprintf("%.1f s", x.WallS) })
	if r.Simulated {
		row(fmt.Sprintf("wall-clock, API-equivalent (×%g)", r.SpeedFactor), func(x *ArmResult) string { return dur(x.APIEquivalentWallS) })
		row("requests/min (API-equivalent)", func(x *ArmResult) string { return fmt.Sprintf("%.0f", x.APIEquivalentRequestsPerMin) })
	} else {
		row("requests/min", func(x *ArmResult) string { return fmt.Sprintf("%.0f", x.RequestsPerMin) })
	}
	row("succeeded / errored / unfinished", func(x *ArmResult) string {
		return fmt.Sprintf("%s / %s / %s", numfmt.Commas(x.Succeeded), numfmt.Commas(x.Errored), numfmt.Commas(x.Unfinished))
	})
	row("cost from usage", func(x *ArmResult) string { return usdF(x.CostUSD) })
	if r.Simulated && a.LedgerCostNanos != nil && d.LedgerCostNanos != nil && (c == nil || c.LedgerCostNanos != nil) {
		row("simulator ledger cost", func(x *ArmResult) string {
			m := "≠ usage"
			if x.CostMatchesLedger != nil && *x.CostMatchesLedger {
				m = "= usage to the nano-dollar"
			}
			return fmt.Sprintf("%s (%s)", cost.Nanos(*x.LedgerCostNanos), m)
		})
	}
	row("attempts", func(x *ArmResult) string { return numfmt.Commas(x.Attempts) })
	row("429s / 529s / other retries", func(x *ArmResult) string {
		return fmt.Sprintf("%s / %s / %s", numfmt.Commas(x.RateLimited429), numfmt.Commas(x.Overloaded529), numfmt.Commas(x.OtherRetries))
	})
	lat := func(l ArmResult) string {
		v := l.LatencyMs
		if r.Simulated {
			v = l.APIEquivalentLatencyMs
		}
		return fmt.Sprintf("%.2f / %.2f / %.2f s", float64(v.P50)/1000, float64(v.P95)/1000, float64(v.P99)/1000)
	}
	name := "latency p50 / p95 / p99"
	if r.Simulated {
		name += " (API-equivalent)"
	}
	row(name, func(x *ArmResult) string { return lat(*x) })
	row("per org (succeeded)", func(x *ArmResult) string {
		var parts []string
		for _, o := range x.Orgs {
			parts = append(parts, fmt.Sprintf("%s %s", o, numfmt.Commas(x.ByOrg[o].Succeeded)))
		}
		return strings.Join(parts, ", ")
	})
	row("data-loss check", func(x *ArmResult) string {
		s := passFail(x.DataLoss.Passed)
		if !x.DataLoss.Passed {
			s += fmt.Sprintf(" (missing %d, duplicates %d, retryable marked terminal %d)", x.DataLoss.Missing, x.DataLoss.Duplicates, x.DataLoss.RetryableMarkedTerminal)
		}
		return s
	})
	row("process CPU; host load avg (CPUs)", func(x *ArmResult) string {
		return fmt.Sprintf("%.0f s (%.2f ms/request); %.1f → %.1f (%d)", x.Host.ProcessCPUS, x.Host.CPUMsPerRequest, x.Host.LoadAvgStart, x.Host.LoadAvgEnd, x.Host.CPUs)
	})
	fmt.Fprintf(&b, "| **speed-up (wall A ÷ wall B)** | **%.2f×** | target ≥ %.0f×: **%s** |", r.Speedup, r.TargetSpeedup, metOrNot(r.TargetMet))
	if c != nil {
		fmt.Fprintf(&b, " batch ÷ dispatcher: cost %.3f×, wall %.2f× |", r.BatchCostRatio, r.BatchVsDispatcherWall)
	}
	b.WriteString("\n")
	return b.String()
}

func passFail(ok bool) string {
	if ok {
		return "passed"
	}
	return "FAILED"
}

func metOrNot(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

func usdF(f float64) string { return fmt.Sprintf("$%.4f", f) }

// dur formats API seconds as "1 h 32 min 5 s" style text.
func dur(s float64) string {
	if s < 60 {
		return fmt.Sprintf("%.1f s", s)
	}
	t := int64(s + 0.5)
	h, m, sec := t/3600, t/60%60, t%60
	if h > 0 {
		return fmt.Sprintf("%d h %02d min %02d s", h, m, sec)
	}
	return fmt.Sprintf("%d min %02d s", m, sec)
}
