package sim

import "testing"

// TestKeysReadAsSpelt: the API reads a body's top-level names exactly and
// refuses one spelt in another case as unknown ("Max_Tokens": Extra
// inputs are not permitted; "N": Unrecognized request argument). The
// simulator, decoding with encoding/json, which matches names whatever
// their case, honoured them: {"max_tokens":10,"Max_Tokens":4000} was a
// request of 4,000 tokens, and {"N":8} one of 8 choices, billed for what
// a client reading names as the API does (run's scanner) bounded at 10
// tokens and 1 choice.
func TestKeysReadAsSpelt(t *testing.T) {
	for _, body := range []string{
		`{"model":"claude-haiku-4-5","max_tokens":10,"Max_Tokens":4000,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"claude-haiku-4-5","MAX_TOKENS":4000,"messages":[{"role":"user","content":"hi"}]}`,
	} {
		if r, e := parseRequest([]byte(body), false, false); e == nil {
			t.Errorf("%s: accepted (max_tokens %d), want the API's 400", body, r.maxTokens)
		}
	}
	for _, body := range []string{
		`{"model":"gpt-4.1-mini","N":8,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"gpt-4.1-mini","max_completion_tokens":10,"Max_Completion_Tokens":4000,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"gpt-4.1-mini","Service_Tier":"priority","messages":[{"role":"user","content":"hi"}]}`,
	} {
		if r, e := parseOpenAIChat([]byte(body)); e == nil {
			t.Errorf("%s: accepted (n %d, max %d, tier %s), want the API's 400", body, r.n, r.maxOut, r.tier)
		}
	}
	// Escapes are the same name to the API.
	if _, e := parseRequest([]byte(`{"model":"claude-haiku-4-5","max\u005ftokens":10,"messages":[{"role":"user","content":"hi"}]}`), false, false); e != nil {
		t.Errorf("an escaped max_tokens: %v", e)
	}
	if _, e := parseOpenAIChat([]byte(`{"model":"gpt-4.1-mini","service\u005ftier":"priority","messages":[{"role":"user","content":"hi"}]}`)); e != nil {
		t.Errorf("an escaped service_tier: %v", e)
	}
}
