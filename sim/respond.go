package sim

import (
	"encoding/binary"
	"strconv"
	"unicode/utf8"
)

// Output sizes. A judge-shaped request answers a JSON verdict of 60–110
// tokens; any other request 30–300 tokens of lorem-ish text; both are cut at
// max_tokens (stop_reason "max_tokens"). About 4 bytes of text a token.
const (
	judgeMinTokens = 60
	judgeMaxTokens = 110
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
}

func plan(sum [32]byte, r request) output {
	seed := binary.LittleEndian.Uint64(sum[:8])
	o := output{seed: seed, judge: r.judge}
	if r.judge {
		o.natural = judgeMinTokens + int64(seed%(judgeMaxTokens-judgeMinTokens+1))
	} else {
		o.natural = proseMinTokens + int64(seed%(proseMaxTokens-proseMinTokens+1))
	}
	o.tokens = o.natural
	if r.maxTokens > 0 && o.tokens > r.maxTokens {
		o.tokens, o.cut = r.maxTokens, true
	}
	return o
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
	if o.cut {
		keep := int(o.tokens) * bytesPerToken
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
}

// appendMessage appends the Messages response body.
func appendMessage(b []byte, msgID, model string, o output, u usage) []byte {
	b = append(b, `{"id":`...)
	b = appendJSONString(b, msgID)
	b = append(b, `,"type":"message","role":"assistant","model":`...)
	b = appendJSONString(b, model)
	b = append(b, `,"content":[{"type":"text","text":"`...)
	b = o.appendText(b)
	b = append(b, `"}],"stop_reason":`...)
	if o.cut {
		b = append(b, `"max_tokens"`...)
	} else {
		b = append(b, `"end_turn"`...)
	}
	b = append(b, `,"stop_sequence":null,"usage":{"input_tokens":`...)
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
	b = append(b, `,"service_tier":"standard","inference_geo":"global","server_tool_use":null}}`...)
	return b
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
