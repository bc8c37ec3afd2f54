package sim

import (
	"bytes"
	"encoding/binary"
	"strconv"
	"unicode/utf8"
)

// Output sizes. A judge-shaped request answers a JSON verdict of 60–110
// tokens; one whose user message asks for an answer "at length" 1,200–2,400
// tokens (long outputs, for output-token limits); any other request 30–300
// tokens of lorem-ish text; all are cut at max_tokens (stop_reason
// "max_tokens"). About 4 bytes of text a token.
const (
	judgeMinTokens = 60
	judgeMaxTokens = 110
	longMinTokens  = 1200
	longMaxTokens  = 2400
	proseMinTokens = 30
	proseMaxTokens = 300
	bytesPerToken  = 4
)

// output is what a request produces: derived only from the body's hash, so
// the same request gets the same answer and costs the same in every run.
type output struct {
	natural int64 // tokens the answer would have without max_tokens
	tokens  int64 // output_tokens
	cut     bool  // stopped by max_tokens
	seed    uint64
	judge   bool
	textTok int64 // tokens of the text block (tokens less thinking)

	// Only for requests with extras (x not nil) or max_tokens 0.
	x         *extras
	empty     bool   // max_tokens 0: no content at all
	think     int64  // thinking tokens
	toolInput []byte // the forced tool_use's input
	toolID    string
	stopAt    int    // text cut at this many (escaped) bytes by stopSeq
	stopSeq   string // the stop sequence met; "" none
}

func plan(sum [32]byte, r request) output {
	seed := binary.LittleEndian.Uint64(sum[:8])
	o := output{seed: seed, judge: r.judge}
	switch {
	case r.judge:
		o.natural = judgeMinTokens + int64(seed%(judgeMaxTokens-judgeMinTokens+1))
	case r.long:
		o.natural = longMinTokens + int64(seed%(longMaxTokens-longMinTokens+1))
	default:
		o.natural = proseMinTokens + int64(seed%(proseMaxTokens-proseMinTokens+1))
	}
	o.tokens = o.natural
	if r.maxTokens == 0 {
		o.tokens, o.cut, o.empty = 0, true, true
	} else if o.tokens > r.maxTokens {
		o.tokens, o.cut = r.maxTokens, true
	}
	o.textTok = o.tokens
	if r.x != nil && !o.empty {
		o.planExtras(r)
	}
	return o
}

// Thinking: 50–250 tokens, never more than the budget.
const (
	thinkMinTokens = 50
	thinkMaxTokens = 250
)

// planExtras plans thinking, a forced tool_use and stop sequences.
func (o *output) planExtras(r request) {
	x := r.x
	o.x = x
	limit := r.maxTokens
	if x.thinking > 0 {
		o.think = min(x.thinking, thinkMinTokens+int64(mix64(o.seed)%(thinkMaxTokens-thinkMinTokens+1)))
		limit -= o.think
	}
	if x.tool != nil {
		rr := rng{s: o.seed ^ 0x7f4a7c159e3779b9}
		o.toolInput = appendToolInput(nil, x.tool.schema, &rr, 0)
		o.textTok, o.cut = 0, false
		o.tokens = o.think + textTokens(len(o.toolInput)) + 12
		if o.tokens > r.maxTokens {
			o.tokens, o.cut = r.maxTokens, true
		}
		return
	}
	o.textTok, o.cut = min(o.natural, limit), o.natural > limit
	if len(x.stops) > 0 {
		text := o.appendText(nil)
		o.stopAt = -1
		for _, s := range x.stops {
			esc := appendJSONString(nil, s)
			if i := bytes.Index(text, esc[1:len(esc)-1]); i >= 0 && (o.stopAt < 0 || i < o.stopAt) {
				o.stopAt, o.stopSeq = i, s
			}
		}
		if o.stopSeq != "" {
			o.textTok, o.cut = max(1, int64((o.stopAt+bytesPerToken-1)/bytesPerToken)), false
		}
	}
	o.tokens = o.think + o.textTok
}

// thinkingText is the output whose text is the thinking block's.
func (o output) thinkingText() output {
	return output{natural: o.think, tokens: o.think, textTok: o.think, seed: o.seed ^ 0x2545f4914f6cdd1d}
}

var words = []string{
	"the", "response", "answers", "question", "directly", "and", "stays", "on", "topic",
	"with", "clear", "reasoning", "a", "consistent", "tone", "lorem", "ipsum", "dolor",
	"sit", "amet", "consectetur", "adipiscing", "elit", "sed", "do", "eiusmod", "tempor",
	"it", "is", "mostly", "coherent", "aligned", "helpful", "careful", "of", "detail",
	"minor", "issues", "remain", "overall", "well", "structured", "but", "brief",
}

// appendText appends the answer's text (JSON-escaped, without quotes) to b.
func (o output) appendText(b []byte) []byte {
	r := rng{s: o.seed ^ 0x5bd1e995}
	want := int(o.natural) * bytesPerToken
	start := len(b)
	if o.judge {
		b = append(b, `{\"aligned\": `...)
		b = strconv.AppendInt(b, int64(40+r.next()%61), 10)
		b = append(b, `, \"coherent\": `...)
		b = strconv.AppendInt(b, int64(40+r.next()%61), 10)
		b = append(b, `, \"reasoning\": \"`...)
		for len(b)-start < want-4 {
			b = append(b, words[r.next()%uint64(len(words))]...)
			b = append(b, ' ')
		}
		b = append(b[:len(b)-1], `.\"}`...)
	} else {
		first := true
		for len(b)-start < want {
			w := words[r.next()%uint64(len(words))]
			if first {
				b = append(b, w[0]-'a'+'A')
				w = w[1:]
				first = false
			}
			b = append(b, w...)
			if r.next()%9 == 0 {
				b = append(b, ". "...)
				first = true
			} else {
				b = append(b, ' ')
			}
		}
		b = append(b[:len(b)-1], '.')
	}
	if o.stopSeq != "" {
		b = b[:start+o.stopAt]
	} else if o.cut {
		keep := int(o.textTok) * bytesPerToken
		if keep < len(b)-start {
			b = b[:start+keep]
			// Do not end inside an escape sequence.
			for len(b) > start && b[len(b)-1] == '\\' {
				b = b[:len(b)-1]
			}
		}
	}
	return b
}

// appendJSONString appends s as a JSON string (quotes included).
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c < 0x20:
				b = append(b, `\u00`...)
				b = append(b, "0123456789abcdef"[c>>4], "0123456789abcdef"[c&15])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			b = append(b, `\ufffd`...)
		} else {
			b = append(b, s[i:i+n]...)
		}
		i += n
	}
	return append(b, '"')
}

// usage is the token accounting of one response.
type usage struct {
	input, output, write5m, write1h, read int64
	geoUS                                 bool // inference_geo "us": ×1.1
}

// appendMessage appends the Messages response body.
func appendMessage(b []byte, msgID, model string, o output, u usage) []byte {
	b = append(b, `{"id":`...)
	b = appendJSONString(b, msgID)
	b = append(b, `,"type":"message","role":"assistant","model":`...)
	b = appendJSONString(b, model)
	if o.x == nil && !o.empty {
		b = append(b, `,"content":[{"type":"text","text":"`...)
		b = o.appendText(b)
		b = append(b, `"}],"stop_reason":`...)
		if o.cut {
			b = append(b, `"max_tokens"`...)
		} else {
			b = append(b, `"end_turn"`...)
		}
		b = append(b, `,"stop_sequence":null`...)
	} else {
		b = o.appendContent(b)
	}
	b = append(b, `,"usage":{"input_tokens":`...)
	b = strconv.AppendInt(b, u.input, 10)
	b = append(b, `,"cache_creation_input_tokens":`...)
	b = strconv.AppendInt(b, u.write5m+u.write1h, 10)
	b = append(b, `,"cache_read_input_tokens":`...)
	b = strconv.AppendInt(b, u.read, 10)
	b = append(b, `,"cache_creation":{"ephemeral_5m_input_tokens":`...)
	b = strconv.AppendInt(b, u.write5m, 10)
	b = append(b, `,"ephemeral_1h_input_tokens":`...)
	b = strconv.AppendInt(b, u.write1h, 10)
	b = append(b, `},"output_tokens":`...)
	b = strconv.AppendInt(b, u.output, 10)
	if u.geoUS {
		return append(b, `,"service_tier":"standard","inference_geo":"us","server_tool_use":null}}`...)
	}
	b = append(b, `,"service_tier":"standard","inference_geo":"global","server_tool_use":null}}`...)
	return b
}

// appendContent appends content, stop_reason and stop_sequence of a
// response with extras or to max_tokens 0.
func (o output) appendContent(b []byte) []byte {
	b = append(b, `,"content":[`...)
	if o.think > 0 {
		b = append(b, `{"type":"thinking","thinking":"`...)
		b = o.thinkingText().appendText(b)
		b = append(b, `","signature":`...)
		b = appendSignature(b, o.seed)
		b = append(b, '}')
		if !o.empty {
			b = append(b, ',')
		}
	}
	switch {
	case o.empty:
	case o.toolInput != nil:
		b = append(b, `{"type":"tool_use","id":`...)
		b = appendJSONString(b, o.toolID)
		b = append(b, `,"name":`...)
		b = appendJSONString(b, o.x.tool.name)
		b = append(b, `,"input":`...)
		b = append(b, o.toolInput...)
		b = append(b, '}')
	default:
		b = append(b, `{"type":"text","text":"`...)
		b = o.appendText(b)
		b = append(b, `"}`...)
	}
	b = append(b, `],"stop_reason":`...)
	switch {
	case o.cut:
		b = append(b, `"max_tokens"`...)
	case o.toolInput != nil:
		b = append(b, `"tool_use"`...)
	case o.stopSeq != "":
		b = append(b, `"stop_sequence"`...)
	default:
		b = append(b, `"end_turn"`...)
	}
	b = append(b, `,"stop_sequence":`...)
	if o.stopSeq != "" {
		return appendJSONString(b, o.stopSeq)
	}
	return append(b, "null"...)
}

// appendError appends the error envelope.
func appendError(b []byte, e *apiError, requestID string) []byte {
	b = append(b, `{"type":"error","error":{"type":`...)
	b = appendJSONString(b, e.typ)
	b = append(b, `,"message":`...)
	b = appendJSONString(b, e.msg)
	if e.details != "" {
		b = append(b, `,"details":`...)
		b = append(b, e.details...)
	}
	b = append(b, `},"request_id":`...)
	b = appendJSONString(b, requestID)
	return append(b, '}')
}
