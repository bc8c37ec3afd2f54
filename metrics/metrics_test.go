package metrics

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
)

func TestMetricsCountALane(t *testing.T) {
	m := New()
	newGate := m.Wrap(nil)
	g := newGate(dispatch.LaneConfig{Org: "a", Pool: anthropic.PoolSonnet4, Cap: 10, StartFraction: 1})
	d := dispatch.Demand{EstInput: 10, MaxTokens: 10}
	now := time.Now()
	p1, _, ok1 := g.TryAdmit(now, d)
	p2, _, ok2 := g.TryAdmit(now, d)
	if _, _, ok3 := g.TryAdmit(now, d); !ok1 || !ok2 || !ok3 {
		t.Fatal("not admitted")
	}
	g.Done(now, p1, dispatch.Feedback{Outcome: anthropic.Outcome{Kind: anthropic.Success, Status: 200}, Billed: true, Cost: cost.Nanos(2_500_000)})
	g.Done(now, p2, dispatch.Feedback{Outcome: anthropic.Outcome{Kind: anthropic.Retryable, Status: 429, RateLimited: true}})

	srv, addr, err := m.Serve("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	resp, err := http.Get("http://" + addr.String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	body := string(b)
	for _, want := range []string{
		`apidispatch_admitted_total{org="a",pool="sonnet-4"} 3`,
		`apidispatch_in_flight{org="a",pool="sonnet-4"} 1`,
		`apidispatch_cap{org="a",pool="sonnet-4"} 10`,
		`apidispatch_outcomes_total{class="success",org="a",pool="sonnet-4"} 1`,
		`apidispatch_outcomes_total{class="retryable",org="a",pool="sonnet-4"} 1`,
		`apidispatch_rate_limited_total{org="a",pool="sonnet-4"} 1`,
		`apidispatch_cost_usd_total{org="a",pool="sonnet-4"} 0.0025`,
		// One 429 of two attempts ended.
		`apidispatch_org_rate_limited_ratio{org="a"} 0.5`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if _, _, err := m.Serve("0.0.0.0:0"); err == nil {
		t.Error("served metrics on a non-loopback address")
	}
}
