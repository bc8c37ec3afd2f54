package openai

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/apihttp"
)

var t0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

const okBody = `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"gpt-4.1","choices":[{"index":0,"message":{"role":"assistant","content":"hi","refusal":null},"finish_reason":"stop","logprobs":null}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`

func env(typ, code, msg string) string {
	c := "null"
	if code != "" {
		c = `"` + code + `"`
	}
	return `{"error":{"message":"` + msg + `","type":"` + typ + `","param":null,"code":` + c + `}}`
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
	cases := []struct {
		name    string
		status  int
		h       http.Header
		body    string
		terr    error
		kind    Kind
		errType string
		scope   Scope
		retry   time.Duration
		rate    bool
		quota   bool
	}{
		{"200 completion", 200, nil, okBody, nil, Success, "", 0, 0, false, false},
		{"200 truncated", 200, nil, okBody[:50], nil, Retryable, ErrTypeTruncated, 0, 0, false, false},
		{"200 not a completion", 200, nil, `{"id":"x","object":"list","data":[]}`, nil, Retryable, ErrTypeNotCompletion, 0, 0, false, false},
		{"200 empty", 200, nil, ``, nil, Retryable, ErrTypeTruncated, 0, 0, false, false},
		{"transport", 0, nil, "", errors.New("connection reset by peer"), Retryable, ErrTypeConnection, 0, 0, false, false},
		{"redirect", 0, nil, "", &apihttp.RedirectError{Status: 301, From: "api.example", To: "https://elsewhere.example"}, LaneFatal, ErrTypeConnection, ScopeOrg, 0, false, false},
		{"429 tokens", 429, hdr("retry-after", "2"), env("tokens", "rate_limit_exceeded", "Rate limit reached"), nil, Retryable, "tokens", 0, 2 * time.Second, true, false},
		{"429 requests", 429, nil, env("requests", "rate_limit_exceeded", "Rate limit reached"), nil, Retryable, "requests", 0, 0, true, false},
		{"429 no body", 429, nil, "", nil, Retryable, ErrTypeRateLimit, 0, 0, true, false},
		{"429 insufficient_quota", 429, nil, env("insufficient_quota", "insufficient_quota", "You exceeded your current quota"), nil, LaneFatal, "insufficient_quota", ScopeOrg, 0, false, true},
		{"429 quota code null", 429, nil, env("insufficient_quota", "", "You exceeded your current quota"), nil, LaneFatal, "insufficient_quota", ScopeOrg, 0, false, true},
		{"429 spend limit code", 429, nil, env("insufficient_quota", "organization_spend_limit_exceeded", "spend limit"), nil, LaneFatal, "insufficient_quota", ScopeOrg, 0, false, true},
		{"429 should-retry false still retried", 429, hdr("x-should-retry", "false"), env("requests", "rate_limit_exceeded", "x"), nil, Retryable, "requests", 0, 0, true, false},
		{"500", 500, nil, env("server_error", "", "The server had an error"), nil, Retryable, ErrServer, 0, 0, false, false},
		{"500 html", 500, nil, "<html>oops</html>", nil, Retryable, ErrServer, 0, 0, false, false},
		{"502", 502, nil, "bad gateway", nil, Retryable, ErrServer, 0, 0, false, false},
		{"503", 503, nil, env("server_error", "", "overloaded"), nil, Retryable, ErrServer, 0, 0, false, false},
		{"408", 408, nil, "", nil, Retryable, ErrServer, 0, 0, false, false},
		{"401", 401, nil, env("invalid_request_error", "invalid_api_key", "Incorrect API key provided"), nil, LaneFatal, ErrInvalidRequest, ScopeOrg, 0, false, false},
		{"403", 403, nil, "", nil, LaneFatal, ErrTypePermission, ScopeLane, 0, false, false},
		{"404 model", 404, nil, env("invalid_request_error", "model_not_found", "The model `x` does not exist"), nil, LaneFatal, ErrInvalidRequest, ScopeLane, 0, false, false},
		{"404 other", 404, nil, env("invalid_request_error", "", "No such File object"), nil, Terminal, ErrInvalidRequest, 0, 0, false, false},
		{"400", 400, nil, env("invalid_request_error", "", "messages: required"), nil, Terminal, ErrInvalidRequest, 0, 0, false, false},
		{"400 with a transient type", 400, nil, env("server_error", "", "x"), nil, Retryable, ErrServer, 0, 0, false, false},
		{"302", 302, nil, "", nil, Retryable, ErrTypeUnknownStatus, 0, 0, false, false},
	}
	for _, c := range cases {
		o := Classify(c.status, c.h, []byte(c.body), c.terr, t0)
		if o.Kind != c.kind || o.ErrorType != c.errType || o.Scope != c.scope || o.RetryAfter != c.retry || o.RateLimited != c.rate || o.Quota != c.quota {
			t.Errorf("%s: got kind %v type %q scope %v retry %v rate %v quota %v; want %v %q %v %v %v %v",
				c.name, o.Kind, o.ErrorType, o.Scope, o.RetryAfter, o.RateLimited, o.Quota, c.kind, c.errType, c.scope, c.retry, c.rate, c.quota)
		}
		if c.kind == Success && (o.Completion == nil || o.Completion.Usage == nil || o.Completion.Usage.TotalTokens != 5) {
			t.Errorf("%s: completion head %+v", c.name, o.Completion)
		}
	}
}

func FuzzClassify(f *testing.F) {
	f.Add(200, okBody)
	f.Add(429, env("insufficient_quota", "insufficient_quota", "x"))
	f.Add(429, env("tokens", "rate_limit_exceeded", "x"))
	f.Add(500, "")
	f.Fuzz(func(t *testing.T, status int, body string) {
		o := Classify(status, http.Header{"Retry-After": {body}}, []byte(body), nil, t0)
		if o.Kind < Success || o.Kind > LaneFatal {
			t.Fatalf("kind %v", o.Kind)
		}
		if status == 429 && o.Kind != Retryable && !o.Quota {
			t.Fatalf("a 429 that is not the quota must be retryable: %+v", o)
		}
		if status >= 500 && o.Kind != Retryable {
			t.Fatalf("5xx must be retryable: %+v", o)
		}
		if o.RetryAfter < 0 || o.RetryAfter > maxReset {
			t.Fatalf("retry-after %v out of range", o.RetryAfter)
		}
	})
}
