package gateway

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/openai"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/sim"
	upstreampkg "github.com/apidispatch/apidispatch/upstream"
)

// The attempts a dead gateway left in flight on an OpenAI org hold a slot
// of that org's lane of their model, OpenAI's pool, not an Anthropic pool
// of the same name no OpenAI lane is in.
func TestDeadOpenAIAttemptHeldInItsModelsPool(t *testing.T) {
	orgs := []*upstream{{Org: org.Org{Name: "claude"}}, {Org: org.Org{Name: "gpt", Provider: org.OpenAI}}}
	s := newLaneSet(orgs, gate.LaneConfig{}, func(*upstreampkg.Provider, string) int { return 2 }, 10, nil, nil)
	s.holdDead([]spendTag{{Org: "gpt", Model: "gpt-4.1-mini", MaxTokens: 200}}, time.Now(), time.Minute)
	k := deadKey{"gpt", upstreampkg.OpenAI.PoolOf("gpt-4.1-mini")}
	if h := s.dead[k]; h == nil || len(h.until) != 1 {
		t.Errorf("holds %v, want one slot under %v", s.dead, k)
	}
}

// withUsage asks for the stream's usage chunk whatever the client's body
// says of it, and keeps a body that asks already byte for byte.
func TestWithUsageAsksForTheUsageChunk(t *testing.T) {
	for _, body := range []string{
		`{"model":"gpt-4.1-mini","stream":true,"messages":[]}`,
		` { "model":"gpt-4.1-mini","stream":true}`,
		`{"model":"gpt-4.1-mini","stream":true,"stream_options":{"include_usage":false,"include_obfuscation":false}}`,
		`{"model":"gpt-4.1-mini","stream":true,"stream_options":{}}`,
		`{"model":"gpt-4.1-mini","stream":true,"stream_options":{"include_usage":true}}`,
	} {
		p, bad, _ := parseChat([]byte(body))
		if bad != "" {
			t.Fatalf("%s: %s", body, bad)
		}
		got, err := withUsage([]byte(body), p)
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		var v struct {
			Model         string
			StreamOptions map[string]any `json:"stream_options"`
		}
		if err := json.Unmarshal(got, &v); err != nil || v.Model != "gpt-4.1-mini" || v.StreamOptions["include_usage"] != true {
			t.Errorf("%s → %s (%v)", body, got, err)
		}
		if strings.Contains(body, "include_obfuscation") && v.StreamOptions["include_obfuscation"] != false {
			t.Errorf("%s → %s: the client's other stream options are lost", body, got)
		}
		if p.clientUsage && string(got) != body {
			t.Errorf("%s changed to %s", body, got)
		}
	}
}

// A gateway without an OpenAI org answers a chat completion at once, in
// OpenAI's envelope, naming what is missing (not a 503 the SDKs would
// retry for nothing), and its Anthropic clients' models list stays
// Anthropic's whatever header they authenticate with.
func TestChatCompletionWithoutOpenAIOrgs(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	_, srv := startGW(t, run, nil)
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"gpt-4.1-mini","messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Authorization", "Bearer "+tokA)
	req.Header.Set("content-type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	e := openai.ParseEnvelope(b)
	if resp.StatusCode != http.StatusBadRequest || e == nil || e.Error.Type != openai.ErrInvalidRequest || !strings.Contains(e.Error.Message, "no OpenAI org") ||
		resp.Header.Get("x-should-retry") != "false" {
		t.Errorf("%d %s", resp.StatusCode, b)
	}
	req, _ = http.NewRequest(http.MethodGet, srv.URL+"/v1/models", nil)
	req.Header.Set("Authorization", "Bearer "+tokA)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"claude-`) {
		t.Errorf("models of a Bearer client of an Anthropic-only gateway: %d %s", resp.StatusCode, b)
	}
}
