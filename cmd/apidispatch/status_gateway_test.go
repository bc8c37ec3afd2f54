package main

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/gateway"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/sim"
)

// 'apidispatch status --gateway STATE_DIR' shows a running gateway's
// clients (spend, reserved, max_cost, spend by org), its spend by org and
// its gateway batches by status, then that it stopped.
func TestStatusGatewayShowsClientsSpendAndBatches(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 1000, func(c *sim.Config) {
		for i := range c.Orgs {
			c.Orgs[i].Batch.QueueWaitS = 3600 // the batch stays in progress: 3.6 s at K=1000
		}
	})
	dir := t.TempDir()
	state := filepath.Join(dir, "gateway-state")
	const alice, bob = "sk-gw-status-alice-000001", "sk-gw-status-bob-0000002"
	clients := filepath.Join(dir, "clients.toml")
	os.WriteFile(clients, []byte("[[client]]\nname = \"alice\"\ntoken = \""+alice+"\"\nmax_cost = 5\n\n[[client]]\nname = \"bob\"\ntoken = \""+bob+"\"\npriority = \"bulk\"\nweight = 2\nmax_in_flight = 4\n"), 0o600)
	p, base, _ := startServe(t, run, "--speed", "1000", "--clients", clients, "--state-dir", state)

	msg := []byte(`{"model":"claude-haiku-4-5","max_tokens":32,"messages":[{"role":"user","content":"hi"}]}`)
	for _, tok := range []string{alice, bob} {
		if st, b := gwDo(t, http.MethodPost, base+"/v1/messages", tok, msg); st != 200 {
			t.Fatalf("message: %d %s", st, b)
		}
	}
	if st, b := gwDo(t, http.MethodPost, base+"/v1/messages/batches", alice, []byte(`{"requests":[{"custom_id":"x","params":`+string(msg)+`}]}`)); st != 200 {
		t.Fatalf("batch: %d %s", st, b)
	}
	var s gateway.StatusSnapshot
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, out, errOut := runCLI("status", "--gateway", state, "--json")
		if code != 0 {
			t.Fatalf("status --gateway --json: %d %s", code, errOut)
		}
		s = gateway.StatusSnapshot{}
		if err := json.Unmarshal([]byte(out), &s); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if len(s.Clients) == 2 && s.Clients[0].Requests == 1 && s.Clients[1].Requests == 1 && s.Batches["in_progress"] == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status never showed both clients' answers and alice's batch: %s", out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	a, b := s.Clients[0], s.Clients[1]
	if a.Client != "alice" || b.Client != "bob" || a.SpentUSD <= 0 || b.SpentUSD <= 0 || a.CapUSD != 5 || b.CapUSD != 0 ||
		a.InFlight <= 0 || len(a.ByOrg) != 1 || len(b.ByOrg) != 1 || s.Total.SpentUSD != a.SpentUSD+b.SpentUSD ||
		len(s.OrgSpend) == 0 || s.Stopped || s.PID != p.Pid || len(s.Lanes) == 0 {
		t.Errorf("status: %+v", s)
	}
	// The queue by client and class: each waited once, nothing waits or
	// is in flight now.
	if q := s.Queues; len(q) != 2 || q[0].Client != "alice" || q[0].Class != "interactive" || q[0].Weight != 1 || q[0].Waits != 1 ||
		q[1].Client != "bob" || q[1].Class != "bulk" || q[1].Weight != 2 || q[1].MaxInFlight != 4 || q[1].Waits != 1 ||
		q[0].Queued+q[1].Queued != 0 || q[0].InFlight+q[1].InFlight != 0 {
		t.Errorf("queues: %+v", q)
	}
	code, out, _ := runCLI("status", "--gateway", state)
	for _, want := range []string{"running (pid", "alice", "bob", "$5.000000", "(all clients)", "gateway batches: in_progress 1", "queued 0",
		"wait p99", "interactive", "bulk"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("status --gateway: no %q in:\n%s", want, out)
		}
	}
	for _, key := range run.Server.Orgs() {
		if strings.Contains(out, key.Key.Reveal()) {
			t.Errorf("status shows an upstream key")
		}
	}
	p.Signal(syscall.SIGTERM)
	deadline = time.Now().Add(20 * time.Second)
	for {
		_, out, _ = runCLI("status", "--gateway", state)
		if strings.Contains(out, "stopped") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status never showed the gateway stopped:\n%s", out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// A plain 'status' where serve ran with its default --state-dir names it.
	c := cliCmd(run, "status")
	c.Dir = dir
	if out, err := c.Output(); err != nil || !strings.Contains(string(out), "apidispatch status --gateway gateway-state") {
		t.Errorf("status beside a gateway's state: %v\n%s", err, out)
	}
	if code, _, errOut := runCLI("status", "--gateway", dir); code != exitUsage || !strings.Contains(errOut, "status.json") {
		t.Errorf("status --gateway on a directory without a gateway: %d %s", code, errOut)
	}
}
