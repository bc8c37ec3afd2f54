package sim

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/textproto"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/internal/numfmt"
	"github.com/apidispatch/apidispatch/openai"
)

// The OpenAI surface (docs/openai.md). An org with provider "openai"
// serves, to its Bearer keys,
//
//	POST /v1/chat/completions          chat completions, streamed or not
//	GET  /v1/models, /v1/models/{id}   the models it may call
//	POST|GET /v1/files, GET|DELETE /v1/files/{id}, GET /v1/files/{id}/content
//	POST|GET /v1/batches, GET /v1/batches/{id}, POST /v1/batches/{id}/cancel
//
// with the OpenAI error envelope, x-request-id, openai-organization,
// openai-processing-ms and openai-version on every answer, and on chat
// completions the x-ratelimit-* headers of the org's two buckets for the
// model: requests and tokens per minute. A request is admitted when both
// have room for it: one request, and its prompt plus max_completion_tokens
// (or max_tokens) × n tokens; without a maximum its prompt at admission and
// its completion when it ends. The same speed factor, latency model,
// faults and ledger serve both providers.

// oaOrg is an OpenAI org's own state; its rate limits are its orgState's
// pools, keyed by model id.
type oaOrg struct {
	projects map[string]bool
	queueCap map[string]int64 // enqueued-token limit per model id

	// Lock order: mu, then a batch's mu, then fmu.
	mu      sync.Mutex
	batches []*oaBatch
	batchBy map[string]*oaBatch
	busy    time.Duration // API time the org's last batch ends processing

	fmu      sync.Mutex // guards the files
	files    map[string]*oaFile
	fileList []*oaFile
}

func (s *Server) newOpenAIOrg(oc OrgConfig) *oaOrg {
	o := &oaOrg{projects: map[string]bool{}, queueCap: map[string]int64{}, files: map[string]*oaFile{}, batchBy: map[string]*oaBatch{}}
	for _, p := range oc.Projects {
		o.projects[p] = true
	}
	for i := range oaModels {
		m := &oaModels[i]
		lim, ok := oc.ModelLimits[m.id]
		if !ok {
			lim, ok = oc.ModelLimits["*"]
		}
		if !ok {
			continue
		}
		o.queueCap[m.id] = lim.BatchQueueTokens
		if o.queueCap[m.id] == 0 {
			o.queueCap[m.id] = DefaultOpenAIBatchQueueTokens
		}
	}
	return o
}

// openAIPools adds an OpenAI org's per-model limiters to its pools (called
// by New with the orgState built).
func (s *Server) openAIPools(o *orgState, oc OrgConfig) {
	for i := range oaModels {
		m := &oaModels[i]
		lim, ok := oc.ModelLimits[m.id]
		if !ok {
			lim, ok = oc.ModelLimits["*"]
		}
		if !ok {
			continue
		}
		o.poolOrder = append(o.poolOrder, m.pool())
		if s.cfg.Unlimited {
			o.pools[m.pool()] = nil
		} else {
			o.pools[m.pool()] = newPoolLimiter(Limits{RPM: lim.RPM, ITPM: lim.TPM}, s.cfg.BurstFraction, s.speed)
		}
	}
}

// oaError is an OpenAI error answer.
type oaError struct {
	status int
	typ    string
	msg    string
	param  string // "" is null
	code   string // "" is null
}

func (e *oaError) appendJSON(b []byte) []byte {
	b = append(b, `{"error":{"message":`...)
	b = appendJSONString(b, e.msg)
	b = append(b, `,"type":`...)
	b = appendJSONString(b, e.typ)
	b = append(b, `,"param":`...)
	if e.param == "" {
		b = append(b, "null"...)
	} else {
		b = appendJSONString(b, e.param)
	}
	b = append(b, `,"code":`...)
	if e.code == "" {
		b = append(b, "null"...)
	} else {
		b = appendJSONString(b, e.code)
	}
	return append(b, "}}"...)
}

func oaInvalid(param, code, format string, a ...any) *oaError {
	return &oaError{status: http.StatusBadRequest, typ: openai.ErrInvalidRequest, msg: fmt.Sprintf(format, a...), param: param, code: code}
}

// oaCall is one request on the OpenAI surface.
type oaCall struct {
	*call
	start time.Time
	ks    *keyState
}

var (
	hXRequestID    = textproto.CanonicalMIMEHeaderKey(openai.HeaderRequestID)
	hOAOrg         = textproto.CanonicalMIMEHeaderKey(openai.HeaderAnswerOrganization)
	hOAProcessing  = textproto.CanonicalMIMEHeaderKey(openai.HeaderProcessingMs)
	hOAVersion     = textproto.CanonicalMIMEHeaderKey(openai.HeaderVersion)
	oaVersionValue = []string{openai.APIVersion}
	hOARate        = [2][3]string{
		{textproto.CanonicalMIMEHeaderKey(openai.HeaderRequestsLimit), textproto.CanonicalMIMEHeaderKey(openai.HeaderRequestsRemaining), textproto.CanonicalMIMEHeaderKey(openai.HeaderRequestsReset)},
		{textproto.CanonicalMIMEHeaderKey(openai.HeaderTokensLimit), textproto.CanonicalMIMEHeaderKey(openai.HeaderTokensRemaining), textproto.CanonicalMIMEHeaderKey(openai.HeaderTokensReset)},
	}
)

// bearer is the key of an "Authorization: Bearer" header, or "".
func bearer(r *http.Request) string {
	if a := r.Header.Get("Authorization"); len(a) > 7 && strings.EqualFold(a[:7], "bearer ") {
		return strings.TrimSpace(a[7:])
	}
	return ""
}

// isOpenAICall reports whether r is for the OpenAI surface: its own
// paths, or /v1/models with the Bearer key of an OpenAI org (the path is
// shared with the Anthropic surface).
func (s *Server) isOpenAICall(r *http.Request) bool {
	p := r.URL.Path
	switch {
	case p == openai.PathChatCompletions, p == openai.PathFiles, strings.HasPrefix(p, openai.PathFiles+"/"),
		p == openai.PathBatches, strings.HasPrefix(p, openai.PathBatches+"/"):
		return true
	case p == "/v1/models" || strings.HasPrefix(p, "/v1/models/"):
		if r.Header.Get(anthropic.HeaderAPIKey) != "" {
			return false
		}
		ks := s.byKey[bearer(r)]
		return ks != nil && ks.org.oa != nil
	}
	return false
}

func (s *Server) serveOpenAI(c0 *call) {
	c := &oaCall{call: c0, start: time.Now()}
	c.h[hXRequestID] = []string{c.rid}
	c.h[hOAVersion] = oaVersionValue
	c.h[hSpeed] = s.speedHdr
	if !s.oaAuthenticate(c) {
		return
	}
	p := c.r.URL.Path
	m := c.r.Method
	switch {
	case p == openai.PathChatCompletions:
		if m != http.MethodPost {
			s.oaMethod(c, "POST")
			return
		}
		s.oaChat(c)
	case p == "/v1/models":
		if m != http.MethodGet {
			s.oaMethod(c, "GET")
			return
		}
		s.oaListModels(c)
	case strings.HasPrefix(p, "/v1/models/"):
		if m != http.MethodGet {
			s.oaMethod(c, "GET")
			return
		}
		s.oaGetModel(c, strings.TrimPrefix(p, "/v1/models/"))
	case p == openai.PathFiles || strings.HasPrefix(p, openai.PathFiles+"/"):
		s.oaFilesRoute(c)
	default:
		s.oaBatchRoute(c)
	}
}

func (s *Server) oaMethod(c *oaCall, use string) {
	s.oaWriteError(c, &oaError{status: http.StatusMethodNotAllowed, typ: openai.ErrInvalidRequest,
		msg: fmt.Sprintf("Invalid method for URL (%s %s): use %s", c.r.Method, c.r.URL.Path, use)})
}

// oaAuthenticate resolves the Bearer key and checks OpenAI-Organization and
// OpenAI-Project against it, answering 401 itself on failure.
func (s *Server) oaAuthenticate(c *oaCall) bool {
	key := bearer(c.r)
	if key == "" {
		s.oaWriteError(c, &oaError{status: http.StatusUnauthorized, typ: openai.ErrInvalidRequest,
			msg: "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."})
		return false
	}
	ks := s.byKey[key]
	if ks == nil || ks.org.oa == nil {
		s.oaWriteError(c, &oaError{status: http.StatusUnauthorized, typ: openai.ErrInvalidRequest,
			msg: "Incorrect API key provided. You can find your API key at https://platform.openai.com/account/api-keys.", code: openai.CodeInvalidAPIKey})
		return false
	}
	o := ks.org
	if v := c.r.Header.Get(openai.HeaderOrganization); v != "" && v != o.id {
		s.oaWriteError(c, &oaError{status: http.StatusUnauthorized, typ: openai.ErrInvalidRequest,
			msg: "OpenAI-Organization header should match organization for API key", code: "mismatched_organization"})
		return false
	}
	c.ks = ks
	c.h[hOAOrg] = o.idHdr
	if v := c.r.Header.Get(openai.HeaderProject); v != "" && !o.oa.projects[v] {
		s.oaWriteError(c, &oaError{status: http.StatusUnauthorized, typ: openai.ErrInvalidRequest,
			msg: "OpenAI-Project header should match project for API key", code: "mismatched_project"})
		return false
	}
	if s.faults.Load().match(FaultKeyRevoked, o.idx, "", ks.fp, s.apiNow(), &c.rng) != nil {
		s.oaWriteError(c, &oaError{status: http.StatusUnauthorized, typ: openai.ErrInvalidRequest,
			msg: "Incorrect API key provided. You can find your API key at https://platform.openai.com/account/api-keys.", code: openai.CodeInvalidAPIKey})
		return false
	}
	return true
}

func (c *oaCall) processing() {
	c.h[hOAProcessing] = []string{strconv.FormatInt(time.Since(c.start).Milliseconds(), 10)}
}

// oaWriteJSON answers status with body.
func (s *Server) oaWriteJSON(c *oaCall, status int, body []byte) {
	c.processing()
	writeJSON(c.call, status, body)
}

// oaWriteError answers e and counts it for the key's org.
func (s *Server) oaWriteError(c *oaCall, e *oaError) {
	s.oaWriteJSON(c, e.status, e.appendJSON(nil))
	if c.ks != nil {
		s.count(c.ks.org, e.status)
	}
}

// --- models -----------------------------------------------------------------

// oaServed returns the models o may call, each once, in table order.
func (o *orgState) oaServed() []*oaModel {
	var out []*oaModel
	for i := range oaModels {
		if _, ok := o.pools[oaModels[i].pool()]; ok {
			out = append(out, &oaModels[i])
		}
	}
	return out
}

func appendOAModel(b []byte, id string, created int64) []byte {
	b = append(b, `{"id":`...)
	b = appendJSONString(b, id)
	b = append(b, `,"object":"model","created":`...)
	b = strconv.AppendInt(b, created, 10)
	return append(b, `,"owned_by":"system"}`...)
}

func (s *Server) oaListModels(c *oaCall) {
	b := []byte(`{"object":"list","data":[`)
	for i, m := range c.ks.org.oaServed() {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendOAModel(b, m.id, m.created)
		b = append(b, ',')
		b = appendOAModel(b, m.snapshot, m.created)
	}
	s.oaWriteJSON(c, http.StatusOK, append(b, "]}"...))
}

func (s *Server) oaGetModel(c *oaCall, id string) {
	m := oaModelByID[id]
	if m != nil {
		if _, ok := c.ks.org.pools[m.pool()]; ok {
			s.oaWriteJSON(c, http.StatusOK, appendOAModel(nil, id, m.created))
			return
		}
	}
	s.oaWriteError(c, &oaError{status: http.StatusNotFound, typ: openai.ErrInvalidRequest,
		msg: fmt.Sprintf("The model '%s' does not exist", id), param: "model", code: openai.CodeModelNotFound})
}

// --- chat completion requests -------------------------------------------------

// oaWire is a chat completion body as the simulator reads it. Fields it
// does not act on are accepted raw, so that any other top-level field is
// refused as the API refuses it.
type oaWire struct {
	Model               *string           `json:"model"`
	Messages            *[]oaWireMessage  `json:"messages"`
	MaxCompletionTokens *int64            `json:"max_completion_tokens"`
	MaxTokens           *int64            `json:"max_tokens"`
	N                   *int64            `json:"n"`
	Temperature         *float64          `json:"temperature"`
	TopP                *float64          `json:"top_p"`
	Stream              *bool             `json:"stream"`
	StreamOptions       *oaStreamOptions  `json:"stream_options"`
	Seed                *int64            `json:"seed"`
	ServiceTier         *string           `json:"service_tier"`
	Tools               json.RawMessage   `json:"tools"`
	ToolChoice          json.RawMessage   `json:"tool_choice"`
	ResponseFormat      json.RawMessage   `json:"response_format"`
	Stop                json.RawMessage   `json:"stop"`
	PresencePenalty     *float64          `json:"presence_penalty"`
	FrequencyPenalty    *float64          `json:"frequency_penalty"`
	LogitBias           json.RawMessage   `json:"logit_bias"`
	Logprobs            *bool             `json:"logprobs"`
	TopLogprobs         *int64            `json:"top_logprobs"`
	User                *string           `json:"user"`
	Metadata            map[string]string `json:"metadata"`
	Store               *bool             `json:"store"`
	ParallelToolCalls   *bool             `json:"parallel_tool_calls"`
	ReasoningEffort     *string           `json:"reasoning_effort"`
	Verbosity           *string           `json:"verbosity"`
	Modalities          json.RawMessage   `json:"modalities"`
	Audio               json.RawMessage   `json:"audio"`
	Prediction          json.RawMessage   `json:"prediction"`
	WebSearchOptions    json.RawMessage   `json:"web_search_options"`
	SafetyIdentifier    *string           `json:"safety_identifier"`
	PromptCacheKey      *string           `json:"prompt_cache_key"`
	PromptCacheRet      *string           `json:"prompt_cache_retention"`
	FunctionCall        json.RawMessage   `json:"function_call"`
	Functions           json.RawMessage   `json:"functions"`
}

type oaStreamOptions struct {
	IncludeUsage       *bool `json:"include_usage"`
	IncludeObfuscation *bool `json:"include_obfuscation"`
}

type oaWireMessage struct {
	Role         *string         `json:"role"`
	Content      json.RawMessage `json:"content"`
	Name         *string         `json:"name"`
	ToolCalls    json.RawMessage `json:"tool_calls"`
	ToolCallID   *string         `json:"tool_call_id"`
	Refusal      json.RawMessage `json:"refusal"`
	FunctionCall json.RawMessage `json:"function_call"`
	Audio        json.RawMessage `json:"audio"`
}

// oaRequest is a validated chat completion request.
type oaRequest struct {
	model        *oaModel
	echo         string // the model id the answer names: the snapshot
	prompt       int64
	maxOut       int64 // per choice; the model's maximum when !hasMax
	hasMax       bool
	n            int64
	stream       bool
	includeUsage bool
	obfuscate    bool // stream_options.include_obfuscation (default true)
	judge, long  bool
	schema       any   // response_format's json_schema.schema: the answer fits it
	prefix       int64 // tokens of every message but the last (the cacheable prefix)
	prefixKey    [16]byte
	tier         string
}

// Token-count stand-in for chat messages: the same text measure as the
// Anthropic surface, plus 3 a message and 3 a request.
const (
	oaTokensPerMessage = 3
	oaTokensPerRequest = 3
	oaTokensPerImage   = 765
)

var oaRoles = map[string]bool{"system": true, "developer": true, "user": true, "assistant": true, "tool": true, "function": true}

// oaWireKeys are the top-level names of a chat completion body, as spelt.
var oaWireKeys = func() map[string]bool {
	m := map[string]bool{}
	t := reflect.TypeFor[oaWire]()
	for i := range t.NumField() {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); name != "" && name != "-" {
			m[name] = true
		}
	}
	return m
}()

// parseOpenAIChat validates a chat completion body the way the API does.
// It never panics, whatever the bytes.
func parseOpenAIChat(body []byte) (oaRequest, *oaError) {
	var w oaWire
	d := json.NewDecoder(bytes.NewReader(body))
	d.DisallowUnknownFields()
	if err := d.Decode(&w); err != nil {
		return oaRequest{}, oaDecodeError(body, err)
	}
	if rest := bytes.TrimSpace(body[d.InputOffset():]); len(rest) > 0 {
		return oaRequest{}, oaInvalid("", "", "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON.)")
	}
	if k, ok := inexactKey(body, oaWireKeys); !ok {
		return oaRequest{}, oaInvalid("", "", "Unrecognized request argument supplied: %s", k)
	}
	if w.Model == nil || *w.Model == "" {
		return oaRequest{}, oaInvalid("", "", "you must provide a model parameter")
	}
	if w.Messages == nil {
		return oaRequest{}, oaInvalid("messages", "missing_required_parameter", "Missing required parameter: 'messages'.")
	}
	msgs := *w.Messages
	if len(msgs) == 0 {
		return oaRequest{}, oaInvalid("messages", "empty_array", "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.")
	}
	m := oaModelByID[*w.Model]
	if m == nil {
		return oaRequest{}, &oaError{status: http.StatusNotFound, typ: openai.ErrInvalidRequest,
			msg: fmt.Sprintf("The model `%s` does not exist or you do not have access to it.", *w.Model), code: openai.CodeModelNotFound}
	}
	r := oaRequest{model: m, echo: m.snapshot, n: 1, tier: "default"}
	if w.N != nil {
		if *w.N < 1 || *w.N > 128 {
			return oaRequest{}, oaInvalid("n", "invalid_value", "Invalid 'n': integer out of range. Expected a value between 1 and 128, but got %d instead.", *w.N)
		}
		r.n = *w.N
	}
	if w.Temperature != nil {
		if *w.Temperature < 0 || *w.Temperature > 2 {
			return oaRequest{}, oaInvalid("temperature", "decimal_above_max_value", "Invalid 'temperature': decimal out of range. Expected a value between 0 and 2, but got %g instead.", *w.Temperature)
		}
		if m.reasoning && *w.Temperature != 1 {
			return oaRequest{}, oaInvalid("temperature", openai.CodeUnsupportedValue, "Unsupported value: 'temperature' does not support %g with this model. Only the default (1) value is supported.", *w.Temperature)
		}
	}
	if w.TopP != nil && (*w.TopP < 0 || *w.TopP > 1) {
		return oaRequest{}, oaInvalid("top_p", "decimal_above_max_value", "Invalid 'top_p': decimal out of range. Expected a value between 0 and 1, but got %g instead.", *w.TopP)
	}
	switch {
	case w.MaxTokens != nil && m.reasoning:
		return oaRequest{}, oaInvalid("max_tokens", openai.CodeUnsupportedParameter, "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.")
	case w.MaxCompletionTokens != nil && w.MaxTokens != nil:
		return oaRequest{}, oaInvalid("max_tokens", "invalid_request_error", "max_tokens and max_completion_tokens cannot both be set.")
	case w.MaxCompletionTokens != nil:
		r.maxOut, r.hasMax = *w.MaxCompletionTokens, true
	case w.MaxTokens != nil:
		r.maxOut, r.hasMax = *w.MaxTokens, true
	default:
		r.maxOut = m.maxOutput
	}
	if r.hasMax {
		param := "max_completion_tokens"
		if w.MaxTokens != nil {
			param = "max_tokens"
		}
		if r.maxOut < 1 {
			return oaRequest{}, oaInvalid(param, "integer_below_min_value", "Invalid '%s': integer below minimum value. Expected a value >= 1, but got %d instead.", param, r.maxOut)
		}
		if r.maxOut > m.maxOutput {
			return oaRequest{}, oaInvalid(param, "invalid_value", "max_tokens is too large: %d. This model supports at most %d completion tokens, whereas you provided %d.", r.maxOut, m.maxOutput, r.maxOut)
		}
	}
	if w.ServiceTier != nil {
		switch *w.ServiceTier {
		case "auto", "default":
		case "flex", "priority", "scale", "fast":
			asked := *w.ServiceTier
			if asked == "fast" {
				asked = "priority"
			}
			r.tier = m.tier(asked)
		default:
			return oaRequest{}, oaInvalid("service_tier", "invalid_value", "Invalid value: '%s'. Supported values are: 'auto', 'default', 'flex', 'scale', 'priority' and 'fast'.", *w.ServiceTier)
		}
	}
	r.stream = w.Stream != nil && *w.Stream
	if w.StreamOptions != nil {
		if !r.stream {
			return oaRequest{}, oaInvalid("stream_options", "invalid_value", "The 'stream_options' parameter is only allowed when 'stream' is enabled.")
		}
		r.includeUsage = w.StreamOptions.IncludeUsage != nil && *w.StreamOptions.IncludeUsage
	}
	r.obfuscate = r.stream && (w.StreamOptions == nil || w.StreamOptions.IncludeObfuscation == nil || *w.StreamOptions.IncludeObfuscation)
	format, schema, e := oaResponseFormat(w.ResponseFormat)
	if e != nil {
		return oaRequest{}, e
	}
	// JSON mode answers a JSON object, as a judge's verdict is; a
	// json_schema without a schema too.
	r.judge = format == "json_object" || format == "json_schema"
	r.schema = schema
	mentionsJSON := false
	r.prompt = oaTokensPerRequest
	h := sha256.New()
	h.Write([]byte(m.id))
	for i, msg := range msgs {
		where := "messages[" + strconv.Itoa(i) + "]"
		if msg.Role == nil {
			return oaRequest{}, oaInvalid(where+".role", "missing_required_parameter", "Missing required parameter: '%s.role'.", where)
		}
		role := *msg.Role
		if !oaRoles[role] {
			return oaRequest{}, oaInvalid(where+".role", "invalid_value", "Invalid value: '%s'. Supported values are: 'system', 'assistant', 'user', 'function', 'tool', and 'developer'.", role)
		}
		content := bytes.TrimSpace(msg.Content)
		hasTools := len(msg.ToolCalls) > 0 && !bytes.Equal(msg.ToolCalls, []byte("null"))
		if role == "tool" && (msg.ToolCallID == nil || *msg.ToolCallID == "") {
			return oaRequest{}, oaInvalid(where+".tool_call_id", "missing_required_parameter", "Missing required parameter: '%s.tool_call_id'.", where)
		}
		if len(content) == 0 || bytes.Equal(content, []byte("null")) {
			if role == "assistant" && (hasTools || len(msg.FunctionCall) > 0) {
				content = nil
			} else {
				return oaRequest{}, oaInvalid(where+".content", "missing_required_parameter", "Missing required parameter: '%s.content'.", where)
			}
		}
		n, judge, long, e := oaScanContent(content, where+".content", role)
		if e != nil {
			return oaRequest{}, e
		}
		n += textTokens(len(msg.ToolCalls))
		if msg.Name != nil {
			n++
		}
		if i == len(msgs)-1 {
			r.prefix = r.prompt
		} else {
			h.Write(content)
			h.Write(msg.ToolCalls)
			h.Write([]byte{0})
		}
		r.prompt += n + oaTokensPerMessage
		r.judge = r.judge || judge
		mentionsJSON = mentionsJSON || containsFold(content, jsonWord)
		r.long = r.long || long
	}
	if format == "json_object" && !mentionsJSON {
		return oaRequest{}, oaInvalid("messages", "", "'messages' must contain the word 'json' in some form, to use 'response_format' of type 'json_object'.")
	}
	copy(r.prefixKey[:], h.Sum(nil))
	need := r.prompt
	if r.hasMax {
		need += r.maxOut
	}
	if need > m.context {
		return oaRequest{}, oaInvalid("messages", "context_length_exceeded", "This model's maximum context length is %d tokens. However, your messages resulted in %d tokens. Please reduce the length of the messages.", m.context, r.prompt)
	}
	return r, nil
}

var jsonWord = [][]byte{[]byte("json")}

// oaResponseFormat validates response_format and returns its type: "" when
// absent, else "text", "json_object" or "json_schema" (whose json_schema
// must be an object with a name), and a json_schema's schema, its $refs
// into $defs resolved (nil when it has none).
func oaResponseFormat(raw json.RawMessage) (string, any, *oaError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil, nil
	}
	if raw[0] != '{' {
		return "", nil, oaInvalid("response_format", "invalid_type", "Invalid type for 'response_format': expected an object, but got %s instead.", jsonTypeName(raw))
	}
	var rf struct {
		Type       *string         `json:"type"`
		JSONSchema json.RawMessage `json:"json_schema"`
	}
	if json.Unmarshal(raw, &rf) != nil {
		return "", nil, oaInvalid("response_format", "invalid_type", "Invalid type for 'response_format': expected an object.")
	}
	switch {
	case rf.Type == nil:
		return "", nil, oaInvalid("response_format.type", "missing_required_parameter", "Missing required parameter: 'response_format.type'.")
	case *rf.Type == "text", *rf.Type == "json_object":
		return *rf.Type, nil, nil
	case *rf.Type != "json_schema":
		return "", nil, oaInvalid("response_format.type", "invalid_value", "Invalid value: '%s'. Supported values are: 'text', 'json_object' and 'json_schema'.", *rf.Type)
	}
	js := bytes.TrimSpace(rf.JSONSchema)
	if len(js) == 0 || bytes.Equal(js, []byte("null")) {
		return "", nil, oaInvalid("response_format.json_schema", "missing_required_parameter", "Missing required parameter: 'response_format.json_schema'.")
	}
	var w struct {
		Name   *string         `json:"name"`
		Schema json.RawMessage `json:"schema"`
	}
	if js[0] != '{' || json.Unmarshal(js, &w) != nil {
		return "", nil, oaInvalid("response_format.json_schema", "invalid_type", "Invalid type for 'response_format.json_schema': expected an object, but got %s instead.", jsonTypeName(js))
	}
	if w.Name == nil {
		return "", nil, oaInvalid("response_format.json_schema.name", "missing_required_parameter", "Missing required parameter: 'response_format.json_schema.name'.")
	}
	var schema map[string]any
	if sc := bytes.TrimSpace(w.Schema); len(sc) > 0 && !bytes.Equal(sc, []byte("null")) {
		if sc[0] != '{' || json.Unmarshal(sc, &schema) != nil {
			return "", nil, oaInvalid("response_format.json_schema.schema", "invalid_type", "Invalid type for 'response_format.json_schema.schema': expected an object, but got %s instead.", jsonTypeName(sc))
		}
	}
	if schema == nil {
		return "json_schema", nil, nil
	}
	defs, _ := schema["$defs"].(map[string]any)
	if defs == nil {
		defs, _ = schema["definitions"].(map[string]any)
	}
	budget := maxResolvedNodes
	return "json_schema", resolveRefs(schema, defs, 0, &budget), nil
}

// maxResolvedNodes bounds the schema resolveRefs builds: definitions that
// refer to each other many times would otherwise multiply.
const maxResolvedNodes = 10_000

// resolveRefs returns v with each {"$ref": "#/$defs/Name"} (or
// "#/definitions/Name") replaced by that definition, to a depth of 8 (a
// recursive model ends there) and within budget nodes (an empty schema
// beyond); the schema's own maps are not changed.
func resolveRefs(v any, defs map[string]any, depth int, budget *int) any {
	switch x := v.(type) {
	case map[string]any:
		if *budget--; *budget < 0 {
			return map[string]any{}
		}
		if ref, ok := x["$ref"].(string); ok {
			name, found := strings.CutPrefix(ref, "#/$defs/")
			if !found {
				name, found = strings.CutPrefix(ref, "#/definitions/")
			}
			if d, ok := defs[name]; found && ok && depth < 8 {
				return resolveRefs(d, defs, depth+1, budget)
			}
			return map[string]any{}
		}
		out := make(map[string]any, len(x))
		for k, e := range x {
			if k != "$defs" && k != "definitions" {
				out[k] = resolveRefs(e, defs, depth, budget)
			}
		}
		return out
	case []any:
		if *budget--; *budget < 0 {
			return []any{}
		}
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = resolveRefs(e, defs, depth, budget)
		}
		return out
	}
	return v
}

// oaScanContent measures a message's content: a string or an array of
// content parts. It reports the tokens and whether it asks for a judge's
// JSON verdict (a system or developer message about judging or
// evaluating, or a user message asking for a "JSON object") or for an
// answer "at length".
func oaScanContent(raw []byte, where, role string) (n int64, judge, long bool, e *oaError) {
	if raw == nil {
		return 0, false, false, nil
	}
	words := userJudgeWords
	if role == "system" || role == "developer" {
		words = systemJudgeWords
	}
	switch raw[0] {
	case '"':
		return textTokens(len(raw) - 2), containsFold(raw, words), role == "user" && containsFold(raw, userLongWords), nil
	case '[':
	default:
		return 0, false, false, oaInvalid(where, "invalid_type", "Invalid type for '%s': expected one of a string or array of objects, but got %s instead.", where, jsonTypeName(raw))
	}
	var parts []struct {
		Type     string          `json:"type"`
		Text     json.RawMessage `json:"text"`
		ImageURL json.RawMessage `json:"image_url"`
		Other    json.RawMessage `json:"input_audio"`
		File     json.RawMessage `json:"file"`
		Refusal  json.RawMessage `json:"refusal"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return 0, false, false, oaInvalid(where, "invalid_type", "Invalid type for '%s': expected an array of content parts.", where)
	}
	for j, p := range parts {
		pw := where + "[" + strconv.Itoa(j) + "]"
		switch p.Type {
		case "text":
			if len(p.Text) < 2 || p.Text[0] != '"' {
				return 0, false, false, oaInvalid(pw+".text", "missing_required_parameter", "Missing required parameter: '%s.text'.", pw)
			}
			n += textTokens(len(p.Text) - 2)
			judge = judge || containsFold(p.Text, words)
			long = long || role == "user" && containsFold(p.Text, userLongWords)
		case "image_url":
			n += oaTokensPerImage
		case "input_audio", "file", "refusal":
			n += textTokens(len(p.Other) + len(p.File) + len(p.Refusal))
		case "":
			return 0, false, false, oaInvalid(pw+".type", "missing_required_parameter", "Missing required parameter: '%s.type'.", pw)
		default:
			return 0, false, false, oaInvalid(pw+".type", "invalid_value", "Invalid value: '%s'. Supported values are: 'text', 'image_url', 'input_audio', 'refusal', and 'file'.", p.Type)
		}
	}
	return n, judge, long, nil
}

func jsonTypeName(raw []byte) string {
	switch raw[0] {
	case '{':
		return "an object"
	case '"':
		return "a string"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

// oaDecodeError turns a decoding failure into the API's 400.
func oaDecodeError(body []byte, err error) *oaError {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		return oaInvalid(te.Field, "invalid_type", "Invalid type for '%s': expected %s, but got %s instead.", te.Field, jsonKind(te.Type.Kind().String()), te.Value)
	}
	var se *json.SyntaxError
	if errors.As(err, &se) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || te != nil {
		return oaInvalid("", "", "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON.)")
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		name = strings.Trim(name, `"`)
		var top map[string]json.RawMessage
		if json.Unmarshal(body, &top) == nil {
			if _, atTop := top[name]; atTop {
				return oaInvalid("", "", "Unrecognized request argument supplied: %s", name)
			}
		}
		return oaInvalid("messages", "", "Additional properties are not allowed ('%s' was unexpected)", name)
	}
	return oaInvalid("", "", "We could not parse the JSON body of your request.")
}

// --- answers ------------------------------------------------------------------

// oaChoice is one planned choice.
type oaChoice struct {
	out       output
	text      []byte // when not nil, the content (JSON-escaped) instead of out's
	reasoning int64
	tokens    int64 // completion tokens: reasoning + visible
	finish    string
}

// schemaChoice is a structured output's choice: JSON that fits schema,
// derived from the choice's hash, cut at limit tokens (finish "length").
func schemaChoice(sum [32]byte, schema any, limit int64) oaChoice {
	r := rng{s: binary.LittleEndian.Uint64(sum[:8]) ^ 0x7f4a7c159e3779b9}
	js := appendToolInput(nil, schema, &r, 0)
	c := oaChoice{tokens: textTokens(len(js)), finish: "stop"}
	if c.tokens > limit {
		// textTokens is about 3.6 bytes a token: keep what limit tokens hold.
		keep := min(len(js), int(limit*18/5))
		for keep > 0 && textTokens(keep) > limit {
			keep--
		}
		js, c.tokens, c.finish = js[:keep], limit, "length"
	}
	esc := appendJSONString(nil, string(js))
	c.text = esc[1 : len(esc)-1]
	return c
}

// appendText appends the choice's content, JSON-escaped, to b.
func (c *oaChoice) appendText(b []byte) []byte {
	switch {
	case c.text != nil:
		return append(b, c.text...)
	case c.out.empty:
		return b
	}
	return c.out.appendText(b)
}

// choiceSum is the hash choice i's answer derives from.
func choiceSum(sum [32]byte, i int64) [32]byte {
	if i > 0 {
		binary.LittleEndian.PutUint64(sum[:8], binary.LittleEndian.Uint64(sum[:8])^mix64(uint64(i)*0x9e3779b97f4a7c15))
	}
	return sum
}

// Reasoning models think 64–512 tokens before answering.
const (
	oaReasonMin = 64
	oaReasonMax = 512
)

// planChoices plans every choice of r from the body's hash.
func planChoices(sum [32]byte, r *oaRequest) (cs []oaChoice, completion, reasoning int64) {
	cs = make([]oaChoice, r.n)
	for i := range cs {
		s := choiceSum(sum, int64(i))
		limit := r.maxOut
		var think int64
		if r.model.reasoning {
			think = min(limit, oaReasonMin+int64(mix64(binary.LittleEndian.Uint64(s[8:16]))%(oaReasonMax-oaReasonMin+1)))
		}
		var c oaChoice
		if r.schema != nil {
			c = schemaChoice(s, r.schema, limit-think)
		} else {
			out := plan(s, request{judge: r.judge, long: r.long, maxTokens: limit - think})
			c = oaChoice{out: out, tokens: out.tokens, finish: "stop"}
			if out.cut {
				c.finish = "length"
			}
		}
		c.reasoning, c.tokens = think, think+c.tokens
		cs[i] = c
		completion += c.tokens
		reasoning += think
	}
	return cs, completion, reasoning
}

// oaUsage is the accounting of one answer.
type oaUsage struct{ prompt, cached, completion, reasoning int64 }

func (u oaUsage) appendJSON(b []byte) []byte {
	b = append(b, `{"prompt_tokens":`...)
	b = strconv.AppendInt(b, u.prompt, 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, u.completion, 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, u.prompt+u.completion, 10)
	b = append(b, `,"prompt_tokens_details":{"cached_tokens":`...)
	b = strconv.AppendInt(b, u.cached, 10)
	b = append(b, `,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":`...)
	b = strconv.AppendInt(b, u.reasoning, 10)
	return append(b, `,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}`...)
}

// fingerprint is the system_fingerprint of a model's answers.
func (m *oaModel) fingerprint() string {
	sum := sha256.Sum256([]byte(m.snapshot))
	return "fp_" + strconv.FormatUint(binary.LittleEndian.Uint64(sum[:8])&0xffffffffff, 16)
}

// appendCompletion appends a chat.completion object.
func appendCompletion(b []byte, id string, created int64, r *oaRequest, cs []oaChoice, u oaUsage) []byte {
	b = append(b, `{"id":`...)
	b = appendJSONString(b, id)
	b = append(b, `,"object":"chat.completion","created":`...)
	b = strconv.AppendInt(b, created, 10)
	b = append(b, `,"model":`...)
	b = appendJSONString(b, r.echo)
	b = append(b, `,"choices":[`...)
	for i, c := range cs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"index":`...)
		b = strconv.AppendInt(b, int64(i), 10)
		b = append(b, `,"message":{"role":"assistant","content":"`...)
		b = c.appendText(b)
		b = append(b, `","refusal":null,"annotations":[]},"logprobs":null,"finish_reason":"`...)
		b = append(b, c.finish...)
		b = append(b, `"}`...)
	}
	b = append(b, `],"usage":`...)
	b = u.appendJSON(b)
	b = append(b, `,"service_tier":`...)
	b = appendJSONString(b, r.tier)
	b = append(b, `,"system_fingerprint":`...)
	b = appendJSONString(b, r.model.fingerprint())
	return append(b, '}')
}

// oaRateHeaders sets the x-ratelimit-* headers from a bucket view: limits
// per real minute (K times the API's), remaining exact, reset the real
// time until the bucket is full, as a duration ("6m0s", "20ms").
func oaRateHeaders(h http.Header, v limitView) {
	if !v.on {
		return
	}
	for i := range 2 {
		if v.limit[i] <= 0 {
			continue
		}
		h[hOARate[i][0]] = []string{strconv.FormatInt(int64(v.limit[i]), 10)}
		h[hOARate[i][1]] = []string{strconv.FormatInt(remaining(v.level[i], v.limit[i], false), 10)}
		h[hOARate[i][2]] = []string{openai.FormatResetDuration(v.untilFull[i])}
	}
}

// oaRateLimited answers the rate-limit 429: error.type the limit that
// refused ("requests" or "tokens"), code rate_limit_exceeded, retry-after
// in whole seconds (at least 1) and, when K > 1, an exact retry-after-ms.
// The rate-limit headers must already be set.
func (s *Server) oaRateLimited(c *oaCall, typ string, wait time.Duration, msg string) {
	secs := int64(math.Ceil(wait.Seconds()))
	c.h[hRetryAfter] = []string{strconv.FormatInt(max(1, secs), 10)}
	if s.speed > 1 {
		ms := int64(math.Ceil(float64(wait) / float64(time.Millisecond)))
		c.h[hRetryAfterM] = []string{strconv.FormatInt(max(1, ms), 10)}
	}
	s.oaWriteError(c, &oaError{status: http.StatusTooManyRequests, typ: typ, msg: msg, code: openai.CodeRateLimitExceeded})
}

func oaLimitMessage(d dim, v limitView, orgID, model string, need int64, wait time.Duration) (typ, msg string) {
	i, what, typ := 0, "requests per min (RPM)", openai.ErrTypeRequests
	if d == dimInput {
		i, what, typ = 1, "tokens per min (TPM)", openai.ErrTypeTokens
	}
	used := int64(v.limit[i] - math.Max(0, v.level[i]))
	return typ, fmt.Sprintf("Rate limit reached for %s in organization %s on %s: Limit %s, Used %s, Requested %s. Please try again in %s. Visit https://platform.openai.com/account/rate-limits to learn more.",
		model, orgID, what, numfmt.Commas(int64(v.limit[i])), numfmt.Commas(max(0, used)), numfmt.Commas(need), openai.FormatResetDuration(wait))
}

// insufficientQuota is the billing 429: no retry-after, the org stops.
var insufficientQuota = &oaError{status: http.StatusTooManyRequests, typ: openai.ErrInsufficientQuota,
	msg:  "You exceeded your current quota, please check your plan and billing details. For more information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors.",
	code: openai.CodeInsufficientQuota}

// oaInjectBefore answers the faults that strike before admission (spend
// cap as insufficient_quota, overloaded as 503, the 500s, a 429 storm,
// acceleration) and reports whether it answered.
func (s *Server) oaInjectBefore(c *oaCall, m *oaModel, lim *poolLimiter, fs *faultSet, now, api time.Duration, colleague load) bool {
	ks := c.ks
	o, pool := ks.org, m.pool()
	if f := fs.match(FaultSpendCap, o.idx, pool, ks.fp, api, &c.rng); f != nil && o.costNanos.Load() >= f.capNanos {
		s.oaWriteError(c, insufficientQuota)
		return true
	}
	if fs.match(FaultOverloaded, o.idx, pool, ks.fp, api, &c.rng) != nil {
		s.oaWriteError(c, &oaError{status: http.StatusServiceUnavailable, typ: openai.ErrServer, msg: "The server is overloaded or not ready yet."})
		return true
	}
	if fs.match(FaultServerError, o.idx, pool, ks.fp, api, &c.rng) != nil {
		s.oaWriteError(c, &oaError{status: http.StatusInternalServerError, typ: openai.ErrServer,
			msg: "The server had an error while processing your request. Sorry about that!"})
		return true
	}
	if fs.match(FaultServerErrorHTML, o.idx, pool, ks.fp, api, &c.rng) != nil {
		c.processing()
		c.h[hContentType] = []string{"text/html; charset=utf-8"}
		c.w.WriteHeader(http.StatusInternalServerError)
		io.WriteString(c.w, htmlError)
		s.count(o, http.StatusInternalServerError)
		return true
	}
	storm := fs.match(FaultRateLimitStorm, o.idx, pool, ks.fp, api, &c.rng)
	accel := fs.match(FaultAcceleration, o.idx, pool, ks.fp, api, &c.rng)
	if accel != nil && !o.accelerating(api, accel) {
		accel = nil
	}
	if storm != nil || accel != nil {
		wait := time.Second
		if storm != nil && storm.RetryAfter > 0 {
			wait = storm.RetryAfter
		} else if accel != nil {
			wait = accel.RetryAfter
			if wait == 0 {
				wait = accel.window()
			}
		}
		if lim != nil {
			oaRateHeaders(c.h, lim.view(now, colleague))
		}
		s.oaRateLimited(c, openai.ErrTypeRequests, s.real(wait), fmt.Sprintf("Rate limit reached for %s in organization %s on requests per min (RPM). Please try again in %s. Visit https://platform.openai.com/account/rate-limits to learn more.",
			m.id, o.id, openai.FormatResetDuration(s.real(wait))))
		return true
	}
	return false
}

// oaReadBody reads a request body up to MaxBodyBytes.
func (s *Server) oaReadBody(c *oaCall, into []byte) ([]byte, bool) {
	buf := bytes.NewBuffer(into)
	n, err := buf.ReadFrom(io.LimitReader(c.r.Body, MaxBodyBytes+1))
	if n > MaxBodyBytes || c.r.ContentLength > MaxBodyBytes {
		s.oaWriteError(c, &oaError{status: http.StatusRequestEntityTooLarge, typ: openai.ErrInvalidRequest, msg: "Request too large."})
		return nil, false
	}
	if err != nil {
		s.oaWriteError(c, oaInvalid("", "", "could not read the request body: %v", err))
		return nil, false
	}
	return buf.Bytes(), true
}

// oaChat serves POST /v1/chat/completions.
func (s *Server) oaChat(c *oaCall) {
	ks := c.ks
	o := ks.org
	bp := bufPool.Get().(*[]byte)
	defer putBuf(bp)
	body, ok := s.oaReadBody(c, (*bp)[:0])
	if !ok {
		return
	}
	*bp = body[:0]
	r, e := parseOpenAIChat(body)
	if e != nil {
		s.oaWriteError(c, e)
		return
	}
	// The same request streamed or not gets the same answer and bill.
	sum := sha256.Sum256(withoutStreamKeys(body))
	m := r.model
	lim, served := o.pools[m.pool()]
	if !served {
		s.oaWriteError(c, &oaError{status: http.StatusNotFound, typ: openai.ErrInvalidRequest,
			msg: fmt.Sprintf("The model `%s` does not exist or you do not have access to it.", m.id), code: openai.CodeModelNotFound})
		return
	}
	now := time.Since(s.start)
	api := s.api(now)
	fs := s.faults.Load()
	colleague := fs.colleague(o.idx, m.pool(), api)
	if s.oaInjectBefore(c, m, lim, fs, now, api, colleague) {
		return
	}

	// Automatic prompt caching: a prefix (every message but the last) of
	// at least 1,024 tokens seen by the org within 5 API-minutes is read
	// from the cache, in steps of 128 tokens.
	var cached int64
	if s.cfg.PromptCaching && r.prefix >= 1024 {
		o.mu.Lock()
		if o.oaCache == nil {
			o.oaCache = map[[16]byte]time.Duration{}
		}
		exp, hit := o.oaCache[r.prefixKey]
		o.oaCache[r.prefixKey] = api + 5*time.Minute
		o.mu.Unlock()
		if hit && exp > api {
			cached = 1024 + (r.prefix-1024)/128*128
		}
	}
	charge := r.prompt
	if r.hasMax {
		charge += r.maxOut * r.n
	}
	var admitted limitView
	if lim != nil {
		refused, wait, view := lim.admit(now, colleague, charge, 0)
		admitted = view
		if refused != dimNone {
			oaRateHeaders(c.h, view)
			need := int64(1)
			if refused == dimInput {
				need = charge
			}
			typ, msg := oaLimitMessage(refused, view, o.id, m.id, need, s.api(wait))
			s.oaRateLimited(c, typ, wait, msg)
			return
		}
	}
	cs, completion, reasoning := planChoices(sum, &r)
	u := oaUsage{prompt: r.prompt, cached: cached, completion: completion, reasoning: reasoning}

	o.mu.Lock()
	o.inFlight++
	inFlight := o.inFlight
	o.maxInFlight = max(o.maxInFlight, inFlight)
	p := o.pointLocked(now, s.speed)
	p.Admitted++
	p.InFlight = inFlight
	p.InFlightMax = max(p.InFlightMax, inFlight)
	sl := &o.accel[int64(api/time.Second)%accelSlots]
	if sec := int64(api / time.Second); sl.sec != sec {
		sl.sec, sl.n = sec, 0
	}
	sl.n++
	o.mu.Unlock()

	lat := s.lat.sample(completion, &c.rng)
	if f := s.lat.congestion(inFlight, o.capacity); f > 1 {
		lat = time.Duration(float64(lat) * f)
	}
	if f := fs.match(FaultSlow, o.idx, m.pool(), ks.fp, api, &c.rng); f != nil {
		lat += f.ExtraLatency
	}
	id := "chatcmpl-" + s.newID("", c.n, 0x3c6ef372fe94f82b)
	if r.stream {
		s.oaStream(c, &r, lim, sum, id, cs, u, lat, admitted)
		return
	}
	sctx := c.r.Context()
	if s.cfg.BillAbandoned {
		sctx = context.WithoutCancel(sctx)
	}
	if !sleep(sctx, s.real(lat)) {
		s.oaAbandoned(o)
		return
	}
	wall := time.Now()
	now = wall.Sub(s.start)
	api = s.api(now)
	fs = s.faults.Load()
	if lim != nil {
		oaRateHeaders(c.h, s.oaSettle(lim, fs, o, m, now, api, &r, completion))
	}
	delivery := DeliveryOK
	if fs.match(FaultConnectionReset, o.idx, m.pool(), ks.fp, api, &c.rng) != nil {
		delivery = DeliveryReset
	} else if fs.match(FaultTruncatedBody, o.idx, m.pool(), ks.fp, api, &c.rng) != nil {
		delivery = DeliveryTruncated
	}
	s.oaBill(c, &r, sum, id, u, wall, now, delivery)
	b := appendCompletion((*bp)[:0], id, wall.Unix(), &r, cs, u)
	*bp = b[:0]
	switch delivery {
	case DeliveryOK:
		s.oaWriteJSON(c, http.StatusOK, b)
	case DeliveryReset:
		hijackAndClose(c.call, nil, 0)
	case DeliveryTruncated:
		c.processing()
		hijackAndClose(c.call, b, len(b)/2)
	}
}

// oaAbandoned: the client gave up; nothing is billed.
func (s *Server) oaAbandoned(o *orgState) {
	now := time.Since(s.start)
	o.mu.Lock()
	o.inFlight--
	o.pointLocked(now, s.speed).InFlight = o.inFlight
	o.mu.Unlock()
	s.count(o, 499)
}

// oaSettle charges the completion of a request without a maximum to the
// tokens bucket (one with a maximum paid it at admission) and returns the
// view after.
func (s *Server) oaSettle(lim *poolLimiter, fs *faultSet, o *orgState, m *oaModel, now, api time.Duration, r *oaRequest, completion int64) limitView {
	col := fs.colleague(o.idx, m.pool(), api)
	lim.mu.Lock()
	defer lim.mu.Unlock()
	for i := range lim.b {
		lim.b[i].refill(now, col)
	}
	if !r.hasMax {
		lim.b[1].charge(float64(completion))
	}
	return lim.viewLocked(col)
}

// oaBill records a processed chat completion in the ledger.
func (s *Server) oaBill(c *oaCall, r *oaRequest, sum [32]byte, id string, u oaUsage, wall time.Time, now time.Duration, delivery string) {
	ks := c.ks
	cost := r.model.cost(u.prompt, u.cached, u.completion, r.tier)
	tier := r.tier
	if tier == "default" {
		tier = "" // the ledger names a tier other than the default only
	}
	s.bill(ks.org, ks, &LedgerEntry{
		RequestID: c.rid, MessageID: id, Org: ks.org.name, KeyFingerprint: ks.fp, Model: r.echo,
		BodySHA256: sum, InputTokens: u.prompt - u.cached, OutputTokens: u.completion, CacheRead: u.cached,
		ReasoningTokens: u.reasoning, CostNanos: cost, CostUSD: nanosToUSD(cost),
		Time: wall, APISeconds: float64(s.api(now).Microseconds()) / 1e6, Status: http.StatusOK, Delivery: delivery,
		Provider: ProviderOpenAI, ServiceTier: tier,
	}, now)
}

// withoutStreamKeys is the body without its "stream" and "stream_options"
// members, so that a streamed request hashes like the same one unstreamed.
func withoutStreamKeys(body []byte) []byte {
	b := withoutStreamKey(body)
	sc := &jsonScanner{b: b}
	from, to, prevEnd := -2, -1, -1
	ok := sc.object(func(key string) bool {
		_, ok := sc.value()
		if key == "stream_options" {
			from, to = prevEnd, sc.i
		}
		prevEnd = sc.i
		return ok
	})
	if !ok || to < 0 {
		return b
	}
	if from >= 0 {
		return append(append([]byte{}, b[:from]...), b[to:]...)
	}
	open := bytes.IndexByte(b, '{') + 1
	rest := to
	for rest < len(b) && (b[rest] == ' ' || b[rest] == '\t' || b[rest] == '\n' || b[rest] == '\r') {
		rest++
	}
	if rest < len(b) && b[rest] == ',' {
		rest++
	}
	return append(append([]byte{}, b[:open]...), b[rest:]...)
}

// --- streaming ----------------------------------------------------------------

// oaStream sends the answer as server-sent "data:" events: per choice a
// first chunk with the role, content chunks, and a chunk with the finish
// reason; with stream_options.include_usage every chunk has "usage":null
// and a last chunk without choices has the usage; then "data: [DONE]".
// FaultStreamOverloaded ends the stream after the first content chunk
// with an error event; the request is not billed.
func (s *Server) oaStream(c *oaCall, r *oaRequest, lim *poolLimiter, sum [32]byte, id string, cs []oaChoice, u oaUsage, lat time.Duration, admitted limitView) {
	ks := c.ks
	o := ks.org
	m := r.model
	sctx := c.r.Context()
	if s.cfg.BillAbandoned {
		sctx = context.WithoutCancel(sctx)
	}
	first := lat / 4
	if !sleep(sctx, s.real(first)) {
		s.oaAbandoned(o)
		return
	}
	oaRateHeaders(c.h, admitted)
	c.h[hContentType] = sseType
	c.h[hCacheCtl] = noCache
	c.processing()
	c.w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(c.w)
	created := time.Now().Unix()
	var buf []byte
	head := func(b []byte) []byte {
		b = append(b, `data: {"id":`...)
		b = appendJSONString(b, id)
		b = append(b, `,"object":"chat.completion.chunk","created":`...)
		b = strconv.AppendInt(b, created, 10)
		b = append(b, `,"model":`...)
		b = appendJSONString(b, r.echo)
		b = append(b, `,"service_tier":`...)
		b = appendJSONString(b, r.tier)
		b = append(b, `,"system_fingerprint":`...)
		b = appendJSONString(b, m.fingerprint())
		return append(b, `,"choices":[`...)
	}
	obf := rng{s: uint64(sum[0]) ^ c.n}
	tail := func(b []byte) []byte {
		b = append(b, ']')
		if r.includeUsage {
			b = append(b, `,"usage":null`...)
		}
		if r.obfuscate {
			// Padding that varies the size of each event, as the API's does.
			b = append(b, `,"obfuscation":"`...)
			for range 2 + obf.next()%12 {
				b = append(b, idAlphabet[obf.next()%62])
			}
			b = append(b, '"')
		}
		return append(b, "}\n\n"...)
	}
	send := func(b []byte) bool {
		if _, err := c.w.Write(b); err != nil {
			return false
		}
		rc.Flush()
		return true
	}
	api := s.apiNow()
	overload := s.faults.Load().match(FaultStreamOverloaded, o.idx, m.pool(), ks.fp, api, &c.rng) != nil
	var pieces [][]byte
	for i, ch := range cs {
		text := ch.appendText(nil)
		pieces = pieces[:0]
		for len(text) > 0 { // split on spaces: never inside an escape
			k := min(len(text), deltaBytes)
			for k < len(text) && text[k-1] != ' ' {
				k++
			}
			pieces = append(pieces, text[:k])
			text = text[k:]
		}
		buf = head(buf[:0])
		buf = append(buf, `{"index":`...)
		buf = strconv.AppendInt(buf, int64(i), 10)
		buf = append(buf, `,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}`...)
		if !send(tail(buf)) {
			s.oaAbandonedStream(o, lim, r, u.completion)
			return
		}
		for j, p := range pieces {
			if i == 0 && j == 1 {
				if overload {
					buf = append(buf[:0], `data: {"error":{"message":"The server is overloaded or not ready yet.","type":"server_error","param":null,"code":null}}`+"\n\n"...)
					send(buf)
					s.oaAbandonedStream(o, lim, r, u.completion)
					o.status[statusIndex(http.StatusServiceUnavailable)].Add(1)
					return
				}
				if !sleep(sctx, s.real(lat-first)) {
					s.oaAbandonedStream(o, lim, r, u.completion)
					return
				}
			}
			buf = head(buf[:0])
			buf = append(buf, `{"index":`...)
			buf = strconv.AppendInt(buf, int64(i), 10)
			buf = append(buf, `,"delta":{"content":"`...)
			buf = append(buf, p...)
			buf = append(buf, `"},"logprobs":null,"finish_reason":null}`...)
			if !send(tail(buf)) && !s.cfg.BillAbandoned {
				s.oaAbandonedStream(o, lim, r, u.completion)
				return
			}
		}
		if i == 0 && len(pieces) < 2 {
			if !sleep(sctx, s.real(lat-first)) {
				s.oaAbandonedStream(o, lim, r, u.completion)
				return
			}
		}
		buf = head(buf[:0])
		buf = append(buf, `{"index":`...)
		buf = strconv.AppendInt(buf, int64(i), 10)
		buf = append(buf, `,"delta":{},"logprobs":null,"finish_reason":"`...)
		buf = append(buf, ch.finish...)
		buf = append(buf, `"}`...)
		send(tail(buf))
	}
	wall := time.Now()
	now := wall.Sub(s.start)
	fs := s.faults.Load()
	if lim != nil {
		s.oaSettle(lim, fs, o, m, now, s.api(now), r, u.completion)
	}
	s.oaBill(c, r, sum, id, u, wall, now, DeliveryOK)
	if r.includeUsage {
		buf = head(buf[:0])
		buf = append(buf, `],"usage":`...)
		buf = u.appendJSON(buf)
		buf = append(buf, "}\n\n"...)
		send(buf)
	}
	send([]byte("data: [DONE]\n\n"))
}

// oaAbandonedStream: a stream that ended before its last chunk; nothing is
// billed and the request leaves the in-flight count.
func (s *Server) oaAbandonedStream(o *orgState, lim *poolLimiter, r *oaRequest, completion int64) {
	now := time.Since(s.start)
	o.mu.Lock()
	o.inFlight--
	o.pointLocked(now, s.speed).InFlight = o.inFlight
	o.mu.Unlock()
}
