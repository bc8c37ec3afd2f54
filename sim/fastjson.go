package sim

import (
	"encoding/json"
	"strconv"
)

// A fast path for decoding the common request shapes without reflection.
// It fills exactly what encoding/json would (FuzzFastDecode holds it to
// that) and gives up, returning false, on anything it does not handle —
// unknown or repeated keys, escapes or non-ASCII in decoded strings, blocks
// other than text, any invalid JSON — so that the slow path decides and
// words every error. Validation then runs on the result either way.

// jsonScanner walks a JSON document. Not safe for concurrent use.
type jsonScanner struct {
	b     []byte
	i     int
	depth int
}

func (s *jsonScanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *jsonScanner) peek() byte {
	s.ws()
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

func (s *jsonScanner) eat(c byte) bool {
	if s.peek() == c {
		s.i++
		return true
	}
	return false
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// str scans a string and returns it raw (quotes included), and whether it
// is plain: printable ASCII without escapes, so its bytes are its value.
func (s *jsonScanner) str() (raw []byte, plain, ok bool) {
	if s.peek() != '"' {
		return nil, false, false
	}
	start := s.i
	s.i++
	plain = true
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			return s.b[start:s.i], plain, true
		case c < 0x20:
			return nil, false, false
		case c == '\\':
			plain = false
			if s.i+1 >= len(s.b) {
				return nil, false, false
			}
			switch s.b[s.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i += 2
			case 'u':
				if s.i+5 >= len(s.b) || !isHex(s.b[s.i+2]) || !isHex(s.b[s.i+3]) || !isHex(s.b[s.i+4]) || !isHex(s.b[s.i+5]) {
					return nil, false, false
				}
				s.i += 6
			default:
				return nil, false, false
			}
		default:
			if c >= 0x80 {
				plain = false
			}
			s.i++
		}
	}
	return nil, false, false
}

// plainString scans a string that must be plain and returns its value.
func (s *jsonScanner) plainString() (string, bool) {
	raw, plain, ok := s.str()
	if !ok || !plain {
		return "", false
	}
	return string(raw[1 : len(raw)-1]), true
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// number scans a JSON number and returns its text.
func (s *jsonScanner) number() ([]byte, bool) {
	s.ws()
	start := s.i
	if s.i < len(s.b) && s.b[s.i] == '-' {
		s.i++
	}
	switch {
	case s.i < len(s.b) && s.b[s.i] == '0':
		s.i++
	case s.i < len(s.b) && '1' <= s.b[s.i] && s.b[s.i] <= '9':
		for s.i < len(s.b) && isDigit(s.b[s.i]) {
			s.i++
		}
	default:
		return nil, false
	}
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if s.i >= len(s.b) || !isDigit(s.b[s.i]) {
			return nil, false
		}
		for s.i < len(s.b) && isDigit(s.b[s.i]) {
			s.i++
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if s.i >= len(s.b) || !isDigit(s.b[s.i]) {
			return nil, false
		}
		for s.i < len(s.b) && isDigit(s.b[s.i]) {
			s.i++
		}
	}
	return s.b[start:s.i], true
}

func (s *jsonScanner) literal(word string) bool {
	s.ws()
	if len(s.b)-s.i >= len(word) && string(s.b[s.i:s.i+len(word)]) == word {
		s.i += len(word)
		return true
	}
	return false
}

// value scans any value and returns it raw.
func (s *jsonScanner) value() ([]byte, bool) {
	switch c := s.peek(); {
	case c == '"':
		raw, _, ok := s.str()
		return raw, ok
	case c == '{' || c == '[':
		if s.depth++; s.depth > 200 {
			return nil, false
		}
		defer func() { s.depth-- }()
		start := s.i
		ok := false
		if c == '{' {
			ok = s.object(func(string) bool { _, ok := s.value(); return ok })
		} else {
			ok = s.array(func() bool { _, ok := s.value(); return ok })
		}
		return s.b[start:s.i], ok
	case c == 't' || c == 'f' || c == 'n':
		start := s.i
		if !s.literal("true") && !s.literal("false") && !s.literal("null") {
			return nil, false
		}
		return s.b[start:s.i], true
	default:
		return s.number()
	}
}

// object scans an object, calling field for each key (plain keys only, no
// key twice) with the scanner at its value.
func (s *jsonScanner) object(field func(key string) bool) bool {
	if !s.eat('{') {
		return false
	}
	if s.eat('}') {
		return true
	}
	var seen [8]string
	n := 0
	for {
		raw, plain, ok := s.str()
		if !ok || !plain {
			return false
		}
		key := string(raw[1 : len(raw)-1])
		for _, k := range seen[:min(n, len(seen))] {
			if k == key {
				return false
			}
		}
		if n >= len(seen) {
			return false // more keys than any shape the fast path knows
		}
		seen[n] = key
		n++
		if !s.eat(':') || !field(key) {
			return false
		}
		if s.eat('}') {
			return true
		}
		if !s.eat(',') {
			return false
		}
	}
}

func (s *jsonScanner) array(elem func() bool) bool {
	if !s.eat('[') {
		return false
	}
	if s.eat(']') {
		return true
	}
	for {
		if !elem() {
			return false
		}
		if s.eat(']') {
			return true
		}
		if !s.eat(',') {
			return false
		}
	}
}

// fastDecodeRequest fills w as a strict json decode of body would, or
// reports false.
func fastDecodeRequest(body []byte, w *wireRequest) bool {
	s := &jsonScanner{b: body}
	ok := s.object(func(key string) bool {
		switch key {
		case "model":
			v, ok := s.plainString()
			w.Model = &v
			return ok && v != ""
		case "max_tokens":
			num, ok := s.number()
			if !ok || len(num) > 18 {
				return false
			}
			n, err := strconv.ParseInt(string(num), 10, 64)
			w.MaxTokens = &n
			return err == nil
		case "temperature":
			num, ok := s.number()
			if !ok {
				return false
			}
			f, err := strconv.ParseFloat(string(num), 64)
			w.Temperature = &f
			return err == nil
		case "stream":
			f := false
			w.Stream = &f
			return s.literal("false")
		case "metadata":
			raw, ok := s.value()
			w.Metadata = json.RawMessage(raw)
			return ok && raw[0] == '{'
		case "system":
			raw, ok := s.value()
			w.System = json.RawMessage(raw)
			return ok && (raw[0] == '"' || raw[0] == '[')
		case "messages":
			w.Messages = []wireMessage{}
			return s.array(func() bool {
				var m wireMessage
				ok := s.object(func(key string) bool {
					switch key {
					case "role":
						v, ok := s.plainString()
						m.Role = &v
						return ok
					case "content":
						raw, ok := s.value()
						m.Content = json.RawMessage(raw)
						return ok && (raw[0] == '"' || raw[0] == '[')
					}
					return false
				})
				w.Messages = append(w.Messages, m)
				return ok
			})
		}
		return false
	})
	return ok && s.peek() == 0 && s.i == len(body)
}

// fastDecodeBlocks fills blocks as json.Unmarshal of a content array would,
// for text blocks (type, text, cache_control of type and ttl), or reports
// false.
func fastDecodeBlocks(raw []byte, blocks *[]wireBlock) bool {
	s := &jsonScanner{b: raw}
	out := []wireBlock{}
	ok := s.array(func() bool {
		var b wireBlock
		ok := s.object(func(key string) bool {
			switch key {
			case "type":
				v, ok := s.plainString()
				b.Type = v
				return ok && v == "text"
			case "text":
				v, _, ok := s.str()
				b.Text = json.RawMessage(v)
				return ok
			case "cache_control":
				cc := &struct {
					Type string `json:"type"`
					TTL  string `json:"ttl"`
				}{}
				b.CacheControl = cc
				return s.object(func(key string) bool {
					var ok bool
					switch key {
					case "type":
						cc.Type, ok = s.plainString()
					case "ttl":
						cc.TTL, ok = s.plainString()
					}
					return ok
				})
			}
			return false
		})
		out = append(out, b)
		return ok && b.Type == "text"
	})
	if !ok || s.peek() != 0 || s.i != len(raw) {
		return false
	}
	*blocks = out
	return true
}
