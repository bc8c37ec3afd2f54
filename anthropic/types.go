// Package anthropic holds the wire types of the Anthropic Messages API that
// apidispatch speaks (requests, messages, usage, the error envelope), the names
// of its rate-limit headers, the model pools that share a rate limit, and the
// one pure function that classifies an HTTP outcome (see Classify).
//
// Everything here is plain data and pure functions; it is safe for concurrent use.
package anthropic

import "encoding/json"

// APIVersion is the anthropic-version header value the client sends and the
// simulator requires.
const APIVersion = "2023-06-01"

// BatchRequest is one line of a Message Batches request file.
type BatchRequest struct {
	CustomID string          `json:"custom_id"`
	Params   json.RawMessage `json:"params"`
}

// MessageParams is the subset of Messages request fields that apidispatch and
// the simulator read. Unknown fields are preserved by callers that keep the
// raw body; this struct is for inspection only.
type MessageParams struct {
	Model         string          `json:"model"`
	MaxTokens     *int            `json:"max_tokens"`
	Messages      []InputMessage  `json:"messages"`
	System        json.RawMessage `json:"system,omitempty"`
	Temperature   *float64        `json:"temperature,omitempty"`
	StopSequences []string        `json:"stop_sequences,omitempty"`
	Stream        bool            `json:"stream,omitempty"`
	Metadata      json.RawMessage `json:"metadata,omitempty"`
}

// InputMessage is one turn of the messages array. Content is either a string
// or an array of content blocks; it is kept raw.
type InputMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// ContentBlock is a block of a response message (only text is produced by the
// simulator; other types are passed through by the dispatcher untouched).
type ContentBlock struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// CacheCreation splits cache-creation tokens by TTL.
type CacheCreation struct {
	Ephemeral5mInputTokens int64 `json:"ephemeral_5m_input_tokens"`
	Ephemeral1hInputTokens int64 `json:"ephemeral_1h_input_tokens"`
}

// Usage is the token accounting the API returns with every message.
type Usage struct {
	InputTokens              int64          `json:"input_tokens"`
	OutputTokens             int64          `json:"output_tokens"`
	CacheCreationInputTokens int64          `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64          `json:"cache_read_input_tokens"`
	CacheCreation            *CacheCreation `json:"cache_creation,omitempty"`
	ServiceTier              string         `json:"service_tier,omitempty"`
	InferenceGeo             string         `json:"inference_geo,omitempty"`
}

// Message is a Messages API response body.
type Message struct {
	ID           string         `json:"id"`
	Type         string         `json:"type"`
	Role         string         `json:"role"`
	Model        string         `json:"model"`
	Content      []ContentBlock `json:"content"`
	StopReason   *string        `json:"stop_reason"`
	StopSequence *string        `json:"stop_sequence"`
	Usage        Usage          `json:"usage"`
}

// MessageHead is a Message whose content is left undecoded.
type MessageHead struct {
	ID         string          `json:"id"`
	Type       string          `json:"type"`
	Role       string          `json:"role"`
	Model      string          `json:"model"`
	Content    json.RawMessage `json:"content"`
	StopReason *string         `json:"stop_reason"`
	Usage      Usage           `json:"usage"`
}

// ErrorDetail is the inner object of the error envelope.
type ErrorDetail struct {
	Type    string          `json:"type"`
	Message string          `json:"message"`
	Details json.RawMessage `json:"details,omitempty"`
}

// ErrorEnvelope is the body of every non-2xx API response:
// {"type":"error","error":{"type":"...","message":"..."},"request_id":"req_..."}.
type ErrorEnvelope struct {
	Type      string      `json:"type"`
	Error     ErrorDetail `json:"error"`
	RequestID string      `json:"request_id,omitempty"`
}

// Error types of the envelope.
const (
	ErrInvalidRequest  = "invalid_request_error"
	ErrAuthentication  = "authentication_error"
	ErrBilling         = "billing_error"
	ErrPermission      = "permission_error"
	ErrNotFound        = "not_found_error"
	ErrConflict        = "conflict_error"
	ErrRequestTooLarge = "request_too_large"
	ErrRateLimit       = "rate_limit_error"
	ErrAPI             = "api_error"
	ErrTimeout         = "timeout_error"
	ErrOverloaded      = "overloaded_error"
)

// SpendLimitErrorCode is error.details.error_code on the monthly spend-cap 429.
const SpendLimitErrorCode = "enforced_spend_limit_reached"

// SpendLimitMessagePrefix starts the message of the 400 returned when a
// self-set org or workspace spend limit is reached.
const SpendLimitMessagePrefix = "You have reached your specified"

// Header names.
const (
	HeaderAPIKey         = "x-api-key"
	HeaderVersion        = "anthropic-version"
	HeaderRequestID      = "request-id"
	HeaderOrganizationID = "anthropic-organization-id"
	HeaderRetryAfter     = "retry-after"
	HeaderRetryAfterMs   = "retry-after-ms"
	HeaderShouldRetry    = "x-should-retry"

	HeaderRequestsLimit     = "anthropic-ratelimit-requests-limit"
	HeaderRequestsRemaining = "anthropic-ratelimit-requests-remaining"
	HeaderRequestsReset     = "anthropic-ratelimit-requests-reset"
	HeaderTokensLimit       = "anthropic-ratelimit-tokens-limit"
	HeaderTokensRemaining   = "anthropic-ratelimit-tokens-remaining"
	HeaderTokensReset       = "anthropic-ratelimit-tokens-reset"
	HeaderInputLimit        = "anthropic-ratelimit-input-tokens-limit"
	HeaderInputRemaining    = "anthropic-ratelimit-input-tokens-remaining"
	HeaderInputReset        = "anthropic-ratelimit-input-tokens-reset"
	HeaderOutputLimit       = "anthropic-ratelimit-output-tokens-limit"
	HeaderOutputRemaining   = "anthropic-ratelimit-output-tokens-remaining"
	HeaderOutputReset       = "anthropic-ratelimit-output-tokens-reset"
)
