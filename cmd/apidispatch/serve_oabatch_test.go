package main

import (
	"bytes"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/workload"
)

// oaDo is an OpenAI client's request to the gateway (Authorization:
// Bearer), with body of content type ct.
func oaDo(t *testing.T, method, url, token, ct string, body []byte) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, url, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	if ct != "" {
		req.Header.Set("content-type", ct)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// simOpenAIBatches counts the batches the simulator's OpenAI orgs hold.
func simOpenAIBatches(t *testing.T, run *sim.Running) int {
	n := 0
	for _, o := range run.Server.AllOrgs() {
		if o.Provider != "openai" {
			continue
		}
		req, _ := http.NewRequest(http.MethodGet, run.URL+"/v1/batches?limit=100", nil)
		req.Header.Set("Authorization", "Bearer "+o.Key.Reveal())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var l struct {
			Data []json.RawMessage `json:"data"`
		}
		json.NewDecoder(resp.Body).Decode(&l)
		resp.Body.Close()
		n += len(l.Data)
	}
	return n
}

// kill -9 of 'apidispatch serve' while an OpenAI batch (uploaded and
// created by an OpenAI client) runs on the OpenAI orgs' Batch API, then a
// restart on the same state directory: the batch completes, each
// custom_id once in its output file, billed once by the API, and once in
// the gateway's ledger.
func TestServeKillNineMidOpenAIBatchBillsNothingTwice(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 1000, func(c *sim.Config) {
		for _, name := range []string{"gpt_a", "gpt_b"} {
			// 150 requests an org take 300 API seconds (0.3 s here).
			c.Orgs = append(c.Orgs, sim.OrgConfig{Name: name, Provider: sim.ProviderOpenAI, Batch: sim.BatchLimits{PerMinute: 30},
				ModelLimits: map[string]sim.OpenAILimits{"*": {RPM: 30_000, TPM: 50_000_000}}})
		}
	})
	dir := t.TempDir()
	args := []string{"--speed", "1000", "--token-file", filepath.Join(dir, "token"), "--state-dir", filepath.Join(dir, "state")}
	p1, base, token := startServe(t, run, args...)
	const n = 300
	var in bytes.Buffer
	if err := workload.GenerateOpenAIJudge(&in, n, 7, workload.GenOptions{}); err != nil {
		t.Fatal(err)
	}
	var form bytes.Buffer
	mw := multipart.NewWriter(&form)
	mw.WriteField("purpose", "batch")
	fw, _ := mw.CreateFormFile("file", "judge.jsonl")
	fw.Write(in.Bytes())
	mw.Close()
	status, b := oaDo(t, http.MethodPost, base+"/v1/files", token, mw.FormDataContentType(), form.Bytes())
	var file struct{ ID string }
	if json.Unmarshal(b, &file); status != 200 || file.ID == "" {
		t.Fatalf("upload: %d %s", status, b)
	}
	status, b = oaDo(t, http.MethodPost, base+"/v1/batches", token, "application/json",
		[]byte(`{"input_file_id":"`+file.ID+`","endpoint":"/v1/chat/completions","completion_window":"24h"}`))
	var obj struct {
		ID            string                                 `json:"id"`
		Status        string                                 `json:"status"`
		OutputFileID  string                                 `json:"output_file_id"`
		ErrorFileID   string                                 `json:"error_file_id"`
		RequestCounts struct{ Total, Completed, Failed int } `json:"request_counts"`
	}
	if json.Unmarshal(b, &obj); status != 200 || obj.ID == "" {
		t.Fatalf("create: %d %s", status, b)
	}
	for deadline := time.Now().Add(20 * time.Second); simOpenAIBatches(t, run) == 0 && time.Now().Before(deadline); {
		time.Sleep(2 * time.Millisecond)
	}
	p1.Signal(syscall.SIGKILL)
	p1.Wait()
	before := simOpenAIBatches(t, run)
	if before == 0 {
		t.Fatal("no upstream batch was created before the kill")
	}
	_, base2, _ := startServe(t, run, args...)
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		status, b = oaDo(t, http.MethodGet, base2+"/v1/batches/"+obj.ID, token, "", nil)
		json.Unmarshal(b, &obj)
		if status != 200 || obj.Status == "completed" || obj.Status == "failed" || obj.Status == "expired" || time.Now().After(deadline) {
			break
		}
	}
	if obj.Status != "completed" || obj.RequestCounts.Completed != n || obj.ErrorFileID != "" {
		t.Fatalf("after the restart: %d %s", status, b)
	}
	status, b = oaDo(t, http.MethodGet, base2+"/v1/files/"+obj.OutputFileID+"/content", token, "", nil)
	seen := map[string]int{}
	for _, l := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		var r struct {
			CustomID string `json:"custom_id"`
			Response struct {
				StatusCode int `json:"status_code"`
			} `json:"response"`
		}
		json.Unmarshal(l, &r)
		if r.Response.StatusCode == 200 {
			seen[r.CustomID]++
		}
	}
	if status != 200 || len(seen) != n {
		t.Errorf("output file: %d, %d custom_ids answered", status, len(seen))
	}
	for id, k := range seen {
		if k != 1 {
			t.Errorf("%s %d times in the output file", id, k)
		}
	}
	t.Logf("upstream batches: %d before the kill, %d in all", before, simOpenAIBatches(t, run))
	billed := map[string]int{}
	for _, e := range run.Server.Ledger() {
		if e.Provider == sim.ProviderOpenAI && e.BatchID != "" {
			billed[e.CustomID]++
		}
	}
	twice := 0
	for _, k := range billed {
		if k > 1 {
			twice++
		}
	}
	if len(billed) != n || twice != 0 {
		t.Errorf("the simulator billed %d custom_ids, %d more than once; want %d, each once", len(billed), twice, n)
	}
	led, _ := os.ReadFile(filepath.Join(dir, "state", "ledger.jsonl"))
	if c := bytes.Count(led, []byte(obj.ID)); c != 1 {
		t.Errorf("the ledger holds the batch %d times:\n%s", c, led)
	}
}
