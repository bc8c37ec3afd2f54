package cache

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// Key is the SHA-256 of a request's canonical form (see KeyOf).
type Key [32]byte

// String is the key in hex.
func (k Key) String() string { return hex.EncodeToString(k[:]) }

// ParseKey reads a key written by String.
func ParseKey(s string) (Key, error) {
	var k Key
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != len(k) {
		return k, fmt.Errorf("cache: %q is not a 64-digit hex key", s)
	}
	copy(k[:], b)
	return k, nil
}

// keyDomain separates this key from any other SHA-256 of the same bytes, and
// names the canonical form: change the form, change the domain.
const keyDomain = "apidispatch-cache-key-v1\n"

// ignoredFields are the params that never change the answer: metadata
// (user_id) only tags the request. custom_id is not in params at all.
var ignoredFields = map[string]bool{"metadata": true}

// ErrNotObject: the params are not one JSON object.
var ErrNotObject = errors.New("cache: request params are not a JSON object")

// KeyOf returns the key of a request's params object (the Message Batches
// "params": model, system, messages, max_tokens, temperature, top_p, top_k,
// stop_sequences, tools, tool_choice, thinking, … — everything but
// metadata). The canonical form is the params re-encoded with object keys
// sorted at every depth, no insignificant white space, and every number
// written in its shortest float64 form (so 0, 0.0 and 0e0 agree); strings
// and array order are kept exactly. KeyOf is safe for concurrent use.
func KeyOf(params []byte) (Key, error) {
	k, _, err := Inspect(params)
	return k, err
}

// Inspect returns the key of a request's params and whether it is sampled
// (see Sampled), in one pass.
func Inspect(params []byte) (k Key, sampled bool, err error) {
	return inspect(params, ignoredFields)
}

// messageIgnored are the fields of a Messages request body that never
// change its answer's message: metadata, and stream (a streamed answer is
// the same message in events).
var messageIgnored = map[string]bool{"metadata": true, "stream": true}

// InspectMessage is Inspect of a POST /v1/messages body: as the params of
// a request line, with its top-level "stream" left out too, so the body
// {"stream": false, …} has the key of the same params without it (a
// caller that answers streams must not answer them with a stored message).
func InspectMessage(body []byte) (k Key, sampled bool, err error) {
	return inspect(body, messageIgnored)
}

func inspect(params []byte, ignore map[string]bool) (k Key, sampled bool, err error) {
	c, temp, err := canonicalIgnoring(params, ignore)
	if err != nil {
		return Key{}, true, err
	}
	h := sha256.New()
	h.Write([]byte(keyDomain))
	h.Write(c)
	h.Sum(k[:0])
	return k, temperatureSampled(temp), nil
}

// Canonical returns the canonical form KeyOf hashes.
func Canonical(params []byte) ([]byte, error) {
	c, _, err := canonical(params)
	return c, err
}

func canonical(params []byte) (out, temperature []byte, err error) {
	return canonicalIgnoring(params, ignoredFields)
}

func canonicalIgnoring(params []byte, ignore map[string]bool) (out, temperature []byte, err error) {
	c := canon{in: params, ignore: ignore}
	c.ws()
	if c.pos >= len(c.in) || c.in[c.pos] != '{' {
		if json.Valid(params) {
			return nil, nil, ErrNotObject
		}
		return nil, nil, errSyntax
	}
	out, err = c.value(make([]byte, 0, len(params)), 0)
	if err != nil {
		return nil, nil, err
	}
	if c.ws(); c.pos != len(c.in) {
		return nil, nil, fmt.Errorf("cache: request params: trailing data after the object")
	}
	return out, c.temperature, nil
}

// canonicalSlow is the canonical form by encoding/json: the reference the
// fast form is tested against.
func canonicalSlow(params []byte) ([]byte, error) {
	if !json.Valid(params) {
		return nil, errSyntax
	}
	d := json.NewDecoder(bytes.NewReader(params))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, fmt.Errorf("cache: request params: %w", err)
	}
	if d.More() {
		return nil, fmt.Errorf("cache: request params: trailing data after the object")
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, ErrNotObject
	}
	for f := range ignoredFields {
		delete(m, f)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(normalise(m)); err != nil {
		return nil, fmt.Errorf("cache: request params: %w", err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte{'\n'}), nil
}

// normalise rewrites numbers in their shortest float64 form; encoding/json
// already sorts map keys.
func normalise(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, x := range t {
			t[k] = normalise(x)
		}
	case []any:
		for i, x := range t {
			t[i] = normalise(x)
		}
	case json.Number:
		if f, err := strconv.ParseFloat(string(t), 64); err == nil {
			return json.Number(strconv.FormatFloat(f, 'g', -1, 64))
		}
	}
	return v
}

// Sampled reports whether a request's answer is one sample of many: its
// temperature is above 0 — or absent, since the API's default temperature
// is 1.0. Such a request is cached (and shared between duplicates) only when
// the user asks for it (run --cache-sampled). Params that are not an object
// count as sampled.
func Sampled(params []byte) bool {
	_, sampled, err := Inspect(params)
	return err != nil || sampled
}

// temperatureSampled: absent (the API's default, 1.0) or above 0.
func temperatureSampled(canonNum []byte) bool {
	if canonNum == nil {
		return true
	}
	f, err := strconv.ParseFloat(string(canonNum), 64)
	return err != nil || f > 0
}
