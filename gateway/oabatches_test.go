package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/openai"
	"github.com/apidispatch/apidispatch/sim"
)

// oaSim is a simulator of the preset's Anthropic orgs and one OpenAI org,
// gpt, whose batches process 6,000 requests an API minute, at speed 200.
func oaSim(t *testing.T) *sim.Running { return oaSimAt(t, 200) }

func oaSimAt(t *testing.T, speed float64) *sim.Running {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, speed, func(c *sim.Config) {
		c.Orgs = append(c.Orgs, sim.OrgConfig{Name: "gpt", Provider: sim.ProviderOpenAI, ServiceCapacity: 120,
			ModelLimits: map[string]sim.OpenAILimits{"*": {RPM: 100_000, TPM: 100_000_000}},
			Batch:       sim.BatchLimits{PerMinute: 6000, CancelS: 2}})
	})
	return run
}

// oaInput is an OpenAI batch input file: one chat completion line for each
// model (custom_ids prefix-0 …).
func oaInput(prefix string, models ...string) []byte {
	var in bytes.Buffer
	for i, m := range models {
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"Item %d"}],"max_completion_tokens":16}`, m, i)
		line, _ := json.Marshal(openai.BatchInputLine{CustomID: fmt.Sprintf("%s-%d", prefix, i), Method: "POST", URL: "/v1/chat/completions", Body: json.RawMessage(body)})
		in.Write(append(line, '\n'))
	}
	return in.Bytes()
}

// oaCall sends an OpenAI request of tok to the gateway at url and returns
// the status and the body.
func oaCall(t *testing.T, method, url, tok, body string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+tok)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// oaCreate uploads data as tok's batch input file and creates a batch of
// it; it returns the create's answer.
func oaCreate(t *testing.T, url, tok string, data []byte) openai.Batch {
	t.Helper()
	st, f, e := uploadRaw(t, url, tok, "batch", "in.jsonl", data)
	if st != http.StatusOK {
		t.Fatalf("upload: %d %+v", st, e.Error)
	}
	return oaCreateOf(t, url, tok, f.ID, "")
}

// oaCreateOf creates a batch of tok's file id, with the create's fields
// extra (`,"name":value…`).
func oaCreateOf(t *testing.T, url, tok, id, extra string) openai.Batch {
	t.Helper()
	st, body := oaCall(t, http.MethodPost, url+"/v1/batches", tok, `{"input_file_id":"`+id+`","endpoint":"/v1/chat/completions","completion_window":"24h"`+extra+`}`)
	var b openai.Batch
	if st != http.StatusOK || json.Unmarshal(body, &b) != nil {
		t.Fatalf("create: %d %s", st, body)
	}
	return b
}

// oaGet retrieves batch id of tok.
func oaGet(t *testing.T, url, tok, id string) openai.Batch {
	t.Helper()
	st, body := oaCall(t, http.MethodGet, url+"/v1/batches/"+id, tok, "")
	var b openai.Batch
	if st != http.StatusOK || json.Unmarshal(body, &b) != nil {
		t.Fatalf("retrieve: %d %s", st, body)
	}
	return b
}

// oaAwait polls batch id until its status is one of want (up to 30 s).
func oaAwait(t *testing.T, url, tok, id string, want ...string) openai.Batch {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		b := oaGet(t, url, tok, id)
		for _, w := range want {
			if b.Status == w {
				return b
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("batch %s is %s after 30 s, want %v", id, b.Status, want)
		}
	}
}

func at(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

// TestOpenAIBatchFinalizingIsVisible: while the gateway writes the
// results of a batch whose run ended every request, the batch is
// finalizing (finalizing_at set, no completed_at, no output file yet),
// and a cancel is refused as the API refuses one of a finalizing batch;
// then it is completed, created_at ≤ in_progress_at ≤ finalizing_at ≤
// completed_at. Before, it went from in_progress to completed and a
// cancel in between was taken (the completed batch then showed
// cancelled). The writing is held here by holding the file store's lock,
// which recording the output file takes.
func TestOpenAIBatchFinalizingIsVisible(t *testing.T) {
	run := oaSim(t)
	g, srv := startGW(t, run, func(c *Config) { c.Orgs = run.Server.AllOrgs() })
	b := oaCreate(t, srv.URL, tokA, oaInput("fin", "gpt-4.1-mini", "gpt-4.1-mini", "gpt-4.1-mini"))
	g.files.mu.Lock()
	locked := true
	defer func() {
		if locked {
			g.files.mu.Unlock()
		}
	}()
	fin := oaAwait(t, srv.URL, tokA, b.ID, openai.BatchFinalizing, openai.BatchCompleted)
	if fin.Status != openai.BatchFinalizing || fin.FinalizingAt == nil || fin.CompletedAt != nil || fin.OutputFileID != nil || fin.InProgressAt == nil {
		t.Fatalf("while its results are written: %+v, want finalizing, finalizing_at set, no completed_at nor output file", fin)
	}
	st, body := oaCall(t, http.MethodPost, srv.URL+"/v1/batches/"+b.ID+"/cancel", tokA, "")
	if st != http.StatusBadRequest || !strings.Contains(string(body), "Cannot cancel a batch with status 'finalizing'") {
		t.Errorf("cancel of a finalizing batch: %d %s, want the API's 400", st, body)
	}
	g.files.mu.Unlock()
	locked = false
	done := oaAwait(t, srv.URL, tokA, b.ID, openai.BatchCompleted, openai.BatchCancelled, openai.BatchFailed)
	if done.Status != openai.BatchCompleted || done.OutputFileID == nil || done.RequestCounts.Completed != 3 || done.CancellingAt != nil {
		t.Fatalf("after: %+v", done)
	}
	if c, p, f, e := done.CreatedAt, at(done.InProgressAt), at(done.FinalizingAt), at(done.CompletedAt); !(c <= p && p <= f && f <= e) || f != *fin.FinalizingAt {
		t.Errorf("created_at %d, in_progress_at %d, finalizing_at %d (%d while finalizing), completed_at %d: want them in order, finalizing_at kept",
			c, p, f, *fin.FinalizingAt, e)
	}
}

// simBatchErrors creates a batch of data on run's first OpenAI org
// directly (the simulator plays the API's batch validation) and returns
// its status and errors.data once it has left validating.
func simBatchErrors(t *testing.T, run *sim.Running, data []byte) (string, []openai.BatchError) {
	t.Helper()
	var key string
	for _, o := range run.Server.AllOrgs() {
		if o.Provider == "openai" {
			key = o.Key.Reveal()
			break
		}
	}
	st, f, e := uploadRaw(t, run.URL, key, "batch", "in.jsonl", data)
	if st != http.StatusOK {
		t.Fatalf("upload to the simulator: %d %+v", st, e.Error)
	}
	st, body := oaCall(t, http.MethodPost, run.URL+"/v1/batches", key, `{"input_file_id":"`+f.ID+`","endpoint":"/v1/chat/completions","completion_window":"24h"}`)
	var b openai.Batch
	if st != http.StatusOK || json.Unmarshal(body, &b) != nil {
		t.Fatalf("create on the simulator: %d %s", st, body)
	}
	b = oaAwait(t, run.URL, key, b.ID, openai.BatchFailed, openai.BatchInProgress, openai.BatchCompleted)
	if b.Errors == nil {
		return b.Status, nil
	}
	return b.Status, b.Errors.Data
}

// TestOpenAIBatchOfMixedModelsFails: a batch whose input file names more
// than one model fails as the API's does (the simulator's, checked here
// on the same file): the create answers validating, then the batch is
// failed, errors.data naming the first line of another model with code
// mixed_models, param body.model and the API's message; nothing is held
// or sent. Before, the gateway ran it (completed, each line on its own
// model).
func TestOpenAIBatchOfMixedModelsFails(t *testing.T) {
	run := oaSim(t)
	g, srv := startGW(t, run, func(c *Config) { c.Orgs = run.Server.AllOrgs() })
	data := oaInput("mix", "gpt-4.1-mini", "gpt-4.1-mini", "gpt-4.1-nano", "gpt-4.1-mini")
	simStatus, want := simBatchErrors(t, run, data)
	if simStatus != openai.BatchFailed || len(want) != 1 {
		t.Fatalf("the simulator's batch of mixed models: %s %+v, want failed with one error", simStatus, want)
	}
	b := oaCreate(t, srv.URL, tokA, data)
	if b.Status != openai.BatchValidating || b.Errors != nil || b.FailedAt != nil || b.InProgressAt != nil {
		t.Errorf("the create's answer: %+v, want validating, no errors nor failed_at yet (the API's)", b)
	}
	got := oaAwait(t, srv.URL, tokA, b.ID, openai.BatchFailed, openai.BatchCompleted, openai.BatchCancelled, openai.BatchExpired)
	if got.Status != openai.BatchFailed || got.Errors == nil || len(got.Errors.Data) != 1 || got.FailedAt == nil || got.InProgressAt != nil {
		t.Fatalf("batch of mixed models: %+v, want failed with one error, failed_at set, never in progress", got)
	}
	e, w := got.Errors.Data[0], want[0]
	if e.Code != "mixed_models" || e.Code != w.Code || e.Message != w.Message || at(e.Line) != 3 || at(e.Line) != at(w.Line) ||
		e.Param == nil || w.Param == nil || *e.Param != *w.Param {
		t.Errorf("errors.data[0] %+v (param %v, line %v), the API's (the simulator's) %+v (param %v, line %v)", e, e.Param, at(e.Line), w, w.Param, at(w.Line))
	}
	if c := got.RequestCounts; c.Total != 0 || c.Completed != 0 || c.Failed != 0 {
		t.Errorf("request_counts %+v, want 0s as the API's failed batch", c)
	}
	time.Sleep(100 * time.Millisecond)
	for _, le := range run.Server.Ledger() {
		if le.Provider == sim.ProviderOpenAI && strings.HasPrefix(le.CustomID, "mix-") {
			t.Fatalf("the simulator billed %s of a batch of mixed models", le.CustomID)
		}
	}
	if r := g.clientGate("a").Reserved(); r != 0 {
		t.Errorf("%v reserved for a failed batch", r)
	}
}
