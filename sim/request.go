package sim

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"

	"github.com/apidispatch/apidispatch/anthropic"
)

// apiError is an error response: status, envelope type and message, and
// optionally error.details.
type apiError struct {
	status  int
	typ     string
	msg     string
	details string // raw JSON; empty omits "details"
}

func invalid(format string, a ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: anthropic.ErrInvalidRequest, msg: fmt.Sprintf(format, a...)}
}

// wireRequest is the body of POST /v1/messages as the simulator reads it.
// Fields the simulator does not act on are accepted as raw JSON, so that the
// top-level field set matches the API's and anything else is refused
// ("Extra inputs are not permitted").
type wireRequest struct {
	Model         *string         `json:"model"`
	MaxTokens     *int64          `json:"max_tokens"`
	Messages      []wireMessage   `json:"messages"`
	System        json.RawMessage `json:"system"`
	Stream        *bool           `json:"stream"`
	Temperature   *float64        `json:"temperature"`
	TopP          *float64        `json:"top_p"`
	TopK          *int64          `json:"top_k"`
	StopSequences []string        `json:"stop_sequences"`
	Metadata      json.RawMessage `json:"metadata"`
	Tools         json.RawMessage `json:"tools"`
	ToolChoice    json.RawMessage `json:"tool_choice"`
	Thinking      json.RawMessage `json:"thinking"`
	ServiceTier   *string         `json:"service_tier"`
	InferenceGeo  json.RawMessage `json:"inference_geo"`
	CacheControl  json.RawMessage `json:"cache_control"`
	Container     json.RawMessage `json:"container"`
	MCPServers    json.RawMessage `json:"mcp_servers"`
	Context       json.RawMessage `json:"context_management"`
	OutputConfig  json.RawMessage `json:"output_config"`
	OutputFormat  json.RawMessage `json:"output_format"`
	Speed         json.RawMessage `json:"speed"`
}

type wireMessage struct {
	Role    *string         `json:"role"`
	Content json.RawMessage `json:"content"`
}

// wireBlock is a content block; payloads stay raw (they are only measured).
type wireBlock struct {
	Type         string          `json:"type"`
	Text         json.RawMessage `json:"text"`
	Source       json.RawMessage `json:"source"`
	Input        json.RawMessage `json:"input"`
	Content      json.RawMessage `json:"content"`
	Data         json.RawMessage `json:"data"`
	ID           string          `json:"id"`
	ToolUseID    string          `json:"tool_use_id"`
	CacheControl *struct {
		Type string `json:"type"`
		TTL  string `json:"ttl"`
	} `json:"cache_control"`
}

// request is a validated request, reduced to what the simulator needs.
type request struct {
	model     *modelInfo
	maxTokens int64
	input     int64   // total input tokens (cached prefix included)
	judge     bool    // looks like a judge call: answer with a JSON verdict
	long      bool    // a user message asks for an answer "at length": a long one
	x         *extras // tools, stop sequences, thinking, geo; nil for a plain request
	stream    bool    // stream: true (server-sent events)

	// Prompt caching: the prefix up to the last block marked cache_control.
	cacheTokens int64
	cache1h     bool
	cacheKey    [16]byte
}

// Token-count stand-in: ceil(bytes/3.6) per text, plus 4 per message and 3
// per request. Plausible, deterministic, and deliberately not what a planner
// would compute from characters.
const (
	tokensPerRequest = 3
	tokensPerMessage = 4
	tokensPerImage   = 1568
)

func textTokens(n int) int64 { return (int64(n)*5 + 17) / 18 }

var knownBlockTypes = map[string]bool{
	"text": true, "image": true, "document": true, "tool_use": true, "tool_result": true,
	"thinking": true, "redacted_thinking": true, "server_tool_use": true,
	"web_search_tool_result": true, "search_result": true, "container_upload": true,
}

// parseRequest validates a Messages (or, with countOnly, count_tokens) body
// the way the API does and returns what the simulator needs, or the error
// response. It never panics, whatever the bytes (FuzzValidateRequest).
func parseRequest(body []byte, countOnly, longContextBeta bool) (request, *apiError) {
	var w wireRequest
	if !fastDecodeRequest(body, &w) {
		w = wireRequest{}
		if e := strictDecodeRequest(body, &w); e != nil {
			return request{}, e
		}
	}
	if w.Model == nil || *w.Model == "" {
		return request{}, invalid("model: Field required")
	}
	if !countOnly && w.MaxTokens == nil {
		return request{}, invalid("max_tokens: Field required")
	}
	if w.Messages == nil {
		return request{}, invalid("messages: Field required")
	}
	if w.Temperature != nil && (*w.Temperature < 0 || *w.Temperature > 1) {
		return request{}, invalid("temperature: Input should be between 0 and 1")
	}
	if w.TopP != nil && (*w.TopP < 0 || *w.TopP > 1) {
		return request{}, invalid("top_p: Input should be between 0 and 1")
	}
	if w.TopK != nil && *w.TopK < 0 {
		return request{}, invalid("top_k: Input should be greater than or equal to 0")
	}
	if w.ServiceTier != nil && *w.ServiceTier != "auto" && *w.ServiceTier != "standard_only" {
		return request{}, invalid("service_tier: Input should be 'auto' or 'standard_only'")
	}
	m := modelByID[*w.Model]
	if m == nil {
		return request{}, &apiError{status: http.StatusNotFound, typ: anthropic.ErrNotFound, msg: "model: " + *w.Model}
	}
	r := request{model: m, stream: w.Stream != nil && *w.Stream && !countOnly}
	if !countOnly {
		r.maxTokens = *w.MaxTokens
		if r.maxTokens < 0 {
			// 0 is allowed: it pre-warms the cache and returns no content.
			return request{}, invalid("max_tokens: Input should be greater than or equal to 0")
		}
		if r.maxTokens > m.maxOutput {
			return request{}, invalid("max_tokens: %d > %d, which is the maximum allowed number of output tokens for %s", r.maxTokens, m.maxOutput, m.id)
		}
	}
	if len(w.Messages) == 0 {
		return request{}, invalid("messages: at least one message is required")
	}
	x, toolTokens, aerr := parseExtras(&w, m, r.maxTokens, countOnly)
	if aerr != nil {
		return request{}, aerr
	}
	r.x = x

	var segs [][]byte // raw prompt pieces, in order, for the cache key
	r.input = tokensPerRequest + toolTokens
	var uses toolUses
	if len(w.System) > 0 && !bytes.Equal(w.System, []byte("null")) {
		n, judge, err := scanContent(w.System, "system", true, &r, &segs, nil)
		if err != nil {
			return request{}, err
		}
		r.input += n
		r.judge = r.judge || judge
	}
	for i, msg := range w.Messages {
		where := "messages." + strconv.Itoa(i)
		if msg.Role == nil {
			return request{}, invalid("%s.role: Field required", where)
		}
		switch *msg.Role {
		case "user", "assistant":
		case "system":
			return request{}, invalid("%s: Unexpected role \"system\". The Messages API accepts a top-level `system` parameter, not \"system\" as an input message role.", where)
		default:
			return request{}, invalid("%s.role: Input should be 'user' or 'assistant'", where)
		}
		if len(msg.Content) == 0 {
			return request{}, invalid("%s.content: Field required", where)
		}
		uses.prev, uses.cur = uses.cur, uses.prev[:0]
		n, judge, err := scanContent(msg.Content, where+".content", false, &r, &segs, &uses)
		if err != nil {
			return request{}, err
		}
		if n == 0 && (i < len(w.Messages)-1 || *msg.Role == "user") {
			return request{}, invalid("%s: all messages must have non-empty content except for the optional final assistant message", where)
		}
		r.input += n + tokensPerMessage
		r.judge = r.judge || (judge && *msg.Role == "user")
		r.long = r.long || (*msg.Role == "user" && containsFold(msg.Content, userLongWords))
	}
	window := m.context
	if m.longContext && longContextBeta {
		window = 1000000
	}
	if r.input > window {
		return request{}, invalid("prompt is too long: %d tokens > %d maximum", r.input, window)
	}
	if r.cacheTokens < m.cacheMin {
		r.cacheTokens = 0
	}
	return r, nil
}

// strictDecodeRequest decodes body with encoding/json, refusing unknown
// fields and trailing data.
func strictDecodeRequest(body []byte, w *wireRequest) *apiError {
	d := json.NewDecoder(bytes.NewReader(body))
	d.DisallowUnknownFields()
	if err := d.Decode(w); err != nil {
		return decodeError(body, err)
	}
	if rest := bytes.TrimSpace(body[d.InputOffset():]); len(rest) > 0 {
		return invalid("There was an error parsing the body of your request: unexpected data after the JSON object")
	}
	if k, ok := inexactKey(body, knownTopLevel); !ok {
		return invalid("%s: Extra inputs are not permitted", k)
	}
	return nil
}

// inexactKey finds a top-level key of the object body that is not in
// known as spelt: encoding/json matches a field's name whatever its case
// ("Max_Tokens" fills max_tokens), where the API reads names exactly and
// refuses any other as unknown. A request whose "MAX_TOKENS" the
// simulator honoured would be billed for what the API refuses, and for
// what a client reading names as the API does never bounded.
func inexactKey(body []byte, known map[string]bool) (string, bool) {
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil {
		return "", true
	}
	for k := range top {
		if !known[k] {
			return k, false
		}
	}
	return "", true
}

// decodeError turns a decoding failure into the API's 400. For an unknown
// field it finds the field's name by decoding the body as a plain object.
func decodeError(body []byte, err error) *apiError {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		if te.Field != "" {
			return invalid("%s: Input should be a valid %s", te.Field, jsonKind(te.Type.Kind().String()))
		}
		return invalid("Input should be a valid dictionary")
	}
	var se *json.SyntaxError
	if errors.As(err, &se) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return invalid("There was an error parsing the body of your request: invalid JSON")
	}
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) == nil {
		for k := range top {
			if !knownTopLevel[k] {
				return invalid("%s: Extra inputs are not permitted", k)
			}
		}
	}
	return invalid("There was an error parsing the body of your request: invalid JSON")
}

func jsonKind(k string) string {
	switch k {
	case "int64", "int", "float64":
		return "number"
	case "string", "ptr":
		return "value"
	case "slice":
		return "list"
	case "bool":
		return "boolean"
	}
	return k
}

var knownTopLevel = func() map[string]bool {
	m := map[string]bool{}
	for _, f := range []string{"model", "max_tokens", "messages", "system", "stream", "temperature",
		"top_p", "top_k", "stop_sequences", "metadata", "tools", "tool_choice", "thinking",
		"service_tier", "inference_geo", "cache_control", "container", "mcp_servers",
		"context_management", "output_config", "output_format", "speed"} {
		m[f] = true
	}
	return m
}()

// scanContent counts the tokens of a content value (a string or a list of
// blocks; for system only text blocks), reports whether it asks for a JSON
// verdict (system: mentions judging or evaluation; user: asks for a "JSON
// object"), and records the cached prefix. The value is valid JSON already
// (the request decoded); strings are measured raw, escapes and all, which is
// as good a tokenizer stand-in as the decoded length and costs no copy.
// A tool_result must answer a tool_use of the message before it (uses).
func scanContent(raw json.RawMessage, where string, system bool, r *request, segs *[][]byte, uses *toolUses) (int64, bool, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return 0, false, invalid("%s: Field required", where)
	}
	judgeWords := userJudgeWords
	if system {
		judgeWords = systemJudgeWords
	}
	switch raw[0] {
	case '"':
		*segs = append(*segs, raw)
		return textTokens(len(raw) - 2), containsFold(raw, judgeWords), nil
	case '[':
	default:
		return 0, false, invalid("%s: Input should be a valid string or list of content blocks", where)
	}
	var blocks []wireBlock
	if !fastDecodeBlocks(raw, &blocks) {
		blocks = nil
		if err := json.Unmarshal(raw, &blocks); err != nil {
			return 0, false, invalid("%s: Input should be a valid list of content blocks", where)
		}
	}
	var n int64
	judge := false
	for j := range blocks {
		b := &blocks[j]
		if b.Type == "" {
			return 0, false, invalid("%s.%d.type: Field required", where, j)
		}
		if !knownBlockTypes[b.Type] || (system && b.Type != "text") {
			return 0, false, invalid("%s.%d.type: Input tag '%s' found using 'type' does not match any of the expected tags", where, j, b.Type)
		}
		switch b.Type {
		case "text":
			if len(b.Text) == 0 || b.Text[0] != '"' {
				return 0, false, invalid("%s.%d.text: Field required (a string)", where, j)
			}
			if len(b.Text) == 2 {
				return 0, false, invalid("%s.%d: text content blocks must be non-empty", where, j)
			}
			*segs = append(*segs, b.Text)
			n += textTokens(len(b.Text) - 2)
			judge = judge || containsFold(b.Text, judgeWords)
		case "image":
			*segs = append(*segs, b.Source)
			n += tokensPerImage
		case "tool_use", "tool_result":
			if uses != nil && b.Type == "tool_use" {
				uses.cur = append(uses.cur, b.ID)
			}
			if uses != nil && b.Type == "tool_result" && !slices.Contains(uses.prev, b.ToolUseID) {
				return 0, false, invalid("%s.%d: unexpected `tool_use_id` found in `tool_result` blocks: %s. Each `tool_result` block must have a corresponding `tool_use` block in the previous message.", where, j, b.ToolUseID)
			}
			fallthrough
		default:
			size := len(b.Text) + len(b.Source) + len(b.Input) + len(b.Content) + len(b.Data)
			*segs = append(*segs, []byte(b.Type), b.Text, b.Source, b.Input, b.Content, b.Data)
			n += textTokens(size + 16)
		}
		if b.CacheControl != nil {
			if b.CacheControl.Type != "ephemeral" {
				return 0, false, invalid("%s.%d.cache_control.type: Input should be 'ephemeral'", where, j)
			}
			if b.CacheControl.TTL != "" && b.CacheControl.TTL != "5m" && b.CacheControl.TTL != "1h" {
				return 0, false, invalid("%s.%d.cache_control.ttl: Input should be '5m' or '1h'", where, j)
			}
			r.cacheTokens = r.input + n
			r.cache1h = b.CacheControl.TTL == "1h"
			h := sha256.New()
			for _, s := range *segs {
				h.Write(s)
				h.Write([]byte{0})
			}
			copy(r.cacheKey[:], h.Sum(nil))
		}
	}
	return n, judge, nil
}

// toolUses are the tool_use ids of the previous and the current message.
type toolUses struct{ prev, cur []string }

var (
	userJudgeWords   = [][]byte{[]byte("json object")}
	systemJudgeWords = [][]byte{[]byte("judg"), []byte("evaluat")}
	userLongWords    = [][]byte{[]byte("at length")}
)

// containsFold reports whether s contains any of the lower-case words,
// ignoring ASCII case.
func containsFold(s []byte, words [][]byte) bool {
	for _, w := range words {
		for i := 0; i+len(w) <= len(s); i++ {
			ok := true
			for k := range w {
				c := s[i+k]
				if 'A' <= c && c <= 'Z' {
					c += 'a' - 'A'
				}
				if c != w[k] {
					ok = false
					break
				}
			}
			if ok {
				return true
			}
		}
	}
	return false
}
