package gateway

import (
	"context"
	"fmt"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/internal/netproxy"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/store/sqlite"
)

// A gateway restarted after one of its batches expired (stopped or killed
// while the batch ran, started again past its expiry) ends it as expired.
// Its expiry timer fires at once, as the executor starts its run: the
// executor must not read its expired flag while the timer's watcher
// writes it (go test -race reported that race). The first gateway's link
// is cut, so its run sends nothing before it is stopped.
func TestBatchResumedPastItsExpiryEndsExpired(t *testing.T) {
	const speed = 100000 // a gateway batch expires in 0.864 s
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, speed, nil)
	cut := netproxy.Start(t, strings.TrimPrefix(run.URL, "http://"))
	cut.BlackHole(true)
	dir := t.TempDir()
	mk := func(base string) *Gateway { return batchGateway(t, run, base, dir, speed) }
	g1 := mk("http://" + cut.Addr)
	s1 := httptest.NewServer(g1.Handler())
	c1 := sdkClient(s1.URL, tokA)
	var reqs []sdk.MessageBatchNewParamsRequest
	for i := range 20 {
		reqs = append(reqs, sdk.MessageBatchNewParamsRequest{CustomID: fmt.Sprintf("r-%d", i), Params: sdk.MessageBatchNewParamsRequestParams{
			Model: "claude-sonnet-4-5", MaxTokens: 64, Messages: []sdk.MessageParam{sdk.NewUserMessage(sdk.NewTextBlock(fmt.Sprintf("Item %d", i)))}}})
	}
	b, err := c1.Messages.Batches.New(context.Background(), sdk.MessageBatchNewParams{Requests: reqs})
	if err != nil {
		t.Fatal(err)
	}
	s1.Close()
	g1.Close()
	time.Sleep(1500 * time.Millisecond) // past the batch's expiry
	g2 := mk(run.URL)
	s2 := httptest.NewServer(g2.Handler())
	defer func() { s2.Close(); g2.Close() }()
	c2 := sdkClient(s2.URL, tokA)
	e := waitEnded(t, &c2, b.ID)
	if e.RequestCounts.Expired != 20 {
		t.Errorf("counts %s, want 20 expired", e.RequestCounts.RawJSON())
	}
}

// A run whose context ended between creating its store and initialising
// it (the batch's expiry or a cancel cut it there) leaves a store with no
// meta. It sent nothing, so the batch spent nothing; refused ("store: not
// initialized"), finalize returned before ending the batch, which stayed
// in_progress for ever, at every restart.
func TestRunSpentOfAnUninitialisedStore(t *testing.T) {
	dir := t.TempDir()
	st, err := sqlite.Open(filepath.Join(dir, rundir.StateFile))
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	spent, unread, err := runSpent(dir)
	if err != nil || spent != 0 || unread != 0 {
		t.Fatalf("runSpent of a store never initialised: %s, %s unread, %v; want 0, 0, nil", spent, unread, err)
	}
}

// batchGateway is a gateway on state directory dir sending to base (run's
// simulator, or a proxy to it) at speed, with one client, "a", whose
// max_cost ($1) no batch of these tests reaches.
func batchGateway(t *testing.T, run *sim.Running, base, dir string, speed float64) *Gateway {
	t.Helper()
	g, err := New(Config{Orgs: run.Server.Orgs(), BaseURL: base, Speed: speed, Prices: cost.Default(),
		Clients: []Client{{Name: "a", Token: tokA, MaxCost: 1_000_000_000}}, StateDir: dir, RetryFor: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return g
}
