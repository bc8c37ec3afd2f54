package plan

import (
	"bufio"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/apidispatch/apidispatch/internal/numfmt"
)

// WriteText writes the projection as tables a person reads: per model
// (items, input and output tokens per request, expected, all-max_tokens and
// worst-case cost), per lane (cap, latency, each limit as requests per
// minute, the ceiling and the binding limit), per pool (the wall-clock
// arithmetic), the routes side by side when ProjectRoutes was called, the
// gate decision with its arithmetic, and the assumptions.
func (p *Projection) WriteText(w io.Writer, g GateResult) error {
	bw := bufio.NewWriter(w)
	armNote := ""
	if p.Arms > 1 {
		armNote = fmt.Sprintf(" × %d arms", p.Arms)
	}
	fmt.Fprintf(bw, "plan: %s items%s", numfmt.Commas(p.N), armNote)
	if p.Done > 0 {
		fmt.Fprintf(bw, " (%s already done, %s spent)", numfmt.Commas(p.Done), usd(p.Spent))
	}
	if p.Cached.Hits > 0 {
		fmt.Fprintf(bw, " to send; %s more answered by the result cache (%s saved)", numfmt.Commas(p.Cached.Hits), usd(p.Cached.Saved))
	}
	fmt.Fprintln(bw)
	fmt.Fprintln(bw)

	tw := tabwriter.NewWriter(bw, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "model\titems\tinput/req\toutput/req\tmax_tokens\texpected\tall max_tokens\tworst case\t")
	for _, m := range p.Models {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", m.Model, numfmt.Commas(m.Remaining), tok(round1(m.InputPerReq)),
			tok(round1(m.OutputPerReq)), tok(round1(m.MaxTokensPerReq)), usd(m.Expected), usd(m.AllMaxTokens), usd(m.WorstCase))
	}
	if p.Done > 0 {
		fmt.Fprintf(tw, "already spent\t%s\t\t\t\t%s\t%s\t%s\t\n", numfmt.Commas(p.Done), usd(p.Spent), usd(p.Spent), usd(p.Spent))
	}
	if p.Arms > 1 {
		fmt.Fprintf(tw, "per arm\t%s\t\t\t\t%s\t%s\t%s\t\n", numfmt.Commas(p.N), usd(p.PerArmExpected), usd(p.PerArmAllMax), usd(p.PerArmWorst))
		fmt.Fprintf(tw, "total (%d arms)\t%s\t\t\t\t%s\t%s\t%s\t\n", p.Arms, numfmt.Commas(p.N*int64(p.Arms)), usd(p.ExpectedCost), usd(p.AllMaxTokens), usd(p.WorstCase))
	} else {
		fmt.Fprintf(tw, "total\t%s\t\t\t\t%s\t%s\t%s\t\n", numfmt.Commas(p.N), usd(p.ExpectedCost), usd(p.AllMaxTokens), usd(p.WorstCase))
	}
	tw.Flush()
	fmt.Fprintln(bw)
	for _, m := range p.Models {
		fmt.Fprintf(bw, "  %s: %s\n", m.Model, m.Arithmetic)
		fmt.Fprintf(bw, "    input: %s; output: %s\n", m.InputSource, m.OutputSource)
	}
	fmt.Fprintln(bw)

	writeLanes(bw, "lanes (org × pool), requests/min", p.Lanes)
	for _, pp := range p.Pools {
		fmt.Fprintf(bw, "  pool %s: %s req/min → %s\n", pp.Pool, rpm(pp.CeilingRPM), pp.Arithmetic)
	}
	fmt.Fprintf(bw, "projected wall-clock: %s (API time)", dur(p.WallS))
	if p.Speed != 1 {
		fmt.Fprintf(bw, "; %s at speed K=%g", dur(p.WallAtSpeedS), p.Speed)
	}
	fmt.Fprintln(bw)
	if len(p.Baseline) > 0 {
		fmt.Fprintln(bw)
		writeLanes(bw, "baseline arm (legacy: one org, concurrency 50), requests/min", p.Baseline)
		fmt.Fprintf(bw, "projected baseline wall-clock: %s (API time)", dur(p.BaselineWallS))
		if p.WallS > 0 && p.BaselineWallS > 0 {
			fmt.Fprintf(bw, "; projected speed-up %.1f×", p.BaselineWallS/p.WallS)
		}
		fmt.Fprintln(bw)
	}
	fmt.Fprintln(bw)

	if p.Routes != nil {
		p.Routes.writeText(bw, p.Speed)
		fmt.Fprintln(bw)
	}

	fmt.Fprintf(bw, "gate: %s\n", g.Decision)
	for _, line := range strings.Split(g.Explain, "\n") {
		if line != "" {
			fmt.Fprintf(bw, "  %s\n", line)
		}
	}
	if len(p.Assumptions) > 0 {
		fmt.Fprintln(bw)
		fmt.Fprintln(bw, "assumptions:")
		for _, a := range p.Assumptions {
			fmt.Fprintf(bw, "  - %s\n", a)
		}
	}
	return bw.Flush()
}

func writeLanes(w io.Writer, title string, ls []LaneProjection) {
	fmt.Fprintln(w, title+":")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "org\tpool\tcap\tlatency\tcap/latency\trpm\titpm/in\totpm/out\tceiling\tbinding\t")
	for _, l := range ls {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.2f s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", l.Org, l.Pool, l.Cap, l.LatencyS,
			rpm(l.CapRPM), rpm(l.RPM), rpm(l.ITPMRPM), rpm(l.OTPMRPM), rpm(l.CeilingRPM), l.BindingLimit)
	}
	tw.Flush()
	for _, l := range ls {
		if l.Note != "" {
			fmt.Fprintf(w, "  %s/%s: %s\n", l.Org, l.Pool, l.Note)
		}
	}
	for _, l := range ls {
		if l.CacheWrites+l.CacheReads > 0 {
			fmt.Fprintf(w, "  %s/%s prompt cache: %s writes, %s reads\n", l.Org, l.Pool, numfmt.Commas(l.CacheWrites), numfmt.Commas(l.CacheReads))
		}
	}
}

func round1(f float64) float64 { return float64(int64(f*10+0.5)) / 10 }

// writeText writes the routes table and each route's arithmetic.
func (r *Routes) writeText(w io.Writer, speed float64) {
	title := "routes (one arm; wall-clock in API time"
	if speed != 1 {
		title += fmt.Sprintf(" and at speed K=%g", speed)
	}
	if r.DeadlineS > 0 {
		title += fmt.Sprintf("; deadline %s", dur(r.DeadlineS))
	}
	fmt.Fprintln(w, title+"):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "route\titems\texpected\tworst case\twall\twall at K\tbound\tbinding\t")
	rows := []RouteProjection{r.Sync, r.Batch}
	if r.Auto != nil {
		rows = append(rows, *r.Auto)
	}
	for _, rp := range rows {
		items := numfmt.Commas(rp.Items)
		if rp.Route == RouteAuto {
			items = fmt.Sprintf("%s batch + %s sync", numfmt.Commas(rp.BatchItems), numfmt.Commas(rp.SyncItems))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", rp.Route, items, usd(rp.ExpectedCost), usd(rp.WorstCase),
			dur(rp.WallS), dur(rp.WallAtSpeedS), dur(rp.BoundS), rp.Binding)
	}
	tw.Flush()
	for _, rp := range rows {
		fmt.Fprintf(w, "  %s: %s\n", rp.Route, rp.Explain)
	}
	if r.Auto != nil {
		verdict := "meets the deadline"
		if !r.Auto.Meets {
			verdict = "MISSES the deadline"
		}
		fmt.Fprintf(w, "--route auto would send %s items by batch and %s by sync: %s, %s expected\n",
			numfmt.Commas(r.Auto.BatchItems), numfmt.Commas(r.Auto.SyncItems), verdict, usd(r.Auto.ExpectedCost))
	} else {
		b, sy := r.Split()
		fmt.Fprintf(w, "--route auto without --deadline would send %s items by batch and %s by sync (the cheapest; fewer than %d items go by sync)\n",
			numfmt.Commas(b), numfmt.Commas(sy), minBatchItems)
	}
}
