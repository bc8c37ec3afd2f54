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
	c, err := Canonical(params)
	if err != nil {
		return Key{}, err
	}
	h := sha256.New()
	h.Write([]byte(keyDomain))
	h.Write(c)
	var k Key
	h.Sum(k[:0])
	return k, nil
}

// Canonical returns the canonical form KeyOf hashes.
func Canonical(params []byte) ([]byte, error) {
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
	var p struct {
		Temperature *json.Number `json:"temperature"`
	}
	if err := json.Unmarshal(params, &p); err != nil {
		return true
	}
	if p.Temperature == nil {
		return true
	}
	f, err := p.Temperature.Float64()
	return err != nil || f > 0
}
