package plan

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/apidispatch/apidispatch/internal/numfmt"
	"github.com/apidispatch/apidispatch/workload"
)

// Prompt caching in the projection. The API keeps one prompt cache per
// organisation; with cache-affine placement (package promptcache) a prefix
// shared by c items is written once in each org it reaches, min(c, k) of
// the k orgs of its pool (a shared prefix reaches every org at full load),
// and read by its other items. The projection prices those writes and
// reads and says how many fall to each org.

// cacheWrites is how many requests of uses (ModelSummary.PrefixUses)
// write their prefix over k orgs.
func cacheWrites(uses [workload.PrefixUsesMax]int64, k int) int64 {
	var w int64
	for i, n := range uses {
		w += n * int64(min(i+1, k))
	}
	return w
}

// promptCacheMix splits the input of a model's items (ms) into uncached,
// written and read tokens over k orgs, and returns the writes.
func promptCacheMix(ms workload.ModelSummary, k int) (usageMix, int64) {
	if ms.Prefixed == 0 || ms.EstInput == 0 {
		return usageMix{uncached: 1}, 0
	}
	writes := cacheWrites(ms.PrefixUses, max(k, 1))
	per := float64(ms.PrefixTokens) / float64(ms.Prefixed)
	total := float64(ms.EstInput)
	m := usageMix{write: float64(writes) * per / total, read: float64(ms.Prefixed-writes) * per / total}
	m.uncached = math.Max(0, 1-m.write-m.read)
	return m, writes
}

// orgCount is how many orgs the lanes will be projected for.
func orgCount(in Input) int {
	switch {
	case len(in.Orgs) > 0:
		return len(in.Orgs)
	case in.Limits != nil && len(in.Limits.OrgNames()) > 0:
		return len(in.Limits.OrgNames())
	}
	return 1
}

// splitPromptCache shares a pool's cached items among its lanes (ls, the
// pool's lanes in p.Lanes): by ceiling, the lanes that can serve; the
// writes of each prefix to its first min(c, k) of them.
func splitPromptCache(ls []LaneProjection, prefixed int64, uses [workload.PrefixUsesMax]int64) {
	if prefixed == 0 {
		return
	}
	var usable []int
	sum := 0.0
	for i, l := range ls {
		if l.CeilingRPM > 0 && !math.IsInf(l.CeilingRPM, 0) {
			usable = append(usable, i)
			sum += l.CeilingRPM
		}
	}
	if len(usable) == 0 {
		return
	}
	slices.SortStableFunc(usable, func(a, b int) int { return cmp.Compare(ls[b].CeilingRPM, ls[a].CeilingRPM) })
	var given int64
	for rank, i := range usable {
		items := int64(math.Round(float64(prefixed) * ls[i].CeilingRPM / sum))
		if rank == len(usable)-1 {
			items = prefixed - given
		}
		given += items
		var w int64
		for c, n := range uses {
			if rank < min(c+1, len(usable)) {
				w += n
			}
		}
		ls[i].CacheWrites = min(w, items)
		ls[i].CacheReads = items - ls[i].CacheWrites
	}
}

// describePromptCache is the assumption note of a model's cached items.
func describePromptCache(model string, ms workload.ModelSummary, k int, writes int64) string {
	var distinct int64
	for _, n := range ms.PrefixUses {
		distinct += n
	}
	return fmt.Sprintf("prompt caching: %s of %s %s items mark a cached prefix (%s distinct, about %s tokens each); "+
		"placed where each is warm, it is written once in each org it reaches (%s writes over %d orgs) and read by the rest, "+
		"writes at the 5-minute price; a prefix idle in an org for longer than its lifetime is written again there (not counted)",
		numfmt.Commas(ms.Prefixed), numfmt.Commas(ms.N), model, numfmt.Commas(distinct), tok(float64(ms.PrefixTokens)/float64(ms.Prefixed)),
		numfmt.Commas(writes), k)
}
