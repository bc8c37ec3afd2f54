package workload

import (
	"fmt"
	"strconv"
	"unicode/utf8"
)

// checker applies the per-line rules to one line at a time. It reuses its
// buffers across lines and interns model names, so checking a line does not
// allocate.
type checker struct {
	p     parser
	r     request
	b     []byte
	probs []string // problems of the current line

	idOK        bool
	id          string // decoded custom_id when it had escapes
	maxTokensOK bool
	maxTokens   int64
	// openai: the line is an OpenAI request; choices its n (0: unset).
	openai  bool
	choices int64
	models  map[string]string
}

func newChecker() *checker {
	return &checker{models: map[string]string{}}
}

// check parses line b (not blank, within the length limit) and records its
// problems in c.probs; on a clean line c.probs is empty.
func (c *checker) check(b []byte) {
	c.b = b
	c.probs = c.probs[:0]
	c.idOK, c.id, c.maxTokensOK, c.maxTokens, c.openai, c.choices = false, "", false, 0, false, 0
	c.r = request{}

	if !utf8.Valid(b) {
		c.problem("not valid UTF-8 at column %d (binary data?)", invalidUTF8At(b)+1)
		return
	}
	c.p = parser{b: b}
	if !parseRequest(&c.p, &c.r) {
		c.probs = append(c.probs, c.p.syntaxError())
		c.r = request{} // keep nothing half-parsed
		return
	}
	r := &c.r
	if r.top != kindObject {
		c.problem("the line is %s, not a JSON object", r.top)
		return
	}

	switch r.customIDKind {
	case kindMissing:
		c.problem("missing custom_id")
	case kindString:
		c.checkID()
	default:
		c.problem("custom_id must be a string, found %s", r.customIDKind)
	}

	if r.openAI() {
		if r.paramsKind != kindMissing {
			c.problem("the line has params (an Anthropic request) and body, url or method (an OpenAI request): give one")
			return
		}
		c.checkOpenAI()
		return
	}

	if !c.requestAndModel("params", r.paramsKind) {
		return
	}

	switch r.maxTokensKind {
	case kindMissing:
		c.problem("params.max_tokens is missing")
	case kindNumber:
		c.maxTokens, c.maxTokensOK = c.positive("params.max_tokens", r.maxTokens, maxMaxTokens)
	default:
		c.problem("params.max_tokens must be a positive integer, found %s", r.maxTokensKind)
	}

	c.messagesAndStream("params")
}

func (c *checker) problem(format string, args ...any) {
	c.probs = append(c.probs, fmt.Sprintf(format, args...))
}

// checkID applies ^[a-zA-Z0-9_-]{1,64}$ to the decoded custom_id.
func (c *checker) checkID() {
	sp := c.r.customID
	var id []byte
	if sp.esc {
		c.id = decodeString(c.b, sp)
		id = []byte(c.id)
	} else {
		id = c.b[sp.s:sp.e]
	}
	if len(id) == 0 {
		c.problem("custom_id is empty (it must be 1 to 64 characters)")
		return
	}
	bad := false
	for _, ch := range id {
		if !('a' <= ch && ch <= 'z' || 'A' <= ch && ch <= 'Z' || '0' <= ch && ch <= '9' || ch == '_' || ch == '-') {
			bad = true
			break
		}
	}
	n := utf8.RuneCount(id)
	switch {
	case bad && n > 64:
		c.problem("custom_id %s has characters outside [a-zA-Z0-9_-] and is %d characters long (at most 64)", quoteID(string(id)), n)
	case bad:
		c.problem("custom_id %s has characters outside [a-zA-Z0-9_-]", quoteID(string(id)))
	case n > 64:
		c.problem("custom_id %s is %d characters long (at most 64)", quoteID(string(id)), n)
	default:
		c.idOK = true
	}
}

// idBytes is the decoded custom_id (valid after check).
func (c *checker) idBytes() []byte {
	if c.r.customID.esc {
		return []byte(c.id)
	}
	return c.b[c.r.customID.s:c.r.customID.e]
}

// customID returns the decoded custom_id as a new string.
func (c *checker) customID() string {
	if c.r.customID.esc {
		return c.id
	}
	return string(c.b[c.r.customID.s:c.r.customID.e])
}

// positive reads the number literal sp of field name as an integer from 1
// to most; a problem when it is not one.
func (c *checker) positive(name string, sp span, most int64) (int64, bool) {
	lit := c.b[sp.s:sp.e]
	for _, ch := range lit {
		if ch < '0' || ch > '9' {
			c.problem("%s must be a positive integer, found %s", name, lit)
			return 0, false
		}
	}
	n, err := strconv.ParseInt(string(lit), 10, 64)
	switch {
	case err != nil || n > most:
		c.problem("%s %s is too large (at most %d)", name, lit, most)
	case n <= 0:
		c.problem("%s must be a positive integer, found %s", name, lit)
	default:
		return n, true
	}
	return 0, false
}

// maxChoices bounds an OpenAI request's n (the API's own limit).
const maxChoices = 128

// OpenAIEndpoint is the one url an OpenAI line may name: the chat
// completions endpoint, which the sync route sends it to as it is.
const OpenAIEndpoint = "/v1/chat/completions"

// checkOpenAI applies the rules of an OpenAI batch-input line:
// method "POST", url /v1/chat/completions, and a body with a model, a
// non-empty messages array, an optional positive max_completion_tokens
// (else max_tokens) and n, and no stream. c.maxTokens is then the
// completion limit per choice (0: none set) and c.choices n (0: unset).
func (c *checker) checkOpenAI() {
	r := &c.r
	c.openai, c.choices = true, 0
	switch {
	case r.methodKind == kindMissing:
		c.problem("method is missing (an OpenAI request line has \"method\": \"POST\")")
	case r.methodKind != kindString:
		c.problem("method must be a string, found %s", r.methodKind)
	case spanString(c.b, r.method) != "POST":
		c.problem("method is %s: an OpenAI request line is sent with POST", quoteID(decodeString(c.b, r.method)))
	}
	switch {
	case r.urlKind == kindMissing:
		c.problem("url is missing (an OpenAI request line names its endpoint, %s)", OpenAIEndpoint)
	case r.urlKind != kindString:
		c.problem("url must be a string, found %s", r.urlKind)
	case decodeString(c.b, r.url) != OpenAIEndpoint:
		c.problem("url is %s: only %s is supported", quoteID(decodeString(c.b, r.url)), OpenAIEndpoint)
	}
	if !c.requestAndModel("body", r.bodyKind) {
		return
	}
	c.maxTokensOK = true
	switch r.maxCompletionKind {
	case kindMissing:
		switch r.maxTokensKind {
		case kindMissing:
		case kindNumber:
			c.maxTokens, c.maxTokensOK = c.positive("body.max_tokens", r.maxTokens, maxMaxTokens)
		default:
			c.maxTokensOK = false
			c.problem("body.max_tokens must be a positive integer, found %s", r.maxTokensKind)
		}
	case kindNumber:
		c.maxTokens, c.maxTokensOK = c.positive("body.max_completion_tokens", r.maxCompletion, maxMaxTokens)
	default:
		c.maxTokensOK = false
		c.problem("body.max_completion_tokens must be a positive integer, found %s", r.maxCompletionKind)
	}
	switch r.nKind {
	case kindMissing:
	case kindNumber:
		c.choices, _ = c.positive("body.n", r.n, maxChoices)
	default:
		c.problem("body.n must be a positive integer, found %s", r.nKind)
	}
	c.messagesAndStream("body")
}

// model returns the model name, interned: lines with the same model share
// one string.
func (c *checker) model() string {
	sp := c.r.model
	if !sp.esc {
		if m, ok := c.models[string(c.b[sp.s:sp.e])]; ok {
			return m
		}
	}
	m := string(c.b[sp.s:sp.e])
	if sp.esc {
		m = decodeString(c.b, sp)
	}
	if len(c.models) < maxModels {
		c.models[m] = m
	}
	return m
}

func invalidUTF8At(b []byte) int {
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size == 1 {
			return i
		}
		i += size
	}
	return len(b)
}

// requestAndModel checks the line's request object, named name ("params"
// of an Anthropic line, "body" of an OpenAI one), of kind k, and its
// model; false when there is no object to check further.
func (c *checker) requestAndModel(name string, k kind) bool {
	r := &c.r
	switch k {
	case kindMissing:
		c.problem("missing %s", name)
		return false
	case kindObject:
	default:
		c.problem("%s must be an object, found %s", name, k)
		return false
	}
	switch r.modelKind {
	case kindMissing:
		c.problem("%s.model is missing", name)
	case kindString:
		if r.model.e == r.model.s {
			c.problem("%s.model is empty", name)
		}
	default:
		c.problem("%s.model must be a string, found %s", name, r.modelKind)
	}
	return true
}

// messagesAndStream checks the messages and stream of the line's request
// object, named name ("params" or "body"): a non-empty array, and no
// streaming (requests are sent whole).
func (c *checker) messagesAndStream(name string) {
	r := &c.r
	switch {
	case r.messagesKind == kindMissing:
		c.problem("%s.messages is missing", name)
	case r.messagesKind != kindArray:
		c.problem("%s.messages must be a non-empty array, found %s", name, r.messagesKind)
	case r.messages == 0:
		c.problem("%s.messages is empty", name)
	}
	switch r.streamKind {
	case kindMissing, kindFalse:
	case kindTrue:
		c.problem("%s.stream is true; requests are sent without streaming", name)
	default:
		c.problem("%s.stream must be a boolean, found %s", name, r.streamKind)
	}
}
