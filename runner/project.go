package runner

import (
	"fmt"
	"io"
	"time"

	"github.com/apidispatch/apidispatch/plan"
)

// Projection is a run's projection: the sync route's (embedded), the
// routes side by side, and Gated, the chosen route's, which the gates
// judge. 'plan' prints it; Run gates on it.
type Projection struct {
	*plan.Projection
	Routes *plan.Routes
	// Gated is the projection the gates judge: the chosen route's cost.
	Gated *plan.Projection
	Route string
}

// ProjectOptions are what a projection needs beside its plan.Input.
type ProjectOptions struct {
	// Route is RouteSync (default), RouteBatch or RouteAuto: the route
	// whose cost the gates judge.
	Route string
	// Limits, when set, give the batch model (else plan's default).
	Limits *plan.Limits
	// BatchSize, when positive, is the most requests per batch.
	BatchSize int64
	// Deadline, when positive, is the wall-clock auto's split ends by.
	Deadline time.Duration
	// Speed is the server's K (≤ 0: 1).
	Speed float64
}

// Project projects in by every route (both side by side, and auto's split
// for the deadline) and picks the projection the gates judge for o.Route.
func Project(in plan.Input, o ProjectOptions) (*Projection, error) {
	p, err := plan.Project(in)
	if err != nil {
		return nil, err
	}
	m := o.Limits.BatchModel()
	if o.BatchSize > 0 {
		m.MaxBatch = o.BatchSize
	}
	speed := o.Speed
	if speed <= 0 {
		speed = 1
	}
	deadlineS := o.Deadline.Seconds() * speed // API seconds
	r, err := plan.ProjectRoutes(p, in, m, deadlineS)
	if err != nil {
		return nil, err
	}
	route := o.Route
	if route == "" {
		route = RouteSync
	}
	pr := &Projection{Projection: p, Routes: r, Route: route}
	g := *p
	switch route {
	case RouteBatch:
		g.ExpectedCost, g.WorstCase = r.Batch.ExpectedCost, r.Batch.WorstCase
	case RouteAuto:
		if r.Auto != nil {
			g.ExpectedCost, g.WorstCase = r.Auto.ExpectedCost, r.Auto.WorstCase
		} else {
			g.ExpectedCost, g.WorstCase = r.Batch.ExpectedCost, r.Batch.WorstCase
		}
	}
	g.PerArmExpected, g.PerArmWorst = g.ExpectedCost, g.WorstCase
	pr.Gated = &g
	return pr, nil
}

// Gate applies the budget gate and the confirm rule to the chosen route's
// projection for n items.
func (pr *Projection) Gate(n int64, g plan.GateConfig) plan.GateResult {
	return plan.Gate(pr.Gated, n, g)
}

// project projects pin for cfg's route.
func (cfg *Config) project(pin plan.Input) (*Projection, error) {
	return Project(pin, ProjectOptions{Route: cfg.Route, Limits: cfg.Limits, BatchSize: int64(cfg.BatchSize),
		Deadline: cfg.Deadline, Speed: cfg.Sync.Speed})
}

// gate prints the gate's arithmetic for the chosen route and returns the
// stop it demands (Complete: go on).
func (pr *Projection) gate(n int64, g plan.GateConfig, w io.Writer) StopKind {
	gr := pr.Gate(n, g)
	if pr.Route != RouteSync {
		fmt.Fprintf(w, "route %s: projected at its prices\n", pr.Route)
	}
	k := GateStop(gr.Decision)
	switch k {
	case Paused:
		fmt.Fprintln(w, "paused by the budget gate; nothing sent:")
		fmt.Fprintln(w, gr.Explain)
		return k
	case Refused:
		fmt.Fprintln(w, "refused: --confirm is required for this run; nothing sent:")
		fmt.Fprintln(w, gr.Explain)
		return k
	}
	if gr.Explain != "" {
		fmt.Fprintln(w, gr.Explain)
	}
	return k
}
