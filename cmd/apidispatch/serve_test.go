package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
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

// startServe runs 'apidispatch serve' as a child process and returns it
// with the base URL and token it printed.
func startServe(t *testing.T, r *sim.Running, args ...string) (proc *os.Process, base, token string) {
	t.Helper()
	c := cliCmd(r, append([]string{"serve", "--listen", "127.0.0.1:0", "--base-url", r.URL, "--quiet"}, args...)...)
	out, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c.Stderr = os.Stderr
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	for (base == "" || token == "") && sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), "=")
		switch k {
		case "ANTHROPIC_BASE_URL":
			base = v
		case "ANTHROPIC_API_KEY":
			token = v
		}
	}
	go io.Copy(io.Discard, out)
	if base == "" || token == "" {
		c.Process.Kill()
		t.Fatalf("serve printed no environment lines")
	}
	t.Cleanup(func() { c.Process.Kill(); c.Wait() })
	return c.Process, base, token
}

func gwDo(t *testing.T, method, url, token string, body []byte) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, url, bytes.NewReader(body))
	req.Header.Set("x-api-key", token)
	req.Header.Set("content-type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// kill -9 of 'apidispatch serve' in the middle of a gateway batch, then a
// restart on the same state directory: the batch ends with every custom_id
// once, nothing billed twice by the API, and once in the gateway's ledger.
func TestServeKillNineMidBatchBillsNothingTwice(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 1000, func(c *sim.Config) {
		for i := range c.Orgs {
			c.Orgs[i].Batch.QueueWaitS = 2000 // 2 s at K=1000
		}
	})
	dir := t.TempDir()
	args := []string{"--speed", "1000", "--token-file", filepath.Join(dir, "token"), "--state-dir", filepath.Join(dir, "state")}
	p1, base, token := startServe(t, run, args...)
	if fi, err := os.Stat(filepath.Join(dir, "token")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file %v %v", fi, err)
	}
	const n = 300
	var body bytes.Buffer
	body.WriteString(`{"requests":[`)
	for i := range n {
		if i > 0 {
			body.WriteByte(',')
		}
		fmt.Fprintf(&body, `{"custom_id":"k-%d","params":{"model":"claude-haiku-4-5","max_tokens":64,"messages":[{"role":"user","content":"Item %d. Provide your evaluation as a JSON object."}]}}`, i, i)
	}
	body.WriteString(`]}`)
	status, b := gwDo(t, http.MethodPost, base+"/v1/messages/batches", token, body.Bytes())
	if status != 200 {
		t.Fatalf("create: %d %s", status, b)
	}
	var obj struct {
		ID               string `json:"id"`
		ProcessingStatus string `json:"processing_status"`
		RequestCounts    struct {
			Succeeded, Processing int
		} `json:"request_counts"`
	}
	json.Unmarshal(b, &obj)
	created := func() (c int64) {
		for _, st := range run.Server.BatchStats() {
			c += st.Created
		}
		return c
	}
	deadline := time.Now().Add(20 * time.Second)
	for created() == 0 && time.Now().Before(deadline) {
		time.Sleep(2 * time.Millisecond)
	}
	p1.Signal(syscall.SIGKILL)
	p1.Wait()
	before := created()
	if before == 0 {
		t.Fatal("no upstream batch was created before the kill")
	}
	_, base2, _ := startServe(t, run, args...)
	deadline = time.Now().Add(60 * time.Second)
	for {
		status, b = gwDo(t, http.MethodGet, base2+"/v1/messages/batches/"+obj.ID, token, nil)
		json.Unmarshal(b, &obj)
		if status != 200 || obj.ProcessingStatus == "ended" || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if obj.ProcessingStatus != "ended" || obj.RequestCounts.Succeeded != n {
		t.Fatalf("after the restart: %d %s", status, b)
	}
	status, b = gwDo(t, http.MethodGet, base2+"/v1/messages/batches/"+obj.ID+"/results", token, nil)
	seen := map[string]int{}
	for _, l := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		var r struct {
			CustomID string `json:"custom_id"`
		}
		json.Unmarshal(l, &r)
		seen[r.CustomID]++
	}
	if status != 200 || len(seen) != n {
		t.Errorf("results: %d, %d custom_ids", status, len(seen))
	}
	for id, k := range seen {
		if k != 1 {
			t.Errorf("%s %d times", id, k)
		}
	}
	// Batches whose create the kill cut off may be made again by the
	// resumed run (runner's adoption rules); what must hold is the billing.
	t.Logf("upstream batches: %d before the kill, %d in all", before, created())
	// Let every upstream batch end (an orphan would be billed then).
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		open := 0
		for _, st := range run.Server.BatchStats() {
			open += st.InProgress
		}
		if open == 0 {
			break
		}
	}
	_, billed, twice := sim.BatchBilling(run.Server.Ledger())
	if billed != n || twice != 0 {
		t.Errorf("simulator billed %d items, %d twice", billed, twice)
	}
	led, _ := os.ReadFile(filepath.Join(dir, "state", "ledger.jsonl"))
	if c := bytes.Count(led, []byte(obj.ID)); c != 1 {
		t.Errorf("ledger holds the batch %d times:\n%s", c, led)
	}
}

// Listening beyond loopback without TLS is refused.
func TestServeRefusesPlainHTTPBeyondLoopback(t *testing.T) {
	var out, errb bytes.Buffer
	code := mainCode([]string{"serve", "--listen", "0.0.0.0:0"}, &out, &errb)
	if code != exitUsage || !strings.Contains(errb.String(), "--tls-cert") {
		t.Errorf("exit %d: %s", code, errb.String())
	}
}

// serve --cache --cache-scope shared answers a request that 'run --cache'
// stored (same upstream, same params): 200, x-apidispatch-cached, nothing
// sent to the simulator; a request not in the file is sent and stored; the
// hit is in the status file.
func TestServeAnswersFromRunsCache(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	dir := t.TempDir()
	cachePath := filepath.Join(dir, "cache.db")
	params := func(i int) string {
		return fmt.Sprintf(`{"model":"claude-haiku-4-5","max_tokens":64,"temperature":0,"messages":[{"role":"user","content":"Item %d. Provide your evaluation as a JSON object."}]}`, i)
	}
	input := filepath.Join(dir, "in.jsonl")
	if err := os.WriteFile(input, []byte(`{"custom_id":"a","params":`+params(1)+"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := cliCmd(run, "run", input, "--run-dir", filepath.Join(dir, "run"), "--base-url", run.URL, "--speed", "200", "--quiet", "--cache", cachePath)
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("run: %v %s", err, out)
	}
	sent := run.Server.LedgerTotals().Requests
	state := filepath.Join(dir, "state")
	p, base, token := startServe(t, run, "--speed", "200", "--token-file", filepath.Join(dir, "token"), "--state-dir", state, "--cache", cachePath, "--cache-scope", "shared")
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/messages", strings.NewReader(params(1)))
	req.Header.Set("x-api-key", token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("x-apidispatch-cached") != "true" || run.Server.LedgerTotals().Requests != sent {
		t.Fatalf("a request run stored: %d cached=%q, %d sent: %s", resp.StatusCode, resp.Header.Get("x-apidispatch-cached"), run.Server.LedgerTotals().Requests-sent, b)
	}
	if status, b := gwDo(t, http.MethodPost, base+"/v1/messages", token, []byte(params(2))); status != 200 || run.Server.LedgerTotals().Requests != sent+1 {
		t.Fatalf("a request not stored: %d %s", status, b)
	}
	p.Signal(syscall.SIGTERM)
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		st, err := gateway.ReadStatus(state)
		if err == nil && st.Stopped {
			if st.Cache == nil || st.Cache.Hits != 1 || st.Cache.Misses != 1 || st.Cache.Stored != 1 || st.Cache.SavedUSD <= 0 {
				t.Errorf("status.json cache %+v", st.Cache)
			}
			if code, out, errOut := runCLI("status", "--gateway", state); code != exitOK || !strings.Contains(out, "result cache "+cachePath+" (readwrite, origin ") ||
				!strings.Contains(out, ": 1 hits saving $") || !strings.Contains(out, "1 misses (0 held only another origin's answer), 1 stored") {
				t.Errorf("status --gateway: %d %s %s", code, out, errOut)
			}
			break
		}
		if time.Now().After(end) {
			t.Fatalf("no stopped status: %v", err)
		}
	}
}
