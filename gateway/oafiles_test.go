package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/openai"
	"github.com/apidispatch/apidispatch/sim"
)

// uploadRaw posts a multipart upload of data as filename with purpose and
// the form fields given as name, value pairs, and returns the status and
// the answer's file object or error.
func uploadRaw(t *testing.T, url, tok, purpose, filename string, data []byte, fields ...string) (int, openai.File, openai.ErrorEnvelope) {
	t.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	mw.WriteField("purpose", purpose)
	for i := 0; i+1 < len(fields); i += 2 {
		mw.WriteField(fields[i], fields[i+1])
	}
	fw, _ := mw.CreateFormFile("file", filename)
	fw.Write(data)
	mw.Close()
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/files", &body)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var f openai.File
	var e openai.ErrorEnvelope
	if resp.StatusCode == http.StatusOK {
		json.Unmarshal(b, &f)
	} else {
		json.Unmarshal(b, &e)
	}
	return resp.StatusCode, f, e
}

// The gateway's file storage is bounded: an upload above the size bound
// is refused (413) and leaves nothing on disk; a client whose uploads
// hold the most bytes (or files) allowed is refused (400
// storage_limit_exceeded) until it deletes some, while another client is
// not; what is kept is 0600; an upload cut before it was recorded is
// removed at the next start.
func TestFileStorageBounded(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	g, srv := startGW(t, run, nil)
	g.files.maxFile, g.files.maxClientBytes, g.files.maxClientFiles = 100, 150, 3
	line := []byte(strings.Repeat("x", 90))

	st, _, e := uploadRaw(t, srv.URL, tokA, "batch", "big.jsonl", bytes.Repeat(line, 2))
	if st != http.StatusRequestEntityTooLarge || e.Error.Param == nil || *e.Error.Param != "file" {
		t.Errorf("an upload above the size bound: %d %+v, want 413", st, e.Error)
	}
	if st, _, e := uploadRaw(t, srv.URL, tokA, "fine-tune", "a.jsonl", line); st != 400 || *e.Error.Param != "purpose" {
		t.Errorf("purpose fine-tune: %d %+v", st, e.Error)
	}
	if st, _, e := uploadRaw(t, srv.URL, tokA, "batch", "a.txt", line); st != 400 || e.Error.CodeString() != "invalid_file_format" {
		t.Errorf("a .txt batch file: %d %+v", st, e.Error)
	}
	st, first, _ := uploadRaw(t, srv.URL, tokA, "batch", "a.jsonl", line)
	if st != 200 || first.Bytes != 90 {
		t.Fatalf("an upload within the bounds: %d %+v", st, first)
	}
	st, _, e = uploadRaw(t, srv.URL, tokA, "batch", "b.jsonl", line)
	if st != 400 || e.Error.CodeString() != "storage_limit_exceeded" || !strings.Contains(e.Error.Message, "delete files") {
		t.Errorf("an upload past the client's bytes: %d %+v, want 400 storage_limit_exceeded", st, e.Error)
	}
	if st, _, _ := uploadRaw(t, srv.URL, tokB, "batch", "b.jsonl", line); st != 200 {
		t.Errorf("another client's upload: %d, want 200 (the bound is per client)", st)
	}
	req, _ := http.NewRequest(http.MethodDelete, srv.URL+"/v1/files/"+first.ID, nil)
	req.Header.Set("Authorization", "Bearer "+tokA)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("delete: %v %v", resp, err)
	}
	resp.Body.Close()
	if st, _, _ := uploadRaw(t, srv.URL, tokA, "batch", "c.jsonl", line); st != 200 {
		t.Errorf("an upload after a delete: %d, want 200", st)
	}
	g.files.maxClientBytes = 1 << 20
	for i := range 3 {
		st, _, e := uploadRaw(t, srv.URL, tokA, "batch", "d.jsonl", line)
		if want := map[bool]int{true: 200, false: 400}[i < 2]; st != want {
			t.Errorf("upload %d past 1 file: %d %+v, want %d (3 files at most)", i, st, e.Error, want)
		}
	}

	ents, _ := os.ReadDir(g.files.dir)
	recs := 0
	for _, ent := range ents {
		fi, _ := ent.Info()
		if fi.Mode().Perm() != 0o600 || strings.HasSuffix(ent.Name(), ".tmp") {
			t.Errorf("%s: mode %v (want 0600; no upload's temporary file left)", ent.Name(), fi.Mode().Perm())
		}
		if strings.HasSuffix(ent.Name(), ".json") {
			recs++
		}
	}
	if recs != 4 {
		t.Errorf("%d file records on disk, want 4 (a's 3, b's 1)", recs)
	}
	// An upload cut before it was recorded: removed at the next start.
	for _, n := range []string{"upload-1.tmp", "file-0123.jsonl"} {
		os.WriteFile(filepath.Join(g.files.dir, n), line, 0o600)
	}
	s, err := openFileStore(g.cfg.StateDir, g.cfg.Speed)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.byID) != 4 {
		t.Errorf("%d files after a restart, want 4", len(s.byID))
	}
	for _, n := range []string{"upload-1.tmp", "file-0123.jsonl"} {
		if _, err := os.Stat(filepath.Join(g.files.dir, n)); err == nil {
			t.Errorf("%s left after a restart", n)
		}
	}
}

// An Anthropic client (anthropic-version) asking /v1/files, which
// Anthropic's own Files API shares, gets the Anthropic 404 it got before
// the gateway served OpenAI files: not an OpenAI answer.
func TestAnthropicClientNotServedOpenAIFiles(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	_, srv := startGW(t, run, nil)
	for _, p := range []string{"/v1/files", "/v1/files/file-x", "/v1/batches"} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+p, nil)
		req.Header.Set("x-api-key", tokA)
		req.Header.Set("anthropic-version", "2023-06-01")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e struct {
			Type  string `json:"type"`
			Error struct {
				Type string `json:"type"`
			} `json:"error"`
		}
		json.Unmarshal(b, &e)
		if resp.StatusCode != 404 || e.Type != "error" || e.Error.Type != "not_found_error" {
			t.Errorf("GET %s by an Anthropic client: %d %s, want the Anthropic 404", p, resp.StatusCode, b)
		}
	}
}

// Hostile input on the OpenAI Files and Batches routes reaches no upstream
// and no file outside the gateway's records: a wrong token, ids that
// would climb out of the state directory, a filename with a path, an
// upload over the bound sent chunked, and malformed creates are each
// answered in OpenAI's envelope.
func TestHostileInputOnOpenAIFileRoutes(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	up, reached := countingUpstream(t, run)
	g, srv := startGW(t, run, func(c *Config) { c.BaseURL = up })
	g.files.maxFile = 1000
	a := map[string]string{"Authorization": "Bearer " + tokA}
	type want struct {
		status int
		param  string
	}
	var calls []hostileCall
	wants := map[string]want{}
	add := func(c hostileCall, status int, param string) {
		calls = append(calls, c)
		wants[c.name] = want{status, param}
	}
	for _, r := range [][2]string{{"POST", "/v1/files"}, {"GET", "/v1/files"}, {"GET", "/v1/files/file-x"}, {"DELETE", "/v1/files/file-x"},
		{"GET", "/v1/files/file-x/content"}, {"POST", "/v1/batches"}, {"GET", "/v1/batches"}, {"GET", "/v1/batches/batch_x"}, {"POST", "/v1/batches/batch_x/cancel"}} {
		add(hostileCall{name: "wrong token " + r[0] + " " + r[1], method: r[0], path: r[1], hdr: map[string]string{"Authorization": "Bearer sk-gw-wrong-token-000000000"}}, 401, "")
	}
	for _, id := range []string{"..%2Fledger.jsonl", "..%2F..%2Fstatus.json", "file-x%2F..%2F..%2Fledger.jsonl", "%2E%2E"} {
		add(hostileCall{name: "file id " + id, method: "GET", path: "/v1/files/" + id + "/content", hdr: a}, 404, "id")
		add(hostileCall{name: "file get " + id, method: "GET", path: "/v1/files/" + id, hdr: a}, 404, "id")
	}
	for _, id := range []string{"../ledger.jsonl", "../../files/x", "batches/../files"} {
		body := `{"input_file_id":"` + id + `","endpoint":"/v1/chat/completions","completion_window":"24h"}`
		add(hostileCall{name: "batch input " + id, method: "POST", path: "/v1/batches", body: strings.NewReader(body), hdr: a}, 404, "input_file_id")
	}
	add(hostileCall{name: "batch create malformed", method: "POST", path: "/v1/batches", body: strings.NewReader(`{"input_file_id":`), hdr: a}, 400, "")
	add(hostileCall{name: "batch create unknown field", method: "POST", path: "/v1/batches", body: strings.NewReader(`{"input_file_id":"f","endpoint":"/v1/chat/completions","completion_window":"24h","x":1}`), hdr: a}, 400, "")
	add(hostileCall{name: "batch create window", method: "POST", path: "/v1/batches", body: strings.NewReader(`{"input_file_id":"f","endpoint":"/v1/chat/completions","completion_window":"1h"}`), hdr: a}, 400, "completion_window")
	add(hostileCall{name: "batch create endpoint", method: "POST", path: "/v1/batches", body: strings.NewReader(`{"input_file_id":"f","endpoint":"/v1/embeddings","completion_window":"24h"}`), hdr: a}, 400, "endpoint")
	add(hostileCall{name: "upload not multipart", method: "POST", path: "/v1/files", body: strings.NewReader(`{}`), hdr: map[string]string{"Authorization": "Bearer " + tokA, "Content-Type": "application/json"}}, 400, "")
	var form bytes.Buffer
	mw := multipart.NewWriter(&form)
	mw.WriteField("purpose", "batch")
	fw, _ := mw.CreateFormFile("file", "x.jsonl")
	fw.Write(bytes.Repeat([]byte("0"), 5000))
	mw.Close()
	add(hostileCall{name: "upload over the bound chunked", method: "POST", path: "/v1/files", body: &form, length: -1,
		hdr: map[string]string{"Authorization": "Bearer " + tokA, "Content-Type": mw.FormDataContentType()}}, 413, "file")
	for _, c := range calls {
		status, body := c.do(t, srv.URL)
		w := wants[c.name]
		var e openai.ErrorEnvelope
		if json.Unmarshal([]byte(body), &e); status != w.status || e.Error.Message == "" || w.param != "" && (e.Error.Param == nil || *e.Error.Param != w.param) {
			t.Errorf("%s: %d %.200s, want %d (param %q) in OpenAI's envelope", c.name, status, body, w.status, w.param)
		}
	}
	// A filename with a path is kept as its base name only, and the
	// content is stored under the gateway's own name.
	st, f, _ := uploadRaw(t, srv.URL, tokA, "batch", "../../../escape.jsonl", []byte("x"))
	if st != 200 || f.Filename != "escape.jsonl" {
		t.Errorf("an upload named ../../../escape.jsonl: %d %+v", st, f)
	}
	if _, err := os.Stat(filepath.Join(g.cfg.StateDir, "..", "escape.jsonl")); err == nil {
		t.Error("an upload was written outside the state directory")
	}
	// A batch of the client's own file, on a gateway without OpenAI orgs:
	// a 400 naming what is missing.
	body := `{"input_file_id":"` + f.ID + `","endpoint":"/v1/chat/completions","completion_window":"24h"}`
	st, resp := hostileCall{name: "no OpenAI org", method: "POST", path: "/v1/batches", body: strings.NewReader(body), hdr: a}.do(t, srv.URL)
	if st != 400 || !strings.Contains(resp, "no OpenAI org") {
		t.Errorf("a batch without OpenAI orgs: %d %s", st, resp)
	}
	if n := reached.Load(); n != 0 {
		t.Errorf("%d requests reached the simulator", n)
	}
}

// uploadWith is uploadRaw of a batch file with the form's fields too.
func uploadWith(t *testing.T, url, tok string, data []byte, fields ...string) (int, openai.File, openai.ErrorEnvelope) {
	t.Helper()
	return uploadRaw(t, url, tok, "batch", "in.jsonl", data, fields...)
}

// waitPast sleeps until the wall clock is past Unix second u.
func waitPast(u int64) {
	if d := time.Until(time.Unix(u+1, 0)); d > 0 {
		time.Sleep(d)
	}
}

// TestOpenAIFilesExpire: files expire as the API's. An upload's file
// object says when (30 days of API time by default; expires_after
// anchor created_at with seconds from 3,600 to 30 days, else a 400 on
// the param); past it the file is not found (retrieve, content, as a
// batch's input) nor listed, and its record and content are gone from
// disk. A batch's output file expires after the create's
// output_expires_after the same way. Before, expires_at was null and no
// file ever expired.
func TestOpenAIFilesExpire(t *testing.T) {
	const speed = 10_000 // an hour of API time is 0.36 s
	run := oaSimAt(t, speed)
	g, srv := startGW(t, run, func(c *Config) { c.Orgs = run.Server.AllOrgs() })
	data := oaInput("exp", "gpt-4.1-mini", "gpt-4.1-mini")
	st, keep, e := uploadWith(t, srv.URL, tokA, data)
	if st != 200 || keep.ExpiresAt == nil || *keep.ExpiresAt-keep.CreatedAt < 259 || *keep.ExpiresAt-keep.CreatedAt > 261 {
		t.Fatalf("an upload without expires_after: %d %+v %+v, want expires_at 30 days of API time (259.2 s) after created_at", st, keep, e.Error)
	}
	for _, c := range []struct {
		fields []string
		param  string
	}{
		{[]string{"expires_after[anchor]", "created_at", "expires_after[seconds]", "100"}, "expires_after.seconds"},
		{[]string{"expires_after[anchor]", "created_at", "expires_after[seconds]", "2592001"}, "expires_after.seconds"},
		{[]string{"expires_after[anchor]", "created_at", "expires_after[seconds]", "soon"}, "expires_after.seconds"},
		{[]string{"expires_after[anchor]", "last_used_at", "expires_after[seconds]", "3600"}, "expires_after.anchor"},
		{[]string{"expires_after[seconds]", "3600"}, "expires_after.anchor"},
	} {
		if st, _, e := uploadWith(t, srv.URL, tokA, data, c.fields...); st != 400 || e.Error.Param == nil || *e.Error.Param != c.param {
			t.Errorf("upload with %v: %d %+v, want a 400 on %s", c.fields, st, e.Error, c.param)
		}
	}
	st, short, e := uploadWith(t, srv.URL, tokA, data, "expires_after[anchor]", "created_at", "expires_after[seconds]", "3600")
	if st != 200 || short.ExpiresAt == nil || *short.ExpiresAt-short.CreatedAt > 2 {
		t.Fatalf("an upload expiring after 3600 s of API time: %d %+v %+v", st, short, e.Error)
	}
	// The output file expires 10 hours of API time (3.6 s) after it is
	// written: time enough to read its object once the batch is done.
	b := oaCreateOf(t, srv.URL, tokA, keep.ID, `,"output_expires_after":{"anchor":"created_at","seconds":36000}`)
	if st, body := oaCall(t, http.MethodPost, srv.URL+"/v1/batches", tokA, `{"input_file_id":"`+keep.ID+`","endpoint":"/v1/chat/completions","completion_window":"24h","output_expires_after":{"anchor":"created_at","seconds":60}}`); st != 400 || !strings.Contains(string(body), "output_expires_after.seconds") {
		t.Errorf("a create with output_expires_after 60 s: %d %s, want a 400 on output_expires_after.seconds", st, body)
	}
	done := oaAwait(t, srv.URL, tokA, b.ID, openai.BatchCompleted, openai.BatchFailed, openai.BatchExpired)
	if done.Status != openai.BatchCompleted || done.OutputFileID == nil {
		t.Fatalf("batch %+v", done)
	}
	var out openai.File
	if st, body := oaCall(t, http.MethodGet, srv.URL+"/v1/files/"+*done.OutputFileID, tokA, ""); st != 200 || json.Unmarshal(body, &out) != nil || out.ExpiresAt == nil ||
		*out.ExpiresAt-out.CreatedAt < 3 || *out.ExpiresAt-out.CreatedAt > 5 {
		t.Fatalf("the output file: %d %s, want expires_at 3.6 s after created_at (36,000 s of API time)", st, body)
	}

	waitPast(max(*short.ExpiresAt, *out.ExpiresAt))
	for _, p := range []string{"/v1/files/" + short.ID, "/v1/files/" + short.ID + "/content", "/v1/files/" + out.ID, "/v1/files/" + out.ID + "/content"} {
		if st, body := oaCall(t, http.MethodGet, srv.URL+p, tokA, ""); st != 404 {
			t.Errorf("GET %s past its expiry: %d %s, want 404", p, st, body)
		}
	}
	if st, body := oaCall(t, http.MethodPost, srv.URL+"/v1/batches", tokA, `{"input_file_id":"`+short.ID+`","endpoint":"/v1/chat/completions","completion_window":"24h"}`); st != 404 || !strings.Contains(string(body), "input_file_id") {
		t.Errorf("a batch of an expired file: %d %s, want the 404 on input_file_id", st, body)
	}
	st, body := oaCall(t, http.MethodGet, srv.URL+"/v1/files", tokA, "")
	var list struct {
		Data []openai.File `json:"data"`
	}
	if json.Unmarshal(body, &list); st != 200 || len(list.Data) != 1 || list.Data[0].ID != keep.ID {
		t.Errorf("list past the expiries: %d %s, want the unexpired upload only", st, body)
	}
	for _, f := range []string{filepath.Join(g.files.dir, short.ID+".json"), filepath.Join(g.files.dir, short.ID+".jsonl"),
		filepath.Join(g.files.dir, out.ID+".json"), filepath.Join(g.batches.dir, b.ID, oaOutputFile)} {
		if _, err := os.Stat(f); err == nil {
			t.Errorf("%s is left on disk past its file's expiry", f)
		}
	}
}

// TestOpenAIClientFileBoundCountsResults: a client's storage bound counts
// the output and error files of its batches, not only its uploads: with
// the bound between its uploads and its uploads plus its batch's output
// file, an upload is refused (storage_limit_exceeded) until it deletes
// the output file. Before, the output file was not counted and the
// upload was taken.
func TestOpenAIClientFileBoundCountsResults(t *testing.T) {
	run := oaSim(t)
	g, srv := startGW(t, run, func(c *Config) { c.Orgs = run.Server.AllOrgs() })
	data := oaInput("bound", "gpt-4.1-mini", "gpt-4.1-mini")
	b := oaCreate(t, srv.URL, tokA, data)
	done := oaAwait(t, srv.URL, tokA, b.ID, openai.BatchCompleted, openai.BatchFailed, openai.BatchExpired)
	if done.Status != openai.BatchCompleted || done.OutputFileID == nil || done.ErrorFileID != nil {
		t.Fatalf("batch %+v", done)
	}
	var out openai.File
	if st, body := oaCall(t, http.MethodGet, srv.URL+"/v1/files/"+*done.OutputFileID, tokA, ""); st != 200 || json.Unmarshal(body, &out) != nil || out.Bytes == 0 {
		t.Fatalf("the output file: %d %s", st, body)
	}
	small := []byte("{}\n")
	g.files.mu.Lock()
	g.files.maxClientBytes = int64(len(data)+len(small)) + out.Bytes - 1 // the uploads fit; with the output file, not
	g.files.mu.Unlock()
	st, _, e := uploadRaw(t, srv.URL, tokA, "batch", "more.jsonl", small)
	if st != 400 || e.Error.CodeString() != "storage_limit_exceeded" || !strings.Contains(e.Error.Message, "output and error files") {
		t.Errorf("an upload past the bound with the output file counted: %d %+v, want 400 storage_limit_exceeded", st, e.Error)
	}
	if st, body := oaCall(t, http.MethodDelete, srv.URL+"/v1/files/"+out.ID, tokA, ""); st != 200 {
		t.Fatalf("delete of the output file: %d %s", st, body)
	}
	if st, _, e := uploadRaw(t, srv.URL, tokA, "batch", "more.jsonl", small); st != 200 {
		t.Errorf("the upload once the output file is deleted: %d %+v, want 200", st, e.Error)
	}
}
