package wirelog

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/apidispatch/apidispatch/org"
)

const testKey = "sk-ant-api03-WIRELOGTEST-0123456789abcdef"

// TestWireLogRedactsAndKeepsBlocksWhole sends 64 concurrent requests
// carrying a key in x-api-key and in Authorization, to a server whose
// response echoes the key in a header, and checks that the log holds one
// whole block per exchange, the key's fingerprint, the rate-limit header,
// and no byte sequence of the key.
func TestWireLogRedactsAndKeepsBlocksWhole(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Anthropic-Ratelimit-Requests-Remaining", "3999")
		w.Header().Set("X-Echo", "you sent "+r.Header.Get("X-Api-Key"))
		w.Header().Set("Set-Cookie", "session="+testKey)
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	defer srv.Close()

	var buf bytes.Buffer
	wl := New(&buf)
	c := &http.Client{Transport: wl.Wrap(srv.Client().Transport)}
	const n = 64
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			req, _ := http.NewRequest("POST", srv.URL+"/v1/messages", strings.NewReader(`{"secret_body":"`+testKey+`"}`))
			req.Header.Set("X-Api-Key", testKey)
			req.Header.Set("Authorization", "Bearer "+testKey)
			req.Header.Set("X-Item", fmt.Sprint(i))
			resp, err := c.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		})
	}
	wg.Wait()
	if err := wl.Err(); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, frag := range []string{testKey, testKey[len(testKey)-12:], "WIRELOGTEST", "secret_body"} {
		if strings.Contains(out, frag) {
			t.Fatalf("wire log holds %q:\n%s", frag, out)
		}
	}
	fp := org.Fingerprint(testKey)
	blocks := strings.Split(strings.TrimSuffix(out, "\n\n"), "\n\n")
	if len(blocks) != n {
		t.Fatalf("%d blocks, want %d:\n%s", len(blocks), n, out)
	}
	items := map[string]bool{}
	for _, b := range blocks {
		lines := strings.Split(b, "\n")
		if !strings.HasPrefix(lines[0], "# ") || lines[1] != "> POST "+srv.URL+"/v1/messages" {
			t.Fatalf("block does not start with its number and request line:\n%s", b)
		}
		for _, want := range []string{
			"> X-Api-Key: [key " + fp + "]",
			"> Authorization: Bearer [key " + fp + "]",
			"< 429 Too Many Requests",
			"< Anthropic-Ratelimit-Requests-Remaining: 3999",
			"< X-Echo: you sent [redacted]",
			"< Set-Cookie: [redacted]",
		} {
			if n := slices.Index(lines, want); n < 0 || slices.Index(lines[n+1:], want) >= 0 {
				t.Fatalf("block lacks %q once:\n%s", want, b)
			}
		}
		for _, l := range lines {
			if v, ok := strings.CutPrefix(l, "> X-Item: "); ok {
				items[v] = true
			}
		}
	}
	if len(items) != n {
		t.Fatalf("%d distinct items in the log, want %d", len(items), n)
	}
}

// TestWireLogTransportError checks that a failed exchange is logged with
// its error and passed through unchanged.
func TestWireLogTransportError(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	var buf bytes.Buffer
	c := &http.Client{Transport: New(&buf).Wrap(nil)}
	req, _ := http.NewRequest("GET", url+"/v1/models", nil)
	req.Header.Set("X-Api-Key", testKey)
	_, err := c.Do(req)
	if err == nil {
		t.Fatal("request to a closed server succeeded")
	}
	out := buf.String()
	if !strings.Contains(out, "\n! ") || !strings.Contains(out, "[key "+org.Fingerprint(testKey)+"]") || strings.Contains(out, testKey) {
		t.Fatalf("wire log of a failed exchange:\n%s", out)
	}
}

type failingWriter struct{ calls int }

func (f *failingWriter) Write(p []byte) (int, error) {
	f.calls++
	return 0, errors.New("disk full")
}

// TestWireLogWriteErrorStopsLogging checks that a failing log neither fails
// the requests nor is written to again after its first error.
func TestWireLogWriteErrorStopsLogging(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	fw := &failingWriter{}
	wl := New(fw)
	c := &http.Client{Transport: wl.Wrap(srv.Client().Transport)}
	for range 3 {
		resp, err := c.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if wl.Err() == nil || fw.calls != 1 {
		t.Fatalf("Err() = %v after %d writes; want the first error and one write", wl.Err(), fw.calls)
	}
}

func TestValue(t *testing.T) {
	fp := org.Fingerprint(testKey)
	for _, tc := range []struct{ name, in, want string }{
		{"x-api-key", testKey, "[key " + fp + "]"},
		{"authorization", "Bearer " + testKey, "Bearer [key " + fp + "]"},
		{"Authorization", testKey, "[key " + fp + "]"},
		{"Proxy-Authorization", "Basic " + testKey, "Basic [key " + fp + "]"},
		{"Cookie", "a=b", "[redacted]"},
		{"Request-Id", "req_011CabC", "req_011CabC"},
		{"X-Note", "key " + testKey + " here", "key [redacted] here"},
	} {
		if got := Value(tc.name, tc.in); got != tc.want {
			t.Errorf("Value(%q, …) = %q, want %q", tc.name, got, tc.want)
		}
	}
}
