package plan

import (
	"fmt"
	"math"
	"strings"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/internal/numfmt"
)

// Gate decisions.
const (
	Pass            = "pass"
	Pause           = "pause"            // expected cost over budget × (1 + tolerance): exit 2
	ConfirmRequired = "confirm_required" // a large run without --confirm: exit 3
)

// Thresholds of the confirm rule (docs/design.md §2).
const (
	ConfirmCost cost.Nanos = 100 * cost.NanosPerUSD // projected cost ≥ $100
	ConfirmN    int64      = 50_000                 // or N ≥ 50,000
)

// GateConfig is the spend policy of a run. The zero value has no budget and
// no confirmation: only the confirm rule can stop a run.
type GateConfig struct {
	// Budget in nano-dollars; 0 means no budget gate.
	Budget cost.Nanos
	// Tolerance F: the run pauses when the expected cost is over
	// Budget × (1 + F). docs/design.md §7's default is 0.5; negative is taken as 0.
	Tolerance float64
	// Confirm is --confirm: the user accepts a large run.
	Confirm bool
}

// GateResult is a decision and the arithmetic behind it.
type GateResult struct {
	Decision string // Pass, Pause or ConfirmRequired
	// Explain is the arithmetic, one rule a line.
	Explain string
}

// Threshold is Budget × (1 + Tolerance), rounded to the nearest
// nano-dollar (0 when there is no budget).
func (g GateConfig) Threshold() cost.Nanos {
	if g.Budget <= 0 {
		return 0
	}
	tol := math.Max(g.Tolerance, 0)
	return cost.Nanos(math.Round(float64(g.Budget) * (1 + tol)))
}

// Gate applies the pre-flight rules to a projection for a run of n items
// (n ≤ 0: p.N):
//
//   - pause when the expected cost is over Budget × (1 + Tolerance);
//   - otherwise confirm_required when the expected cost is ≥ $100 or n is
//     ≥ 50,000 and Confirm is false;
//   - otherwise pass.
//
// Pause wins over confirm_required: --confirm cannot lift a budget, so the
// user is told about the budget first (and, in Explain, that --confirm will
// be required too). The cost compared is p.ExpectedCost: the total over
// the projection's arms.
func Gate(p *Projection, n int64, g GateConfig) GateResult {
	if n <= 0 && p != nil {
		n = p.N
	}
	var exp cost.Nanos
	var lines []string
	if p != nil {
		exp = p.ExpectedCost
		if p.Arms > 1 {
			lines = append(lines, fmt.Sprintf("expected cost %s = %d arms × %s (worst case %s)", usd(exp), p.Arms, usd(p.PerArmExpected), usd(p.WorstCase)))
		} else {
			lines = append(lines, fmt.Sprintf("expected cost %s (worst case %s)", usd(exp), usd(p.WorstCase)))
		}
	}
	decision := Pass
	if g.Budget > 0 {
		th := g.Threshold()
		tol := math.Max(g.Tolerance, 0)
		e, t := usd(exp), usd(th)
		if e == t && exp != th { // show the digits that differ
			e, t = exp.String(), th.String()
		}
		if exp > th {
			decision = Pause
			lines = append(lines, fmt.Sprintf("budget: expected %s > %s × (1 + %s) = %s → pause (raise --budget or --tolerance, or shrink the run)", e, usd(g.Budget), fmtTol(tol), t))
		} else {
			lines = append(lines, fmt.Sprintf("budget: expected %s ≤ %s × (1 + %s) = %s → within budget", e, usd(g.Budget), fmtTol(tol), t))
		}
	} else {
		lines = append(lines, "budget: no --budget given, no budget gate")
	}
	var why []string
	if exp >= ConfirmCost {
		why = append(why, fmt.Sprintf("expected %s ≥ %s", usd(exp), usd(ConfirmCost)))
	}
	if n >= ConfirmN {
		why = append(why, fmt.Sprintf("N = %s ≥ %s", numfmt.Commas(n), numfmt.Commas(ConfirmN)))
	}
	switch {
	case len(why) == 0:
		lines = append(lines, fmt.Sprintf("confirm: expected %s < %s and N = %s < %s → not required", usd(exp), usd(ConfirmCost), numfmt.Commas(n), numfmt.Commas(ConfirmN)))
	case g.Confirm:
		lines = append(lines, "confirm: "+strings.Join(why, " and ")+" → --confirm given")
	default:
		lines = append(lines, "confirm: "+strings.Join(why, " and ")+" → --confirm required")
		if decision == Pass {
			decision = ConfirmRequired
		}
	}
	lines = append(lines, "decision: "+decision)
	return GateResult{Decision: decision, Explain: strings.Join(lines, "\n")}
}

func fmtTol(t float64) string {
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.4f", t), "0"), ".")
}
