package cost

import (
	"cmp"
	"maps"
	"slices"

	"github.com/apidispatch/apidispatch/anthropic"
)

// Estimate is a price the table does not hold, borrowed for Model from the
// entry As: the most expensive model the table knows in Model's pool (a
// model released after the table, say), or in the whole table when it
// knows none of that pool. A cost from it is an estimate, never below the
// pool's dearest known rates; a spend cap needs an exact price instead.
type Estimate struct {
	Model string
	As    string
}

// EstimateFor returns the price Estimate borrows for model, which Lookup
// does not know, and from which entry. ok is false for an empty table.
func (t *Table) EstimateFor(model string) (p *Price, as string, ok bool) {
	pool := anthropic.PoolOf(model)
	var best, any *Price
	for _, m := range t.models {
		if any == nil || dearer(m, any) {
			any = m
		}
		if anthropic.PoolOf(m.Model) == pool && (best == nil || dearer(m, best)) {
			best = m
		}
	}
	if best == nil {
		best = any
	}
	if best == nil {
		return nil, "", false
	}
	return best, best.Model, true
}

// dearer orders prices by output, then input rate.
func dearer(a, b *Price) bool {
	if c := cmp.Compare(a.Standard.Output, b.Standard.Output); c != 0 {
		return c > 0
	}
	return a.Standard.Input > b.Standard.Input
}

// WithEstimates returns t extended with an estimated price (EstimateFor)
// for each of models t does not price, and those estimates; t itself when
// it prices them all.
func (t *Table) WithEstimates(models []string) (*Table, []Estimate) {
	var est []Estimate
	byName := maps.Clone(t.byName)
	for _, m := range models {
		if _, err := t.Lookup(m); err == nil {
			continue
		}
		p, as, ok := t.EstimateFor(m)
		if !ok {
			continue
		}
		byName[m] = p
		est = append(est, Estimate{Model: m, As: as})
	}
	if len(est) == 0 {
		return t, nil
	}
	slices.SortFunc(est, func(a, b Estimate) int { return cmp.Compare(a.Model, b.Model) })
	return &Table{byName: byName, models: t.models}, est
}
