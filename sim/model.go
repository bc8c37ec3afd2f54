package sim

import (
	"github.com/apidispatch/apidispatch/anthropic"
)

// modelInfo is what the simulator knows of one model id.
type modelInfo struct {
	id          string
	display     string
	created     string
	pool        anthropic.Pool
	maxOutput   int64
	context     int64 // context window in tokens without beta headers
	longContext bool  // context-1m beta available (1M window, long-context prices)
	cacheMin    int64 // minimum cacheable prefix
	geo         bool  // accepts inference_geo (Claude 4.6 and later)
	price       price
	longPrice   price
}

// price is nano-dollars (1e-9 USD) per token; USD per million tokens × 1000.
// Every figure is an integer, so costs are exact.
type price struct {
	in, out, write5m, write1h, read int64
}

// Prices (docs/design.md §20): cache write 5 m ×1.25, 1 h ×2, read ×0.1.
var (
	priceSonnet4     = price{in: 3000, out: 15000, write5m: 3750, write1h: 6000, read: 300}
	priceSonnet4Long = price{in: 6000, out: 22500, write5m: 7500, write1h: 12000, read: 600}
	priceHaiku45     = price{in: 1000, out: 5000, write5m: 1250, write1h: 2000, read: 100}
	priceHaiku35     = price{in: 800, out: 4000, write5m: 1000, write1h: 1600, read: 80}
	priceOpus45      = price{in: 5000, out: 25000, write5m: 6250, write1h: 10000, read: 500}
	priceSonnet5     = price{in: 2000, out: 10000, write5m: 2500, write1h: 4000, read: 200}
	// Fable 5 is not in the price table of docs/design.md §20; the simulator
	// assumes Sonnet 4.x prices.
	priceFable5 = priceSonnet4
)

// models is the simulator's model list (docs/design.md §18), newest first.
// Any other model id is a 404 not_found_error.
var models = []modelInfo{
	{id: "claude-opus-5", geo: true, display: "Claude Opus 5", created: "2026-11-01T00:00:00Z", pool: anthropic.PoolOpus5, maxOutput: 128000, context: 1000000, cacheMin: 1024, price: priceOpus45},
	{id: "claude-sonnet-5", geo: true, display: "Claude Sonnet 5", created: "2026-10-01T00:00:00Z", pool: anthropic.PoolSonnet5, maxOutput: 128000, context: 1000000, cacheMin: 1024, price: priceSonnet5},
	{id: "claude-fable-5", geo: true, display: "Claude Fable 5", created: "2026-09-15T00:00:00Z", pool: anthropic.PoolFable5, maxOutput: 128000, context: 1000000, cacheMin: 1024, price: priceFable5},
	{id: "claude-opus-4-8", geo: true, display: "Claude Opus 4.8", created: "2026-08-01T00:00:00Z", pool: anthropic.PoolOpus4, maxOutput: 128000, context: 1000000, cacheMin: 1024, price: priceOpus45},
	{id: "claude-opus-4-7", geo: true, display: "Claude Opus 4.7", created: "2026-05-01T00:00:00Z", pool: anthropic.PoolOpus4, maxOutput: 128000, context: 1000000, cacheMin: 1024, price: priceOpus45},
	{id: "claude-opus-4-6", geo: true, display: "Claude Opus 4.6", created: "2026-02-05T00:00:00Z", pool: anthropic.PoolOpus4, maxOutput: 128000, context: 1000000, cacheMin: 1024, price: priceOpus45},
	{id: "claude-sonnet-4-6", geo: true, display: "Claude Sonnet 4.6", created: "2026-02-17T00:00:00Z", pool: anthropic.PoolSonnet4, maxOutput: 64000, context: 1000000, cacheMin: 1024, price: priceSonnet4},
	{id: "claude-opus-4-5-20251101", display: "Claude Opus 4.5", created: "2025-11-24T00:00:00Z", pool: anthropic.PoolOpus4, maxOutput: 64000, context: 200000, cacheMin: 1024, price: priceOpus45},
	{id: "claude-opus-4-5", display: "Claude Opus 4.5", created: "2025-11-24T00:00:00Z", pool: anthropic.PoolOpus4, maxOutput: 64000, context: 200000, cacheMin: 1024, price: priceOpus45},
	{id: "claude-haiku-4-5-20251001", display: "Claude Haiku 4.5", created: "2025-10-15T00:00:00Z", pool: anthropic.PoolHaiku45, maxOutput: 64000, context: 200000, cacheMin: 2048, price: priceHaiku45},
	{id: "claude-haiku-4-5", display: "Claude Haiku 4.5", created: "2025-10-15T00:00:00Z", pool: anthropic.PoolHaiku45, maxOutput: 64000, context: 200000, cacheMin: 2048, price: priceHaiku45},
	{id: "claude-sonnet-4-5-20250929", display: "Claude Sonnet 4.5", created: "2025-09-29T00:00:00Z", pool: anthropic.PoolSonnet4, maxOutput: 64000, context: 200000, longContext: true, cacheMin: 1024, price: priceSonnet4, longPrice: priceSonnet4Long},
	{id: "claude-sonnet-4-5", display: "Claude Sonnet 4.5", created: "2025-09-29T00:00:00Z", pool: anthropic.PoolSonnet4, maxOutput: 64000, context: 200000, longContext: true, cacheMin: 1024, price: priceSonnet4, longPrice: priceSonnet4Long},
	{id: "claude-3-5-haiku-20241022", display: "Claude Haiku 3.5", created: "2024-10-22T00:00:00Z", pool: anthropic.PoolHaiku35, maxOutput: 8192, context: 200000, cacheMin: 2048, price: priceHaiku35},
}

var modelByID = func() map[string]*modelInfo {
	m := make(map[string]*modelInfo, len(models))
	for i := range models {
		m[models[i].id] = &models[i]
	}
	return m
}()

// Models returns the model ids the simulator serves (GET /v1/models), newest
// first.
func Models() []string {
	ids := make([]string, len(models))
	for i, m := range models {
		ids[i] = m.id
	}
	return ids
}

// Pools returns every pool of the simulator's models, without duplicates.
func Pools() []anthropic.Pool {
	var out []anthropic.Pool
	seen := map[anthropic.Pool]bool{}
	for _, m := range models {
		if !seen[m.pool] {
			seen[m.pool] = true
			out = append(out, m.pool)
		}
	}
	return out
}

// cost is the exact cost in nano-dollars of one usage.
func (p price) cost(in, out, write5m, write1h, read int64) int64 {
	return in*p.in + out*p.out + write5m*p.write5m + write1h*p.write1h + read*p.read
}

// CostNanos returns the cost in nano-dollars (1e-9 USD) of a usage on model
// by the simulator's own price table, and false for an unknown model. Cache
// creation tokens are priced as 5-minute writes unless given as 1-hour
// writes in Usage.CacheCreation; Usage.InferenceGeo "us" costs ×1.1. A Sonnet 4.5 request whose total input
// exceeds 200k tokens (possible only with the 1M-context beta) is priced at
// the long-context rates.
func CostNanos(model string, u anthropic.Usage) (int64, bool) {
	m := modelByID[model]
	if m == nil {
		return 0, false
	}
	su := usage{input: u.InputTokens, output: u.OutputTokens, write5m: u.CacheCreationInputTokens, read: u.CacheReadInputTokens, geoUS: u.InferenceGeo == "us"}
	if u.CacheCreation != nil {
		su.write5m, su.write1h = u.CacheCreation.Ephemeral5mInputTokens, u.CacheCreation.Ephemeral1hInputTokens
	}
	return m.cost(su), true
}

// cost prices a usage on m: long-context rates for the whole request when
// the model has them and the total input exceeds 200k tokens; ×1.1 on
// everything for inference_geo "us" (exact: every price is a multiple of 10).
func (m *modelInfo) cost(u usage) int64 {
	p := m.price
	if m.longContext && u.input+u.write5m+u.write1h+u.read > 200000 {
		p = m.longPrice
	}
	c := p.cost(u.input, u.output, u.write5m, u.write1h, u.read)
	if u.geoUS {
		c = c / 10 * 11
	}
	return c
}
