package sim

import "github.com/apidispatch/apidispatch/anthropic"

// oaModel is what the simulator knows of one OpenAI chat model: its id,
// the dated snapshot an answer names, limits and prices. A snapshot id
// reaches the same model (and shares its rate limits).
type oaModel struct {
	id        string
	snapshot  string
	created   int64 // Unix seconds
	context   int64
	maxOutput int64
	reasoning bool    // reports reasoning tokens; refuses max_tokens and temperature ≠ 1
	price     oaPrice // standard; the Batch API bills half of each
	// priority is the rates of priority processing (nil: not offered, a
	// request for it is served at the default tier); flex says flex
	// processing is offered, billed as the Batch API is.
	priority *oaPrice
	flex     bool
}

// tier is the service tier that serves a request asking for asked (its
// service_tier; "" when it sets none): priority and flex when the model
// offers them, else the default tier; "scale" as asked.
func (m *oaModel) tier(asked string) string {
	switch {
	case asked == "priority" && m.priority != nil, asked == "flex" && m.flex, asked == "scale":
		return asked
	}
	return "default"
}

// oaPrice is tenths of a nano-dollar per token: the cached input of the
// small models is below a nano-dollar. USD per million tokens × 10,000.
type oaPrice struct{ in, cached, out int64 }

// oaModels are the simulator's OpenAI models (docs/openai.md, the price
// table dated there), newest family first.
var oaModels = []oaModel{
	{id: "gpt-5", snapshot: "gpt-5-2025-08-07", created: 1754524800, context: 400000, maxOutput: 128000, reasoning: true, price: oaPrice{12500, 1250, 100000}, priority: &oaPrice{25000, 2500, 200000}, flex: true},
	{id: "gpt-5-mini", snapshot: "gpt-5-mini-2025-08-07", created: 1754524800, context: 400000, maxOutput: 128000, reasoning: true, price: oaPrice{2500, 250, 20000}, priority: &oaPrice{4500, 450, 36000}, flex: true},
	{id: "gpt-5-nano", snapshot: "gpt-5-nano-2025-08-07", created: 1754524800, context: 400000, maxOutput: 128000, reasoning: true, price: oaPrice{500, 50, 4000}, flex: true},
	{id: "gpt-4.1", snapshot: "gpt-4.1-2025-04-14", created: 1744588800, context: 1047576, maxOutput: 32768, price: oaPrice{20000, 5000, 80000}, priority: &oaPrice{35000, 8750, 140000}},
	{id: "gpt-4.1-mini", snapshot: "gpt-4.1-mini-2025-04-14", created: 1744588800, context: 1047576, maxOutput: 32768, price: oaPrice{4000, 1000, 16000}, priority: &oaPrice{7000, 1750, 28000}},
	{id: "gpt-4.1-nano", snapshot: "gpt-4.1-nano-2025-04-14", created: 1744588800, context: 1047576, maxOutput: 32768, price: oaPrice{1000, 250, 4000}, priority: &oaPrice{2000, 500, 8000}},
	{id: "gpt-4o", snapshot: "gpt-4o-2024-08-06", created: 1722902400, context: 128000, maxOutput: 16384, price: oaPrice{25000, 12500, 100000}, priority: &oaPrice{42500, 21250, 170000}},
	{id: "gpt-4o-mini", snapshot: "gpt-4o-mini-2024-07-18", created: 1721260800, context: 128000, maxOutput: 16384, price: oaPrice{1500, 750, 6000}, priority: &oaPrice{2500, 1250, 10000}},
	{id: "o3", snapshot: "o3-2025-04-16", created: 1744761600, context: 200000, maxOutput: 100000, reasoning: true, price: oaPrice{20000, 5000, 80000}, priority: &oaPrice{35000, 8750, 140000}, flex: true},
	{id: "o4-mini", snapshot: "o4-mini-2025-04-16", created: 1744761600, context: 200000, maxOutput: 100000, reasoning: true, price: oaPrice{11000, 2750, 44000}, priority: &oaPrice{20000, 5000, 80000}, flex: true},
	{id: "o3-mini", snapshot: "o3-mini-2025-01-31", created: 1738281600, context: 200000, maxOutput: 100000, reasoning: true, price: oaPrice{11000, 5500, 44000}},
	{id: "o1", snapshot: "o1-2024-12-17", created: 1734393600, context: 200000, maxOutput: 100000, reasoning: true, price: oaPrice{150000, 75000, 600000}},
}

// oaModelByID finds a model by its id or its snapshot's.
var oaModelByID = func() map[string]*oaModel {
	m := make(map[string]*oaModel, 2*len(oaModels))
	for i := range oaModels {
		m[oaModels[i].id] = &oaModels[i]
		m[oaModels[i].snapshot] = &oaModels[i]
	}
	return m
}()

// pool is the key of the model's rate limits in an org's pools: its id.
func (m *oaModel) pool() anthropic.Pool { return anthropic.Pool(m.id) }

// cost is the exact cost in nano-dollars of a usage on m served at tier
// (m.tier's; "batch" for the Batch API): the sum in tenths of a
// nano-dollar, at the priority rates for "priority", at half every rate
// for a batch or flex request, rounded half up (the rule of
// cost.OpenAIPrice.Cost).
func (m *oaModel) cost(prompt, cached, completion int64, tier string) int64 {
	p := m.price
	if tier == "priority" && m.priority != nil {
		p = *m.priority
	}
	t := (prompt-cached)*p.in + cached*p.cached + completion*p.out
	if tier == "batch" || tier == "flex" && m.flex {
		t /= 2 // every rate is even, so the half is exact
	}
	return (t + 5) / 10
}

// OpenAIModels returns the OpenAI model ids the simulator serves, newest
// family first.
func OpenAIModels() []string {
	ids := make([]string, len(oaModels))
	for i, m := range oaModels {
		ids[i] = m.id
	}
	return ids
}

// OpenAICostNanos returns the cost in nano-dollars of a chat completion's
// usage on model by the simulator's own price table, and false for an
// unknown model.
func OpenAICostNanos(model string, prompt, cached, completion int64, batch bool) (int64, bool) {
	m := oaModelByID[model]
	if m == nil {
		return 0, false
	}
	tier := "default"
	if batch {
		tier = "batch"
	}
	return m.cost(prompt, cached, completion, tier), true
}
