package upstream

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/cost"
)

func TestMayHaveBilled(t *testing.T) {
	for _, c := range []struct {
		typ   string
		wrote bool
		want  bool
	}{
		{anthropic.ErrTypeTruncated, false, true},
		{anthropic.ErrTypeNotMessage, false, true},
		{anthropic.ErrTypeConnection, true, true},
		{anthropic.ErrTypeConnection, false, false},
		{anthropic.ErrOverloaded, true, false},
		{anthropic.ErrRateLimit, true, false},
	} {
		if got := MayHaveBilled(anthropic.Outcome{ErrorType: c.typ}, c.wrote); got != c.want {
			t.Errorf("%s, written whole %v: may have billed %v, want %v", c.typ, c.wrote, got, c.want)
		}
	}
}

const message = `{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":10,"cache_creation_input_tokens":5,"cache_read_input_tokens":100,"output_tokens":7}}`

// post is a Messages request to srv's URL.
func post(t *testing.T, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/v1/messages", strings.NewReader(`{"model":"m"}`))
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// send is Send to a server running h, counting the onWrote calls.
func send(t *testing.T, h http.HandlerFunc, limit int64) (Result, int32) {
	t.Helper()
	srv := httptest.NewServer(h)
	defer srv.Close()
	var wrote atomic.Int32
	r := Send(srv.Client(), post(t, srv.URL), limit, func() { wrote.Add(1) })
	return r, wrote.Load()
}

func TestSendSuccess(t *testing.T) {
	r, wrote := send(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("content-type", "application/json")
		io.WriteString(w, message)
	}, 1<<20)
	if r.Err != nil || r.Status != 200 || r.Outcome.Kind != anthropic.Success || r.Outcome.Message == nil {
		t.Fatalf("a whole message: %+v", r)
	}
	if !r.Wrote || wrote != 1 || r.MayHaveBilled {
		t.Errorf("wrote %v (onWrote called %d times), may have billed %v; want written once, not unread", r.Wrote, wrote, r.MayHaveBilled)
	}
	if string(r.Body) != message || r.Latency <= 0 || r.At.IsZero() {
		t.Errorf("body %q, latency %v, at %v", r.Body, r.Latency, r.At)
	}
}

// A 2xx whose body broke off after its head is classified as truncated,
// not as a transport error, and may have been billed; the read error is
// kept.
func TestSendCut2xxIsTruncatedAndMayHaveBilled(t *testing.T) {
	r, _ := send(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("content-length", "5000")
		io.WriteString(w, message[:40])
		// Fewer bytes than announced: the server closes the connection.
	}, 1<<20)
	if r.Status != 200 || r.Err == nil {
		t.Fatalf("status %d, error %v: want the 200 and its read error", r.Status, r.Err)
	}
	if o := r.Outcome; o.Kind != anthropic.Retryable || o.ErrorType != anthropic.ErrTypeTruncated {
		t.Errorf("outcome %v %q (%s), want retryable %q", o.Kind, o.ErrorType, o.Reason, anthropic.ErrTypeTruncated)
	}
	if !r.MayHaveBilled {
		t.Error("a cut 2xx: not counted as may have billed")
	}
	if string(r.Body) != message[:40] {
		t.Errorf("body %q, want the %d bytes that came", r.Body, 40)
	}
}

// A refused dial sent nothing: a transport error, never billed.
func TestSendRefusedDialIsNotBilled(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	ln.Close()
	called := false
	r := Send(http.DefaultClient, post(t, url), 1<<20, func() { called = true })
	if r.Err == nil || r.Status != 0 || r.Header != nil {
		t.Fatalf("a refused dial: status %d, error %v", r.Status, r.Err)
	}
	if o := r.Outcome; o.Kind != anthropic.Retryable || o.ErrorType != anthropic.ErrTypeConnection {
		t.Errorf("outcome %v %q, want retryable %q", o.Kind, o.ErrorType, anthropic.ErrTypeConnection)
	}
	if r.Wrote || called || r.MayHaveBilled {
		t.Errorf("wrote %v (onWrote called %v), may have billed %v: want nothing sent, nothing billed", r.Wrote, called, r.MayHaveBilled)
	}
}

// The connection lost after the whole request went out may have been
// billed: the API may be running it.
func TestSendLostAfterWritingMayHaveBilled(t *testing.T) {
	r, wrote := send(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		c, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		c.Close()
	}, 1<<20)
	if r.Err == nil || r.Outcome.ErrorType != anthropic.ErrTypeConnection {
		t.Fatalf("a lost connection: error %v, outcome %q", r.Err, r.Outcome.ErrorType)
	}
	if !r.Wrote || wrote != 1 || !r.MayHaveBilled {
		t.Errorf("wrote %v (onWrote called %d times), may have billed %v: want written once, may have billed", r.Wrote, wrote, r.MayHaveBilled)
	}
}

// An answer longer than the limit is read up to it: what came is not a
// whole message, so it is retried, and may have been billed.
func TestSendOverLimitBody(t *testing.T) {
	r, _ := send(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, message)
	}, 50)
	if r.Err != nil || len(r.Body) != 50 {
		t.Fatalf("error %v, %d bytes read: want the limit's 50 without error", r.Err, len(r.Body))
	}
	if o := r.Outcome; o.Kind != anthropic.Retryable || o.ErrorType != anthropic.ErrTypeTruncated || !r.MayHaveBilled {
		t.Errorf("outcome %v %q, may have billed %v: want retryable %q, may have billed", o.Kind, o.ErrorType, r.MayHaveBilled, anthropic.ErrTypeTruncated)
	}
}

// A 429 is the API's own answer: retryable, rate-limited, its retry-after
// kept, never billed.
func TestSend429WithRetryAfter(t *testing.T) {
	r, _ := send(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("retry-after", "3")
		w.Header().Set(anthropic.HeaderRequestsLimit, "50")
		w.Header().Set(anthropic.HeaderRequestsRemaining, "0")
		w.WriteHeader(http.StatusTooManyRequests)
		io.WriteString(w, `{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}`)
	}, 1<<20)
	o := r.Outcome
	if r.Status != 429 || o.Kind != anthropic.Retryable || !o.RateLimited || o.ErrorType != anthropic.ErrRateLimit {
		t.Fatalf("a 429: status %d, outcome %v %q rate-limited %v", r.Status, o.Kind, o.ErrorType, o.RateLimited)
	}
	if !o.HasRetryAfter || o.RetryAfter != 3*time.Second {
		t.Errorf("retry-after %v (present %v), want 3s", o.RetryAfter, o.HasRetryAfter)
	}
	if r.MayHaveBilled {
		t.Error("a 429 counted as may have billed")
	}
	fb := Feedback(o, r.Header, nil, 0)
	if !fb.Limits.Requests.Present || fb.Limits.Requests.Limit != 50 || fb.Billed {
		t.Errorf("feedback %+v: want the request limit of 50, not billed", fb)
	}
}

// Begin composes its trace with one already on the request's context: the
// caller's hooks still run.
func TestBeginKeepsTheCallersTrace(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, message)
	}))
	defer srv.Close()
	var theirs atomic.Int32
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { theirs.Add(1) }})
	c := Begin(srv.Client(), post(t, srv.URL).WithContext(ctx), nil)
	r := c.Finish(1 << 20)
	if theirs.Load() != 1 || !r.Wrote || !c.Wrote() {
		t.Errorf("the caller's WroteRequest ran %d times, wrote %v: want once, and written", theirs.Load(), r.Wrote)
	}
	if r.Outcome.Kind != anthropic.Success {
		t.Errorf("outcome %v: %s", r.Outcome.Kind, r.Outcome.Reason)
	}
}

// An attempt that never went out is a transport error, never billed.
func TestNotSent(t *testing.T) {
	why := errors.New("not sent: the lease ended")
	r := NotSent(why).Finish(1 << 20)
	if !errors.Is(r.Err, why) || r.Outcome.ErrorType != anthropic.ErrTypeConnection || r.Wrote || r.MayHaveBilled {
		t.Errorf("%+v: want the error kept, a transport error, nothing billed", r)
	}
}

func TestFeedback(t *testing.T) {
	h := http.Header{}
	h.Set(anthropic.HeaderOrganizationID, "org-1")
	u := anthropic.Usage{InputTokens: 10, CacheCreationInputTokens: 5, CacheReadInputTokens: 100, OutputTokens: 7}
	o := anthropic.Outcome{Kind: anthropic.Success, Status: 200}
	fb := Feedback(o, h, &u, cost.Nanos(42))
	if !fb.Billed || fb.Actual.Requests != 1 || fb.Actual.Input != 15 || fb.Actual.Output != 7 || fb.Cost != 42 {
		t.Errorf("billed feedback %+v: want 1 request, 15 input (cache reads excluded), 7 output, cost 42", fb)
	}
	if fb.Limits.OrganizationID != "org-1" || fb.Outcome.Kind != anthropic.Success {
		t.Errorf("feedback %+v: want the org's id and the outcome", fb)
	}
	if fb := Feedback(o, nil, nil, 42); fb.Billed || fb.Cost != 0 || fb.Limits.OrganizationID != "" {
		t.Errorf("feedback without usage or headers %+v: want nothing billed, no limits", fb)
	}
}
