package plan

import (
	"context"
	"fmt"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/internal/numfmt"
	"github.com/apidispatch/apidispatch/store"
	"github.com/apidispatch/apidispatch/workload"
)

// PilotStats is what the terminal items of a run measured: their exact
// spend, their billed tokens and latency, and which items are still
// pending. Project uses it to re-project the whole run as that spend plus
// the pending items at the measured rates. It is plain data.
type PilotStats struct {
	// Size is the pilot size that was asked for (informational).
	Size int64
	// Items is how many items are terminal: Succeeded + Errored.
	Items, Succeeded, Errored int64
	// Spent is the exact cost of the terminal items, from their usage.
	Spent cost.Nanos
	// Billed token sums over the terminal items.
	InputTokens, OutputTokens, CacheRead, CacheWrite int64
	// LatencyMeanS is the mean latency of the succeeded items in seconds of
	// wall-clock as measured (at the server's speed K; Project multiplies it
	// by Input.Speed).
	LatencyMeanS float64
	// Pending sums the items still pending, by model. Project needs it to
	// know which part of the workload is left and what the pilot's items
	// were estimated at.
	Pending map[string]workload.ModelSummary
}

// pendingPage is how many pending items PilotFromStore reads at a time.
const pendingPage = 5000

// PilotFromStore measures a run's terminal items in its store (after a
// pilot of size items, or a resumed run): aggregate spend and tokens, the
// mean latency (averaged over 100 latency quantiles of the succeeded
// items), and the pending items by model. It reads the whole pending set
// once, in pages.
func PilotFromStore(ctx context.Context, st store.Store, size int64) (*PilotStats, error) {
	agg, err := st.Aggregate(ctx)
	if err != nil {
		return nil, fmt.Errorf("plan: reading the run: %w", err)
	}
	ps := &PilotStats{
		Size: size, Items: agg.Succeeded + agg.Errored, Succeeded: agg.Succeeded, Errored: agg.Errored,
		Spent: cost.Nanos(agg.CostNanos), InputTokens: agg.InputTok, OutputTokens: agg.OutputTok,
		CacheRead: agg.CacheRead, CacheWrite: agg.CacheWrite,
		Pending: map[string]workload.ModelSummary{},
	}
	if agg.Succeeded > 0 {
		qs := make([]float64, 100)
		for i := range qs {
			qs[i] = (float64(i) + 0.5) / 100
		}
		lat, err := st.LatencyPercentiles(ctx, qs)
		if err != nil {
			return nil, fmt.Errorf("plan: reading latencies: %w", err)
		}
		var sum float64
		for _, v := range lat {
			sum += float64(v)
		}
		if len(lat) > 0 {
			ps.LatencyMeanS = sum / float64(len(lat)) / 1000
		}
	}
	var after int64
	for {
		items, err := st.Pending(ctx, after, pendingPage)
		if err != nil {
			return nil, fmt.Errorf("plan: reading pending items: %w", err)
		}
		for _, it := range items {
			m := ps.Pending[it.Model]
			m.N++
			m.MaxTokens += it.MaxTokens
			m.EstInput += it.EstInput
			ps.Pending[it.Model] = m
		}
		if len(items) < pendingPage {
			return ps, nil
		}
		after = items[len(items)-1].Seq
	}
}

// pilotView is a PilotStats read against the workload.
type pilotView struct {
	ps       *PilotStats
	w        *workload.Summary
	done     int64
	ratio    float64 // billed input (all kinds) ÷ local estimate, over succeeded items
	mix      usageMix
	outPer   float64 // billed output per succeeded item
	latencyS float64 // API seconds
}

func newPilotView(in Input) *pilotView {
	ps := in.Pilot
	if ps == nil || in.Workload == nil {
		return nil
	}
	v := &pilotView{ps: ps, w: in.Workload}
	var doneEst int64
	if ps.Pending != nil {
		var pend int64
		for m, ms := range in.Workload.Models {
			p := ps.Pending[m]
			pend += p.N
			doneEst += ms.EstInput - p.EstInput
		}
		v.done = in.Workload.N - pend
	} else {
		v.done = min(ps.Items, in.Workload.N)
		var est int64
		for _, ms := range in.Workload.Models {
			est += ms.EstInput
		}
		if in.Workload.N > 0 {
			doneEst = est * v.done / in.Workload.N
		}
	}
	if ps.Succeeded > 0 {
		billedIn := ps.InputTokens + ps.CacheWrite + ps.CacheRead
		// Errored items were billed nothing: compare with the estimate of
		// the succeeded share only.
		succEst := float64(doneEst)
		if ps.Items > 0 {
			succEst *= float64(ps.Succeeded) / float64(ps.Items)
		}
		if succEst > 0 && billedIn > 0 {
			v.ratio = float64(billedIn) / succEst
			v.mix = usageMix{
				uncached: float64(ps.InputTokens) / float64(billedIn),
				write:    float64(ps.CacheWrite) / float64(billedIn),
				read:     float64(ps.CacheRead) / float64(billedIn),
			}
		}
		v.outPer = float64(ps.OutputTokens) / float64(ps.Succeeded)
	}
	speed := in.Speed
	if speed <= 0 {
		speed = 1
	}
	v.latencyS = ps.LatencyMeanS * speed
	return v
}

// pending returns the items of model still to send.
func (v *pilotView) pending(model string) workload.ModelSummary {
	if v.ps.Pending != nil {
		return v.ps.Pending[model]
	}
	ms := v.w.Models[model]
	if v.w.N == 0 {
		return ms
	}
	left := v.w.N - v.done
	return workload.ModelSummary{
		N:         ms.N * left / v.w.N,
		MaxTokens: ms.MaxTokens * left / v.w.N,
		EstInput:  ms.EstInput * left / v.w.N,
	}
}

func (v *pilotView) describe() string {
	ps := v.ps
	if ps.Succeeded == 0 {
		return fmt.Sprintf("pilot: %d items terminal, none succeeded (spent %s): nothing measured, defaults used", ps.Items, ps.Spent)
	}
	return fmt.Sprintf("pilot: %s items done (%d succeeded, %d errored) spent %s exactly; measured %.1f output tokens and %.1f billed input tokens a request (%.3f × the local estimate), mean latency %.2f s; the projection is that spend plus the %s items left at these rates",
		numfmt.Commas(v.done), ps.Succeeded, ps.Errored, ps.Spent, v.outPer,
		float64(ps.InputTokens+ps.CacheWrite+ps.CacheRead)/float64(ps.Succeeded), v.ratio, v.latencyS, numfmt.Commas(v.w.N-v.done))
}
