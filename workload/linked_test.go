package workload

import (
	"encoding/json"
	"testing"
)

// A request's bound counts what its blocks name but do not carry: an image
// by URL or file at the most an image is billed, a document by URL or file
// at the largest context window (it may hold any number of pages). Content
// in the body (base64, plain text) is counted through the body.
func TestBoundOfLinkedMedia(t *testing.T) {
	msg := func(block string) json.RawMessage {
		return json.RawMessage(`{"model":"claude-sonnet-4-5","max_tokens":16,"messages":[{"role":"user","content":[` + block + `,{"type":"text","text":"Judge it."}]}]}`)
	}
	plain := BoundOf("claude-sonnet-4-5", msg(`{"type":"text","text":"x"}`), 16, false).Input
	for _, c := range []struct {
		name  string
		block string
		least int64
		most  int64
	}{
		{"image by URL", `{"type":"image","source":{"type":"url","url":"https://example.com/a.png"}}`, plain + MaxImageTokens, plain + MaxImageTokens + 200},
		{"image by file", `{"type":"image","source":{"type":"file","file_id":"file_1"}}`, plain + MaxImageTokens, plain + MaxImageTokens + 200},
		{"document by URL", `{"type":"document","source":{"type":"url","url":"https://example.com/a.pdf"}}`, MaxContextTokens, MaxContextTokens},
		{"document by file", `{"type":"document","source":{"type":"file","file_id":"file_2"}}`, MaxContextTokens, MaxContextTokens},
		{"document as text", `{"type":"document","source":{"type":"text","media_type":"text/plain","data":"short"}}`, plain, plain + 200},
		{"document in base64", `{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"JVBERi0="}}`, plain, plain + 200},
	} {
		got := BoundOf("claude-sonnet-4-5", msg(c.block), 16, false).Input
		if got < c.least || got > c.most {
			t.Errorf("%s: input bound %d, want %d to %d", c.name, got, c.least, c.most)
		}
	}
}
