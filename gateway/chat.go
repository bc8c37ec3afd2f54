package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/openai"
	"github.com/apidispatch/apidispatch/spend"
	upstreampkg "github.com/apidispatch/apidispatch/upstream"
	"github.com/apidispatch/apidispatch/workload"
)

// OpenAI clients. POST /v1/chat/completions is served by the one exchange
// of Messages requests (messages.go), with the OpenAI provider of the
// upstream layer: the request goes through the same fair queue onto the
// lanes of the OpenAI orgs (one pool per model, capped per key by the
// model's cap family), its worst case is reserved in the client's and the
// gateway's spend gates and journaled before it is sent, and it is
// settled from its usage. What differs is the API's own:
//
//   - the worst case is the provider's: every prompt byte an uncached
//     token, and for each of its n choices its max_completion_tokens
//     (else max_tokens, else the model's largest output);
//   - a stream's usage is its last chunk's (stream_options.include_usage).
//     The gateway always asks for it upstream: a client that did not ask
//     gets the stream without it (the usage chunk and the chunks'
//     "usage":null are taken out), so every stream is settled at its
//     exact cost. A stream that ends without its usage chunk and
//     "data: [DONE]" (cut, reset, an error event after it began) is
//     settled at its worst case, as unread;
//   - the gateway's own answers (its 429 when no lane admits in time, the
//     401 of a bad token, a refused spend cap, a stopping gateway's 503)
//     are in OpenAI's envelope, {"error":{"message","type","param","code"}},
//     with the status codes the openai SDKs retry (408, 409, 429, ≥ 500)
//     only where a retry may succeed; x-should-retry says it either way;
//   - the result cache is not applied to chat completions (the cache keys
//     Messages requests); every chat completion is sent;
//   - a 401 or 403 of an OpenAI org takes its key out of rotation (no
//     probe: an OpenAI client chooses no beta or version that its key
//     could be refused for).
//
// A model without an OpenAI price is refused (400): its worst case, and
// so the spend caps, could not be kept.

// chatParams is what the gateway reads of a chat completion's body.
type chatParams struct {
	Model               string `json:"model"`
	MaxCompletionTokens *int64 `json:"max_completion_tokens"`
	MaxTokens           *int64 `json:"max_tokens"`
	N                   *int64 `json:"n"`
	Stream              bool   `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage *bool `json:"include_usage"`
	} `json:"stream_options"`
	// clientUsage: the client asked for the stream's usage chunk.
	clientUsage bool
}

// parseChat checks a chat completion's body as far as the gateway must
// (valid JSON, a model) and returns its fields, or the problem and the
// parameter it is in.
func parseChat(body []byte) (chatParams, string, string) {
	var p chatParams
	if err := json.Unmarshal(body, &p); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return p, fmt.Sprintf("Invalid type for '%s': expected %s, but got %s.", te.Field, te.Type, te.Value), te.Field
		}
		return p, "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON.)", ""
	}
	if p.Model == "" {
		return p, "you must provide a model parameter", "model"
	}
	p.clientUsage = p.StreamOptions != nil && p.StreamOptions.IncludeUsage != nil && *p.StreamOptions.IncludeUsage
	return p, "", ""
}

// maxCompletion is the completion limit a choice of p sets: its
// max_completion_tokens, else its max_tokens (0: none).
func (p chatParams) maxCompletion() int64 {
	switch {
	case p.MaxCompletionTokens != nil:
		return max(*p.MaxCompletionTokens, 0)
	case p.MaxTokens != nil:
		return max(*p.MaxTokens, 0)
	}
	return 0
}

// withUsage is a streaming body that asks for the usage chunk: body
// itself when it does, else with stream_options.include_usage set (put
// first when the body has no stream_options, the rest left byte for byte).
func withUsage(body []byte, p chatParams) ([]byte, error) {
	if p.clientUsage {
		return body, nil
	}
	if p.StreamOptions == nil {
		i := bytes.IndexByte(body, '{')
		rest := bytes.TrimSpace(body[i+1:])
		sep := ","
		if len(rest) > 0 && rest[0] == '}' {
			sep = ""
		}
		out := append([]byte(nil), body[:i+1]...)
		out = append(out, `"stream_options":{"include_usage":true}`+sep...)
		return append(out, body[i+1:]...), nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	var so map[string]json.RawMessage
	if err := json.Unmarshal(m["stream_options"], &so); err != nil || so == nil {
		so = map[string]json.RawMessage{}
	}
	so["include_usage"] = json.RawMessage("true")
	b, err := json.Marshal(so)
	if err != nil {
		return nil, err
	}
	m["stream_options"] = b
	return json.Marshal(m)
}

// chatCompletions serves POST /v1/chat/completions, streaming or not.
func (g *Gateway) chatCompletions(w http.ResponseWriter, r *http.Request, client string) {
	g.stats.requests.Add(1)
	body, ok := readBodyAs(w, r, MaxMessagesBytes, writeOAError)
	if !ok {
		return
	}
	cp, bad, param := parseChat(body)
	if bad != "" {
		writeOAErrorParam(w, http.StatusBadRequest, openai.ErrInvalidRequest, "", param, bad)
		return
	}
	class, ok := g.classOfAs(w, r, client, writeOAError)
	if !ok {
		return
	}
	prov := upstreampkg.OpenAI
	if !g.serves(prov) {
		writeOAError(w, http.StatusBadRequest, openai.ErrInvalidRequest,
			`apidispatch gateway: no OpenAI org is configured (an org with provider = "openai" in the orgs file, or OPENAI_API_KEY), so chat completions cannot be served`)
		return
	}
	price, err := cost.OpenAI().Lookup(cp.Model)
	if err != nil {
		writeOAErrorParam(w, http.StatusBadRequest, openai.ErrInvalidRequest, openai.CodeModelNotFound, "model",
			fmt.Sprintf("apidispatch gateway: model %q has no price in the gateway's OpenAI price table, so its spend cannot be bounded", cp.Model))
		return
	}
	it := upstreampkg.Item{Model: cp.Model, EstInput: workload.EstimateInputTokens(body), Length: int64(len(body)), MaxTokens: cp.maxCompletion()}
	if cp.N != nil {
		it.Choices = max(*cp.N, 1)
	}
	worst, err := prov.WorstCase(g.cfg.Prices, it, body, false)
	if err != nil {
		worst = cost.Unpriceable
	}
	send := body
	if cp.Stream {
		if send, err = withUsage(body, cp); err != nil {
			writeOAError(w, http.StatusBadRequest, anthropic.ErrInvalidRequest, invalidJSON)
			return
		}
	}
	hold, err := g.reserve(client, worst)
	if err != nil {
		g.stats.refusedCap.Add(1)
		writeOACapError(w, err)
		return
	}
	g.discover()
	// The journal's max_tokens bounds how long a dead gateway's attempt
	// holds its slot: the completion limit, else the model's largest.
	mt := it.MaxTokens
	if mt == 0 {
		mt = price.MaxOutput
	}
	x := &exchange{g: g, w: w, r: r, client: client, class: class, body: send, hold: hold, worst: worst,
		prov: prov, item: it, chat: &cp, demand: prov.Demand(it),
		p: msgParams{Model: cp.Model, MaxTokens: &mt, Stream: cp.Stream}}
	x.run()
}

// serves reports whether the gateway has an org of provider p.
func (g *Gateway) serves(p *upstreampkg.Provider) bool {
	for _, u := range g.orgs {
		if upstreampkg.For(u.Org) == p {
			return true
		}
	}
	return false
}

// isOpenAIClient reports whether r comes from an OpenAI client: one that
// sends its token as Authorization: Bearer, with neither x-api-key nor
// anthropic-version (which every Anthropic SDK sends), to a gateway that
// has OpenAI orgs. It tells GET /v1/models apart, whose path both APIs
// share.
func (g *Gateway) isOpenAIClient(r *http.Request) bool {
	h := r.Header
	if h.Get(anthropic.HeaderAPIKey) != "" || h.Get(anthropic.HeaderVersion) != "" || h.Get("Authorization") == "" {
		return false
	}
	return g.serves(upstreampkg.OpenAI)
}

// --- the exchange's answers, in its provider's form --------------------------

// fail answers x's client with the gateway's own error.
func (x *exchange) fail(status int, typ, msg string) {
	if x.chat != nil {
		writeOAError(x.w, status, typ, msg)
		return
	}
	writeError(x.w, status, typ, msg)
}

// draining answers that the gateway is stopping.
func (x *exchange) draining(msg string) {
	if x.chat != nil {
		writeOADraining(x.w, msg)
		return
	}
	writeDraining(x.w, msg)
}

// capError answers a request refused by a spend cap.
func (x *exchange) capError(err error) {
	if x.chat != nil {
		writeOACapError(x.w, err)
		return
	}
	writeCapError(x.w, err)
}

// errorBody is the API's error envelope for a body passed on.
func (x *exchange) errorBody(typ, msg string) []byte {
	if x.chat != nil {
		return oaErrorBody(typ, "", "", msg)
	}
	return errorBody(typ, msg)
}

// streamError is the event that ends a stream with an error.
func (x *exchange) streamError(typ, msg string) []byte {
	if x.chat != nil {
		return []byte("data: " + string(oaErrorBody(typ, "", "", msg)) + "\n\n")
	}
	return []byte("event: error\ndata: " + string(errorBody(typ, msg)) + "\n\n")
}

// requestIDHeader names the request id of the provider's answers.
func (x *exchange) requestIDHeader() string {
	if x.chat != nil {
		return openai.HeaderRequestID
	}
	return anthropic.HeaderRequestID
}

// refusal is whose doing a lane-fatal answer of u is (refusalOf; an
// OpenAI org's is its key's).
func (x *exchange) refusal(u *upstream, o anthropic.Outcome) refusal {
	if x.prov != upstreampkg.Anthropic {
		return keyRefused
	}
	return x.g.refusalOf(u, x.p.Model, o)
}

// errWriter writes an error answer in one API's envelope.
type errWriter func(w http.ResponseWriter, status int, typ, msg string)

// oaKind is the OpenAI type and code of the gateway's own error of the
// Anthropic type typ, and the status it is answered with.
func oaKind(status int, typ string) (int, string, string) {
	switch typ {
	case anthropic.ErrAuthentication:
		return status, openai.ErrInvalidRequest, openai.CodeInvalidAPIKey
	case anthropic.ErrRateLimit:
		return status, openai.ErrTypeRequests, openai.CodeRateLimitExceeded
	case anthropic.ErrOverloaded:
		// The API's 529 is Anthropic's own; OpenAI's overloaded is 503.
		return http.StatusServiceUnavailable, openai.ErrServer, ""
	case anthropic.ErrAPI:
		return status, openai.ErrServer, ""
	case openai.ErrInvalidRequest, openai.ErrServer, openai.ErrTypeRequests, openai.ErrTypeTokens, openai.ErrInsufficientQuota:
		return status, typ, ""
	}
	return status, openai.ErrInvalidRequest, ""
}

// oaErrorBody is OpenAI's error envelope.
func oaErrorBody(typ, code, param, msg string) []byte {
	_, t, c := oaKind(0, typ)
	if code != "" {
		c = code
	}
	d := openai.ErrorDetail{Message: msg, Type: t}
	if c != "" {
		d.Code = &c
	}
	if param != "" {
		d.Param = &param
	}
	b, _ := json.Marshal(openai.ErrorEnvelope{Error: d})
	return b
}

// writeOAError answers OpenAI's error envelope (typ an Anthropic or an
// OpenAI type, mapped by oaKind), with x-should-retry false, unless set
// already, for an answer the openai SDKs should not retry.
func writeOAError(w http.ResponseWriter, status int, typ, msg string) {
	writeOAErrorParam(w, status, typ, "", "", msg)
}

func writeOAErrorParam(w http.ResponseWriter, status int, typ, code, param, msg string) {
	status, _, _ = oaKind(status, typ)
	b := oaErrorBody(typ, code, param, msg)
	h := w.Header()
	h.Set("content-type", "application/json")
	h.Set(openai.HeaderRequestID, newRequestID())
	if h.Get(openai.HeaderShouldRetry) == "" && status < 500 && status != http.StatusTooManyRequests && status != http.StatusConflict && status != http.StatusRequestTimeout {
		h.Set(openai.HeaderShouldRetry, "false")
	}
	w.WriteHeader(status)
	w.Write(b)
}

// writeOADraining answers that the gateway is stopping: 503, which the
// openai SDKs retry.
func writeOADraining(w http.ResponseWriter, msg string) {
	w.Header().Set(openai.HeaderShouldRetry, "true")
	w.Header().Set(openai.HeaderRetryAfter, "1")
	writeOAError(w, http.StatusServiceUnavailable, anthropic.ErrOverloaded, "apidispatch gateway: "+msg)
}

// writeOACapError answers a request refused by a spend cap as OpenAI
// answers an organisation out of quota: 429 insufficient_quota, with
// x-should-retry false (a retry is refused alike). A cap that cannot be
// judged now (the shared budget's Redis is out of reach) is a 503 the
// SDKs retry.
func writeOACapError(w http.ResponseWriter, err error) {
	if errors.Is(err, spend.ErrUnavailable) {
		writeOAError(w, http.StatusServiceUnavailable, anthropic.ErrAPI, "apidispatch gateway: the request was not sent: a spend cap applies to it and cannot be checked now: "+err.Error())
		return
	}
	w.Header().Set(openai.HeaderShouldRetry, "false")
	writeOAErrorParam(w, http.StatusTooManyRequests, openai.ErrInsufficientQuota, openai.CodeInsufficientQuota, "",
		"apidispatch gateway: the request was not sent: it would pass a spend cap of this gateway: "+err.Error())
}

// --- the stream --------------------------------------------------------------

// oaStreamState follows a chat completion's stream: "data:" events, each
// a chunk, the last with choices [] and the usage, then "data: [DONE]"; an
// error is a data event {"error":…}. With strip (the client did not ask
// for the usage), the usage chunk is not passed on, nor the "usage":null
// of the other chunks.
type oaStreamState struct {
	strip     bool
	usage     *upstreampkg.Usage
	done      bool // data: [DONE] seen
	begun     bool // a chunk came
	errType   string
	dropBlank bool // the blank line after a chunk taken out
	skip      bool // inside a long line already judged
}

var nullUsage = []byte(`,"usage":null`)

func (s *oaStreamState) partial([]byte) { s.skip = true; s.begun = true }

func (s *oaStreamState) endName() string { return "its usage chunk and data: [DONE]" }

func (s *oaStreamState) end() streamEnd {
	e := streamEnd{begun: s.begun, errType: s.errType, done: s.done && s.usage != nil, usage: s.usage,
		rateLimited: s.errType == openai.ErrTypeRequests || s.errType == openai.ErrTypeTokens, overloaded: s.errType == openai.ErrServer}
	if !e.done {
		e.usage = nil
	}
	return e
}

func (s *oaStreamState) pass(b []byte) ([]byte, bool) {
	if !s.line(b) {
		return nil, false
	}
	return s.rewrite(b), true
}

func (s *oaStreamState) line(b []byte) bool {
	if s.skip {
		s.skip = false
		return true
	}
	t := bytes.TrimRight(b, "\r\n")
	if len(t) == 0 {
		if s.dropBlank {
			s.dropBlank = false
			return false
		}
		return true
	}
	if !bytes.HasPrefix(t, []byte("data:")) {
		return true
	}
	data := bytes.TrimSpace(t[5:])
	if bytes.Equal(data, []byte("[DONE]")) {
		s.done = true
		return true
	}
	var v struct {
		Usage       *openai.Usage `json:"usage"`
		ServiceTier string        `json:"service_tier"`
		Error       *struct {
			Type string `json:"type"`
		} `json:"error"`
	}
	if json.Unmarshal(data, &v) != nil {
		s.begun = true
		return true
	}
	switch {
	case v.Error != nil:
		s.errType = v.Error.Type
		if s.errType == "" {
			s.errType = openai.ErrServer
		}
		return true
	case v.Usage != nil:
		s.begun = true
		s.usage = upstreampkg.OpenAIUsage(*v.Usage, v.ServiceTier)
		if s.strip {
			s.dropBlank = true
			return false
		}
		return true
	}
	s.begun = true
	return true
}

// rewrite is the line passed on for b (line reported true): a chunk
// without its "usage":null when the client did not ask for the usage.
func (s *oaStreamState) rewrite(b []byte) []byte {
	if s.strip && bytes.HasPrefix(b, []byte("data:")) {
		if i := bytes.Index(b, nullUsage); i >= 0 {
			return append(append([]byte(nil), b[:i]...), b[i+len(nullUsage):]...)
		}
	}
	return b
}
