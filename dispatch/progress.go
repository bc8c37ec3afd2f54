package dispatch

import (
	"context"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/rundir"
)

// WatchProgress renders the engine's progress to w until ctx ends: on a
// terminal, a live display redrawn twice a second (done/total, requests/min,
// ETA, cost so far, 429s, each lane's limit and in-flight); otherwise one log
// line every 10 seconds. It returns when ctx is done.
func WatchProgress(ctx context.Context, e *Engine, w io.Writer, terminal bool) {
	period := 10 * time.Second
	if terminal {
		period = 500 * time.Millisecond
	}
	t := time.NewTicker(period)
	defer t.Stop()
	lines := 0
	for {
		select {
		case <-ctx.Done():
			if terminal && lines > 0 {
				fmt.Fprint(w, strings.Repeat("\x1b[1A\x1b[2K", lines))
			}
			return
		case <-t.C:
		}
		p := e.Progress()
		if !terminal {
			fmt.Fprintln(w, ProgressLine(p))
			continue
		}
		var b strings.Builder
		b.WriteString(strings.Repeat("\x1b[1A\x1b[2K", lines))
		fmt.Fprintln(&b, ProgressLine(p))
		n := 1
		for _, l := range p.Lanes {
			state := ""
			switch {
			case l.Disabled != "":
				state = " stopped"
			case l.Held:
				state = " held"
			}
			if l.Others {
				state += " others-seen"
			}
			fmt.Fprintf(&b, "  %-24s limit %6.1f/%-4d in flight %4d  cuts %d%s\n", l.Org+"/"+l.Pool, l.Limit, l.Cap, l.InFlight, l.Cuts, state)
			n++
		}
		fmt.Fprint(w, b.String())
		lines = n
	}
}

// ProgressLine is the one-line form of a progress snapshot.
func ProgressLine(p Progress) string {
	pct := 0.0
	if p.Total > 0 {
		pct = float64(p.Done) / float64(p.Total) * 100
	}
	eta := "-"
	if p.ETA > 0 {
		eta = (time.Duration(p.ETA) * time.Second).String()
	}
	line := fmt.Sprintf("%d/%d (%.1f%%)  %.0f req/min  ETA %s  $%.4f  in flight %d  429s %d  retries %d",
		p.Done, p.Total, pct, p.RequestsPerMin, eta, p.CostUSD, p.InFlight, p.RateLimited, p.Retries)
	if p.CacheHits > 0 {
		line += fmt.Sprintf("  cache hits %d ($%.4f saved)", p.CacheHits, p.CacheSavedUSD)
	}
	return line
}

// Progress is a snapshot for displays and progress events.
type Progress struct {
	Done           int64               `json:"done"`
	Total          int64               `json:"total"`
	Succeeded      int64               `json:"succeeded"`
	Errored        int64               `json:"errored"`
	InFlight       int                 `json:"in_flight"`
	RequestsPerMin float64             `json:"requests_per_min"`
	ETA            float64             `json:"eta_s"`
	CostUSD        float64             `json:"cost_usd"`
	RateLimited    int64               `json:"rate_limited_429"`
	Retries        int64               `json:"retries"`
	ElapsedS       float64             `json:"elapsed_s"`
	Lanes          []gate.LaneSnapshot `json:"lanes"`
	// CacheHits are items answered without a request in this run, and
	// CacheSavedUSD what those requests cost when they were sent.
	CacheHits     int64   `json:"cache_hits,omitempty"`
	CacheSavedUSD float64 `json:"cache_saved_usd,omitempty"`
}

// progressBase is the part of a run's progress fixed when it starts.
type progressBase struct {
	start            time.Time
	total, doneStart int64
}

// Progress returns a snapshot of the run. It is safe to call from any goroutine.
func (e *Engine) Progress() Progress {
	now := time.Now()
	var b progressBase
	var el float64
	if pb := e.progress.Load(); pb != nil {
		b, el = *pb, now.Sub(pb.start).Seconds()
	}
	succ, errd := e.c.succeeded.Load(), e.c.errored.Load()
	p := Progress{
		Done: b.doneStart + succ + errd, Total: b.total, Succeeded: succ, Errored: errd,
		CostUSD: cost.Nanos(e.c.costN.Load()).USD(), RateLimited: e.c.rateLimited.Load(),
		Retries: e.c.rateLimited.Load() + e.c.overloaded.Load() + e.c.otherRetries.Load(), ElapsedS: el,
		CacheHits: e.c.cacheHits.Load(), CacheSavedUSD: cost.Nanos(e.c.cacheSaved.Load()).USD(),
	}
	if el > 0 {
		p.RequestsPerMin = float64(succ+errd) / el * 60
	}
	if p.RequestsPerMin > 0 {
		p.ETA = float64(p.Total-p.Done) / p.RequestsPerMin * 60
	}
	for _, l := range e.lanesSnapshotSafe() {
		s := l.Snapshot(now)
		p.InFlight += s.InFlight
		p.Lanes = append(p.Lanes, s)
	}
	if math.IsInf(p.ETA, 0) || math.IsNaN(p.ETA) {
		p.ETA = 0
	}
	return p
}

func (e *Engine) summarize(ctx context.Context) (*rundir.Summary, error) {
	now := time.Now()
	var lanes []gate.LaneSnapshot
	for _, l := range e.allLanes() {
		lanes = append(lanes, l.Snapshot(now))
	}
	s, agg, err := rundir.BuildSummary(ctx, rundir.SummaryInput{
		Store: e.cfg.Store, ResultsPath: e.cfg.ResultsPath, Orgs: orgsOf(e.orgs), Start: e.start,
		DoneStart: e.doneStart, Speed: e.cfg.Speed, Lanes: lanes, StopReason: e.stopReason,
	})
	if err != nil {
		return nil, err
	}
	s.Cache = e.cacheSummary(agg)
	return s, nil
}

func orgsOf(os []*orgState) []org.Org {
	out := make([]org.Org, len(os))
	for i, o := range os {
		out[i] = o.Org
	}
	return out
}
