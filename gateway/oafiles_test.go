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

	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/openai"
	"github.com/apidispatch/apidispatch/sim"
)

// uploadRaw posts a multipart upload of data as filename with purpose,
// and returns the status and the answer's file object or error.
func uploadRaw(t *testing.T, url, tok, purpose, filename string, data []byte) (int, openai.File, openai.ErrorEnvelope) {
	t.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	mw.WriteField("purpose", purpose)
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
	s, err := openFileStore(g.cfg.StateDir)
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
