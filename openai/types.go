// Package openai holds the wire types of the OpenAI API that apidispatch
// speaks (Chat Completions, Files and Batches, the error envelope), the names
// of its headers, the parser of its x-ratelimit-* headers, and the one pure
// function that classifies an HTTP outcome (Classify). It is a leaf beside
// package anthropic: it imports nothing of the module but apihttp, and the
// provider seam above it maps its outcomes and limits onto the engine's.
//
// The facts it encodes, and where they were checked, are in docs/openai.md.
//
// Everything here is plain data and pure functions; it is safe for
// concurrent use.
package openai

import "encoding/json"

// Header names. Request headers first, then those of every answer.
const (
	HeaderAuthorization = "Authorization" // "Bearer <key>"
	HeaderOrganization  = "OpenAI-Organization"
	HeaderProject       = "OpenAI-Project"

	// HeaderAnswerOrganization names the organisation that served (and
	// billed) the request: the key's org, or the one asked for.
	HeaderAnswerOrganization = "openai-organization"
	HeaderProcessingMs       = "openai-processing-ms"
	HeaderVersion            = "openai-version"
	HeaderRequestID          = "x-request-id"
	HeaderRetryAfter         = "retry-after"
	HeaderRetryAfterMs       = "retry-after-ms"
	HeaderShouldRetry        = "x-should-retry"

	HeaderRequestsLimit     = "x-ratelimit-limit-requests"
	HeaderRequestsRemaining = "x-ratelimit-remaining-requests"
	HeaderRequestsReset     = "x-ratelimit-reset-requests"
	HeaderTokensLimit       = "x-ratelimit-limit-tokens"
	HeaderTokensRemaining   = "x-ratelimit-remaining-tokens"
	HeaderTokensReset       = "x-ratelimit-reset-tokens"
)

// APIVersion is the openai-version header the API sends with every answer.
const APIVersion = "2020-10-01"

// Endpoint paths (the batch input's "url" and the batch's "endpoint").
const (
	PathChatCompletions = "/v1/chat/completions"
	PathModels          = "/v1/models"
	PathFiles           = "/v1/files"
	PathBatches         = "/v1/batches"
)

// Error types (error.type) and codes (error.code) of the envelope.
const (
	ErrInvalidRequest = "invalid_request_error"
	ErrServer         = "server_error"
	// ErrTypeRequests and ErrTypeTokens are the types of a rate-limit 429:
	// the limit that refused, requests or tokens per minute.
	ErrTypeRequests = "requests"
	ErrTypeTokens   = "tokens"
	// ErrInsufficientQuota is both the type and the code of the billing
	// 429: the org has no credit or has reached its spend limit. Waiting
	// does not help.
	ErrInsufficientQuota = "insufficient_quota"

	CodeRateLimitExceeded    = "rate_limit_exceeded"
	CodeInsufficientQuota    = "insufficient_quota"
	CodeInvalidAPIKey        = "invalid_api_key"
	CodeModelNotFound        = "model_not_found"
	CodeUnsupportedParameter = "unsupported_parameter"
	CodeUnsupportedValue     = "unsupported_value"
	CodeBatchExpired         = "batch_expired"
	CodeBatchCancelled       = "batch_cancelled"
	CodeTokenLimitExceeded   = "token_limit_exceeded"
)

// quotaCodes are the error.code values of a 429 that billing, not pace,
// refused: the org (or the project) stops until someone acts.
var quotaCodes = map[string]bool{
	CodeInsufficientQuota:               true,
	"credit_balance_exhausted":          true,
	"organization_spend_limit_exceeded": true,
	"project_spend_limit_exceeded":      true,
	"organization_usage_limit_exceeded": true,
}

// ErrorDetail is the inner object of the error envelope. Param and Code
// are null for many errors.
type ErrorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// CodeString is Code, or "" when it is null.
func (d ErrorDetail) CodeString() string {
	if d.Code == nil {
		return ""
	}
	return *d.Code
}

// ErrorEnvelope is the body of every non-2xx answer:
// {"error":{"message":…,"type":…,"param":…,"code":…}}.
type ErrorEnvelope struct {
	Error ErrorDetail `json:"error"`
}

// Message is one message of a chat completion request. Content is a
// string or an array of content parts; it is kept raw.
type Message struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	Name    string          `json:"name,omitempty"`
}

// StreamOptions is stream_options.
type StreamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// ChatCompletionParams is the subset of a chat completion request that
// apidispatch and the simulator read. Callers that forward a request keep
// its raw body; this struct is for inspection only.
type ChatCompletionParams struct {
	Model               string         `json:"model"`
	Messages            []Message      `json:"messages"`
	MaxCompletionTokens *int64         `json:"max_completion_tokens,omitempty"`
	MaxTokens           *int64         `json:"max_tokens,omitempty"` // deprecated; refused by reasoning models
	N                   *int64         `json:"n,omitempty"`
	Temperature         *float64       `json:"temperature,omitempty"`
	Seed                *int64         `json:"seed,omitempty"`
	Stream              bool           `json:"stream,omitempty"`
	StreamOptions       *StreamOptions `json:"stream_options,omitempty"`
	ServiceTier         string         `json:"service_tier,omitempty"`
}

// OutputLimit is the most completion tokens the request allows per
// choice: max_completion_tokens, else max_tokens; ok is false when
// neither is set (the model's own maximum applies).
func (p *ChatCompletionParams) OutputLimit() (n int64, ok bool) {
	switch {
	case p.MaxCompletionTokens != nil:
		return *p.MaxCompletionTokens, true
	case p.MaxTokens != nil:
		return *p.MaxTokens, true
	}
	return 0, false
}

// Choices is n, 1 when unset.
func (p *ChatCompletionParams) Choices() int64 {
	if p.N == nil {
		return 1
	}
	return *p.N
}

// PromptTokensDetails is usage.prompt_tokens_details.
type PromptTokensDetails struct {
	CachedTokens int64 `json:"cached_tokens"`
	AudioTokens  int64 `json:"audio_tokens"`
}

// CompletionTokensDetails is usage.completion_tokens_details.
type CompletionTokensDetails struct {
	ReasoningTokens          int64 `json:"reasoning_tokens"`
	AudioTokens              int64 `json:"audio_tokens"`
	AcceptedPredictionTokens int64 `json:"accepted_prediction_tokens"`
	RejectedPredictionTokens int64 `json:"rejected_prediction_tokens"`
}

// Usage is the token accounting of a chat completion. PromptTokens
// includes the cached ones (PromptTokensDetails.CachedTokens, billed at
// the cached-input price); CompletionTokens includes the reasoning ones
// (CompletionTokensDetails.ReasoningTokens, billed as output).
type Usage struct {
	PromptTokens            int64                   `json:"prompt_tokens"`
	CompletionTokens        int64                   `json:"completion_tokens"`
	TotalTokens             int64                   `json:"total_tokens"`
	PromptTokensDetails     PromptTokensDetails     `json:"prompt_tokens_details"`
	CompletionTokensDetails CompletionTokensDetails `json:"completion_tokens_details"`
}

// ResponseMessage is choices[i].message.
type ResponseMessage struct {
	Role      string          `json:"role"`
	Content   *string         `json:"content"`
	Refusal   *string         `json:"refusal"`
	ToolCalls json.RawMessage `json:"tool_calls,omitempty"`
}

// Choice is one of a completion's choices.
type Choice struct {
	Index        int64           `json:"index"`
	Message      ResponseMessage `json:"message"`
	FinishReason string          `json:"finish_reason"`
	Logprobs     json.RawMessage `json:"logprobs"`
}

// ChatCompletion is the body of a successful POST /v1/chat/completions
// (and the body of a succeeded batch output line).
type ChatCompletion struct {
	ID                string   `json:"id"`
	Object            string   `json:"object"` // "chat.completion"
	Created           int64    `json:"created"`
	Model             string   `json:"model"`
	Choices           []Choice `json:"choices"`
	Usage             *Usage   `json:"usage"`
	ServiceTier       string   `json:"service_tier,omitempty"`
	SystemFingerprint *string  `json:"system_fingerprint"`
}

// ObjectChatCompletion and ObjectChunk are the "object" of a completion
// and of one streamed chunk.
const (
	ObjectChatCompletion = "chat.completion"
	ObjectChunk          = "chat.completion.chunk"
)

// ChunkDelta is choices[i].delta of a streamed chunk.
type ChunkDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
	Refusal *string `json:"refusal,omitempty"`
}

// ChunkChoice is one choice of a streamed chunk.
type ChunkChoice struct {
	Index        int64      `json:"index"`
	Delta        ChunkDelta `json:"delta"`
	FinishReason *string    `json:"finish_reason"`
}

// Chunk is one "data:" event of a streamed completion. With
// stream_options.include_usage every chunk has "usage": null except the
// last before [DONE], which has no choices and the whole request's usage.
type Chunk struct {
	ID      string        `json:"id"`
	Object  string        `json:"object"`
	Created int64         `json:"created"`
	Model   string        `json:"model"`
	Choices []ChunkChoice `json:"choices"`
	Usage   *Usage        `json:"usage"`
}

// StreamDone is the data of the event that ends a stream.
const StreamDone = "[DONE]"

// BatchInputLine is one line of a batch input file.
type BatchInputLine struct {
	CustomID string          `json:"custom_id"`
	Method   string          `json:"method"` // "POST"
	URL      string          `json:"url"`    // the batch's endpoint
	Body     json.RawMessage `json:"body"`
}

// BatchLineResponse is a batch output line's response.
type BatchLineResponse struct {
	StatusCode int             `json:"status_code"`
	RequestID  string          `json:"request_id"`
	Body       json.RawMessage `json:"body"`
}

// BatchLineError is a batch output line's error: a request the batch did
// not execute (expired, cancelled).
type BatchLineError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// BatchOutputLine is one line of a batch's output or error file. A
// request that was executed has Response (a 200 in the output file, any
// other status in the error file); one that was not has Error.
type BatchOutputLine struct {
	ID       string             `json:"id"`
	CustomID string             `json:"custom_id"`
	Response *BatchLineResponse `json:"response"`
	Error    *BatchLineError    `json:"error"`
}

// Batch statuses.
const (
	BatchValidating = "validating"
	BatchFailed     = "failed"
	BatchInProgress = "in_progress"
	BatchFinalizing = "finalizing"
	BatchCompleted  = "completed"
	BatchExpired    = "expired"
	BatchCancelling = "cancelling"
	BatchCancelled  = "cancelled"
)

// BatchTerminal reports whether a batch in this status will not change again.
func BatchTerminal(status string) bool {
	switch status {
	case BatchFailed, BatchCompleted, BatchExpired, BatchCancelled:
		return true
	}
	return false
}

// BatchRequestCounts is a batch's request_counts.
type BatchRequestCounts struct {
	Total     int64 `json:"total"`
	Completed int64 `json:"completed"`
	Failed    int64 `json:"failed"`
}

// BatchError is one of a failed batch's errors.data: why its input file
// was refused.
type BatchError struct {
	Code    string  `json:"code"`
	Message string  `json:"message"`
	Param   *string `json:"param"`
	Line    *int64  `json:"line"`
}

// BatchErrors is a batch's errors.
type BatchErrors struct {
	Object string       `json:"object"` // "list"
	Data   []BatchError `json:"data"`
}

// Batch is the batch object. Timestamps are Unix seconds; those of a
// state not reached are null (nil).
type Batch struct {
	ID               string             `json:"id"`
	Object           string             `json:"object"` // "batch"
	Endpoint         string             `json:"endpoint"`
	Errors           *BatchErrors       `json:"errors"`
	InputFileID      string             `json:"input_file_id"`
	CompletionWindow string             `json:"completion_window"`
	Status           string             `json:"status"`
	OutputFileID     *string            `json:"output_file_id"`
	ErrorFileID      *string            `json:"error_file_id"`
	CreatedAt        int64              `json:"created_at"`
	InProgressAt     *int64             `json:"in_progress_at"`
	ExpiresAt        *int64             `json:"expires_at"`
	FinalizingAt     *int64             `json:"finalizing_at"`
	CompletedAt      *int64             `json:"completed_at"`
	FailedAt         *int64             `json:"failed_at"`
	ExpiredAt        *int64             `json:"expired_at"`
	CancellingAt     *int64             `json:"cancelling_at"`
	CancelledAt      *int64             `json:"cancelled_at"`
	RequestCounts    BatchRequestCounts `json:"request_counts"`
	Metadata         map[string]string  `json:"metadata"`
}

// File is the file object.
type File struct {
	ID        string `json:"id"`
	Object    string `json:"object"` // "file"
	Bytes     int64  `json:"bytes"`
	CreatedAt int64  `json:"created_at"`
	ExpiresAt *int64 `json:"expires_at"`
	Filename  string `json:"filename"`
	Purpose   string `json:"purpose"`
	Status    string `json:"status"`
}

// File purposes apidispatch uses.
const (
	PurposeBatch       = "batch"
	PurposeBatchOutput = "batch_output"
)

// Limits of the Batch API.
const (
	MaxBatchRequests  = 50_000    // requests per input file
	MaxBatchFileBytes = 200 << 20 // bytes per input file
	CompletionWindow  = "24h"
)
