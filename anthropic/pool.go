package anthropic

import "strings"

// Pool names a set of models that share one rate limit inside an org
// (docs/design.md §14): Sonnet 4.x is one pool, Haiku 4.5 another, and so on.
type Pool string

// Known pools. A model outside them gets a pool of its own, "model:<id>".
const (
	PoolSonnet4 Pool = "sonnet-4"
	PoolHaiku45 Pool = "haiku-4-5"
	PoolOpus4   Pool = "opus-4"
	PoolSonnet5 Pool = "sonnet-5"
	PoolOpus5   Pool = "opus-5"
	PoolFable5  Pool = "fable-5"
	PoolHaiku35 Pool = "haiku-3-5"
)

// PoolOf returns the rate-limit pool of a model id, with or without a date
// suffix ("claude-sonnet-4-5-20250929" and "claude-sonnet-4-5" are both Sonnet 4.x).
func PoolOf(model string) Pool {
	m := strings.ToLower(model)
	switch {
	case strings.Contains(m, "sonnet-5"):
		return PoolSonnet5
	case strings.Contains(m, "opus-5"):
		return PoolOpus5
	case strings.Contains(m, "fable-5"):
		return PoolFable5
	case strings.Contains(m, "sonnet-4"):
		return PoolSonnet4
	case strings.Contains(m, "opus-4"):
		return PoolOpus4
	case strings.Contains(m, "haiku-4-5"):
		return PoolHaiku45
	case strings.Contains(m, "3-5-haiku"), strings.Contains(m, "haiku-3-5"):
		return PoolHaiku35
	}
	return Pool("model:" + model)
}

// Family is the coarse model family used for polite per-key concurrency caps:
// "sonnet", "haiku", "opus" or "other".
func Family(model string) string {
	m := strings.ToLower(model)
	for _, f := range []string{"sonnet", "haiku", "opus"} {
		if strings.Contains(m, f) {
			return f
		}
	}
	return "other"
}
