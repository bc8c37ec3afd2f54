package workload

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/store"
)

// Scan reads the request file at path in one streaming pass and calls fn
// with each item in file order: Seq (1, 2, 3… over non-blank lines), Line,
// CustomID, Offset and Length (the line's byte range, without its line
// ending, BOM excluded), Model, MaxTokens and EstInput.
//
// Scan is meant for a file Validate accepted. It still checks each line as
// it reads it (but not custom_id uniqueness or the KnownModel hook) and
// stops at the first problem with a *ValidationError, wrapped with the path.
// An error from fn stops the scan and is returned unchanged.
func Scan(path string, fn func(it store.Item) error) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("workload: %w", err)
	}
	defer f.Close()
	lr := newLineReader(f, MaxLineBytes)
	c := newChecker()
	var seq int64
	for {
		ln, err := lr.next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("workload: %s: %w", path, err)
		}
		if ln.tooLong {
			return scanError(path, ln.num, fmt.Sprintf("line is longer than the limit of %d bytes", MaxLineBytes))
		}
		if isBlank(ln.b) {
			continue
		}
		c.check(ln.b)
		if len(c.probs) > 0 {
			return scanError(path, ln.num, c.probs[0])
		}
		seq++
		it := store.Item{
			Seq:       seq,
			Line:      ln.num,
			CustomID:  c.customID(),
			Offset:    ln.off,
			Length:    int64(len(ln.b)),
			Model:     c.model(),
			MaxTokens: c.maxTokens,
			EstInput:  c.r.estimate(),
		}
		if c.openai {
			it.Provider, it.Choices = ProviderOpenAI, c.choices
		}
		if err := fn(it); err != nil {
			return err
		}
	}
}

func scanError(path string, line int64, msg string) error {
	return fmt.Errorf("workload: %s: %w", path, &ValidationError{Problems: []Problem{{Line: line, Msg: msg}}})
}

// ProviderOpenAI is store.Item.Provider of an OpenAI request line (the
// org package's name for the provider).
const ProviderOpenAI = "openai"

// ReadAt reads item it back from the request file by its byte range (one
// positioned read, so concurrent calls on one *os.File are safe) and returns
// its params object (an OpenAI line's body) exactly as the file holds it. If the bytes there are not
// a request with it.CustomID, the file changed since it was scanned: the
// error wraps ErrChanged.
func ReadAt(r io.ReaderAt, it store.Item) (json.RawMessage, error) {
	if it.Length <= 0 || it.Length > MaxLineBytes || it.Offset < 0 {
		return nil, fmt.Errorf("workload: item %q (line %d): invalid byte range %d+%d", it.CustomID, it.Line, it.Offset, it.Length)
	}
	buf := make([]byte, it.Length)
	n, err := r.ReadAt(buf, it.Offset)
	if n < len(buf) {
		if err == nil || errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("line %d: the file is shorter than it was: %w", it.Line, ErrChanged)
		}
		return nil, fmt.Errorf("workload: line %d: %w", it.Line, err)
	}
	p := parser{b: buf}
	req := request{shallow: true}
	if !parseRequest(&p, &req) {
		return nil, fmt.Errorf("line %d: %s: %w", it.Line, p.syntaxError(), ErrChanged)
	}
	if req.customIDKind != kindString {
		return nil, fmt.Errorf("line %d: no custom_id: %w", it.Line, ErrChanged)
	}
	id := buf[req.customID.s:req.customID.e]
	if req.customID.esc {
		id = []byte(decodeString(buf, req.customID))
	}
	if string(id) != it.CustomID {
		return nil, fmt.Errorf("line %d: custom_id is %s, want %s: %w", it.Line, quoteID(string(id)), quoteID(it.CustomID), ErrChanged)
	}
	if req.openAI() != (it.Provider == ProviderOpenAI) {
		return nil, fmt.Errorf("line %d: not the provider it was scanned for: %w", it.Line, ErrChanged)
	}
	if req.openAI() {
		if req.bodyKind != kindObject {
			return nil, fmt.Errorf("line %d: body is %s: %w", it.Line, req.bodyKind, ErrChanged)
		}
		return json.RawMessage(buf[req.body.s:req.body.e:req.body.e]), nil
	}
	if req.paramsKind != kindObject {
		return nil, fmt.Errorf("line %d: params is %s: %w", it.Line, req.paramsKind, ErrChanged)
	}
	return json.RawMessage(buf[req.params.s:req.params.e:req.params.e]), nil
}

// EstimateInputTokens is apidispatch's LOCAL estimate of the input tokens of
// a Messages request's params, for projections and rate-limit reservations
// before the API reports the real count. It is not a tokenizer:
//
//	ceil(A / 4) + W + 4 × len(messages) + 4
//
// where A counts the ASCII characters and W the non-ASCII characters of the
// string values in system, messages and tools (keys and the values of
// "type", "role", "cache_control" and "media_type" are left out; a JSON
// escape is one character; a base64 "data" string counts at most 6,400
// characters, about an image's price). English prose runs about four
// characters a token; CJK text about one token a character, which is why a
// non-ASCII character counts as a whole token (this overestimates accented
// Latin text a little, erring toward a higher cost projection). The
// Phase 6 judge item (a 720-character rubric and a 364-character question)
// is estimated at about 280 tokens.
//
// For an exact count, the plan command can ask the API's count_tokens
// endpoint. Params that are not a valid JSON object are estimated as a
// quarter of their length.
func EstimateInputTokens(params json.RawMessage) int64 {
	if r, ok := scanParams(params); ok {
		return r.estimate()
	}
	return (int64(len(params)) + 3) / 4
}

// scanParams reads a params object whole; ok is false when params are not
// a valid JSON object.
func scanParams(params json.RawMessage) (r request, ok bool) {
	p := parser{b: params}
	p.skipWS()
	if p.i < len(p.b) && p.b[p.i] == '{' && parseParams(&p, &r) {
		p.skipWS()
		return r, p.i == len(p.b)
	}
	return r, false
}

// ItemSummary is what Validate adds to its model's ModelSummary for one
// request whose params are params (N is 1; MaxTokens is not read).
func ItemSummary(params json.RawMessage) ModelSummary {
	r, ok := scanParams(params)
	if !ok {
		return ModelSummary{N: 1, EstInput: (int64(len(params)) + 3) / 4}
	}
	return r.summary()
}

// BoundOf is the cost.Bound of a Messages request whose body (params) is
// params, for cost.Table.WorstCase, the one worst case of every route: its
// model and max_tokens as the caller read them, its input bounded by the
// larger of the local estimate and the body's length in bytes (a token is
// at least one byte), and the multipliers its params ask for as the API
// reads them (escaped keys too): the dearest write of its cache_control
// markers (in system, messages, tools or at the top) and inference_geo
// "us". Thinking needs nothing more: its budget is output within
// max_tokens. Params that are not a valid JSON object are bounded at every
// multiplier.
func BoundOf(model string, params json.RawMessage, maxTokens int64, batch bool) cost.Bound {
	b := cost.Bound{Model: model, MaxTokens: maxTokens, Batch: batch, Input: int64(len(params))}
	if r, ok := scanParams(params); ok {
		images, docs := linkedMedia(params)
		b.Input = max(b.Input, r.estimate()) + images*MaxImageTokens
		if docs > 0 {
			// A document named by a URL or a file may hold any number of
			// pages: only the largest context window bounds it.
			b.Input = max(b.Input, MaxContextTokens)
		}
		b.CacheWrite, b.GeoUS = r.cacheWrite, r.geoUS
		return b
	}
	b.CacheWrite, b.GeoUS = cost.CacheWrite1h, true
	return b
}

// MaxImageTokens bounds the input tokens one image block is billed at:
// the API scales an image down to about 1.15 megapixels before it reads
// it, about 1,600 tokens at most.
const MaxImageTokens = 1600

// fields are m's values of the key name in any case: a reader of Go's
// encoding/json (the simulator) matches a field's name whatever its case,
// so the bound counts a block as what any of them says.
func fields(m map[string]any, name string) []any {
	var vs []any
	for k, v := range m {
		if strings.EqualFold(k, name) {
			vs = append(vs, v)
		}
	}
	return vs
}

// MaxContextTokens is the largest context window of any model (with the
// long-context beta): the most input tokens one request can be billed.
const MaxContextTokens = 1_000_000

// linkedMedia is how many image blocks params hold, and how many document
// blocks name their content (a URL, a file) rather than carry it in the
// body. Neither the body's length nor its text bounds them: a document
// named is billed for what it names, and an image at its size in pixels,
// however few bytes spell it (a base64 PNG of a large blank image is a
// few hundred bytes billed as a full image). A base64 or plain-text
// document is in the body and counted there. Params are read as the API
// reads them: a type spelt with \u escapes ("imag\u0065") is one.
func linkedMedia(params []byte) (images, docs int64) {
	if !bytes.Contains(params, []byte(`"image"`)) && !bytes.Contains(params, []byte(`"document"`)) && !bytes.Contains(params, []byte(`\u`)) {
		return 0, 0
	}
	var v any
	if json.Unmarshal(params, &v) != nil {
		return 0, 0
	}
	var walk func(any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			types := fields(x, "type")
			switch {
			case slices.Contains(types, any("image")):
				images++
			case slices.Contains(types, any("document")):
				for _, s := range fields(x, "source") {
					src, ok := s.(map[string]any)
					if !ok {
						continue
					}
					if slices.ContainsFunc(fields(src, "type"), func(st any) bool { return st != "base64" && st != "text" && st != "content" }) {
						docs++
						break
					}
				}
			}
			for _, c := range x {
				walk(c)
			}
		case []any:
			for _, c := range x {
				walk(c)
			}
		}
	}
	walk(v)
	return images, docs
}
