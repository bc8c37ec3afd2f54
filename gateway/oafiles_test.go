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
