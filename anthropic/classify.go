package anthropic

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

// Kind is what the dispatcher must do with an attempt's outcome.
type Kind int

// Outcome kinds (docs/design.md §4).
const (
	// Success: a 2xx whose body is a complete message.
	Success Kind = iota + 1
	// Retryable: the item goes back to pending; it never becomes an error by
	// counting retries.
	Retryable
	// Terminal: the request itself is wrong; the item ends errored with the
	// API's error object.
	Terminal
	// LaneFatal: this key cannot succeed now (revoked, no permission, billing,
	// monthly spend cap). The lane stops; the item goes back to pending for
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
	ScopeLane Scope = iota // this (org, pool) lane only (403 permission)
	ScopeOrg               // every lane of the org: the key or the org's billing is the problem
)

// Outcome is the classification of one HTTP attempt.
type Outcome struct {
	Kind   Kind
	Status int // HTTP status; 0 for a transport error
	// ErrorType is the error envelope's error.type, or a local name for
	// failures without one ("connection_error", "truncated_body", ...).
	ErrorType string
	// Reason is a one-line human explanation (never contains a key).
	Reason string
	// RetryAfter is the server-requested delay when HasRetryAfter.
	RetryAfter    time.Duration
	HasRetryAfter bool
	// RateLimited marks a 429 that is a rate or acceleration limit (not the spend cap).
	RateLimited bool
	// Overloaded marks a 529.
	Overloaded bool
	// Scope applies to LaneFatal.
	Scope Scope
	// Message is the head of the message on Success: everything but the
	// content blocks, which are kept raw (the dispatcher stores the body as
	// it came and never needs the text).
	Message *MessageHead
	// Envelope is the parsed error envelope when the body had one.
	Envelope *ErrorEnvelope
}

// Local error types for failures that carry no API error envelope.
const (
	ErrTypeConnection    = "connection_error"
	ErrTypeTruncated     = "truncated_body"
	ErrTypeNotMessage    = "invalid_response"
	ErrTypeUnknownStatus = "unexpected_status"
)

// retryableTypes are the error types that must never end an item as errored.
var retryableTypes = map[string]bool{
	ErrRateLimit: true, ErrOverloaded: true, ErrAPI: true, ErrTimeout: true, ErrConflict: true,
	ErrTypeConnection: true, ErrTypeTruncated: true, ErrTypeNotMessage: true,
}

// IsRetryableType reports whether an item errored with this type would be a
// retryable cause marked terminal: the data-loss bug of docs/design.md §23.
func IsRetryableType(t string) bool { return retryableTypes[t] }

// Classify maps one attempt to an Outcome. It is pure: the same inputs always
// give the same answer. transportErr is the error from sending or reading the
// response (then status and body are ignored); now resolves an HTTP-date
// retry-after.
//
// Rules (docs/design.md §4): 2xx with a complete message → Success; a 2xx whose
// body is truncated or not a message → Retryable; 408, 409, 429, 5xx (529
// included) and transport errors → Retryable; 401, 402 and the monthly
// spend-cap 429 and a redirect (apihttp.ErrRedirect: never followed) →
// LaneFatal for the org; 403 → LaneFatal for the lane; 400
// with the self-set spend-limit message → LaneFatal for the org; other 4xx →
// Terminal with the API's error kept. x-should-retry is not consulted: a 4xx
// that the server calls retryable is still a client error here, and a 429 or
// 5xx is retried whatever it says, because turning a retryable item into an
// error is the one thing this tool must never do.
func Classify(status int, h http.Header, body []byte, transportErr error, now time.Time) Outcome {
	if transportErr != nil {
		if errors.Is(transportErr, apihttp.ErrRedirect) {
			// The base URL redirects: retrying cannot help, and following
			// would send the key elsewhere.
			return Outcome{Kind: LaneFatal, Scope: ScopeOrg, ErrorType: ErrTypeConnection, Reason: oneLine(transportErr.Error())}
		}
		return Outcome{Kind: Retryable, ErrorType: ErrTypeConnection, Reason: "transport: " + oneLine(transportErr.Error())}
	}
	o := Outcome{Status: status}
	if h != nil {
		o.RetryAfter, o.HasRetryAfter = ParseRetryAfter(h, now)
	}
	if status >= 200 && status < 300 {
		var m MessageHead
		if err := DecodeMessageHead(body, &m); err != nil {
			o.Kind, o.ErrorType = Retryable, ErrTypeTruncated
			o.Reason = fmt.Sprintf("HTTP %d with an unreadable body (%d bytes): %s", status, len(body), oneLine(err.Error()))
			return o
		}
		if m.Type != "message" || m.ID == "" || len(m.Content) == 0 || m.Content[0] != '[' {
			o.Kind, o.ErrorType = Retryable, ErrTypeNotMessage
			o.Reason = fmt.Sprintf("HTTP %d body is not a message (type %q)", status, m.Type)
			return o
		}
		o.Kind, o.Message = Success, &m
		return o
	}
	env := parseEnvelope(body)
	o.Envelope = env
	if env != nil {
		o.ErrorType = env.Error.Type
		o.Reason = fmt.Sprintf("HTTP %d %s: %s", status, env.Error.Type, oneLine(env.Error.Message))
	} else {
		o.Reason = fmt.Sprintf("HTTP %d without an API error body", status)
	}
	switch {
	case status == http.StatusTooManyRequests:
		if env != nil && isSpendCap(env) {
			o.Kind, o.Scope = LaneFatal, ScopeOrg
			return o
		}
		o.Kind, o.RateLimited = Retryable, true
		if o.ErrorType == "" {
			o.ErrorType = ErrRateLimit
		}
	case status == 529:
		o.Kind, o.Overloaded = Retryable, true
		if o.ErrorType == "" {
			o.ErrorType = ErrOverloaded
		}
	case status >= 500, status == http.StatusRequestTimeout, status == http.StatusConflict:
		o.Kind = Retryable
		if o.ErrorType == "" {
			o.ErrorType = ErrAPI
			if status == http.StatusRequestTimeout || status == http.StatusGatewayTimeout {
				o.ErrorType = ErrTimeout
			}
			if status == http.StatusConflict {
				o.ErrorType = ErrConflict
			}
		}
	case status == http.StatusUnauthorized, status == http.StatusPaymentRequired:
		o.Kind, o.Scope = LaneFatal, ScopeOrg
		if o.ErrorType == "" {
			o.ErrorType = map[int]string{401: ErrAuthentication, 402: ErrBilling}[status]
		}
	case status == http.StatusForbidden:
		o.Kind, o.Scope = LaneFatal, ScopeLane
		if o.ErrorType == "" {
			o.ErrorType = ErrPermission
		}
	case status == http.StatusBadRequest && env != nil && strings.HasPrefix(env.Error.Message, SpendLimitMessagePrefix):
		o.Kind, o.Scope = LaneFatal, ScopeOrg
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
		// 1xx/3xx: the server answered with something that is not an API
		// response; retry rather than lose the item.
		o.Kind, o.ErrorType = Retryable, ErrTypeUnknownStatus
	}
	return o
}

func parseEnvelope(body []byte) *ErrorEnvelope {
	body = bytes.TrimSpace(body)
	if len(body) == 0 || body[0] != '{' {
		return nil
	}
	var env ErrorEnvelope
	if json.Unmarshal(body, &env) != nil || env.Error.Type == "" {
		return nil
	}
	return &env
}

func isSpendCap(env *ErrorEnvelope) bool {
	if len(env.Error.Details) == 0 {
		return false
	}
	var d struct {
		ErrorCode string `json:"error_code"`
	}
	return json.Unmarshal(env.Error.Details, &d) == nil && d.ErrorCode == SpendLimitErrorCode
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}
