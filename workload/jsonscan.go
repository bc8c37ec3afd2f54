package workload

import (
	"encoding/binary"
	"encoding/json"
	"strconv"
	"strings"

	"github.com/apidispatch/apidispatch/cost"
)

// This file is a minimal JSON scanner for one request line. It checks the
// whole JSON grammar (RFC 8259; strings are checked for escapes and control
// characters here, and for UTF-8 separately) but records only the fields a
// request needs, as byte ranges into the line. It is several times faster
// than decoding the line with encoding/json, which matters at a million lines.

// kind is the JSON type of a value, or kindMissing when a field is absent.
type kind uint8

const (
	kindMissing kind = iota
	kindString
	kindNumber
	kindObject
	kindArray
	kindTrue
	kindFalse
	kindNull
)

// String names the kind for messages: "found a string".
func (k kind) String() string {
	switch k {
	case kindString:
		return "a string"
	case kindNumber:
		return "a number"
	case kindObject:
		return "an object"
	case kindArray:
		return "an array"
	case kindTrue:
		return "true"
	case kindFalse:
		return "false"
	case kindNull:
		return "null"
	}
	return "nothing"
}

// span is a byte range [s, e) of the line. For a string it is the contents
// between the quotes; esc says whether they hold a backslash escape.
type span struct {
	s, e int
	esc  bool
}

// request is what one line holds, as far as apidispatch cares.
type request struct {
	// shallow (set by the caller) checks params' syntax only, without
	// reading its fields or counting its text: enough to send a line that
	// was validated whole before.
	shallow bool

	top kind // kind of the whole line's value

	customIDKind kind
	customID     span

	paramsKind kind
	params     span // the params object, braces included

	// An OpenAI batch-input line: {"custom_id", "method", "url", "body"}.
	// body is read as params are (parseParams); method and url are kept.
	bodyKind   kind
	body       span // the body object, braces included
	methodKind kind
	method     span
	urlKind    kind
	url        span

	// OpenAI's max_completion_tokens and n (number literals).
	maxCompletionKind kind
	maxCompletion     span
	nKind             kind
	n                 span

	modelKind kind
	model     span

	maxTokensKind kind
	maxTokens     span // the number literal

	messagesKind kind
	messages     int // number of elements of messages

	streamKind kind

	// What makes the request dearer than plain input and output (for the
	// projection's worst case): the dearest cache write its cache_control
	// markers may make, and inference_geo "us".
	cacheWrite cost.CacheWrite
	geoUS      bool

	// Estimate counters over the text of system, messages and tools.
	ascii int64 // ASCII characters (an escape sequence counts as one)
	wide  int64 // non-ASCII characters
}

// countMode says whether the string values under a value are counted
// toward the input-token estimate.
type countMode uint8

const (
	countNone  countMode = iota
	countText            // count every string value (keys excluded)
	countData            // a base64 "data" string: counted, capped
	countCache           // a cache_control marker: read for its write, not counted
)

// maxDepth bounds nesting, as encoding/json does, so a hostile line cannot
// exhaust the stack.
const maxDepth = 10000

// dataCapChars caps how much one base64 "data" string (an image or a
// document) adds to the estimate: 6,400 characters, 1,600 tokens, about what
// the API charges for a full-size image.
const dataCapChars = 6400

// parser scans one line. Its zero value is ready after setting b.
type parser struct {
	b     []byte
	i     int
	depth int
	err   string // first syntax error, "" if none
	errAt int    // byte index of the error
	ascii int64  // estimate counters, advanced in count modes only
	wide  int64
	cache cost.CacheWrite // the dearest cache_control marker seen in counted text
}

func (p *parser) fail(at int, msg string) {
	if p.err == "" {
		p.err, p.errAt = msg, at
	}
}

// syntaxError formats the error as "malformed JSON at column N: ...".
func (p *parser) syntaxError() string {
	return "malformed JSON at column " + strconv.Itoa(p.errAt+1) + ": " + p.err
}

func (p *parser) skipWS() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// strStop marks the bytes that end the fast path of a string: the quote, the
// backslash, control characters, and (for counting) non-ASCII bytes.
var strStop = func() (t [256]bool) {
	for c := 0; c < 0x20; c++ {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	for c := 0x80; c < 0x100; c++ {
		t[c] = true
	}
	return t
}()

const (
	lanes01 = 0x0101010101010101
	lanes80 = 0x8080808080808080
)

// str scans the string at p.i (which is '"') and returns its contents'
// span. When count is set it also returns its characters: ASCII ones and
// non-ASCII ones (UTF-8 leading bytes; an escape counts as one character).
func (p *parser) str() (sp span, ascii, wide int64, ok bool) {
	b := p.b
	i := p.i + 1
	sp.s = i
	for {
		j := i
		// Eight bytes at a time while none is a quote, a backslash, a
		// control character or non-ASCII (SWAR: each test sets the high bit
		// of a lane that matches; no lane is missed).
		for i+8 <= len(b) {
			w := binary.LittleEndian.Uint64(b[i:])
			q := w ^ 0x2222222222222222  // '"' lanes become zero
			bs := w ^ 0x5C5C5C5C5C5C5C5C // '\\' lanes become zero
			m := (q-lanes01)&^q | (bs-lanes01)&^bs | (w-0x2020202020202020)&^w | w
			if m&lanes80 != 0 {
				break
			}
			i += 8
		}
		for i < len(b) && !strStop[b[i]] {
			i++
		}
		ascii += int64(i - j)
		if i >= len(b) {
			p.fail(p.i, "unterminated string")
			return sp, 0, 0, false
		}
		c := b[i]
		switch {
		case c == '"':
			sp.e = i
			p.i = i + 1
			return sp, ascii, wide, true
		case c == '\\':
			sp.esc = true
			if i+1 >= len(b) {
				p.fail(i, "unterminated string")
				return sp, 0, 0, false
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				ascii++
				i += 2
			case 'u':
				if i+6 > len(b) || !isHex(b[i+2]) || !isHex(b[i+3]) || !isHex(b[i+4]) || !isHex(b[i+5]) {
					p.fail(i, `invalid \u escape in string`)
					return sp, 0, 0, false
				}
				if b[i+2] == '0' && b[i+3] == '0' && b[i+4] < '8' {
					ascii++
				} else {
					wide++
				}
				i += 6
			default:
				p.fail(i, "invalid escape "+strconv.QuoteRune(rune(b[i+1]))+" in string")
				return sp, 0, 0, false
			}
		case c < 0x20:
			p.fail(i, "control character "+strconv.QuoteRune(rune(c))+" in string (escape it)")
			return sp, 0, 0, false
		default: // non-ASCII byte
			if c >= 0xC0 {
				wide++
			}
			i++
		}
	}
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// number scans a JSON number at p.i and returns its span.
func (p *parser) number() (span, bool) {
	b := p.b
	i := p.i
	start := i
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
	default:
		p.fail(i, "invalid number")
		return span{}, false
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			p.fail(i, "invalid number: digit expected after '.'")
			return span{}, false
		}
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			p.fail(i, "invalid number: digit expected in exponent")
			return span{}, false
		}
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
	}
	p.i = i
	return span{s: start, e: i}, true
}

func (p *parser) literal(word string, k kind) (kind, bool) {
	if len(p.b)-p.i >= len(word) && string(p.b[p.i:p.i+len(word)]) == word {
		p.i += len(word)
		return k, true
	}
	p.fail(p.i, "invalid character "+quoteByte(p.b[p.i])+" (expected a value)")
	return kindMissing, false
}

func quoteByte(c byte) string {
	if c < 0x80 {
		return strconv.QuoteRune(rune(c))
	}
	return "byte 0x" + strconv.FormatUint(uint64(c), 16)
}

// value scans any JSON value at p.i (after whitespace) and returns its kind.
func (p *parser) value(count countMode) (kind, bool) {
	p.skipWS()
	if p.i >= len(p.b) {
		p.fail(p.i, "unexpected end of line (expected a value)")
		return kindMissing, false
	}
	switch c := p.b[p.i]; {
	case c == '{':
		return kindObject, p.object(count)
	case c == '[':
		_, ok := p.array(count)
		return kindArray, ok
	case c == '"':
		_, a, w, ok := p.str()
		p.addCount(count, a, w)
		return kindString, ok
	case c == '-' || '0' <= c && c <= '9':
		_, ok := p.number()
		return kindNumber, ok
	case c == 't':
		return p.literal("true", kindTrue)
	case c == 'f':
		return p.literal("false", kindFalse)
	case c == 'n':
		return p.literal("null", kindNull)
	}
	p.fail(p.i, "invalid character "+quoteByte(p.b[p.i])+" (expected a value)")
	return kindMissing, false
}

func (p *parser) addCount(count countMode, ascii, wide int64) {
	switch count {
	case countText:
		p.ascii += ascii
		p.wide += wide
	case countData:
		p.ascii += min(ascii+wide, dataCapChars)
	}
}

func (p *parser) enter() bool {
	p.depth++
	if p.depth > maxDepth {
		p.fail(p.i, "nested too deeply")
		return false
	}
	return true
}

// objectKeys scans an object at p.i, calling field for each key with p.i at
// the start of the key's value; field must scan the value. It is the one
// object loop, used by the generic scan and by the request and params
// readers.
func (p *parser) objectKeys(field func(p *parser, key span) bool) bool {
	if !p.enter() {
		return false
	}
	p.i++ // '{'
	p.skipWS()
	if p.i < len(p.b) && p.b[p.i] == '}' {
		p.i++
		p.depth--
		return true
	}
	for {
		p.skipWS()
		if p.i >= len(p.b) || p.b[p.i] != '"' {
			p.expected("a string key")
			return false
		}
		key, _, _, ok := p.str()
		if !ok {
			return false
		}
		p.skipWS()
		if p.i >= len(p.b) || p.b[p.i] != ':' {
			p.expected("':' after key")
			return false
		}
		p.i++
		p.skipWS()
		if p.i >= len(p.b) {
			p.expected("a value")
			return false
		}
		if !field(p, key) {
			return false
		}
		p.skipWS()
		if p.i >= len(p.b) {
			p.expected("',' or '}'")
			return false
		}
		switch p.b[p.i] {
		case ',':
			p.i++
		case '}':
			p.i++
			p.depth--
			return true
		default:
			p.expected("',' or '}'")
			return false
		}
	}
}

func (p *parser) expected(what string) {
	if p.i >= len(p.b) {
		p.fail(p.i, "unexpected end of line (expected "+what+")")
		return
	}
	p.fail(p.i, "invalid character "+quoteByte(p.b[p.i])+" (expected "+what+")")
}

// object scans a generic object. In a count mode, string values are counted
// except those of structural keys.
func (p *parser) object(count countMode) bool {
	if count == countNone {
		return p.objectKeys(fieldSkip)
	}
	return p.objectKeys(fieldCount)
}

func fieldSkip(p *parser, _ span) bool {
	_, ok := p.value(countNone)
	return ok
}

func fieldCount(p *parser, key span) bool {
	mode := childCount(p.b, key)
	if mode == countCache {
		return p.cacheControl()
	}
	_, ok := p.value(mode)
	return ok
}

// cacheControl scans a cache_control value at p.i and records the write it
// may make: none for null, the 1-hour rate for ttl "1h", the 5-minute rate
// for anything else (the API refuses what is not a marker; counting it
// errs on the dear side).
func (p *parser) cacheControl() bool {
	p.skipWS()
	if p.i < len(p.b) && p.b[p.i] == '{' {
		w := cost.CacheWrite5m
		ok := p.objectKeys(func(p *parser, key span) bool {
			if strings.EqualFold(keyString(p.b, key), "ttl") && p.i < len(p.b) && p.b[p.i] == '"' {
				sp, _, _, ok := p.str()
				if ok && spanString(p.b, sp) == "1h" {
					w = cost.CacheWrite1h
				}
				return ok
			}
			_, ok := p.value(countNone)
			return ok
		})
		p.cache = max(p.cache, w)
		return ok
	}
	k, ok := p.value(countNone)
	if k != kindNull {
		p.cache = max(p.cache, cost.CacheWrite5m)
	}
	return ok
}

// childCount is the count mode of a value under key inside counted text:
// structural keys ("type", "role", "cache_control", "media_type") are not
// text the model reads as prose; base64 "data" is capped.
//
// A cache_control and its ttl are recognised whatever the case of their
// names: a decoder of Go's encoding/json (the simulator's) matches a field
// name in any case, and the bound must not be below what such a reader
// may bill.
func childCount(b []byte, key span) countMode {
	k := keyString(b, key)
	if strings.EqualFold(k, "cache_control") {
		return countCache
	}
	switch k {
	case "type", "role", "media_type":
		return countNone
	case "data":
		return countData
	}
	return countText
}

// keyString returns the key's text: the raw bytes when there is no escape
// (the conversion in a switch or comparison does not allocate), the decoded
// string otherwise.
func keyString(b []byte, key span) string {
	if !key.esc {
		return string(b[key.s:key.e])
	}
	return decodeString(b, key)
}

// spanString is the decoded text of a string span (a scanned string's).
func spanString(b []byte, sp span) string {
	if sp.esc {
		return decodeString(b, sp)
	}
	return string(b[sp.s:sp.e])
}

// decodeString decodes a string span with escapes (slow path, rare).
func decodeString(b []byte, sp span) string {
	var s string
	if err := json.Unmarshal(b[sp.s-1:sp.e+1], &s); err != nil {
		return string(b[sp.s:sp.e])
	}
	return s
}

// array scans an array and returns its number of elements.
func (p *parser) array(count countMode) (int, bool) {
	if !p.enter() {
		return 0, false
	}
	p.i++ // '['
	p.skipWS()
	if p.i < len(p.b) && p.b[p.i] == ']' {
		p.i++
		p.depth--
		return 0, true
	}
	n := 0
	for {
		if _, ok := p.value(count); !ok {
			return n, false
		}
		n++
		p.skipWS()
		if p.i >= len(p.b) {
			p.expected("',' or ']'")
			return n, false
		}
		switch p.b[p.i] {
		case ',':
			p.i++
		case ']':
			p.i++
			p.depth--
			return n, true
		default:
			p.expected("',' or ']'")
			return n, false
		}
	}
}

// openAI reports whether r is an OpenAI batch-input line (it has a body,
// a url or a method).
func (r *request) openAI() bool {
	return r.bodyKind != kindMissing || r.urlKind != kindMissing || r.methodKind != kindMissing
}

// parseRequest scans a whole line into r. It returns false on a syntax
// error (p.err says which); r is then incomplete.
func parseRequest(p *parser, r *request) bool {
	*r = request{shallow: r.shallow}
	p.skipWS()
	if p.i < len(p.b) && p.b[p.i] == '{' {
		r.top = kindObject
		ok := p.objectKeys(func(p *parser, key span) bool {
			switch keyString(p.b, key) {
			case "custom_id":
				r.customIDKind = kindMissing
				if p.i < len(p.b) && p.b[p.i] == '"' {
					sp, _, _, ok := p.str()
					r.customIDKind, r.customID = kindString, sp
					return ok
				}
				k, ok := p.value(countNone)
				r.customIDKind = k
				return ok
			case "params", "body":
				kp, sp := &r.paramsKind, &r.params
				if keyString(p.b, key) == "body" {
					kp, sp = &r.bodyKind, &r.body
				}
				if p.i < len(p.b) && p.b[p.i] == '{' {
					start := p.i
					var ok bool
					if r.shallow {
						_, ok = p.value(countNone)
					} else {
						ok = parseParams(p, r)
					}
					*kp, *sp = kindObject, span{s: start, e: p.i}
					return ok
				}
				k, ok := p.value(countNone)
				*kp = k
				return ok
			case "method", "url":
				kp, sp := &r.methodKind, &r.method
				if keyString(p.b, key) == "url" {
					kp, sp = &r.urlKind, &r.url
				}
				if p.i < len(p.b) && p.b[p.i] == '"' {
					v, _, _, ok := p.str()
					*kp, *sp = kindString, v
					return ok
				}
				k, ok := p.value(countNone)
				*kp = k
				return ok
			}
			_, ok := p.value(countNone)
			return ok
		})
		if !ok {
			return false
		}
	} else {
		k, ok := p.value(countNone)
		if !ok {
			return false
		}
		r.top = k
	}
	p.skipWS()
	if p.i != len(p.b) {
		p.fail(p.i, "unexpected "+quoteByte(p.b[p.i])+" after the end of the JSON value")
		return false
	}
	return true
}

// parseParams scans the params object at p.i into r, counting the text of
// system, messages and tools for the estimate.
func parseParams(p *parser, r *request) bool {
	p.ascii, p.wide, p.cache = 0, 0, cost.NoCacheWrite
	ok := p.objectKeys(func(p *parser, key span) bool {
		switch keyString(p.b, key) {
		case "model":
			if p.i < len(p.b) && p.b[p.i] == '"' {
				sp, _, _, ok := p.str()
				r.modelKind, r.model = kindString, sp
				return ok
			}
			k, ok := p.value(countNone)
			r.modelKind = k
			return ok
		case "max_tokens":
			if c := p.b[p.i]; c == '-' || '0' <= c && c <= '9' {
				sp, ok := p.number()
				r.maxTokensKind, r.maxTokens = kindNumber, sp
				return ok
			}
			k, ok := p.value(countNone)
			r.maxTokensKind = k
			return ok
		case "max_completion_tokens", "n":
			kp, sp := &r.maxCompletionKind, &r.maxCompletion
			if keyString(p.b, key) == "n" {
				kp, sp = &r.nKind, &r.n
			}
			if c := p.b[p.i]; c == '-' || '0' <= c && c <= '9' {
				v, ok := p.number()
				*kp, *sp = kindNumber, v
				return ok
			}
			k, ok := p.value(countNone)
			*kp = k
			return ok
		case "messages":
			if p.b[p.i] == '[' {
				n, ok := p.array(countText)
				r.messagesKind, r.messages = kindArray, n
				return ok
			}
			k, ok := p.value(countNone)
			r.messagesKind = k
			return ok
		case "system", "tools":
			_, ok := p.value(countText)
			return ok
		case "stream":
			k, ok := p.value(countNone)
			r.streamKind = k
			return ok
		case "cache_control":
			return p.cacheControl()
		case "inference_geo":
			if p.b[p.i] == '"' {
				sp, _, _, ok := p.str()
				r.geoUS = ok && spanString(p.b, sp) == "us"
				return ok
			}
		}
		_, ok := p.value(countNone)
		return ok
	})
	r.ascii, r.wide, r.cacheWrite = p.ascii, p.wide, p.cache
	return ok
}

// estimate is the local input-token estimate of a request's counters; see
// EstimateInputTokens.
func (r *request) estimate() int64 {
	return (r.ascii+3)/4 + r.wide + 4*int64(r.messages) + 4
}
