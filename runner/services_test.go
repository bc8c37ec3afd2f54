package runner_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/runner"
	"github.com/apidispatch/apidispatch/shared"
)

// Exec.Shared is opened by Execute itself (an A/B arm's shared budget,
// once a closure of the command's): with Redis out of reach it refuses
// without the fallback, and with it runs the arm on a local share, saying
// so in the run's events.
func TestExecuteOpensItsSharedBudget(t *testing.T) {
	b := newBench(t, 30, 50, nil)
	const down = "redis://127.0.0.1:1/0" // nothing listens on port 1
	_, err, _ := b.exec(t.Context(), "", runner.Exec{Route: runner.RouteSync, Shared: runner.Shared{URL: down}})
	if !errors.Is(err, shared.ErrUnreachable) {
		t.Fatalf("an unreachable Redis without the fallback: %v; want shared.ErrUnreachable", err)
	}
	res, err, dir := b.exec(t.Context(), "", runner.Exec{Route: runner.RouteSync, Shared: runner.Shared{URL: down, Fallback: "local"}})
	if err != nil || !res.Complete || res.Stop.Kind != runner.Complete {
		t.Fatalf("on the local share: %v, %+v", err, res)
	}
	ev, _ := os.ReadFile(filepath.Join(dir, rundir.EventsFile))
	if !strings.Contains(string(ev), "running on a conservative local share") {
		t.Errorf("no event of the local share:\n%s", ev)
	}
}

// StartServices refuses a fallback without --shared and an unknown one,
// as the flags did.
func TestSharedFlagsChecked(t *testing.T) {
	for _, s := range []runner.Shared{{Fallback: "local"}, {URL: "redis://127.0.0.1:1/0", Fallback: "remote"}} {
		if _, err := runner.StartServices(t.Context(), runner.ServicesConfig{Shared: s}); err == nil {
			t.Errorf("%+v: no error", s)
		}
	}
	svc, err := runner.StartServices(t.Context(), runner.ServicesConfig{})
	if err != nil || svc.NewGate(nil) != nil || svc.SharedStats() != nil {
		t.Fatalf("no services: %v", err)
	}
	if err := svc.Stop(); err != nil {
		t.Fatal(err)
	}
}
