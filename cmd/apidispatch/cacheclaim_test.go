package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/sim"
)

// A gateway ('apidispatch serve') and a run, two processes on one --cache
// file, given the same 50 requests at once: each is billed once, and the
// run's result for each is the body the gateway's client got. Before
// claims in the cache file both sent most of them.
func TestServeAndRunOnOneCacheBillEachOnce(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 50, nil)
	dir := t.TempDir()
	cachePath := filepath.Join(dir, "cache.db")
	const n = 50
	params := func(i int) string {
		return fmt.Sprintf(`{"model":"claude-haiku-4-5","max_tokens":64,"temperature":0,"messages":[{"role":"user","content":"Item %d. Provide your evaluation as a JSON object."}]}`, i)
	}
	var in bytes.Buffer
	for i := range n {
		fmt.Fprintf(&in, `{"custom_id":"c%d","params":%s}`+"\n", i, params(i))
	}
	input := filepath.Join(dir, "in.jsonl")
	if err := os.WriteFile(input, in.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	_, base, token := startServe(t, run, "--speed", "50", "--token-file", filepath.Join(dir, "token"), "--state-dir", filepath.Join(dir, "state"),
		"--cache", cachePath, "--cache-scope", "shared")

	var wg sync.WaitGroup
	start := make(chan struct{})
	bodies := make([][]byte, n)
	for i := range n {
		wg.Go(func() {
			<-start
			status, b := gwDo(t, http.MethodPost, base+"/v1/messages", token, []byte(params(i)))
			if status != 200 {
				t.Errorf("gateway, request %d: %d %s", i, status, b)
			}
			bodies[i] = b
		})
	}
	runDir := filepath.Join(dir, "run")
	var runOut []byte
	var runErr error
	wg.Go(func() {
		<-start
		runOut, runErr = cliCmd(run, "run", input, "--run-dir", runDir, "--base-url", run.URL, "--speed", "50", "--quiet", "--cache", cachePath).CombinedOutput()
	})
	close(start)
	wg.Wait()
	if runErr != nil {
		t.Fatalf("run: %v\n%s", runErr, runOut)
	}
	results, err := os.ReadFile(filepath.Join(runDir, "results.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	same := 0
	for line := range strings.SplitSeq(strings.TrimSpace(string(results)), "\n") {
		var r struct {
			CustomID string `json:"custom_id"`
			Result   struct {
				Message json.RawMessage `json:"message"`
			} `json:"result"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("%v: %s", err, line)
		}
		var i int
		fmt.Sscanf(r.CustomID, "c%d", &i)
		var a, b any
		if json.Unmarshal(r.Result.Message, &a) == nil && json.Unmarshal(bodies[i], &b) == nil && fmt.Sprint(a) == fmt.Sprint(b) {
			same++
		}
	}
	if got := run.Server.LedgerTotals().Requests; got != n || same != n {
		t.Errorf("%d requests given to a gateway and a run on one cache file at once: billed %d, want %d; the run's result is the gateway's answer for %d", n, got, n, same)
	}
}
