package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/workload"
)

// cliEnv returns the environment for a child apidispatch: the simulator's
// keys and nothing of the parent's ANTHROPIC_* variables.
func cliEnv(r *sim.Running) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ANTHROPIC_") {
			env = append(env, kv)
		}
	}
	env = append(env, "APIDISPATCH_AS_CLI=1")
	return append(env, r.Server.EnvLines()...)
}

func cliCmd(r *sim.Running, args ...string) *exec.Cmd {
	c := exec.Command(os.Args[0], append([]string{"-test.run=^$", "--"}, args...)...)
	c.Env = cliEnv(r)
	return c
}

func writeJudge(t *testing.T, path string, n int) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := workload.GenerateJudge(f, n, 7, workload.GenOptions{}); err != nil {
		t.Fatal(err)
	}
}

func readIDs(t *testing.T, path string) map[string]int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ids := map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var v struct {
			CustomID string `json:"custom_id"`
		}
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("results line %q: %v", sc.Text(), err)
		}
		ids[v.CustomID]++
	}
	return ids
}

// simAndInput starts an origin-3org simulator at speed k (closed at the
// end of the test) and writes n judge requests; it returns the simulator,
// the input path and a run directory path.
func simAndInput(t *testing.T, k float64, n int, faults ...sim.Fault) (*sim.Running, string, string) {
	t.Helper()
	return simWith(t, k, n, func(c *sim.Config) { c.Faults = faults })
}

// simWith is simAndInput with the simulator's config changed by mutate.
func simWith(t *testing.T, k float64, n int, mutate func(*sim.Config)) (*sim.Running, string, string) {
	t.Helper()
	r, _ := simtest.Start(t, sim.PresetOrigin3Org, k, mutate)
	dir := t.TempDir()
	input := filepath.Join(dir, "req.jsonl")
	writeJudge(t, input, n)
	return r, input, filepath.Join(dir, "run")
}

// killNineThenResume kills 'apidispatch run' with SIGKILL at random
// moments spread over one run, restarting it after each, then runs the same
// command to completion. Every custom_id is in results.jsonl exactly once;
// the summary's cost equals what the simulator billed for distinct request
// bodies; and the requests the simulator billed twice are no more than the
// summary's possible_duplicate_billing, which the attempt journal of each
// killed process fills in. The simulator bills a request whose client died
// mid-generation (BillAbandoned, the worse case), so the two figures are
// the same but for requests the kill caught between the server's answer
// and the client's reading of it.
func killNineThenResume(t *testing.T, n, kills int) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	t.Parallel()
	for _, v := range []struct {
		env string
		p   *int
	}{{"APIDISPATCH_KILL_N", &n}, {"APIDISPATCH_KILLS", &kills}} {
		if s := os.Getenv(v.env); s != "" {
			i, err := strconv.Atoi(s)
			if err != nil || i < 1 {
				t.Fatalf("%s=%q: want a positive number", v.env, s)
			}
			*v.p = i
		}
	}
	const k = 20
	r, input, runDir := simWith(t, k, n, func(c *sim.Config) { c.BillAbandoned = true })
	args := []string{"run", input, "--run-dir", runDir, "--base-url", r.URL, "--speed", strconv.Itoa(k), "--quiet", "--confirm"}

	// Kill i strikes once the simulator has billed a random number of
	// requests within the i-th of kills+1 equal slices of the run, so the
	// kills spread over the whole run whatever the machine's speed.
	rng := rand.New(rand.NewPCG(1, 2))
	killed := 0
	for i := 0; i < kills; i++ {
		slice := float64(n) / float64(kills+1)
		target := int64((float64(i) + 0.2 + 0.6*rng.Float64()) * slice)
		c, out, exited := startCLI(t, r, args...)
	poll:
		for {
			select {
			case <-exited:
				t.Fatalf("run %d ended before its kill at %d billed (%d billed)\n%s", i+1, target, r.Server.LedgerTotals().Requests, tail(out.String()))
			case <-time.After(2 * time.Millisecond):
				if r.Server.LedgerTotals().Requests >= target {
					break poll
				}
			}
		}
		if err := c.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-exited
		killed++
	}
	s, dups := resumeAndAudit(t, r, args, runDir, n)
	t.Logf("N=%d, %d kills: the simulator billed %d requests twice, the summary's possible_duplicate_billing is %d (%+d)",
		n, killed, dups, s.PossibleDuplicateBilling, s.PossibleDuplicateBilling-dups)
}

// requireEachOnce fails t unless runDir's results.jsonl holds n distinct
// custom_ids, each on one line.
func requireEachOnce(t *testing.T, runDir string, n int) {
	t.Helper()
	ids := readIDs(t, filepath.Join(runDir, rundir.ResultsFile))
	if len(ids) != n {
		t.Fatalf("%d distinct custom_ids in results, want %d", len(ids), n)
	}
	for id, k := range ids {
		if k != 1 {
			t.Fatalf("%s appears %d times", id, k)
		}
	}
}

// resumeAndAudit runs the command args (a 'run' of n items in runDir) to
// completion with --json and audits the end: every custom_id in
// results.jsonl exactly once, the data-loss check passed, no attempt
// journal left, the summary's cost equal to what the simulator billed for
// distinct request bodies, and no more requests billed twice than the
// summary's possible_duplicate_billing. It returns the summary and the
// number of requests the simulator billed twice.
func resumeAndAudit(t *testing.T, r *sim.Running, args []string, runDir string, n int) (rundir.Summary, int64) {
	t.Helper()
	c := cliCmd(r, append(args, "--json")...)
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	if err := c.Run(); err != nil {
		t.Fatalf("final run: %v\n%s", err, errb.String())
	}
	requireEachOnce(t, runDir, n)
	var s rundir.Summary
	if err := json.Unmarshal(bytes.TrimSpace(out.Bytes()), &s); err != nil {
		t.Fatalf("summary: %v\n%s", err, out.String())
	}
	if !s.DataLoss.Passed || s.Succeeded != int64(n) {
		t.Fatalf("summary: succeeded %d, %+v", s.Succeeded, s.DataLoss)
	}
	if left, _ := filepath.Glob(filepath.Join(runDir, "*.journal")); len(left) != 0 {
		t.Errorf("attempt journals left after a complete run: %v", left)
	}
	// What the simulator billed for distinct request bodies.
	seen := map[sim.BodyHash]bool{}
	var distinct, dups int64
	for _, e := range r.Server.Ledger() {
		if seen[e.BodySHA256] {
			dups++
			continue
		}
		seen[e.BodySHA256] = true
		distinct += e.CostNanos
	}
	if distinct != s.Cost.TotalNanos {
		t.Fatalf("summary cost %d nanos, ledger (distinct requests) %d", s.Cost.TotalNanos, distinct)
	}
	if dups > s.PossibleDuplicateBilling {
		t.Errorf("the simulator billed %d requests twice; the summary counts only %d that may have been", dups, s.PossibleDuplicateBilling)
	}
	return s, dups
}

// TestRunDirInUse: a second 'apidispatch run' in a run directory another
// process is using is refused (exit 3) and changes nothing; once the first
// is gone (even by kill -9) the directory is free again.
func TestRunDirInUse(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	t.Parallel()
	r, input, runDir := simAndInput(t, 1, 2000)
	args := []string{"run", input, "--run-dir", runDir, "--base-url", r.URL, "--quiet", "--confirm"}
	first := cliCmd(r, args...)
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	defer first.Process.Kill()
	for r.Server.LedgerTotals().Requests == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	second := cliCmd(r, args...)
	out, err := second.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitRefused || !strings.Contains(string(out), "in use by another process") {
		t.Fatalf("second run: %v\n%s", err, out)
	}
	first.Process.Signal(syscall.SIGKILL)
	first.Wait()
	third := cliCmd(r, append(args, "--deadline", "1ms")...)
	if out, err := third.CombinedOutput(); strings.Contains(string(out), "in use") {
		t.Fatalf("run dir still locked after the first process died: %v\n%s", err, out)
	}
}

// TestRunGivesUpWhenUnreachable: 'run' pointed at a port nothing listens on
// warns, stops after --give-up-after with exit 4 and every item unfinished,
// and the same command pointed at the API then completes it. --debug-http
// records the failed exchanges.
func TestRunGivesUpWhenUnreachable(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	t.Parallel()
	r, input, runDir := simAndInput(t, 50, 300)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + ln.Addr().String()
	ln.Close()
	wire := filepath.Join(t.TempDir(), "wire.log")
	args := []string{"run", input, "--run-dir", runDir, "--speed", "50", "--quiet"}
	c := cliCmd(r, append(args, "--base-url", down, "--give-up-after", "300ms", "--debug-http", wire)...)
	var stderr bytes.Buffer
	c.Stderr = &stderr
	err = c.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitIncomplete {
		t.Fatalf("run against a closed port: %v, want exit %d\n%s", err, exitIncomplete, stderr.String())
	}
	for _, want := range []string{"cannot reach the API", "no request reached " + down + " for 300ms", "connection refused"} {
		if !strings.Contains(stderr.String(), want) {
			t.Fatalf("stderr lacks %q:\n%s", want, stderr.String())
		}
	}
	var sum rundir.Summary
	b, err := os.ReadFile(filepath.Join(runDir, rundir.SummaryFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &sum); err != nil {
		t.Fatal(err)
	}
	if sum.Unfinished != 300 || sum.Succeeded+sum.Errored != 0 {
		t.Fatalf("after giving up: unfinished %d succeeded %d errored %d", sum.Unfinished, sum.Succeeded, sum.Errored)
	}
	wl, err := os.ReadFile(wire)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(wl, []byte("> POST "+down+"/v1/messages\n")) || !bytes.Contains(wl, []byte("connection refused")) {
		t.Fatalf("wire log of the failed run:\n%.2000s", wl)
	}

	if out, err := cliCmd(r, append(args, "--base-url", r.URL)...).CombinedOutput(); err != nil {
		t.Fatalf("resume against the API: %v\n%s", err, out)
	}
	requireEachOnce(t, runDir, 300)
}
