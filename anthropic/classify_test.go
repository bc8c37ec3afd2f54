package anthropic

import (
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

const okBody = `{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":2}}`

func env(typ, msg string) string {
	return `{"type":"error","error":{"type":"` + typ + `","message":"` + msg + `"},"request_id":"req_1"}`
}

func TestClassify(t *testing.T) {
	t.Parallel()
	hdr := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i+1 < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	spend := `{"type":"error","error":{"type":"rate_limit_error","message":"monthly spend limit reached; resumes 2027-01-01T00:00:00Z","details":{"error_code":"enforced_spend_limit_reached"}},"request_id":"req_2"}`
	cases := []struct {
		name      string
		status    int
		h         http.Header
		body      string
		terr      error
		kind      Kind
		errType   string
		scope     Scope
		retry     time.Duration
		hasRetry  bool
		rateLimit bool
	}{
		{"200 message", 200, nil, okBody, nil, Success, "", 0, 0, false, false},
		{"200 truncated", 200, nil, okBody[:40], nil, Retryable, ErrTypeTruncated, 0, 0, false, false},
		{"200 not a message", 200, nil, `{"hello":1}`, nil, Retryable, ErrTypeNotMessage, 0, 0, false, false},
		{"200 empty", 200, nil, ``, nil, Retryable, ErrTypeTruncated, 0, 0, false, false},
		{"transport", 0, nil, "", errors.New("connection reset by peer"), Retryable, ErrTypeConnection, 0, 0, false, false},
		{"429 retry-after", 429, hdr("retry-after", "7"), env("rate_limit_error", "slow down"), nil, Retryable, ErrRateLimit, 0, 7 * time.Second, true, true},
		{"429 retry-after long", 429, hdr("retry-after", "3600"), env("rate_limit_error", "x"), nil, Retryable, ErrRateLimit, 0, time.Hour, true, true},
		{"429 retry-after-ms wins", 429, hdr("retry-after", "2", "retry-after-ms", "150.5"), env("rate_limit_error", "x"), nil, Retryable, ErrRateLimit, 0, 150500 * time.Microsecond, true, true},
		{"429 no retry-after", 429, nil, env("rate_limit_error", "x"), nil, Retryable, ErrRateLimit, 0, 0, false, true},
		{"429 no body", 429, nil, "", nil, Retryable, ErrRateLimit, 0, 0, false, true},
		{"429 should-retry false still retried", 429, hdr("x-should-retry", "false"), env("rate_limit_error", "x"), nil, Retryable, ErrRateLimit, 0, 0, false, true},
		{"429 spend cap", 429, nil, spend, nil, LaneFatal, ErrRateLimit, ScopeOrg, 0, false, false},
		{"529", 529, nil, env("overloaded_error", "Overloaded"), nil, Retryable, ErrOverloaded, 0, 0, false, false},
		{"500 json", 500, nil, env("api_error", "Internal"), nil, Retryable, ErrAPI, 0, 0, false, false},
		{"500 html", 500, nil, "<html><body>oops</body></html>", nil, Retryable, ErrAPI, 0, 0, false, false},
		{"502", 502, nil, "bad gateway", nil, Retryable, ErrAPI, 0, 0, false, false},
		{"503", 503, nil, "", nil, Retryable, ErrAPI, 0, 0, false, false},
		{"504", 504, nil, env("timeout_error", "t"), nil, Retryable, ErrTimeout, 0, 0, false, false},
		{"408", 408, nil, "", nil, Retryable, ErrTimeout, 0, 0, false, false},
		{"409", 409, nil, env("conflict_error", "c"), nil, Retryable, ErrConflict, 0, 0, false, false},
		{"400", 400, nil, env("invalid_request_error", "max_tokens: field required"), nil, Terminal, ErrInvalidRequest, 0, 0, false, false},
		{"400 self-set spend limit", 400, nil, env("invalid_request_error", "You have reached your specified API usage limits."), nil, LaneFatal, ErrInvalidRequest, ScopeOrg, 0, false, false},
		{"401", 401, nil, env("authentication_error", "invalid x-api-key"), nil, LaneFatal, ErrAuthentication, ScopeOrg, 0, false, false},
		{"401 no body", 401, nil, "", nil, LaneFatal, ErrAuthentication, ScopeOrg, 0, false, false},
		{"402", 402, nil, env("billing_error", "b"), nil, LaneFatal, ErrBilling, ScopeOrg, 0, false, false},
		{"403", 403, nil, env("permission_error", "p"), nil, LaneFatal, ErrPermission, ScopeLane, 0, false, false},
		{"404", 404, nil, env("not_found_error", "model: x"), nil, Terminal, ErrNotFound, 0, 0, false, false},
		{"413", 413, nil, env("request_too_large", "too big"), nil, Terminal, ErrRequestTooLarge, 0, 0, false, false},
		{"418 other 4xx", 418, nil, "", nil, Terminal, ErrInvalidRequest, 0, 0, false, false},
		{"302", 302, nil, "", nil, Retryable, ErrTypeUnknownStatus, 0, 0, false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := Classify(c.status, c.h, []byte(c.body), c.terr, t0)
			if o.Kind != c.kind || o.ErrorType != c.errType || o.RetryAfter != c.retry || o.HasRetryAfter != c.hasRetry || o.RateLimited != c.rateLimit {
				t.Fatalf("got kind=%v type=%q retry=%v/%v rl=%v; want %v %q %v/%v %v (reason %q)",
					o.Kind, o.ErrorType, o.RetryAfter, o.HasRetryAfter, o.RateLimited, c.kind, c.errType, c.retry, c.hasRetry, c.rateLimit, o.Reason)
			}
			if o.Kind == LaneFatal && o.Scope != c.scope {
				t.Fatalf("scope %v, want %v", o.Scope, c.scope)
			}
			if o.Kind == Success && (o.Message == nil || o.Message.Usage.InputTokens != 3) {
				t.Fatalf("message not parsed: %+v", o.Message)
			}
			if o.Kind == Terminal && c.status != 418 && o.Envelope == nil {
				t.Fatalf("terminal error lost the API's envelope")
			}
		})
	}
}

// TestClassifyNeverTerminalForRetryableTypes pins the docs/design.md §23 data-loss
// bug: whatever the status, a retryable error type never classifies Terminal.
func TestClassifyNeverTerminalForRetryableTypes(t *testing.T) {
	t.Parallel()
	for _, st := range []int{408, 409, 429, 500, 502, 503, 504, 529} {
		for _, typ := range []string{ErrRateLimit, ErrOverloaded, ErrAPI, ErrTimeout} {
			o := Classify(st, nil, []byte(env(typ, "x")), nil, t0)
			if o.Kind == Terminal {
				t.Fatalf("status %d type %s classified terminal", st, typ)
			}
		}
	}
}

func TestParseRetryAfterDate(t *testing.T) {
	t.Parallel()
	h := http.Header{}
	h.Set("retry-after", t0.Add(90*time.Second).Format(http.TimeFormat))
	d, ok := ParseRetryAfter(h, t0)
	if !ok || d != 90*time.Second {
		t.Fatalf("got %v %v", d, ok)
	}
	h.Set("retry-after", "-5")
	if d, ok := ParseRetryAfter(h, t0); !ok || d != 0 {
		t.Fatalf("negative: %v %v", d, ok)
	}
	h.Set("retry-after", "soon")
	if _, ok := ParseRetryAfter(h, t0); ok {
		t.Fatal("garbage accepted")
	}
}

func TestParseRateLimits(t *testing.T) {
	t.Parallel()
	h := http.Header{}
	h.Set(HeaderRequestsLimit, "30000")
	h.Set(HeaderRequestsRemaining, "29923")
	h.Set(HeaderRequestsReset, "2026-12-02T12:00:01Z")
	h.Set(HeaderOutputLimit, "1000000")
	h.Set(HeaderOutputRemaining, "-3")
	h.Set(HeaderInputLimit, "x")
	h.Set(HeaderOrganizationID, "b94495b5-0000")
	rl := ParseRateLimits(h)
	if !rl.Requests.Present || rl.Requests.Limit != 30000 || rl.Requests.Remaining != 29923 || !rl.Requests.Reset.Equal(t0.Add(time.Second)) {
		t.Fatalf("requests %+v", rl.Requests)
	}
	if !rl.Output.Present || rl.Output.Remaining != 0 {
		t.Fatalf("output %+v", rl.Output)
	}
	if rl.Input.Present || rl.Tokens.Present {
		t.Fatalf("malformed or missing headers marked present")
	}
	if rl.OrganizationID != "b94495b5-0000" {
		t.Fatal(rl.OrganizationID)
	}
}

func FuzzClassify(f *testing.F) {
	f.Add(200, okBody, "", "")
	f.Add(429, env("rate_limit_error", "x"), "5", "")
	f.Add(529, "", "", "12.5")
	f.Add(400, env("invalid_request_error", "bad"), "", "")
	f.Add(500, "<html>", "Wed, 21 Oct 2015 07:28:00 GMT", "")
	f.Fuzz(func(t *testing.T, status int, body, ra, ram string) {
		h := http.Header{}
		h.Set("retry-after", ra)
		h.Set("retry-after-ms", ram)
		o := Classify(status, h, []byte(body), nil, t0)
		if o.Kind < Success || o.Kind > LaneFatal {
			t.Fatalf("no kind for status %d", status)
		}
		if o.RetryAfter < 0 || o.RetryAfter > maxDelay {
			t.Fatalf("retry-after out of range: %v", o.RetryAfter)
		}
		if o.Kind == Terminal && IsRetryableType(o.ErrorType) {
			t.Fatalf("retryable type %q classified terminal (status %d)", o.ErrorType, status)
		}
		if (status == 429 || status >= 500) && o.Kind == Terminal {
			t.Fatalf("status %d terminal", status)
		}
		_ = ParseRateLimits(h)
	})
}

// FuzzDecodeMessageHead: the fast decoder of a success body agrees with
// json.Unmarshal on every input, valid or not.
func FuzzDecodeMessageHead(f *testing.F) {
	f.Add(okBody)
	f.Add(`{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"a\"}b"}],"stop_reason":null,"usage":{"input_tokens":12,"output_tokens":3,"cache_creation":{"ephemeral_5m_input_tokens":1}}}`)
	f.Add(`{"ID":"x","usage":{"Input_Tokens":5},"usage":{"output_tokens":2}}`)
	f.Add(`{"id":"a\u00e9","usage":{"input_tokens":1.5}}`)
	f.Add(`{"content":null,"stop_reason":"end_turn","usage":null,"x":[1,{"y":"}"}],"z":true}`)
	f.Fuzz(func(t *testing.T, body string) {
		var want, got MessageHead
		werr := json.Unmarshal([]byte(body), &want)
		gerr := DecodeMessageHead([]byte(body), &got)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("json.Unmarshal error %v, DecodeMessageHead error %v", werr, gerr)
		}
		if werr == nil && !reflect.DeepEqual(want, got) {
			t.Fatalf("json.Unmarshal %+v\nDecodeMessageHead %+v", want, got)
		}
	})
}

// A usual body takes the fast path (not the json.Unmarshal fallback).
func TestDecodeMessageHeadFastPath(t *testing.T) {
	var m MessageHead
	if !decodeHeadFast([]byte(okBody), &m) || m.ID != "msg_1" || m.Usage.InputTokens != 3 || m.Usage.OutputTokens != 2 || *m.StopReason != "end_turn" {
		t.Fatalf("fast path refused or misread a usual body: %+v", m)
	}
}

func BenchmarkDecodeMessageHead(b *testing.B) {
	body := []byte(`{"id":"msg_01XFDUDYJgAACzvnptvVoYEL","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[{"type":"text","text":"` +
		strings.Repeat("The answer is graded as correct because it matches. ", 8) + `"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":812,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":0},"output_tokens":97,"service_tier":"standard"}}`)
	b.Run("fast", func(b *testing.B) {
		for b.Loop() {
			var m MessageHead
			if err := DecodeMessageHead(body, &m); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json.Unmarshal", func(b *testing.B) {
		for b.Loop() {
			var m MessageHead
			if err := json.Unmarshal(body, &m); err != nil {
				b.Fatal(err)
			}
		}
	})
}
