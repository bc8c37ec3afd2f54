package cache

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"unicode/utf8"
)

// canon writes the canonical form of JSON values without building a tree:
// the same bytes as Canonical's encoding/json round trip (keys sorted by
// their decoded text, no white space, numbers in shortest float64 form,
// strings re-escaped as encoding/json does with HTML escaping off), at a
// fraction of its cost. A string that needs re-escaping goes through
// encoding/json; the common one is copied.
type canon struct {
	in  []byte
	pos int
	// temperature is the top-level "temperature" number, when present.
	temperature []byte
	// ignore are the top-level fields left out.
	ignore map[string]bool
}

var errSyntax = errors.New("cache: request params are not valid JSON")

func (c *canon) ws() {
	for c.pos < len(c.in) {
		switch c.in[c.pos] {
		case ' ', '\t', '\n', '\r':
			c.pos++
		default:
			return
		}
	}
}

// value appends the canonical form of the value at c.pos to out.
func (c *canon) value(out []byte, depth int) ([]byte, error) {
	c.ws()
	if c.pos >= len(c.in) || depth > 10000 {
		return nil, errSyntax
	}
	switch ch := c.in[c.pos]; {
	case ch == '{':
		return c.object(out, depth)
	case ch == '[':
		c.pos++
		out = append(out, '[')
		c.ws()
		if c.pos < len(c.in) && c.in[c.pos] == ']' {
			c.pos++
			return append(out, ']'), nil
		}
		for {
			var err error
			if out, err = c.value(out, depth+1); err != nil {
				return nil, err
			}
			c.ws()
			if c.pos >= len(c.in) {
				return nil, errSyntax
			}
			switch c.in[c.pos] {
			case ',':
				c.pos++
				out = append(out, ',')
			case ']':
				c.pos++
				return append(out, ']'), nil
			default:
				return nil, errSyntax
			}
		}
	case ch == '"':
		s, err := c.str()
		if err != nil {
			return nil, err
		}
		return appendString(out, s), nil
	case ch == 't' || ch == 'f' || ch == 'n':
		for _, lit := range []string{"true", "false", "null"} {
			if bytes.HasPrefix(c.in[c.pos:], []byte(lit)) {
				c.pos += len(lit)
				return append(out, lit...), nil
			}
		}
		return nil, errSyntax
	default:
		start := c.pos
		for c.pos < len(c.in) && bytes.IndexByte([]byte("+-.0123456789eE"), c.in[c.pos]) >= 0 {
			c.pos++
		}
		num := c.in[start:c.pos]
		if !json.Valid(num) {
			return nil, errSyntax
		}
		if f, err := strconv.ParseFloat(string(num), 64); err == nil {
			return strconv.AppendFloat(out, f, 'g', -1, 64), nil
		}
		return append(out, num...), nil // out of float64 range: kept as written
	}
}

type member struct {
	key string
	val []byte
}

func (c *canon) object(out []byte, depth int) ([]byte, error) {
	c.pos++ // {
	var ms []member
	c.ws()
	if c.pos < len(c.in) && c.in[c.pos] == '}' {
		c.pos++
	} else {
		for {
			c.ws()
			if c.pos >= len(c.in) || c.in[c.pos] != '"' {
				return nil, errSyntax
			}
			k, err := c.str()
			if err != nil {
				return nil, err
			}
			c.ws()
			if c.pos >= len(c.in) || c.in[c.pos] != ':' {
				return nil, errSyntax
			}
			c.pos++
			v, err := c.value(nil, depth+1)
			if err != nil {
				return nil, err
			}
			// A repeated key keeps its last value, as encoding/json does.
			if i := slices.IndexFunc(ms, func(m member) bool { return m.key == k }); i >= 0 {
				ms[i].val = v
			} else {
				ms = append(ms, member{k, v})
			}
			c.ws()
			if c.pos >= len(c.in) {
				return nil, errSyntax
			}
			if c.in[c.pos] == ',' {
				c.pos++
				continue
			}
			if c.in[c.pos] != '}' {
				return nil, errSyntax
			}
			c.pos++
			break
		}
	}
	if depth == 0 {
		ms = slices.DeleteFunc(ms, func(m member) bool {
			if m.key == "temperature" {
				c.temperature = m.val
			}
			return c.ignore[m.key]
		})
	}
	slices.SortFunc(ms, func(a, b member) int { return cmpString(a.key, b.key) })
	out = append(out, '{')
	for i, m := range ms {
		if i > 0 {
			out = append(out, ',')
		}
		out = appendString(out, m.key)
		out = append(out, ':')
		out = append(out, m.val...)
	}
	return append(out, '}'), nil
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// str reads the string at c.pos and returns its decoded text.
func (c *canon) str() (string, error) {
	start := c.pos
	c.pos++
	plain := true
	for c.pos < len(c.in) {
		switch ch := c.in[c.pos]; {
		case ch == '"':
			c.pos++
			raw := c.in[start:c.pos]
			if plain {
				return string(raw[1 : len(raw)-1]), nil
			}
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return "", errSyntax
			}
			return s, nil
		case ch == '\\':
			plain = false
			c.pos += 2
		case ch < 0x20:
			return "", errSyntax
		case ch >= utf8.RuneSelf:
			r, n := utf8.DecodeRune(c.in[c.pos:])
			if r == utf8.RuneError && n == 1 {
				plain = false // invalid UTF-8: decoded as U+FFFD, as encoding/json does
			}
			c.pos += n
		default:
			c.pos++
		}
	}
	return "", errSyntax
}

// appendString appends s as encoding/json writes it with HTML escaping off.
func appendString(out []byte, s string) []byte {
	simple := true
	for i := 0; i < len(s) && simple; {
		ch := s[i]
		if ch < utf8.RuneSelf {
			simple = ch >= 0x20 && ch != '"' && ch != '\\'
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		// encoding/json writes U+2028 and U+2029 escaped, and invalid
		// UTF-8 as U+FFFD.
		simple = !(r == utf8.RuneError && n == 1) && r != '\u2028' && r != '\u2029'
		i += n
	}
	if simple {
		out = append(out, '"')
		out = append(out, s...)
		return append(out, '"')
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.Encode(s)
	return append(out, bytes.TrimSuffix(buf.Bytes(), []byte{'\n'})...)
}
