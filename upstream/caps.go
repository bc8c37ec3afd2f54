package upstream

import "github.com/apidispatch/apidispatch/anthropic"

// DefaultCaps are the polite per-key concurrency caps by model family
// ("sonnet", "haiku", "opus", "other"): the one table run, ab, plan and
// serve take their defaults from.
var DefaultCaps = map[string]int{"sonnet": 100, "haiku": 120, "opus": 40, "other": 40}

// CapFor is the polite cap of model: caps' value for its family when
// positive, else DefaultCaps' (a family the table does not know takes
// "other").
func CapFor(caps map[string]int, model string) int {
	f := anthropic.Family(model)
	if v, ok := caps[f]; ok && v > 0 {
		return v
	}
	if v := DefaultCaps[f]; v > 0 {
		return v
	}
	return DefaultCaps["other"]
}
