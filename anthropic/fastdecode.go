package anthropic

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"unicode/utf8"
)

// DecodeMessageHead decodes a Messages response body into m, as
// json.Unmarshal would, but without reflection on the path every success
// takes: it checks the body is valid JSON in one pass, then picks the
// head's fields out of the top-level object. Anything unusual (an escaped
// key or string, a non-integer token count, a key that only matches a field
// case-insensitively) is left to json.Unmarshal, so the result is always
// the same as json.Unmarshal's.
func DecodeMessageHead(body []byte, m *MessageHead) error {
	if !json.Valid(body) {
		return json.Unmarshal(body, m) // for its error
	}
	var fast MessageHead
	if decodeHeadFast(body, &fast) {
		*m = fast
		return nil
	}
	return json.Unmarshal(body, m)
}

var headKeys = []string{"id", "type", "role", "model", "content", "stop_reason", "usage"}

var cacheKeys = []string{"ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens"}

var usageKeys = []string{"input_tokens", "output_tokens", "cache_creation_input_tokens",
	"cache_read_input_tokens", "cache_creation", "service_tier", "inference_geo"}

// decodeHeadFast decodes a body already known to be valid JSON; false means
// "use json.Unmarshal".
func decodeHeadFast(b []byte, m *MessageHead) bool {
	s := scan{b: b}
	s.ws()
	if !s.is('{') {
		return false
	}
	return s.object(func(key []byte) bool {
		switch string(key) {
		case "id":
			return s.plainString(&m.ID)
		case "type":
			return s.plainString(&m.Type)
		case "role":
			return s.plainString(&m.Role)
		case "model":
			return s.plainString(&m.Model)
		case "content":
			if s.is('n') { // null leaves a RawMessage nil... as "null" bytes
				return false
			}
			start := s.i
			s.skip()
			m.Content = json.RawMessage(b[start:s.i:s.i])
			return true
		case "stop_reason":
			if s.is('n') {
				s.skip()
				m.StopReason = nil
				return true
			}
			var v string
			if !s.plainString(&v) {
				return false
			}
			m.StopReason = &v
			return true
		case "usage":
			if !s.is('{') {
				return false
			}
			return s.object(func(key []byte) bool {
				u := &m.Usage
				switch string(key) {
				case "input_tokens":
					return s.integer(&u.InputTokens)
				case "output_tokens":
					return s.integer(&u.OutputTokens)
				case "cache_creation_input_tokens":
					return s.integer(&u.CacheCreationInputTokens)
				case "cache_read_input_tokens":
					return s.integer(&u.CacheReadInputTokens)
				case "service_tier":
					return s.plainString(&u.ServiceTier)
				case "inference_geo":
					return s.plainString(&u.InferenceGeo)
				case "cache_creation":
					if s.is('n') {
						s.skip()
						u.CacheCreation = nil
						return true
					}
					if !s.is('{') {
						return false
					}
					if u.CacheCreation == nil {
						u.CacheCreation = new(CacheCreation)
					}
					cc := u.CacheCreation
					return s.object(func(key []byte) bool {
						switch string(key) {
						case "ephemeral_5m_input_tokens":
							return s.integer(&cc.Ephemeral5mInputTokens)
						case "ephemeral_1h_input_tokens":
							return s.integer(&cc.Ephemeral1hInputTokens)
						}
						if foldsTo(key, cacheKeys) {
							return false
						}
						s.skip()
						return true
					})
				}
				if foldsTo(key, usageKeys) {
					return false
				}
				s.skip()
				return true
			})
		}
		if foldsTo(key, headKeys) {
			return false
		}
		s.skip()
		return true
	})
}

// foldsTo reports whether key matches one of keys only case-insensitively
// (json.Unmarshal would fill that field).
func foldsTo(key []byte, keys []string) bool {
	for _, k := range keys {
		if strings.EqualFold(string(key), k) {
			return true
		}
	}
	return false
}

// scan walks valid JSON.
type scan struct {
	b []byte
	i int
}

func (s *scan) ws() {
	for s.i < len(s.b) && (s.b[s.i] == ' ' || s.b[s.i] == '\t' || s.b[s.i] == '\n' || s.b[s.i] == '\r') {
		s.i++
	}
}

func (s *scan) is(c byte) bool { return s.i < len(s.b) && s.b[s.i] == c }

// object calls field for each key of the object at s.i, with s.i at the
// value; field must consume the value. Keys with escapes are refused.
func (s *scan) object(field func(key []byte) bool) bool {
	s.i++ // '{'
	for {
		s.ws()
		if s.is('}') {
			s.i++
			return true
		}
		if !s.is('"') {
			return false
		}
		end := bytes.IndexByte(s.b[s.i+1:], '"')
		if end < 0 {
			return false
		}
		key := s.b[s.i+1 : s.i+1+end]
		if bytes.IndexByte(key, '\\') >= 0 {
			return false
		}
		s.i += end + 2
		s.ws()
		s.i++ // ':'
		s.ws()
		if !field(key) {
			return false
		}
		s.ws()
		if s.is(',') {
			s.i++
		}
	}
}

// plainString reads a string without escapes (null leaves v as it is, as
// json.Unmarshal does).
func (s *scan) plainString(v *string) bool {
	if s.is('n') {
		s.skip()
		return true
	}
	if !s.is('"') {
		return false
	}
	end := bytes.IndexByte(s.b[s.i+1:], '"')
	if end < 0 {
		return false
	}
	raw := s.b[s.i+1 : s.i+1+end]
	if bytes.IndexByte(raw, '\\') >= 0 || !utf8.Valid(raw) {
		return false // json.Unmarshal unescapes, and replaces bad UTF-8
	}
	*v = string(raw)
	s.i += end + 2
	return true
}

// integer reads a JSON integer (null leaves v as it is).
func (s *scan) integer(v *int64) bool {
	if s.is('n') {
		s.skip()
		return true
	}
	start := s.i
	for s.i < len(s.b) && (s.b[s.i] == '-' || s.b[s.i] >= '0' && s.b[s.i] <= '9') {
		s.i++
	}
	n, err := strconv.ParseInt(string(s.b[start:s.i]), 10, 64)
	if err != nil || s.i < len(s.b) && (s.b[s.i] == '.' || s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		return false
	}
	*v = n
	return true
}

// skip steps over the value at s.i.
func (s *scan) skip() {
	depth := 0
	for s.i < len(s.b) {
		switch c := s.b[s.i]; c {
		case '"':
			s.i++
			for s.i < len(s.b) && s.b[s.i] != '"' {
				if s.b[s.i] == '\\' {
					s.i++
				}
				s.i++
			}
			s.i++
		case '{', '[':
			depth++
			s.i++
		case '}', ']':
			if depth == 0 {
				return
			}
			depth--
			s.i++
		case ',':
			if depth == 0 {
				return
			}
			s.i++
		default:
			if depth == 0 && (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
				return
			}
			s.i++
		}
		if depth == 0 && s.i > 0 {
			// A scalar ends at a delimiter; a string or a closed container
			// has just ended.
			prev := s.b[s.i-1]
			if prev == '"' || prev == '}' || prev == ']' {
				return
			}
		}
	}
}
