package upstream

import "github.com/apidispatch/apidispatch/openai"

// OpenAIUsage is a chat completion's usage u as every route counts it
// (what Classify returns for a completion answered whole), for a route
// that reads it from elsewhere: the usage chunk that ends a stream, with
// the service tier the chunk names (which its rates depend on).
func OpenAIUsage(u openai.Usage, tier string) *Usage {
	cached := u.PromptTokensDetails.CachedTokens
	return &Usage{Input: u.PromptTokens - cached, CacheRead: cached, Output: u.CompletionTokens,
		Reasoning: u.CompletionTokensDetails.ReasoningTokens, OpenAI: &u, Tier: tier}
}
