package batch

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/org"
)

// TestResultsStream: complete lines are passed on; a last line without its
// newline counts when it is a whole object; a stream that breaks off, or
// ends inside a line, is an error after the lines before it; an error
// status carries the API's error type and retry-after.
func TestResultsStream(t *testing.T) {
	for _, tc := range []struct {
		name   string
		body   string
		status int
		lines  int
		err    bool
		typ    string
	}{
		{"whole", "{\"custom_id\":\"a\"}\n{\"custom_id\":\"b\"}\n", 200, 2, false, ""},
		{"last line without newline", "{\"custom_id\":\"a\"}\n{\"custom_id\":\"b\"}", 200, 2, false, ""},
		{"blank lines", "\n{\"custom_id\":\"a\"}\n\n", 200, 1, false, ""},
		{"ends inside a line", "{\"custom_id\":\"a\"}\n{\"custom_id\":\"b", 200, 1, true, "truncated"},
		{"not found", `{"type":"error","error":{"type":"not_found_error","message":"no such batch"}}`, 404, 0, true, "not_found_error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("x-api-key") != "sk-test" || r.URL.Path != "/v1/messages/batches/msgbatch_1/results" {
					http.Error(w, "bad request", 400)
					return
				}
				w.Header().Set("retry-after", "3")
				w.WriteHeader(tc.status)
				w.Write([]byte(tc.body))
			}))
			defer srv.Close()
			u, _ := url.Parse(srv.URL)
			c := messagesAPI{newConn(srv.Client(), u, org.Org{Name: "a", Key: org.NewKey("sk-test")}, nil)}
			n := 0
			err := c.results(context.Background(), &apiBatch{ID: "msgbatch_1"}, "results", func([]byte) error { n++; return nil })
			if n != tc.lines || (err != nil) != tc.err {
				t.Fatalf("%d lines, error %v; want %d lines, error %v", n, err, tc.lines, tc.err)
			}
			var ae *apiError
			if tc.err && (!errors.As(err, &ae) || (tc.typ != "truncated" && ae.typ != tc.typ)) {
				t.Fatalf("error %v; want an apiError of type %s", err, tc.typ)
			}
			if tc.status == 404 && (ae.retryAfter.Seconds() != 3 || !ae.certain()) {
				t.Fatalf("404: retry-after %v, certain %v", ae.retryAfter, ae.certain())
			}
		})
	}
}

// TestCertain: only a client error other than 408/409 proves a create made
// nothing; a 5xx or no answer may have made a batch.
func TestCertain(t *testing.T) {
	for status, want := range map[int]bool{0: false, 400: true, 408: false, 409: false, 413: true, 429: true, 500: false, 529: false} {
		if got := (&apiError{status: status}).certain(); got != want {
			t.Errorf("status %d: certain %v, want %v", status, got, want)
		}
	}
}

// TestErrorRetryAfter: an error answer's retry-after is read as the sync
// route reads it: seconds, an HTTP date, or retry-after-ms first.
func TestErrorRetryAfter(t *testing.T) {
	at := time.Now().Add(10 * time.Second).UTC().Format(http.TimeFormat)
	for _, tc := range []struct {
		name     string
		h        http.Header
		min, max time.Duration
	}{
		{"seconds", http.Header{"Retry-After": {"3"}}, 3 * time.Second, 3 * time.Second},
		{"fractional seconds", http.Header{"Retry-After": {"0.25"}}, 250 * time.Millisecond, 250 * time.Millisecond},
		{"HTTP date", http.Header{"Retry-After": {at}}, 8 * time.Second, 10 * time.Second},
		{"milliseconds first", http.Header{"Retry-After": {"3"}, "Retry-After-Ms": {"1500"}}, 1500 * time.Millisecond, 1500 * time.Millisecond},
		{"not a delay", http.Header{"Retry-After": {"soon"}}, 0, 0},
		{"none", http.Header{}, 0, 0},
	} {
		e := errorOf(&http.Response{StatusCode: 429, Header: tc.h}, nil)
		if e.retryAfter < tc.min || e.retryAfter > tc.max {
			t.Errorf("%s: retry-after %v, want %v to %v", tc.name, e.retryAfter, tc.min, tc.max)
		}
	}
}
