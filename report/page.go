package report

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/apidispatch/apidispatch/org"
)

// arm is one side of an A/B, or the single run of a run directory.
type arm struct {
	Name      string // "baseline", "dispatcher" or "run"
	Label     string // for people
	Color     string
	Stats     armStats
	TL        *timeline
	Projected num
}

// source is everything read from a directory.
type source struct {
	Name      string // the directory's base name
	AB        *abResult
	Arms      []*arm
	Notes     []string // what could not be read, for the reader
	Simulated truth
	Speed     float64 // the server's speed factor; 1 when unknown
	BaseURL   string
	Harness   []mark // events of the A/B harness itself (DIR/events.jsonl)
}

// Files of a run directory and of an A/B directory.
const (
	summaryFile = "summary.json"
	eventsFile  = "events.jsonl"
	abFile      = "ab.json"
	reportFile  = "report.html"
)

// ErrNotRunDir is returned for a directory that is neither a run directory
// (summary.json or events.jsonl) nor an A/B directory (ab.json).
var ErrNotRunDir = errors.New("not a run directory (no summary.json or events.jsonl) nor an A/B directory (no ab.json)")

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// load reads dir, deciding whether it is an A/B or a single run.
func load(dir string) (*source, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		abs = dir
	}
	src := &source{Name: filepath.Base(abs), Speed: 1}
	switch {
	case exists(filepath.Join(dir, abFile)):
		err = src.loadAB(dir)
	case exists(filepath.Join(dir, summaryFile)) || exists(filepath.Join(dir, eventsFile)):
		err = src.loadRun(dir)
	default:
		return nil, fmt.Errorf("%s: %w", dir, ErrNotRunDir)
	}
	if err != nil {
		return nil, err
	}
	return src, nil
}

// loadArm reads one run directory: its summary, then over it extra (an
// ab.json arm), and its events.
func (src *source) loadArm(name, label, color, dir string, extra []byte) (*arm, error) {
	a := &arm{Name: name, Label: label, Color: color}
	err := readJSON(filepath.Join(dir, summaryFile), &a.Stats)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if extra == nil {
			src.Notes = append(src.Notes, fmt.Sprintf("%s: no %s", label, summaryFile))
		}
	case err != nil:
		src.Notes = append(src.Notes, fmt.Sprintf("%s: %s could not be read (%v)", label, summaryFile, err))
	}
	if extra != nil {
		if err := looseUnmarshal(extra, &a.Stats); err != nil {
			src.Notes = append(src.Notes, fmt.Sprintf("%s: its numbers in %s could not be read (%v)", label, abFile, err))
		}
	}
	tl, err := readTimeline(filepath.Join(dir, eventsFile))
	if err != nil {
		return nil, err
	}
	a.TL = tl
	if len(tl.Rows) == 0 {
		if exists(filepath.Join(dir, eventsFile)) {
			src.Notes = append(src.Notes, fmt.Sprintf("%s: %s holds no samples, so there is nothing to plot over time", label, eventsFile))
		} else {
			src.Notes = append(src.Notes, fmt.Sprintf("%s: no %s, so there is nothing to plot over time", label, eventsFile))
		}
	}
	if tl.Unreadable > 0 {
		src.Notes = append(src.Notes, fmt.Sprintf("%s: %d lines of %s were not readable events and were skipped", label, tl.Unreadable, eventsFile))
	}
	return a, nil
}

func (src *source) loadRun(dir string) error {
	a, err := src.loadArm("run", "This run", colorRun, dir, nil)
	if err != nil {
		return err
	}
	src.Arms = []*arm{a}
	src.Speed = firstPositive(a.Stats.Speed, a.TL.Speed)
	src.BaseURL = a.TL.BaseURL
	return nil
}

func (src *source) loadAB(dir string) error {
	var ab abResult
	if err := readJSON(filepath.Join(dir, abFile), &ab); err != nil {
		return err
	}
	src.AB = &ab
	src.Simulated = ab.Simulated
	var speeds []num
	speeds = append(speeds, ab.SpeedFactor)
	for _, def := range []struct{ name, label, color string }{
		{"baseline", "Baseline (legacy)", colorBaseline},
		{"dispatcher", "Dispatcher", colorDispatcher},
	} {
		raw := ab.Arms[def.name]
		sub := filepath.Join(dir, def.name)
		var peek armIn
		if raw != nil && looseUnmarshal(raw, &peek) == nil && filepath.IsLocal(string(peek.Dir)) {
			sub = filepath.Join(dir, string(peek.Dir))
		}
		if !exists(sub) && raw == nil {
			src.Notes = append(src.Notes, fmt.Sprintf("%s: no %s/ directory and no numbers in %s", def.label, def.name, abFile))
			continue
		}
		a, err := src.loadArm(def.name, def.label, def.color, sub, raw)
		if err != nil {
			return err
		}
		a.Projected = ab.Projected.PerArm.get(def.name)
		src.Arms = append(src.Arms, a)
		speeds = append(speeds, a.Stats.Speed, a.TL.Speed)
		if src.BaseURL == "" {
			src.BaseURL = a.TL.BaseURL
		}
	}
	src.Speed = firstPositive(speeds...)
	if exists(filepath.Join(dir, eventsFile)) {
		tl, err := readTimeline(filepath.Join(dir, eventsFile))
		if err != nil {
			return err
		}
		src.Harness = tl.Marks
	}
	return nil
}

// firstPositive is the first known value > 0, else 1.
func firstPositive(ns ...num) float64 {
	for _, n := range ns {
		if n.OK && n.V > 0 && !math.IsInf(n.V, 0) {
			return n.V
		}
	}
	return 1
}

// Colours. Arms: a warm grey-orange for the legacy baseline, blue for the
// dispatcher. Orgs take the palette in order of their names.
const (
	colorBaseline   = "#d9730d"
	colorDispatcher = "#1f6fd1"
	colorRun        = "#1f6fd1"
	colorTotal      = "#333333"
	color429        = "#d62728"
	colorRetry      = "#f2a93b"
	colorHeld       = "#f6c6c6"
	colorOthers     = "#e7a90b"
	colorLimit      = "#222222"
	colorCap        = "#999999"
)

var orgPalette = []string{"#1f6fd1", "#2ca02c", "#9467bd", "#d62728", "#17becf", "#8c564b", "#e377c2", "#bcbd22", "#7f7f7f", "#ff7f0e"}

// page is the model the template renders.
type page struct {
	Title    string
	Subtitle string
	Banner   *banner
	Cards    []card
	Table    table
	Facts    []fact
	Rounds   *table
	Sections []section
	OrgTable *table
	Routes   *table
	Lanes    *table
	Events   []eventList
	Notes    []string
}

type banner struct {
	Class string // "sim" or "live" or "info"
	Head  string
	Text  string
}

type card struct {
	Label, Value, Sub string
	Class             string // "good", "bad" or ""
}

type table struct {
	Class string
	Head  []cell
	Rows  []tableRow
}

type tableRow struct {
	Label string
	Group bool // a heading row spanning the table
	Cells []cell
}

type cell struct {
	Text  string
	Class string
}

type fact struct {
	Label, Value string
	Class        string
}

type section struct {
	Title  string
	Note   string
	Charts []chart
	Grid   string // "", "two" or "three": how many charts a row
}

type eventList struct {
	Arm   string
	Items []eventItem
	More  int
}

type eventItem struct {
	At, Kind, Note string
	Class          string
}

// clean makes text from the inputs safe to show: API-key-like text is
// redacted (inputs hold fingerprints only; this is a second line of
// defence) and very long text is cut. (HTML escaping is the template's.)
func clean(s string) string {
	s = org.Scrub(s)
	if r := []rune(s); len(r) > 300 {
		s = string(r[:300]) + "…"
	}
	return s
}

var fingerprintRE = regexp.MustCompile(`^[0-9a-f]{8,16}$`)

// fingerprint shows a key fingerprint, or "—" for anything that is not one.
func fingerprint(s string) string {
	if fingerprintRE.MatchString(s) {
		return s
	}
	return "—"
}

// build turns what was read into the page.
func build(src *source) *page {
	p := &page{}
	if src.AB != nil {
		for _, pr := range src.AB.Problems {
			p.Notes = append(p.Notes, "Problem reported by ab: "+clean(string(pr)))
		}
	}
	for _, n := range src.Notes {
		p.Notes = append(p.Notes, clean(n))
	}
	p.Banner = src.banner()
	if src.AB != nil {
		p.Title = "A/B: legacy single-org path vs the dispatcher"
	} else {
		p.Title = "Run report"
	}
	var sub []string
	sub = append(sub, clean(src.Name))
	if src.AB != nil {
		if m := cmp.Or(src.AB.Model, src.AB.Config.Model); m != "" {
			sub = append(sub, "model "+clean(string(m)))
		}
		if n := firstKnown(src.AB.N, src.AB.Config.N); n.OK {
			sub = append(sub, "N = "+fmtInt(n.V))
		}
		c := src.AB.Config
		if c.BaselineOrg != "" {
			b := "baseline: org " + clean(string(c.BaselineOrg)) + " alone"
			if c.BaselineConcurrency.OK {
				b += " at a fixed concurrency of " + fmtInt(c.BaselineConcurrency.V)
			}
			sub = append(sub, b)
		}
		if len(c.Orgs) > 0 {
			var names []string
			for _, o := range c.Orgs {
				names = append(names, clean(string(o.Org)))
			}
			sub = append(sub, "dispatcher: "+plural(float64(len(names)), "org", "orgs")+" ("+strings.Join(names, ", ")+")")
		}
	} else if len(src.Arms) > 0 && src.Arms[0].Stats.N.OK {
		sub = append(sub, "N = "+fmtInt(src.Arms[0].Stats.N.V))
	}
	p.Subtitle = strings.Join(sub, " · ")
	p.Cards = src.cards()
	p.Table = src.headline()
	p.Facts = src.facts()
	p.Rounds = src.roundTable()
	p.Sections = src.sections()
	p.OrgTable = src.orgTable()
	p.Routes = src.routeTable()
	p.Lanes = src.laneTable()
	if l := eventsOf("A/B harness (UTC)", src.Harness, true); len(l.Items) > 0 {
		p.Events = append(p.Events, l)
	}
	for _, a := range src.Arms {
		if l := eventsOf(a.Label, a.TL.Marks, false); len(l.Items) > 0 {
			p.Events = append(p.Events, l)
		}
	}
	return p
}

func firstKnown(ns ...num) num {
	for _, n := range ns {
		if n.OK {
			return n
		}
	}
	return num{}
}

func (src *source) banner() *banner {
	k := fmtFactor(src.Speed)
	switch {
	case src.Simulated.OK && src.Simulated.V:
		b := &banner{Class: "sim", Head: "Simulation — no real API calls were made."}
		b.Text = "Every request of both arms was answered by apidispatch's built-in simulator of the Messages API"
		if src.AB != nil && src.AB.Config.SimPreset != "" {
			b.Text += " (preset " + clean(string(src.AB.Config.SimPreset)) + ")"
		}
		b.Text += "."
		if src.Speed > 1 {
			b.Head = fmt.Sprintf("Simulation at speed factor K = %s — no real API calls were made.", k)
			b.Text += fmt.Sprintf(" The simulator ran %s× faster than the real API (limits ×%s, latencies ÷%s), so measured wall-clock times are 1/%s of what the same work would take on the API; API-equivalent times (measured × %s) are shown beside them and under each time axis.", k, k, k, k, k)
		}
		return b
	case src.Simulated.OK:
		b := &banner{Class: "live", Head: "Live run against the Anthropic API.", Text: "Times and costs are real."}
		if src.Speed > 1 {
			b.Text += fmt.Sprintf(" A speed factor of %s is recorded; API-equivalent times are measured × %s.", k, k)
		}
		return b
	}
	local := isLoopback(src.BaseURL)
	switch {
	case src.Speed > 1:
		b := &banner{Class: "sim", Head: fmt.Sprintf("Time-compressed run: server speed factor K = %s.", k),
			Text: fmt.Sprintf("The server ran %s× faster than the real API, so measured times are 1/%s of the real thing; API-equivalent times (measured × %s) are shown beside them and under each time axis.", k, k, k)}
		if local {
			b.Head = fmt.Sprintf("Simulation (local server) at speed factor K = %s.", k)
		}
		return b
	case local:
		return &banner{Class: "sim", Head: "Run against a local server (the simulator, most likely) at real speed."}
	}
	return nil
}

// isLoopback reports whether a base URL points at this machine.
func isLoopback(raw string) bool {
	if raw == "" {
		return false
	}
	u, err := url.Parse(raw)
	if err != nil {
		return false
	}
	h := u.Hostname()
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// speedup is wall A ÷ wall B: from ab.json, else computed from the walls.
func (src *source) speedup() (v float64, ok, computed bool) {
	if src.AB == nil {
		return 0, false, false
	}
	if src.AB.Speedup.OK && src.AB.Speedup.V > 0 && !math.IsInf(src.AB.Speedup.V, 0) {
		return src.AB.Speedup.V, true, false
	}
	a, b := src.arm("baseline"), src.arm("dispatcher")
	if a != nil && b != nil && a.Stats.WallS.OK && b.Stats.WallS.OK && b.Stats.WallS.V > 0 {
		return a.Stats.WallS.V / b.Stats.WallS.V, true, true
	}
	return 0, false, false
}

func (src *source) target() float64 {
	if src.AB != nil {
		if t := firstKnown(src.AB.TargetSpeedup, src.AB.Target); t.OK && t.V > 0 {
			return t.V
		}
	}
	return 5
}

func (src *source) targetMet() (met, known bool) {
	if src.AB == nil {
		return false, false
	}
	if src.AB.TargetMet.OK {
		return src.AB.TargetMet.V, true
	}
	if v, ok, _ := src.speedup(); ok {
		return v >= src.target(), true
	}
	return false, false
}

func (src *source) arm(name string) *arm {
	for _, a := range src.Arms {
		if a.Name == name {
			return a
		}
	}
	return nil
}

// apiEq is an arm's API-equivalent wall-clock.
func (src *source) apiEq(a *arm) num {
	if a.Stats.APIEqWallS.OK {
		return a.Stats.APIEqWallS
	}
	if a.Stats.WallS.OK && src.Speed > 1 {
		return num{a.Stats.WallS.V * src.Speed, true}
	}
	return num{}
}

func (src *source) cards() []card {
	var cs []card
	if src.AB != nil {
		c := card{Label: "Speed-up (wall A ÷ wall B)", Value: "—"}
		if v, ok, computed := src.speedup(); ok {
			c.Value = fmtFactor(v) + "×"
			if computed {
				c.Sub = "computed from the two wall-clock times; "
			}
		}
		if met, known := src.targetMet(); known {
			if met {
				c.Sub += "target ≥ " + fmtFactor(src.target()) + "× met"
				c.Class = "good"
			} else {
				c.Sub += "target ≥ " + fmtFactor(src.target()) + "× NOT met"
				c.Class = "bad"
			}
		}
		cs = append(cs, c)
	}
	var walls, eqs, costs, rates []string
	for _, a := range src.Arms {
		walls = append(walls, fmtDurNum(a.Stats.WallS))
		eqs = append(eqs, fmtDurNum(src.apiEq(a)))
		costs = append(costs, fmtUSDNum(a.Stats.Cost.Total))
		rates = append(rates, fmtRate(a.Stats.RequestsPerMin))
	}
	sep := " → "
	wall := card{Label: "Wall-clock", Value: strings.Join(walls, sep)}
	if src.Speed > 1 {
		wall.Label = "Wall-clock, measured"
		wall.Sub = "API-equivalent: " + strings.Join(eqs, sep)
	}
	if src.AB != nil {
		wall.Label += " (baseline → dispatcher)"
	}
	cs = append(cs, wall)
	cs = append(cs, card{Label: "Requests per minute", Value: strings.Join(rates, sep)})
	costCard := card{Label: "Cost from usage", Value: strings.Join(costs, " + ")}
	if src.AB != nil {
		costCard.Label += " (baseline + dispatcher)"
		if t := src.AB.Projected.Total; t.OK {
			costCard.Sub = "projected " + fmtUSD(t.V) + " in all"
		}
	}
	cs = append(cs, costCard)
	dl := card{Label: "Data-loss check", Value: "—"}
	var failed []string
	known := 0
	for _, a := range src.Arms {
		if a.Stats.DataLoss.Passed.OK {
			known++
			if !a.Stats.DataLoss.Passed.V {
				failed = append(failed, a.Label)
			}
		}
	}
	switch {
	case len(failed) > 0:
		dl.Value, dl.Class, dl.Sub = "FAILED", "bad", strings.Join(failed, ", ")
	case known > 0 && known == len(src.Arms):
		dl.Value, dl.Class = "passed", "good"
		dl.Sub = "no item lost or duplicated"
	case known > 0:
		dl.Value, dl.Sub = "passed", "not reported for every arm"
	}
	cs = append(cs, dl)
	return cs
}

func (src *source) headline() table {
	t := table{Class: "headline", Head: []cell{{}}}
	for _, a := range src.Arms {
		t.Head = append(t.Head, cell{Text: a.Label})
	}
	row := func(label string, f func(a *arm) cell) {
		r := tableRow{Label: label}
		for _, a := range src.Arms {
			r.Cells = append(r.Cells, f(a))
		}
		t.Rows = append(t.Rows, r)
	}
	plain := func(s string) cell { return cell{Text: s} }
	row("Wall-clock, measured", func(a *arm) cell { return plain(fmtDurNum(a.Stats.WallS)) })
	if src.Speed > 1 || anyArm(src.Arms, func(a *arm) bool { return a.Stats.APIEqWallS.OK }) {
		row("Wall-clock, API-equivalent", func(a *arm) cell { return plain(fmtDurNum(src.apiEq(a))) })
	}
	if anyArm(src.Arms, func(a *arm) bool { return a.Stats.SetupS.OK }) {
		row("Setup before the first request", func(a *arm) cell { return plain(fmtDurNum(a.Stats.SetupS)) })
	}
	row("Requests per minute", func(a *arm) cell { return plain(fmtRate(a.Stats.RequestsPerMin)) })
	if src.Speed > 1 && anyArm(src.Arms, func(a *arm) bool { return a.Stats.APIEqRequestsPerMin.OK }) {
		row("Requests per minute, API-equivalent", func(a *arm) cell { return plain(fmtRate(a.Stats.APIEqRequestsPerMin)) })
	}
	row("Succeeded", func(a *arm) cell { return plain(fmtIntNum(a.Stats.Succeeded)) })
	row("Errored", func(a *arm) cell {
		c := plain(fmtIntNum(a.Stats.Errored))
		if a.Stats.Errored.V > 0 {
			c.Class = "warn"
		}
		return c
	})
	row("Unfinished", func(a *arm) cell {
		c := plain(fmtIntNum(a.Stats.Unfinished))
		if a.Stats.Unfinished.V > 0 {
			c.Class = "warn"
		}
		return c
	})
	row("Cost from usage", func(a *arm) cell { return plain(fmtUSDNum(a.Stats.Cost.Total)) })
	if anyArm(src.Arms, func(a *arm) bool { return a.Stats.LedgerCostUSD.OK }) {
		row("Cost in the simulator's ledger", func(a *arm) cell {
			l, u := a.Stats.LedgerCostUSD, a.Stats.Cost.Total
			c := plain(fmtUSDNum(l))
			match := a.Stats.CostMatchesLedger
			if !match.OK && l.OK && u.OK {
				match = truth{math.Abs(l.V-u.V) <= max(1e-6, 1e-9*math.Abs(l.V)), true}
			}
			if l.OK && match.OK {
				if match.V {
					c.Text += " ✓ equal"
					c.Class = "good"
				} else {
					c.Text += " ≠ usage"
					c.Class = "bad"
				}
			}
			return c
		})
	}
	if anyArm(src.Arms, func(a *arm) bool { return a.Projected.OK }) {
		row("Projected cost", func(a *arm) cell { return plain(fmtUSDNum(a.Projected)) })
	}
	row("429 responses", func(a *arm) cell { return plain(fmtIntNum(a.Stats.RateLimited429)) })
	if anyArm(src.Arms, func(a *arm) bool { return a.Stats.Overloaded529.OK || a.Stats.OtherRetries.OK }) {
		row("Other retries (529 and others)", func(a *arm) cell {
			s := a.Stats
			if !s.Overloaded529.OK && !s.OtherRetries.OK {
				return plain("—")
			}
			return plain(fmtInt(s.Overloaded529.V + s.OtherRetries.V))
		})
	}
	row("Latency p50 / p95 / p99", func(a *arm) cell { return plain(fmtLatency(a.Stats.LatencyMs)) })
	if src.Speed > 1 && anyArm(src.Arms, func(a *arm) bool { return a.Stats.APIEqLatencyMs.P50.OK }) {
		row("Latency, API-equivalent", func(a *arm) cell { return plain(fmtLatency(a.Stats.APIEqLatencyMs)) })
	}
	row("Data-loss check", func(a *arm) cell {
		d := a.Stats.DataLoss
		switch {
		case !d.Passed.OK:
			return plain("—")
		case d.Passed.V:
			return cell{Text: "passed", Class: "good"}
		}
		var why []string
		for _, x := range []struct {
			n    num
			what string
		}{{d.Missing, "missing"}, {d.Duplicates, "duplicated"}, {d.RetryableMarkedTerminal, "retryable marked terminal"}} {
			if x.n.OK && x.n.V > 0 {
				why = append(why, fmtInt(x.n.V)+" "+x.what)
			}
		}
		text := "FAILED"
		if len(why) > 0 {
			text += ": " + strings.Join(why, ", ")
		}
		return cell{Text: text, Class: "bad"}
	})
	if anyArm(src.Arms, func(a *arm) bool { return a.Stats.Note != "" || a.Stats.Reused.V || a.Stats.Resumed.V }) {
		row("Note", func(a *arm) cell {
			var n []string
			if a.Stats.Reused.V {
				n = append(n, "reused: complete from an earlier run, not run again")
			}
			if a.Stats.Resumed.V {
				n = append(n, "resumed: the wall-clock covers only the rest of the run")
			}
			if a.Stats.Note != "" {
				n = append(n, clean(string(a.Stats.Note)))
			}
			return cell{Text: cmp.Or(strings.Join(n, "; "), "—"), Class: "warn"}
		})
	}
	if anyArm(src.Arms, func(a *arm) bool { return a.Stats.StopReason != "" }) {
		row("Stopped because", func(a *arm) cell { return cell{Text: clean(string(a.Stats.StopReason)), Class: "warn"} })
	}
	return t
}

func fmtLatency(l latency) string {
	if !l.P50.OK && !l.P95.OK && !l.P99.OK {
		return "—"
	}
	return fmtMsNum(l.P50) + " / " + fmtMsNum(l.P95) + " / " + fmtMsNum(l.P99)
}

func anyArm(arms []*arm, f func(*arm) bool) bool {
	return slices.ContainsFunc(arms, f)
}

// facts are the A/B's conclusions under the table.
func (src *source) facts() []fact {
	if src.AB == nil {
		return nil
	}
	var fs []fact
	if h := src.AB.Headline; h != "" {
		fs = append(fs, fact{Label: "Verdict", Value: clean(string(h))})
	}
	if v, ok, computed := src.speedup(); ok {
		f := fact{Label: "Speed-up (baseline wall-clock ÷ dispatcher wall-clock)", Value: fmtFactor(v) + "×"}
		if computed {
			f.Value += ", computed here: ab.json has none"
		}
		fs = append(fs, f)
	} else {
		fs = append(fs, fact{Label: "Speed-up", Value: "— (not known: a wall-clock time is missing)"})
	}
	if met, known := src.targetMet(); known {
		f := fact{Label: "Target ≥ " + fmtFactor(src.target()) + "×", Value: "met", Class: "good"}
		if !met {
			f.Value, f.Class = "not met", "bad"
		}
		fs = append(fs, f)
	}
	if v := src.AB.SpeedupInclSetup; v.OK && v.V > 0 {
		fs = append(fs, fact{Label: "Speed-up counting each arm's setup", Value: fmtFactor(v.V) + "×"})
	}
	if st := src.AB.StormSelfTest; st.Passed.OK {
		f := fact{Label: "Storm self-test (no item may be dropped under a 429 storm)", Value: "passed", Class: "good"}
		if st.N.OK && st.RateLimited429.OK {
			f.Value += " (" + fmtInt(st.N.V) + " items, " + fmtInt(st.RateLimited429.V) + " 429s)"
		}
		if !st.Passed.V {
			f.Value, f.Class = "FAILED", "bad"
			if st.Reason != "" {
				f.Value += ": " + clean(string(st.Reason))
			}
		}
		fs = append(fs, f)
	}
	if c := src.AB.Complete; c.OK && !c.V {
		fs = append(fs, fact{Label: "Complete", Value: "no: an arm did not finish", Class: "bad"})
	}
	var actual float64
	all := len(src.Arms) > 0
	for _, a := range src.Arms {
		if !a.Stats.Cost.Total.OK {
			all = false
		}
		actual += a.Stats.Cost.Total.V
	}
	proj := src.AB.Projected.Total
	switch {
	case proj.OK && all:
		v := "projected " + fmtUSD(proj.V) + ", actual " + fmtUSD(actual)
		if proj.V > 0 {
			v += fmt.Sprintf(" (%s of the projection)", fmtPercent(actual/proj.V))
		}
		fs = append(fs, fact{Label: "Cost, both arms", Value: v})
	case proj.OK:
		fs = append(fs, fact{Label: "Cost, both arms", Value: "projected " + fmtUSD(proj.V) + ", actual not known"})
	case all:
		fs = append(fs, fact{Label: "Cost, both arms", Value: "actual " + fmtUSD(actual) + " (no projection recorded)"})
	}
	if pa := src.AB.Projected.PerArm.All; pa.OK {
		fs = append(fs, fact{Label: "Projected cost per arm", Value: fmtUSD(pa.V)})
	}
	return fs
}

// roundTable lists the rounds of an A/B run with --order abab; nil for
// one round.
func (src *source) roundTable() *table {
	if src.AB == nil || len(src.AB.Rounds) < 2 {
		return nil
	}
	t := &table{Head: []cell{{Text: "Round"}, {Text: "Order", Class: "t"}, {Text: "Baseline wall-clock"}, {Text: "Dispatcher wall-clock"}, {Text: "Speed-up"}}}
	for i, r := range src.AB.Rounds {
		label := fmtIntNum(r.Round)
		if !r.Round.OK {
			label = fmtInt(float64(i + 1))
		}
		sp := "—"
		if r.Speedup.OK {
			sp = fmtFactor(r.Speedup.V) + "×"
		}
		t.Rows = append(t.Rows, tableRow{Label: label, Cells: []cell{
			{Text: cmp.Or(clean(string(r.Order)), "—"), Class: "t"}, {Text: fmtDurNum(r.Baseline.WallS)}, {Text: fmtDurNum(r.Dispatcher.WallS)}, {Text: sp},
		}})
	}
	return t
}

// orgColors gives every org seen in any arm a colour, in name order.
func (src *source) orgColors() map[string]string {
	var names []string
	for _, a := range src.Arms {
		names = append(names, a.TL.Orgs...)
		for o := range a.Stats.ByOrg {
			names = append(names, o)
		}
		for _, l := range a.TL.Lanes {
			names = append(names, l.Org)
		}
	}
	slices.Sort(names)
	names = slices.Compact(names)
	m := map[string]string{}
	for i, n := range names {
		m[n] = orgPalette[i%len(orgPalette)]
	}
	return m
}

func (src *source) sections() []section {
	colors := src.orgColors()
	var out []section
	speed := src.Speed
	ab := src.AB != nil && len(src.Arms) > 1

	// Completions per second.
	if ab {
		tc := timeChart{title: "Completions per second, both arms", size: sizeFull, speed: speed,
			empty: "no samples in either arm's events.jsonl"}
		for _, a := range src.Arms {
			tc.lines = append(tc.lines, lineLayer{name: a.Label, color: a.Color, width: 2.2, pts: rateSeries(a.TL.Rows, -1, MaxPoints), area: true})
		}
		tc.note = "each arm from its own start, on one time axis"
		out = append(out, section{Title: "Throughput", Charts: []chart{tc.build()},
			Note: "Items completed (succeeded or errored) per second, averaged over each sample interval."})
		var per []chart
		for _, a := range src.Arms {
			per = append(per, byOrgChart(a, colors, speed, sizeHalf))
		}
		out = append(out, section{Title: "Completions per second by org", Charts: per, Grid: "two",
			Note: "Each arm on its own time axis."})
		cc := timeChart{title: "Cumulative cost from usage", size: sizeFull, speed: speed, yFmt: fmtUSDAxis,
			empty: "no cost in the samples", note: "each arm from its own start, on one time axis"}
		for _, a := range src.Arms {
			if a.TL.HasCost {
				cc.lines = append(cc.lines, lineLayer{name: a.Label, color: a.Color, width: 2.2,
					pts: fromZero(gaugeSeries(a.TL.Rows, MaxPoints, func(r sampleRow) float64 { return r.Cost }))})
			}
		}
		out = append(out, section{Title: "Cost", Charts: []chart{cc.build()}})
		var rc []chart
		for _, a := range src.Arms {
			rc = append(rc, retryChart(a, speed, sizeHalf))
		}
		out = append(out, section{Title: "429s and other retries", Charts: rc, Grid: "two",
			Note: "Responses that were retried, counted per bar of time. Each arm on its own time axis."})
	} else if len(src.Arms) > 0 {
		a := src.Arms[0]
		out = append(out, section{Title: "Throughput", Charts: []chart{byOrgChart(a, colors, speed, sizeFull)},
			Note: "Items completed (succeeded or errored) per second, averaged over each sample interval."})
		cc := timeChart{title: "Cumulative cost from usage", size: sizeHalf, speed: speed, yFmt: fmtUSDAxis, empty: "no cost in the samples"}
		if a.TL.HasCost {
			cc.lines = append(cc.lines, lineLayer{name: "cost", color: a.Color, width: 2.2, area: true,
				pts: fromZero(gaugeSeries(a.TL.Rows, MaxPoints, func(r sampleRow) float64 { return r.Cost }))})
		}
		out = append(out, section{Title: "Retries and cost", Grid: "two", Charts: []chart{retryChart(a, speed, sizeHalf), cc.build()}})
	}

	if len(src.Arms) == 0 {
		tc := timeChart{title: "Completions per second", size: sizeFull, empty: "no arm has data to plot"}
		out = append(out, section{Title: "Throughput", Charts: []chart{tc.build()}})
	}

	// Lanes.
	for _, a := range src.Arms {
		title := "Lanes: in flight and limit"
		if ab {
			title += " — " + a.Label
		}
		out = append(out, section{Title: title, Grid: "three", Charts: laneCharts(a, colors, speed),
			Note: "One chart per (org, model pool) lane: requests in flight (shaded), the AIMD limit (line) and the polite cap (dashed). Red bands: holding for a retry-after; amber strip: colleagues seen drawing on the org."})
	}
	return out
}

// maxRules is how many event lines a chart draws at most.
const maxRules = 60

// fromZero starts a series that is zero when a run starts (cost so far,
// requests in flight) at (0, 0), so it does not seem to begin at its first
// sample a second in.
func fromZero(pts []point) []point {
	if len(pts) == 0 || pts[0].X <= 0 {
		return pts
	}
	return append([]point{{0, 0}}, pts...)
}

// rules marks the resumes and lane stops of an arm on its charts.
func rules(tl *timeline) []ruleLayer {
	rs := rulesAll(tl)
	return rs[:min(len(rs), maxRules)]
}

func rulesAll(tl *timeline) []ruleLayer {
	var rs []ruleLayer
	for _, t := range tl.Resumes {
		rs = append(rs, ruleLayer{t: t, title: "resumed at " + fmtClock(t, 1)})
	}
	for _, m := range tl.Marks {
		switch m.Kind {
		case "lane", "failure", "blocked", "incomplete":
			rs = append(rs, ruleLayer{t: m.T, title: m.Kind + " at " + fmtClock(m.T, 1) + ": " + clean(m.Note)})
		}
	}
	return rs
}

func byOrgChart(a *arm, colors map[string]string, speed float64, size chartSize) chart {
	tc := timeChart{title: "Completions per second — " + a.Label, size: size, speed: speed, rules: rules(a.TL),
		empty: "no samples in events.jsonl"}
	if size == sizeFull {
		tc.title = "Completions per second"
	}
	tl := a.TL
	if len(tl.Orgs) != 1 {
		tc.lines = append(tc.lines, lineLayer{name: "all orgs", color: colorTotal, width: 2.4, pts: rateSeries(tl.Rows, -1, MaxPoints)})
	}
	for i, o := range tl.Orgs {
		w := 1.6
		if len(tl.Orgs) == 1 {
			w = 2.4
		}
		tc.lines = append(tc.lines, lineLayer{name: "org " + clean(o), color: colors[o], width: w, pts: rateSeries(tl.Rows, i, MaxPoints)})
	}
	return tc.build()
}

func retryChart(a *arm, speed float64, size chartSize) chart {
	tl := a.TL
	tc := timeChart{title: "Retried responses — " + a.Label, size: size, speed: speed, rules: rules(tl)}
	if a.Name == "run" {
		tc.title = "Retried responses"
	}
	if !tl.Has429 && !tl.HasRetries {
		tc.empty = "no retry counts in the samples"
		return tc.build()
	}
	maxBins := 120
	if size == sizeFull {
		maxBins = 240
	}
	bins, width := retryBins(tl.Rows, maxBins)
	tc.bars = &barLayer{bins: bins, colorA: color429, colorB: colorRetry, nameA: "429 rate limited", nameB: "other retries (529, 5xx, …)"}
	var n429, nOther float64
	if len(tl.Rows) > 0 {
		last := tl.Rows[len(tl.Rows)-1]
		n429, nOther = last.R429, last.Retries
	}
	tc.note = fmt.Sprintf("per %s bar · %s 429s, %s other in all", fmtClock(width, 1), fmtInt(n429), fmtInt(nOther))
	if n429+nOther == 0 {
		tc.empty = "no 429s and no other retries in this run"
		tc.bars = &barLayer{nameA: tc.bars.nameA, nameB: tc.bars.nameB, colorA: color429, colorB: colorRetry}
	}
	return tc.build()
}

func laneCharts(a *arm, colors map[string]string, speed float64) []chart {
	tl := a.TL
	xMax := tl.Duration()
	final := map[string]laneFinal{}
	for _, l := range a.Stats.Lanes {
		final[string(l.Org)+"\x00"+string(l.Pool)] = l
	}
	var out []chart
	lanes := slices.Clone(tl.Lanes)
	slices.SortStableFunc(lanes, func(x, y *laneTrack) int {
		return cmp.Or(cmp.Compare(x.Pool, y.Pool), cmp.Compare(x.Org, y.Org))
	})
	rs := rules(tl)
	for _, l := range lanes {
		tc := timeChart{title: clean(l.Org) + " · " + clean(l.Pool), size: sizeSmall, speed: speed, xMax: xMax, yMin: l.Cap, rules: rs,
			empty: "no samples for this lane"}
		color := cmp.Or(colors[l.Org], colorDispatcher)
		tc.lines = append(tc.lines,
			lineLayer{name: "in flight", color: color, width: 1.4, pts: fromZero(l.InFlight), area: true},
			lineLayer{name: "limit", color: colorLimit, width: 1.4, pts: l.Limit})
		if l.Cap > 0 && xMax > 0 {
			tc.lines = append(tc.lines, lineLayer{name: "cap", color: colorCap, width: 1.2, dash: "5 4", pts: []point{{0, l.Cap}, {xMax, l.Cap}}})
		}
		if len(l.Held) > 0 {
			tc.bands = append(tc.bands, bandLayer{name: "held", color: colorHeld, spans: l.Held})
		}
		if len(l.Others) > 0 {
			tc.bands = append(tc.bands, bandLayer{name: "colleagues seen", color: colorOthers, spans: l.Others, strip: true})
		}
		var note []string
		if f, ok := final[l.Org+"\x00"+l.Pool]; ok {
			if f.Cap.OK {
				note = append(note, "cap "+fmtInt(f.Cap.V))
			}
			if lim := firstKnown(f.FinalLimit, f.Limit); lim.OK {
				note = append(note, "final limit "+fmtCount(math.Round(lim.V*10)/10))
			}
			if f.MaxInFlight.OK {
				note = append(note, "peak "+fmtInt(f.MaxInFlight.V))
			}
			if f.Cuts.OK {
				note = append(note, plural(f.Cuts.V, "cut", "cuts"))
			}
			if f.HeldS.OK && f.HeldS.V > 0 {
				note = append(note, "held "+fmtDuration(f.HeldS.V))
			}
		} else if l.Cap > 0 {
			note = append(note, "cap "+fmtInt(l.Cap))
		}
		if l.Disabled != "" {
			note = append(note, "stopped: "+clean(l.Disabled))
		}
		tc.note = strings.Join(note, " · ")
		out = append(out, tc.build())
	}
	if len(lanes) == 0 {
		// No per-lane data (an arm that does not report lanes): the total.
		tc := timeChart{title: "all requests in flight", size: sizeSmall, speed: speed, rules: rs,
			empty: "no lane or in-flight samples in events.jsonl"}
		if tl.HasInFlight {
			tc.lines = append(tc.lines, lineLayer{name: "in flight", color: a.Color, width: 1.4, area: true,
				pts: gaugeSeries(tl.Rows, MaxPoints, func(r sampleRow) float64 { return r.InFlight })})
		}
		out = append(out, tc.build())
	}
	return out
}

func (src *source) orgTable() *table {
	t := &table{Head: []cell{{Text: "Arm"}, {Text: "Org", Class: "t"}, {Text: "Key fingerprint", Class: "t"},
		{Text: "Succeeded"}, {Text: "Errored"}, {Text: "Cost from usage"}}}
	for _, a := range src.Arms {
		names := make([]string, 0, len(a.Stats.ByOrg))
		for n := range a.Stats.ByOrg {
			names = append(names, n)
		}
		slices.Sort(names)
		for _, n := range names {
			o := a.Stats.ByOrg[n]
			c := o.CostUSD
			if !c.OK {
				c = a.Stats.Cost.ByOrg[n]
			}
			succ := fmtIntNum(o.Succeeded)
			if !o.Succeeded.OK && o.Completed.OK {
				succ = fmtInt(o.Completed.V) + " (completed)"
			}
			t.Rows = append(t.Rows, tableRow{Label: a.Label, Cells: []cell{
				{Text: clean(n), Class: "t"}, {Text: fingerprint(string(o.Key)), Class: "mono"}, {Text: succ}, {Text: fmtIntNum(o.Errored)}, {Text: fmtUSDNum(c)},
			}})
		}
	}
	return src.dropArmColumn(t)
}

// routeTable is what each route carried, when a run used more than the
// sync route (batch, auto, or the result cache).
func (src *source) routeTable() *table {
	t := &table{Head: []cell{{Text: "Arm"}, {Text: "Route", Class: "t"}, {Text: "Items"}, {Text: "Succeeded"},
		{Text: "Errored"}, {Text: "Cost from usage"}, {Text: "At the sync price"}, {Text: "Wall-clock"}}}
	for _, a := range src.Arms {
		if len(a.Stats.ByRoute) == 0 {
			continue
		}
		if _, ok := a.Stats.ByRoute["sync"]; ok && len(a.Stats.ByRoute) == 1 {
			continue // a plain sync run: the headline says it all
		}
		for _, n := range slices.Sorted(maps.Keys(a.Stats.ByRoute)) {
			r := a.Stats.ByRoute[n]
			sp := "—"
			if r.SyncPriceUSD.OK {
				sp = fmtUSDNum(r.SyncPriceUSD)
			}
			t.Rows = append(t.Rows, tableRow{Label: a.Label, Cells: []cell{
				{Text: clean(n), Class: "t"}, {Text: fmtIntNum(r.Items)}, {Text: fmtIntNum(r.Succeeded)}, {Text: fmtIntNum(r.Errored)},
				{Text: fmtUSDNum(r.CostUSD)}, {Text: sp}, {Text: fmtDurNum(r.WallS)},
			}})
		}
	}
	return src.dropArmColumn(t)
}

func (src *source) laneTable() *table {
	t := &table{Head: []cell{{Text: "Arm"}, {Text: "Org", Class: "t"}, {Text: "Pool", Class: "t"}, {Text: "Cap"},
		{Text: "Final limit"}, {Text: "Peak in flight"}, {Text: "Cuts"}, {Text: "Held"}, {Text: "Stopped", Class: "t"}}}
	for _, a := range src.Arms {
		for _, l := range a.Stats.Lanes {
			t.Rows = append(t.Rows, tableRow{Label: a.Label, Cells: []cell{
				{Text: clean(string(l.Org)), Class: "t"}, {Text: clean(string(l.Pool)), Class: "t"}, {Text: fmtIntNum(l.Cap)},
				{Text: fmtNum1(firstKnown(l.FinalLimit, l.Limit))}, {Text: fmtIntNum(l.MaxInFlight)},
				{Text: fmtIntNum(l.Cuts)}, {Text: fmtDurNum(l.HeldS)}, {Text: cmp.Or(clean(string(l.Disabled)), "—"), Class: "t"},
			}})
		}
	}
	return src.dropArmColumn(t)
}

// dropArmColumn removes the first column (the arm) when there is one arm;
// nil for a table without rows.
func (src *source) dropArmColumn(t *table) *table {
	if len(t.Rows) == 0 {
		return nil
	}
	if len(src.Arms) > 1 {
		return t
	}
	t.Head = t.Head[1:]
	for i, r := range t.Rows {
		t.Rows[i] = tableRow{Label: r.Cells[0].Text, Cells: r.Cells[1:]}
	}
	return t
}

// maxEvents is how many noteworthy events the page lists per arm.
const maxEvents = 40

// eventsOf lists noteworthy events at their time since the start, or at
// their wall-clock time (UTC) when wall is set.
func eventsOf(label string, marks []mark, wall bool) eventList {
	l := eventList{Arm: label}
	for _, m := range marks {
		if len(l.Items) == maxEvents {
			l.More++
			continue
		}
		it := eventItem{At: fmtClock(m.T, 1), Kind: clean(m.Kind), Note: clean(m.Note)}
		if wall {
			it.At = "—"
			if !m.TS.IsZero() {
				it.At = m.TS.UTC().Format("15:04:05")
			}
		}
		switch m.Kind {
		case "failure", "blocked", "incomplete", "lane":
			it.Class = "bad"
		case "warning":
			it.Class = "warn"
		case "completed":
			it.Class = "good"
		}
		l.Items = append(l.Items, it)
	}
	return l
}

// Number formatting for the tables; "—" stands for unknown.

func fmtInt(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "—"
	}
	s := strconv.FormatInt(int64(math.Round(math.Abs(v))), 10)
	var b strings.Builder
	if v < 0 && math.Round(v) != 0 {
		b.WriteByte('-')
	}
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func fmtIntNum(n num) string {
	if !n.OK {
		return "—"
	}
	return fmtInt(n.V)
}

func fmtNum1(n num) string {
	if !n.OK {
		return "—"
	}
	return trimZero(strconv.FormatFloat(n.V, 'f', 1, 64))
}

func fmtUSD(v float64) string {
	sign := ""
	if v < 0 {
		sign, v = "-", -v
	}
	if v > 0 && v < 1 {
		return sign + "$" + strconv.FormatFloat(v, 'f', 4, 64)
	}
	cents := math.Round(v * 100)
	return fmt.Sprintf("%s$%s.%02d", sign, fmtInt(math.Floor(cents/100)), int64(math.Mod(cents, 100)))
}

func fmtUSDNum(n num) string {
	if !n.OK {
		return "—"
	}
	return fmtUSD(n.V)
}

func fmtDurNum(n num) string {
	if !n.OK || n.V < 0 {
		return "—"
	}
	return fmtDuration(n.V)
}

func fmtRate(n num) string {
	if !n.OK {
		return "—"
	}
	return fmtInt(n.V)
}

func fmtMsNum(n num) string {
	if !n.OK {
		return "—"
	}
	return fmtInt(n.V) + " ms"
}

func fmtFactor(v float64) string {
	if v >= 100 {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	if v == math.Trunc(v) {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

func fmtPercent(f float64) string {
	return strconv.FormatFloat(f*100, 'f', 0, 64) + "%"
}

func plural(n float64, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmtInt(n) + " " + many
}
