package workload

import (
	"encoding/json"
	"testing"

	"github.com/apidispatch/apidispatch/cost"
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

// TestBoundOfImagesHoweverSpelt: an image block is billed at up to
// MaxImageTokens whatever its source and however its JSON spells it. A
// base64 PNG of a large blank image is a few hundred bytes and is billed
// as a full image; a type spelt "imag\u0065" is read by the API as
// "image". Before, the first was bounded by its bytes and the second not
// at all (a byte search for "image" missed it): through serve, a client's
// max_cost of $0.033 or $0.041 was billed $0.157 for 100 such images
// (gateway TestMaxCostHeldWithEscapedAndSmallImages).
func TestBoundOfImagesHoweverSpelt(t *testing.T) {
	msg := func(block string) json.RawMessage {
		return json.RawMessage(`{"model":"claude-sonnet-4-5","max_tokens":16,"messages":[{"role":"user","content":[` + block + `,{"type":"text","text":"Judge it."}]}]}`)
	}
	plain := BoundOf("claude-sonnet-4-5", msg(`{"type":"text","text":"x"}`), 16, false).Input
	for _, c := range []struct{ name, block string }{
		{"image in base64", `{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}}`},
		{"image by URL, type escaped", `{"type":"imag\u0065","source":{"type":"url","url":"https://example.com/a.png"}}`},
		{"image in base64, type escaped", `{"type":"\u0069mage","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}}`},
	} {
		if got := BoundOf("claude-sonnet-4-5", msg(c.block), 16, false).Input; got < plain+MaxImageTokens {
			t.Errorf("%s: input bound %d, want at least %d", c.name, got, plain+MaxImageTokens)
		}
	}
	doc := BoundOf("claude-sonnet-4-5", msg(`{"type":"d\u006fcument","source":{"type":"url","url":"https://example.com/a.pdf"}}`), 16, false).Input
	if doc < MaxContextTokens {
		t.Errorf("document by URL, type escaped: input bound %d, want %d", doc, MaxContextTokens)
	}
}

// TestBoundOfNamesInAnyCase: a reader of Go's encoding/json (the
// simulator) matches a field's name whatever its case, so a block's
// "Cache_Control" with "TTL":"1h" is a 1-hour cache write to it, and
// {"Type":"image"} an image. The bound counts them as such (the API
// refuses such names; counting them errs on the dear side). Before, a
// byte-exact match of the names bounded the first at no cache write and
// the second not as an image.
func TestBoundOfNamesInAnyCase(t *testing.T) {
	msg := func(block string) json.RawMessage {
		return json.RawMessage(`{"model":"claude-sonnet-4-5","max_tokens":16,"messages":[{"role":"user","content":[` + block + `,{"type":"text","text":"Judge it."}]}]}`)
	}
	if b := BoundOf("claude-sonnet-4-5", msg(`{"type":"text","text":"x","Cache_Control":{"type":"ephemeral","TTL":"1h"}}`), 16, false); b.CacheWrite != cost.CacheWrite1h {
		t.Errorf("Cache_Control with TTL 1h: cache write %v, want the 1-hour write", b.CacheWrite)
	}
	if b := BoundOf("claude-sonnet-4-5", msg(`{"type":"text","text":"x","cache_control":{"type":"ephemeral","Ttl":"1h"}}`), 16, false); b.CacheWrite != cost.CacheWrite1h {
		t.Errorf("Ttl 1h: cache write %v, want the 1-hour write", b.CacheWrite)
	}
	plain := BoundOf("claude-sonnet-4-5", msg(`{"type":"text","text":"x"}`), 16, false).Input
	if got := BoundOf("claude-sonnet-4-5", msg(`{"Type":"image","Source":{"type":"url","url":"https://example.com/a.png"}}`), 16, false).Input; got < plain+MaxImageTokens {
		t.Errorf(`{"Type":"image"}: input bound %d, want at least %d`, got, plain+MaxImageTokens)
	}
	if got := BoundOf("claude-sonnet-4-5", msg(`{"TYPE":"document","SOURCE":{"TYPE":"url","url":"https://example.com/a.pdf"}}`), 16, false).Input; got < MaxContextTokens {
		t.Errorf(`{"TYPE":"document"} by URL: input bound %d, want %d`, got, MaxContextTokens)
	}
}
