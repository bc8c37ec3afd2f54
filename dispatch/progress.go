package dispatch

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"
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
