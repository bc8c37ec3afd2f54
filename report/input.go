package report

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"
)

// num is a JSON number that may be absent, null, a numeric string, or of
// some other type (then it stays absent). Decoding one never fails.
type num struct {
	V  float64
	OK bool
}

func (n *num) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		var s string
		if json.Unmarshal(b, &s) != nil {
			return nil
		}
		b = []byte(s)
	}
	if f, err := strconv.ParseFloat(string(b), 64); err == nil {
		n.V, n.OK = f, true
	}
	return nil
}

// truth is a JSON boolean that may be absent or null.
type truth struct {
	V  bool
	OK bool
}

func (t *truth) UnmarshalJSON(b []byte) error {
	switch string(bytes.TrimSpace(b)) {
	case "true", `"true"`:
		t.V, t.OK = true, true
	case "false", `"false"`:
		t.V, t.OK = false, true
	}
	return nil
}

// text is a JSON string that may be absent or of another type.
type text string

func (s *text) UnmarshalJSON(b []byte) error {
	// The common case, a string without escapes, needs no decoder.
	if len(b) >= 2 && b[0] == '"' && b[len(b)-1] == '"' && bytes.IndexByte(b, '\\') < 0 {
		*s = text(b[1 : len(b)-1])
		return nil
	}
	var v string
	if json.Unmarshal(b, &v) == nil {
		*s = text(v)
	}
	return nil
}

// costField is cost_usd: a number in ab.json's arms, an object
// {"total", "by_org"} in summary.json.
type costField struct {
	Total num
	ByOrg map[string]num
}

func (c *costField) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '{' {
		var v struct {
			Total num            `json:"total"`
			ByOrg map[string]num `json:"by_org"`
		}
		looseUnmarshal(b, &v)
		if v.Total.OK {
			c.Total = v.Total
		}
		if len(v.ByOrg) > 0 {
			c.ByOrg = v.ByOrg
		}
		return nil
	}
	var n num
	n.UnmarshalJSON(b)
	if n.OK {
		c.Total = n
	}
	return nil
}

// orgSplit is one org's share of an arm. A bare number is taken as the
// count of items the org completed.
type orgSplit struct {
	Succeeded num  `json:"succeeded"`
	Errored   num  `json:"errored"`
	Completed num  `json:"completed"`
	CostUSD   num  `json:"cost_usd"`
	Key       text `json:"key_fingerprint"`
}

func (o *orgSplit) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '{' {
		type plain orgSplit
		looseUnmarshal(b, (*plain)(o))
		return nil
	}
	o.Completed.UnmarshalJSON(b)
	return nil
}

// routeSplit is one route's share of a run (summary.json "by_route").
type routeSplit struct {
	Items        num `json:"items"`
	Succeeded    num `json:"succeeded"`
	Errored      num `json:"errored"`
	CostUSD      num `json:"cost_usd"`
	SyncPriceUSD num `json:"sync_price_usd"`
	WallS        num `json:"wall_s"`
}

// dataLoss is the data-loss check of docs/design.md §3.
type dataLoss struct {
	Inputs                  num   `json:"inputs"`
	Outcomes                num   `json:"outcomes"`
	Missing                 num   `json:"missing"`
	Duplicates              num   `json:"duplicates"`
	RetryableMarkedTerminal num   `json:"retryable_marked_terminal"`
	Passed                  truth `json:"passed"`
}

// laneFinal is a lane's state at the end of a run (summary.json "lanes").
type laneFinal struct {
	Org         text `json:"org"`
	Pool        text `json:"pool"`
	Cap         num  `json:"cap"`
	FinalLimit  num  `json:"final_limit"`
	Limit       num  `json:"limit"`
	MaxInFlight num  `json:"max_in_flight"`
	Cuts        num  `json:"cuts"`
	HeldS       num  `json:"held_s"`
	Disabled    text `json:"disabled"`
}

// latency is latency_ms.
type latency struct {
	P50 num `json:"p50"`
	P95 num `json:"p95"`
	P99 num `json:"p99"`
}

// armStats are an arm's (or a single run's) headline numbers: the union of
// summary.json and an ab.json arm. Decoding the summary first and the ab.json
// arm over it lets the A/B result win where both speak.
type armStats struct {
	N              num                   `json:"n"`
	WallS          num                   `json:"wall_s"`
	APIEqWallS     num                   `json:"api_equivalent_wall_s"`
	Speed          num                   `json:"speed_factor"`
	Cost           costField             `json:"cost_usd"`
	LedgerCostUSD  num                   `json:"ledger_cost_usd"`
	RequestsPerMin num                   `json:"requests_per_min"`
	Succeeded      num                   `json:"succeeded"`
	Errored        num                   `json:"errored"`
	Unfinished     num                   `json:"unfinished"`
	Attempts       num                   `json:"attempts"`
	RateLimited429 num                   `json:"rate_limited_429"`
	Overloaded529  num                   `json:"overloaded_529"`
	OtherRetries   num                   `json:"other_retries"`
	LatencyMs      latency               `json:"latency_ms"`
	ByOrg          map[string]orgSplit   `json:"by_org"`
	ByRoute        map[string]routeSplit `json:"by_route"`
	DataLoss       dataLoss              `json:"data_loss"`
	Lanes          []laneFinal           `json:"lanes"`
	StopReason     text                  `json:"stop_reason"`
	// Only in ab.json's arms:
	Dir                 text    `json:"dir"`
	SetupS              num     `json:"setup_s"`
	CostMatchesLedger   truth   `json:"cost_matches_ledger"`
	APIEqRequestsPerMin num     `json:"api_equivalent_requests_per_min"`
	APIEqLatencyMs      latency `json:"api_equivalent_latency_ms"`
	Note                text    `json:"note"`
	Reused              truth   `json:"reused"`
	Resumed             truth   `json:"resumed"`
}

// perArm is projected_cost_usd.per_arm: one number for every arm, or an
// object of numbers by arm name.
type perArm struct {
	All   num
	ByArm map[string]num
}

func (p *perArm) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '{' {
		looseUnmarshal(b, &p.ByArm)
		return nil
	}
	return p.All.UnmarshalJSON(b)
}

func (p perArm) get(arm string) num {
	if v, ok := p.ByArm[arm]; ok && v.OK {
		return v
	}
	return p.All
}

// abResult is ab.json, loosely.
type abResult struct {
	Speedup          num    `json:"speedup"`
	SpeedupInclSetup num    `json:"speedup_incl_setup"`
	TargetMet        truth  `json:"target_met"`
	TargetSpeedup    num    `json:"target_speedup"`
	Target           num    `json:"target"`
	Simulated        truth  `json:"simulated"`
	SpeedFactor      num    `json:"speed_factor"`
	Headline         text   `json:"headline"`
	Complete         truth  `json:"complete"`
	Problems         []text `json:"problems"`
	N                num    `json:"n"`
	Model            text   `json:"model"`
	Projected        struct {
		PerArm perArm `json:"per_arm"`
		Total  num    `json:"total"`
	} `json:"projected_cost_usd"`
	Config struct {
		N                   num  `json:"n"`
		Model               text `json:"model"`
		SimPreset           text `json:"sim_preset"`
		BaselineOrg         text `json:"baseline_org"`
		BaselineConcurrency num  `json:"baseline_concurrency"`
		Orgs                []struct {
			Org text `json:"org"`
		} `json:"orgs"`
	} `json:"config"`
	StormSelfTest struct {
		Passed         truth `json:"passed"`
		Reason         text  `json:"reason"`
		N              num   `json:"n"`
		RateLimited429 num   `json:"rate_limited_429"`
	} `json:"storm_self_test"`
	Rounds []roundJSON                `json:"rounds"`
	Arms   map[string]json.RawMessage `json:"arms"`
}

// roundJSON is one round of an A/B run with --order abab.
type roundJSON struct {
	Round      num   `json:"round"`
	Order      text  `json:"order"`
	Speedup    num   `json:"speedup"`
	Baseline   armIn `json:"baseline"`
	Dispatcher armIn `json:"dispatcher"`
}

// armIn is the little of an arm a round needs.
type armIn struct {
	WallS num  `json:"wall_s"`
	Dir   text `json:"dir"`
}

// looseUnmarshal decodes b into v, ignoring values of unexpected types
// (encoding/json skips such a field and carries on). It reports only
// syntax errors.
func looseUnmarshal(b []byte, v any) error {
	err := json.Unmarshal(b, v)
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return nil
	}
	return err
}

// readJSON decodes the file at path into v loosely. A missing file is
// reported as os.ErrNotExist.
func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := looseUnmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	return nil
}

// point is one (x, y) of a series; x is seconds since the run started.
type point struct{ X, Y float64 }

// span is an interval of time [From, To].
type span struct{ From, To float64 }

// mark is a noteworthy event on the time axis.
type mark struct {
	T    float64
	TS   time.Time // wall-clock time, when the event has one
	Kind string
	Note string
}

// sampleRow is one "sample" event, decoded and made cumulative-safe.
type sampleRow struct {
	T, Dt    float64
	Done     []float64 // completions since the previous sample, by org index
	R429     float64   // cumulative 429s (corrected for restarts)
	Retries  float64   // cumulative 529 and other retries
	Cost     float64   // cumulative USD
	InFlight float64
}

// laneTrack is one lane's history.
type laneTrack struct {
	Org, Pool string
	Cap       float64
	InFlight  []point
	Limit     []point
	Held      []span
	Others    []span
	Disabled  string
}

// timeline is what events.jsonl says about a run over time.
type timeline struct {
	Rows        []sampleRow
	Orgs        []string // in order of first appearance
	orgIdx      map[string]int
	Lanes       []*laneTrack
	laneIdx     map[string]*laneTrack
	Marks       []mark
	Resumes     []float64 // times at which a resumed run started
	Has429      bool
	HasRetries  bool
	HasCost     bool
	HasInFlight bool
	Unreadable  int // lines that were not JSON events
	Started     time.Time
	BaseURL     string
	Speed       num
}

// sampleJSON is the data of a "sample" event.
type sampleJSON struct {
	T        num            `json:"t_s"`
	Dt       num            `json:"dt_s"`
	Done     map[string]num `json:"completed_by_org"`
	Lanes    []laneJSON     `json:"lanes"`
	R429     num            `json:"rate_limited_429"`
	Retries  num            `json:"retries"`
	Cost     num            `json:"cost_usd"`
	InFlight num            `json:"in_flight"`
}

type laneJSON struct {
	Org      text  `json:"org"`
	Pool     text  `json:"pool"`
	Cap      num   `json:"cap"`
	Limit    num   `json:"limit"`
	InFlight num   `json:"in_flight"`
	Held     truth `json:"held"`
	Others   truth `json:"others_seen_now"`
	Disabled text  `json:"disabled"`
}

type eventJSON struct {
	TS   text            `json:"ts"`
	Kind text            `json:"kind"`
	Note text            `json:"note"`
	Data json.RawMessage `json:"data"`
}

// sampleEventJSON decodes a sample line in one pass.
type sampleEventJSON struct {
	TS   text       `json:"ts"`
	Kind text       `json:"kind"`
	Data sampleJSON `json:"data"`
}

// sampleKind spots the lines that are (almost certainly) samples, the bulk
// of the file, so they can be decoded in one pass.
var sampleKind = []byte(`"kind":"sample"`)

// counter turns a cumulative counter that restarts at zero on a resume into
// one that keeps counting.
type counter struct{ base, last float64 }

func (c *counter) add(v float64) float64 {
	if v < c.last {
		c.base += c.last
	}
	c.last = v
	return c.base + v
}

// readTimeline reads events.jsonl at path. A missing file gives an empty
// timeline. Memory grows with the number of samples, not with the number
// of items.
func readTimeline(path string) (*timeline, error) {
	tl := &timeline{orgIdx: map[string]int{}, laneIdx: map[string]*laneTrack{}}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return tl, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := tl.read(f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return tl, nil
}

func (tl *timeline) read(r io.Reader) error {
	br := bufio.NewReaderSize(r, 256<<10)
	var (
		offset    float64   // added to t_s: the end of the previous segment
		lastT     float64   // latest sample time (with offset)
		origin    time.Time // wall time of t_s = 0 of the current segment
		segHasRow bool
		c429      counter
		cRetry    counter
		cCost     counter
	)
	for {
		line, err := br.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			var ev eventJSON
			var sample *sampleJSON
			if bytes.Contains(line, sampleKind) {
				var se sampleEventJSON
				if looseUnmarshal(line, &se) == nil && se.Kind == "sample" {
					ev.TS, ev.Kind, sample = se.TS, se.Kind, &se.Data
				}
			}
			if sample == nil && json.Unmarshal(line, &ev) != nil {
				tl.Unreadable++
			} else {
				ts, _ := time.Parse(time.RFC3339Nano, string(ev.TS))
				switch ev.Kind {
				case "sample":
					var s sampleJSON
					if sample != nil {
						s = *sample
					} else if looseUnmarshal(ev.Data, &s) != nil {
						tl.Unreadable++
						break
					}
					if !s.T.OK {
						tl.Unreadable++
						break
					}
					if origin.IsZero() && !ts.IsZero() {
						origin = ts.Add(-time.Duration(s.T.V * float64(time.Second)))
					}
					t := offset + s.T.V
					if len(tl.Rows) > 0 && t < lastT {
						// Time went backwards without a "started": a new segment.
						offset = lastT
						t = offset + s.T.V
						tl.Resumes = append(tl.Resumes, offset)
					}
					tl.addSample(t, lastT, s, &c429, &cRetry, &cCost)
					lastT = t
					segHasRow = true
				case "started":
					if segHasRow {
						offset = lastT
						tl.Resumes = append(tl.Resumes, offset)
					}
					segHasRow = false
					origin = ts
					if tl.Started.IsZero() {
						tl.Started = ts
						var d struct {
							BaseURL text `json:"base_url"`
							Speed   num  `json:"speed"`
						}
						looseUnmarshal(ev.Data, &d)
						tl.BaseURL, tl.Speed = string(d.BaseURL), d.Speed
					}
				case "progress", "":
				default:
					t := offset
					if !origin.IsZero() && !ts.IsZero() {
						t = offset + max(0, ts.Sub(origin).Seconds())
					}
					tl.Marks = append(tl.Marks, mark{T: t, TS: ts, Kind: string(ev.Kind), Note: string(ev.Note)})
				}
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

func (tl *timeline) addSample(t, prevT float64, s sampleJSON, c429, cRetry, cCost *counter) {
	row := sampleRow{T: t, Dt: s.Dt.V}
	if !s.Dt.OK || row.Dt <= 0 {
		row.Dt = t - prevT
	}
	if len(s.Done) > 0 {
		// Sort org names so a row's layout does not depend on map order.
		names := make([]string, 0, len(s.Done))
		for name := range s.Done {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			i, ok := tl.orgIdx[name]
			if !ok {
				i = len(tl.Orgs)
				tl.orgIdx[name] = i
				tl.Orgs = append(tl.Orgs, name)
			}
			for len(row.Done) <= i {
				row.Done = append(row.Done, 0)
			}
			row.Done[i] = s.Done[name].V
		}
	}
	if s.R429.OK {
		tl.Has429 = true
		row.R429 = c429.add(s.R429.V)
	} else {
		row.R429 = c429.base + c429.last
	}
	if s.Retries.OK {
		tl.HasRetries = true
		row.Retries = cRetry.add(s.Retries.V)
	} else {
		row.Retries = cRetry.base + cRetry.last
	}
	if s.Cost.OK {
		tl.HasCost = true
		row.Cost = cCost.add(s.Cost.V)
	} else {
		row.Cost = cCost.base + cCost.last
	}
	var laneSum float64
	for _, l := range s.Lanes {
		key := string(l.Org) + "\x00" + string(l.Pool)
		lt := tl.laneIdx[key]
		if lt == nil {
			lt = &laneTrack{Org: string(l.Org), Pool: string(l.Pool)}
			tl.laneIdx[key] = lt
			tl.Lanes = append(tl.Lanes, lt)
		}
		if l.Cap.OK {
			lt.Cap = l.Cap.V
		}
		if l.InFlight.OK {
			lt.InFlight = append(lt.InFlight, point{t, l.InFlight.V})
			laneSum += l.InFlight.V
		}
		if l.Limit.OK {
			lt.Limit = append(lt.Limit, point{t, l.Limit.V})
		}
		from := max(0, t-row.Dt)
		if l.Held.V {
			lt.Held = addSpan(lt.Held, from, t)
		}
		if l.Others.V {
			lt.Others = addSpan(lt.Others, from, t)
		}
		if l.Disabled != "" {
			lt.Disabled = string(l.Disabled)
		}
	}
	switch {
	case s.InFlight.OK:
		row.InFlight = s.InFlight.V
		tl.HasInFlight = true
	case len(s.Lanes) > 0:
		row.InFlight = laneSum
		tl.HasInFlight = true
	}
	tl.Rows = append(tl.Rows, row)
}

// addSpan appends [from, to] to spans, merging it with the last span when
// they touch.
func addSpan(spans []span, from, to float64) []span {
	if n := len(spans); n > 0 && from <= spans[n-1].To+1e-9 {
		spans[n-1].To = max(spans[n-1].To, to)
		return spans
	}
	return append(spans, span{from, to})
}

// Duration is the time covered by the samples, in seconds.
func (tl *timeline) Duration() float64 {
	if len(tl.Rows) == 0 {
		return 0
	}
	return tl.Rows[len(tl.Rows)-1].T
}
