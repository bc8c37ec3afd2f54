package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/apidispatch/apidispatch/apihttp"
)

// Kind is what the dispatcher must do with an attempt's outcome. The kinds
// are those of package anthropic, with the same meaning.
type Kind int

// Outcome kinds.
const (
	// Success: a 2xx whose body is a complete chat completion.
	Success Kind = iota + 1
	// Retryable: the item goes back to pending; counting retries never
	// turns it into an error.
	Retryable
	// Terminal: the request itself is wrong; the item ends errored with
	// the API's error object.
	Terminal
	// LaneFatal: this key cannot succeed now (revoked, no quota, no access
	// to the model). The lane stops; the item goes back to pending for
	// other lanes.
	LaneFatal
)

func (k Kind) String() string {
	switch k {
	case Success:
		return "success"
	case Retryable:
		return "retryable"
	case Terminal:
		return "terminal"
	case LaneFatal:
		return "lane_fatal"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Scope says how far a lane-fatal condition reaches.
type Scope int

// Scopes of a LaneFatal outcome.
const (
	ScopeLane Scope = iota // this (org, model) lane only: no access to the model
	ScopeOrg               // every lane of the org: the key or the org's billing is the problem
)

// Local error types for failures that carry no API error envelope.
const (
	ErrTypeConnection     = "connection_error"
	ErrTypeTruncated      = "truncated_body"
	ErrTypeNotCompletion  = "invalid_response"
	ErrTypeUnknownStatus  = "unexpected_status"
	ErrTypeRateLimit      = "rate_limit" // a 429 without an envelope
	ErrTypeAuthentication = "authentication_error"
	ErrTypePermission     = "permission_error"
)

// CompletionHead is a chat completion whose choices are left undecoded
// (the dispatcher stores the body as it came and never needs the text).
type CompletionHead struct {
	ID      string          `json:"id"`
	Object  string          `json:"object"`
	Created int64           `json:"created"`
	Model   string          `json:"model"`
	Choices json.RawMessage `json:"choices"`
	Usage   *Usage          `json:"usage"`
	// ServiceTier is the tier that served the request, which its usage
	// is billed at.
	ServiceTier string `json:"service_tier"`
}

// Outcome is the classification of one HTTP attempt.
type Outcome struct {
	Kind   Kind
	Status int // HTTP status; 0 for a transport error
	// ErrorType is the envelope's error.type, or a local name for failures
	// without one; Code its error.code ("" when null).
	ErrorType string
	Code      string
	// Reason is a one-line human explanation (never contains a key).
	Reason string
	// RetryAfter is the server-requested delay when HasRetryAfter.
	RetryAfter    time.Duration
	HasRetryAfter bool
	// RateLimited marks a 429 that is a rate limit (requests or tokens
	// per minute), not the quota.
	RateLimited bool
	// Quota marks the billing 429 (insufficient_quota and its kin): the
	// org stops, as for Anthropic's monthly spend cap.
	Quota bool
	// Scope applies to LaneFatal.
	Scope Scope
	// Completion is the head of the completion on Success.
	Completion *CompletionHead
	// Envelope is the parsed error envelope when the body had one.
	Envelope *ErrorEnvelope
}

// retryableTypes are error types that must never end an item as errored.
var retryableTypes = map[string]bool{
	ErrServer: true, ErrTypeRequests: true, ErrTypeTokens: true, ErrTypeRateLimit: true,
	ErrTypeConnection: true, ErrTypeTruncated: true, ErrTypeNotCompletion: true, ErrTypeUnknownStatus: true,
}

// IsRetryableType reports whether an item errored with this type would be
// a retryable cause marked terminal.
func IsRetryableType(t string) bool { return retryableTypes[t] }

// Classify maps one attempt to an Outcome. It is pure: the same inputs
// always give the same answer. transportErr is the error from sending or
// reading the answer (then status and body are ignored); now resolves an
// HTTP-date retry-after.
//
// Rules: a 2xx whose body is a chat completion → Success, any other 2xx →
// Retryable; a 429 whose error.type or error.code is insufficient_quota
// (or one of the billing codes credit_balance_exhausted,
// organization_spend_limit_exceeded, project_spend_limit_exceeded,
// organization_usage_limit_exceeded) → LaneFatal for the org, every other
// 429 (rate_limit_exceeded) → Retryable; 408, 409, 5xx and transport
// errors → Retryable; 401 and a redirect (apihttp.ErrRedirect, never
// followed) → LaneFatal for the org; 403 and a 404 model_not_found (the
// org has no access to the model; another may) → LaneFatal for the lane;
// other 4xx → Terminal with the API's error kept. x-should-retry is not
// consulted.
func Classify(status int, h http.Header, body []byte, transportErr error, now time.Time) Outcome {
	if transportErr != nil {
		if errors.Is(transportErr, apihttp.ErrRedirect) {
			return Outcome{Kind: LaneFatal, Scope: ScopeOrg, ErrorType: ErrTypeConnection, Reason: oneLine(transportErr.Error())}
		}
		return Outcome{Kind: Retryable, ErrorType: ErrTypeConnection, Reason: "transport: " + oneLine(transportErr.Error())}
	}
	o := Outcome{Status: status}
	if h != nil {
		o.RetryAfter, o.HasRetryAfter = ParseRetryAfter(h, now)
	}
	if status >= 200 && status < 300 {
		var c CompletionHead
		if err := json.Unmarshal(body, &c); err != nil {
			o.Kind, o.ErrorType = Retryable, ErrTypeTruncated
			o.Reason = fmt.Sprintf("HTTP %d with an unreadable body (%d bytes): %s", status, len(body), oneLine(err.Error()))
			return o
		}
		if c.Object != ObjectChatCompletion || c.ID == "" || len(c.Choices) == 0 || c.Choices[0] != '[' {
			o.Kind, o.ErrorType = Retryable, ErrTypeNotCompletion
			o.Reason = fmt.Sprintf("HTTP %d body is not a chat completion (object %q)", status, c.Object)
			return o
		}
		o.Kind, o.Completion = Success, &c
		return o
	}
	env := ParseEnvelope(body)
	o.Envelope = env
	if env != nil {
		o.ErrorType, o.Code = env.Error.Type, env.Error.CodeString()
		o.Reason = fmt.Sprintf("HTTP %d %s", status, o.ErrorType)
		if o.Code != "" {
			o.Reason += " (" + o.Code + ")"
		}
		o.Reason += ": " + oneLine(env.Error.Message)
	} else {
		o.Reason = fmt.Sprintf("HTTP %d without an API error body", status)
	}
	switch {
	case status == http.StatusTooManyRequests:
		if env != nil && (quotaCodes[o.Code] || o.ErrorType == ErrInsufficientQuota) {
			o.Kind, o.Scope, o.Quota = LaneFatal, ScopeOrg, true
			return o
		}
		o.Kind, o.RateLimited = Retryable, true
		if o.ErrorType == "" {
			o.ErrorType = ErrTypeRateLimit
		}
	case status >= 500, status == http.StatusRequestTimeout, status == http.StatusConflict:
		o.Kind = Retryable
		if o.ErrorType == "" {
			o.ErrorType = ErrServer
		}
	case status == http.StatusUnauthorized:
		o.Kind, o.Scope = LaneFatal, ScopeOrg
		if o.ErrorType == "" {
			o.ErrorType = ErrTypeAuthentication
		}
	case status == http.StatusForbidden,
		status == http.StatusNotFound && o.Code == CodeModelNotFound:
		o.Kind, o.Scope = LaneFatal, ScopeLane
		if o.ErrorType == "" {
			o.ErrorType = ErrTypePermission
		}
	case status >= 400 && status < 500:
		o.Kind = Terminal
		if o.ErrorType == "" {
			o.ErrorType = ErrInvalidRequest
		}
		if IsRetryableType(o.ErrorType) {
			// A client status whose body names a transient cause: believe
			// the body; ending the item here could lose it.
			o.Kind = Retryable
		}
	default:
		// 1xx/3xx: not an API answer; retry rather than lose the item.
		o.Kind, o.ErrorType = Retryable, ErrTypeUnknownStatus
	}
	return o
}

// ParseEnvelope decodes an error envelope, or returns nil when body is not
// one (an HTML page, an empty body, another JSON shape).
func ParseEnvelope(body []byte) *ErrorEnvelope {
	body = bytes.TrimSpace(body)
	if len(body) == 0 || body[0] != '{' {
		return nil
	}
	var env ErrorEnvelope
	if json.Unmarshal(body, &env) != nil || env.Error.Type == "" && env.Error.Message == "" {
		return nil
	}
	return &env
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}
