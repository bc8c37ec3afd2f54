package upstream

// DefaultCaps are the polite per-key concurrency caps by model family:
// Anthropic's "sonnet", "haiku", "opus" and "other"; OpenAI's "gpt"
// (gpt-4.1, gpt-4o, gpt-5), "gpt-mini" (their -mini and -nano models),
// "o-series" (the reasoning models, whose answers take longest) and
// "openai-other". It is the one table run, ab, plan and serve take their
// defaults from. OpenAI's limits are per organisation and model, so an
// OpenAI cap holds per (key, model), as an Anthropic cap per (key, pool);
// the defaults match the Anthropic families of the same standing.
var DefaultCaps = map[string]int{"sonnet": 100, "haiku": 120, "opus": 40, "other": 40,
	FamilyGPT: 100, FamilyGPTMini: 120, FamilyOSeries: 40, FamilyOpenAI: 40}

// CapFor is the polite cap of model: caps' value for its family when
// positive, else DefaultCaps' (a family the table does not know takes
// "other").
func CapFor(caps map[string]int, model string) int { return Anthropic.CapFor(caps, model) }
