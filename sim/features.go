package sim

import (
	"bytes"
	"encoding/json"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/apidispatch/apidispatch/anthropic"
)

// extras are the request features beyond a plain prompt: tools, stop
// sequences, extended thinking and the inference geography. A request
// without any has none (request.x is nil), so the judge hot path never
// pays for them.
type extras struct {
	tool     *toolSpec // the tool a tool_choice of "tool" or "any" forces
	stops    []string  // stop_sequences
	thinking int64     // thinking budget in tokens; 0: thinking off
	geoUS    bool      // inference_geo "us"
}

// toolSpec is one custom tool as the simulator needs it.
type toolSpec struct {
	name   string
	schema any // decoded input_schema
}

type wireTool struct {
	Type        string          `json:"type"`
	Name        *string         `json:"name"`
	InputSchema json.RawMessage `json:"input_schema"`
}

type wireToolChoice struct {
	Type string  `json:"type"`
	Name *string `json:"name"`
}

type wireThinking struct {
	Type         string `json:"type"`
	BudgetTokens *int64 `json:"budget_tokens"`
}

var toolNameRE = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,128}$`)

const thinkingDocs = "Please consult our documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking"

// isNull reports whether raw is absent or JSON null.
func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// parseExtras validates the optional features of w for model m and returns
// them (nil when the request uses none) and the input tokens the tool
// definitions add.
func parseExtras(w *wireRequest, m *modelInfo, maxTokens int64, countOnly bool) (*extras, int64, *apiError) {
	if e := checkMetadata(w.Metadata); e != nil {
		return nil, 0, e
	}
	if isNull(w.Tools) && isNull(w.ToolChoice) && isNull(w.Thinking) && isNull(w.InferenceGeo) && len(w.StopSequences) == 0 {
		return nil, 0, nil
	}
	x := &extras{}
	var toolTokens int64
	var tools []toolSpec
	if !isNull(w.Tools) {
		var wt []wireTool
		if err := json.Unmarshal(w.Tools, &wt); err != nil {
			return nil, 0, invalid("tools: Input should be a valid list")
		}
		seen := map[string]bool{}
		for i, t := range wt {
			if t.Name == nil {
				return nil, 0, invalid("tools.%d.name: Field required", i)
			}
			if !toolNameRE.MatchString(*t.Name) {
				return nil, 0, invalid("tools.%d.name: String should match pattern '^[a-zA-Z0-9_-]{1,128}$'", i)
			}
			if seen[*t.Name] {
				return nil, 0, invalid("tools: Tool names must be unique.")
			}
			seen[*t.Name] = true
			if t.Type != "" && t.Type != "custom" {
				continue // a server tool: accepted, never forced into a tool_use here
			}
			if isNull(t.InputSchema) {
				return nil, 0, invalid("tools.%d.custom.input_schema: Field required", i)
			}
			var schema any
			if err := json.Unmarshal(t.InputSchema, &schema); err != nil {
				return nil, 0, invalid("tools.%d.custom.input_schema: Input should be a valid dictionary", i)
			}
			obj, _ := schema.(map[string]any)
			if obj == nil || obj["type"] != "object" {
				return nil, 0, invalid("tools.%d.custom.input_schema.type: Input should be 'object'", i)
			}
			tools = append(tools, toolSpec{name: *t.Name, schema: schema})
		}
		toolTokens = textTokens(len(w.Tools))
	}
	if !isNull(w.ToolChoice) {
		var tc wireToolChoice
		if err := json.Unmarshal(w.ToolChoice, &tc); err != nil {
			return nil, 0, invalid("tool_choice: Input should be a valid dictionary")
		}
		switch tc.Type {
		case "auto", "none":
		case "any", "tool":
			if len(tools) == 0 {
				return nil, 0, invalid("tool_choice: `tool_choice` may only be specified while providing tools")
			}
			if tc.Type == "any" {
				x.tool = &tools[0]
				break
			}
			if tc.Name == nil {
				return nil, 0, invalid("tool_choice.tool.name: Field required")
			}
			for i := range tools {
				if tools[i].name == *tc.Name {
					x.tool = &tools[i]
				}
			}
			if x.tool == nil {
				return nil, 0, invalid("tool_choice.name: Tool '%s' not found in provided tools", *tc.Name)
			}
		case "":
			return nil, 0, invalid("tool_choice.type: Field required")
		default:
			return nil, 0, invalid("tool_choice: Input tag '%s' found using 'type' does not match any of the expected tags: 'auto', 'any', 'tool', 'none'", tc.Type)
		}
	}
	for i, s := range w.StopSequences {
		if strings.TrimSpace(s) == "" {
			return nil, 0, invalid("stop_sequences.%d: each stop sequence must contain non-whitespace characters", i)
		}
	}
	x.stops = w.StopSequences
	if !isNull(w.Thinking) {
		var th wireThinking
		if err := json.Unmarshal(w.Thinking, &th); err != nil {
			return nil, 0, invalid("thinking: Input should be a valid dictionary")
		}
		switch th.Type {
		case "disabled":
		case "enabled":
			if th.BudgetTokens == nil {
				return nil, 0, invalid("thinking.enabled.budget_tokens: Field required")
			}
			if *th.BudgetTokens < 1024 {
				return nil, 0, invalid("thinking.enabled.budget_tokens: Input should be greater than or equal to 1024")
			}
			if m.pool == anthropic.PoolHaiku35 {
				return nil, 0, invalid("thinking: 'claude-3-5-haiku-20241022' does not support extended thinking")
			}
			if !countOnly && *th.BudgetTokens >= maxTokens {
				return nil, 0, invalid("`max_tokens` must be greater than `thinking.budget_tokens`. %s#max-tokens-and-context-window-size", thinkingDocs)
			}
			if w.Temperature != nil && *w.Temperature != 1 {
				return nil, 0, invalid("`temperature` may only be set to 1 when thinking is enabled. %s#important-considerations-when-using-extended-thinking", thinkingDocs)
			}
			if w.TopK != nil {
				return nil, 0, invalid("`top_k` must be unset when thinking is enabled. %s#important-considerations-when-using-extended-thinking", thinkingDocs)
			}
			if x.tool != nil {
				return nil, 0, invalid("Thinking may not be enabled when tool_choice forces tool use.")
			}
			x.thinking = *th.BudgetTokens
		case "":
			return nil, 0, invalid("thinking.type: Field required")
		default:
			return nil, 0, invalid("thinking: Input tag '%s' found using 'type' does not match any of the expected tags: 'enabled', 'disabled'", th.Type)
		}
	}
	if !isNull(w.InferenceGeo) {
		var geo string
		if err := json.Unmarshal(w.InferenceGeo, &geo); err != nil || (geo != "us" && geo != "global") {
			return nil, 0, invalid("inference_geo: Input should be 'us' or 'global'")
		}
		if !m.geo {
			return nil, 0, invalid("inference_geo: not supported for model %s; use a Claude 4.6 or later model, or omit inference_geo", m.id)
		}
		x.geoUS = geo == "us"
	}
	return x, toolTokens, nil
}

// checkMetadata accepts an absent or null metadata or an object whose only
// key is user_id (a string or null); anything else is the API's 400.
func checkMetadata(raw json.RawMessage) *apiError {
	if isNull(raw) {
		return nil
	}
	s := &jsonScanner{b: raw}
	bad := ""
	ok := s.object(func(key string) bool {
		if key != "user_id" {
			bad = key
			return false
		}
		v, ok := s.value()
		return ok && (v[0] == '"' || string(v) == "null")
	})
	if ok && s.peek() == 0 {
		return nil
	}
	if bad == "" {
		// A key the scanner does not read plainly, or a bad value: decode.
		var m map[string]json.RawMessage
		if json.Unmarshal(raw, &m) != nil {
			return invalid("metadata: Input should be a valid dictionary")
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if k != "user_id" {
				return invalid("metadata.%s: Extra inputs are not permitted", k)
			}
		}
		return invalid("metadata.user_id: Input should be a valid string")
	}
	return invalid("metadata.%s: Extra inputs are not permitted", bad)
}

// appendToolInput appends a JSON value valid against schema, derived from r
// only: for an object every property (required or not), for a string a word
// padded to minLength, a number within its bounds, the first of an enum, one
// item of an array (or minItems), the first branch of anyOf/oneOf/allOf.
// A schema that asks for more than maxToolInput bytes (huge minItems or
// minLength, deep nesting) gets a shorter value, still valid JSON but no
// longer valid against it: the output stays bounded whatever the request.
func appendToolInput(b []byte, schema any, r *rng, depth int) []byte {
	start := len(b)
	return appendToolValue(b, schema, r, depth, start)
}

const maxToolInput = 16 << 10

func appendToolValue(b []byte, schema any, r *rng, depth, start int) []byte {
	full := func() bool { return len(b)-start > maxToolInput }
	sc, _ := schema.(map[string]any)
	if sc == nil || depth > 8 {
		return append(b, "null"...)
	}
	if v, ok := sc["const"]; ok {
		enc, _ := json.Marshal(v)
		return append(b, enc...)
	}
	if en, ok := sc["enum"].([]any); ok && len(en) > 0 {
		enc, _ := json.Marshal(en[r.next()%uint64(len(en))])
		return append(b, enc...)
	}
	for _, k := range []string{"anyOf", "oneOf", "allOf"} {
		if br, ok := sc[k].([]any); ok && len(br) > 0 {
			return appendToolValue(b, br[0], r, depth+1, start)
		}
	}
	typ, _ := sc["type"].(string)
	if ts, ok := sc["type"].([]any); ok {
		for _, t := range ts {
			if s, _ := t.(string); s != "" && s != "null" {
				typ = s
				break
			}
		}
	}
	if typ == "" {
		if _, ok := sc["properties"]; ok {
			typ = "object"
		}
	}
	num := func(key string) (float64, bool) {
		f, ok := sc[key].(float64)
		return f, ok
	}
	switch typ {
	case "object":
		props, _ := sc["properties"].(map[string]any)
		names := make([]string, 0, len(props))
		for k := range props {
			names = append(names, k)
		}
		sort.Strings(names)
		b = append(b, '{')
		for i, k := range names {
			if full() {
				break
			}
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, k)
			b = append(b, ':')
			b = appendToolValue(b, props[k], r, depth+1, start)
		}
		return append(b, '}')
	case "array":
		n := 1
		if mi, ok := num("minItems"); ok && int(mi) > n {
			n = int(mi)
		}
		if ma, ok := num("maxItems"); ok && int(ma) < n {
			n = int(ma)
		}
		b = append(b, '[')
		for i := 0; i < n && !full(); i++ {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendToolValue(b, sc["items"], r, depth+1, start)
		}
		return append(b, ']')
	case "integer", "number":
		lo, hasLo := num("minimum")
		hi, hasHi := num("maximum")
		if !hasLo {
			lo = 0
			if hasHi && hi < 0 {
				lo = hi - 100
			}
		}
		if !hasHi {
			hi = lo + 100
		}
		v := lo + float64(r.next()%uint64(max(1, int64(hi-lo)+1)))
		if ex, ok := num("exclusiveMinimum"); ok && v <= ex {
			v = ex + 1
		}
		if ex, ok := num("exclusiveMaximum"); ok && v >= ex {
			v = ex - 1
		}
		return strconv.AppendInt(b, int64(v), 10)
	case "boolean":
		return strconv.AppendBool(b, r.next()%2 == 0)
	case "null":
		return append(b, "null"...)
	default: // string, or no type at all
		w := words[r.next()%uint64(len(words))]
		if ml, ok := num("minLength"); ok {
			for len(w) < int(min(ml, maxToolInput)) {
				w += "-" + words[r.next()%uint64(len(words))]
			}
		}
		if ml, ok := num("maxLength"); ok && len(w) > int(ml) {
			w = w[:int(ml)]
		}
		return appendJSONString(b, w)
	}
}

// appendSignature appends a deterministic base64-looking signature of a
// thinking block (quotes included).
func appendSignature(b []byte, seed uint64) []byte {
	const b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	r := rng{s: seed ^ 0x9b05688c2b3e6c1f}
	b = append(b, '"')
	for i := 0; i < 88; i++ {
		b = append(b, b64[r.next()%64])
	}
	return append(b, `=="`...)
}
