package gateway

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/sim"
)

// longSystem is a system prompt of about 3,582 tokens (as the simulator
// counts them), marked for caching.
var longSystem = strings.Repeat("Judge the answer on accuracy, clarity and tone. ", 269)[:12884]

// cachedJudgeBody is a judge request whose long system prompt is marked
// with cache_control.
func cachedJudgeBody(i int) []byte {
	return fmt.Appendf(nil, `{"model":"claude-sonnet-4-5","max_tokens":64,"system":[{"type":"text","text":%q,"cache_control":{"type":"ephemeral"}}],`+
		`"messages":[{"role":"user","content":"Item %d. Provide your evaluation as a JSON object."}]}`, longSystem, i)
}

// Issue 29, finding 3: the same cached system prompt sent four times, one
// after the other, through a three-org gateway landed on three orgs and
// paid three cache writes before its first read. Placed where the prefix
// is warm, it pays one write and three reads.
func TestGatewayPromptCacheFourCallsOneWrite(t *testing.T) {
	t.Parallel()
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 10, nil)
	_, srv := startGW(t, run, nil)
	var orgs []string
	for i := range 4 {
		a := postMessage(t, srv.URL, tokA, cachedJudgeBody(i))
		if a.status != 200 {
			t.Fatalf("call %d: status %d: %s", i, a.status, a.body)
		}
		var m anthropic.Message
		if err := json.Unmarshal(a.body, &m); err != nil {
			t.Fatal(err)
		}
		orgs = append(orgs, a.header.Get(headerOrg))
		u := m.Usage
		if i == 0 && (u.CacheCreationInputTokens < 3500 || u.CacheReadInputTokens != 0) {
			t.Errorf("call 0 usage %+v: want a write of the ~3,582-token prompt", u)
		}
		if i > 0 && (u.CacheReadInputTokens < 3500 || u.CacheCreationInputTokens != 0) {
			t.Errorf("call %d (org %s, after %v) usage %+v: want a read", i, orgs[i], orgs[:i], u)
		}
	}
	var writes, reads int
	for _, e := range run.Server.Ledger() {
		if e.CacheWrite5m > 0 {
			writes++
		}
		if e.CacheRead > 0 {
			reads++
		}
	}
	if writes != 1 || reads != 3 {
		t.Errorf("the simulator billed %d cache writes and %d reads (orgs %v), want 1 and 3", writes, reads, orgs)
	}
}
