package sim

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/apidispatch/apidispatch/anthropic"
)

// A beta the org may not use is refused with 403 permission_error on every
// endpoint, unbilled; the key serves the same request without it, and
// other betas pass.
func TestFaultBetaForbidden(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Faults = []Fault{{Kind: FaultBetaForbidden, Beta: "research-preview-2026-01-01"}}
	run := startSim(t, cfg)

	for _, hdr := range []string{"research-preview-2026-01-01", "context-1m-2025-08-07, research-preview-2026-01-01"} {
		r := post(t, run, soloKey, judgeBody(1, 64), "anthropic-beta", hdr)
		if r.status != http.StatusForbidden || r.envelope(t).Error.Type != anthropic.ErrPermission {
			t.Errorf("messages with anthropic-beta %q: status %d %s, want 403 permission_error", hdr, r.status, r.body)
		}
	}
	r := do(t, http.MethodPost, run.URL+"/v1/messages/count_tokens", soloKey,
		[]byte(`{"model":"claude-sonnet-4-5","messages":[{"role":"user","content":"hi"}]}`), "anthropic-beta", "research-preview-2026-01-01")
	if r.status != http.StatusForbidden {
		t.Errorf("count_tokens with the beta: status %d, want 403", r.status)
	}
	if n := run.Server.LedgerTotals().Requests; n != 0 {
		t.Errorf("the refused requests were billed: %d", n)
	}
	if r := post(t, run, soloKey, judgeBody(1, 64)); r.status != http.StatusOK {
		t.Errorf("without the beta: status %d %s, want 200", r.status, r.body)
	}
	if r := post(t, run, soloKey, judgeBody(2, 64), "anthropic-beta", "context-1m-2025-08-07"); r.status != http.StatusOK {
		t.Errorf("another beta: status %d %s, want 200", r.status, r.body)
	}

	// The JSON form carries the beta; a fault without one is refused.
	var f Fault
	if err := json.Unmarshal([]byte(`{"kind":"beta_forbidden","beta":"x-1"}`), &f); err != nil || f.Beta != "x-1" {
		t.Errorf("JSON form: %+v, %v", f, err)
	}
	if err := run.Server.SetFaults(Fault{Kind: FaultBetaForbidden}); err == nil {
		t.Error("beta_forbidden without a beta was accepted")
	}
}
