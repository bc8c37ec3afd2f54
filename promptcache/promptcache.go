// Package promptcache tells where a request's prompt cache is warm.
//
// The API keeps one prompt cache per organisation (and model): a prefix
// marked with cache_control is written (at 1.25× the input price, 2× with
// "ttl":"1h") by the first request that sends it to an org, and read (at
// 0.1×, and outside ITPM on current models) by the requests that follow
// there within its lifetime, 5 minutes (or 1 hour) refreshed by each read.
// Work placed by headroom alone writes the same prefix in every org, and
// again after every quiet spell; placed where it is warm, it pays one
// write and reads after.
//
// Of finds the prefix a request marks; Places remembers, per prefix, the
// orgs where it was sent and answered recently, which the sync engine and
// the gateway consult when they choose a lane.
package promptcache

import (
	"bytes"
	"hash/maphash"
	"time"
)

// Lifetimes of a cached prefix (API time), by its marker's ttl.
const (
	TTLDefault = 5 * time.Minute
	TTL1h      = time.Hour
)

// Key identifies one prefix of one model, within this process (it is a
// seeded hash, never stored).
type Key struct{ a, b uint64 }

// Prefix is what a request asks the API to cache.
type Prefix struct {
	Key Key
	// TTL is the lifetime of the last marker's entry (TTLDefault or TTL1h).
	TTL time.Duration
	// Bytes is the JSON size of the prefix (tools, system and messages up
	// to the last marker): with the request's size it apportions an input
	// estimate.
	Bytes int
}

var seeds = [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}

var marker = []byte(`"cache_control"`)

// Of returns the prefix that params (a Messages request body) marks for
// caching with model: tools, then system, then messages, up to the end of
// the last block with cache_control, in the API's order whatever the
// order of the JSON keys. A top-level cache_control (automatic caching) marks all
// three. ok is false when nothing is marked, params is not a JSON
// object, or the prefix is shorter than MinBytes. It reads params once,
// without allocating.
func Of(model string, params []byte) (p Prefix, ok bool) {
	if len(params) < MinBytes || !bytes.Contains(params, marker) {
		return Prefix{}, false
	}
	var tools, system, messages, auto []byte
	if !topLevel(params, func(key, val []byte) {
		switch string(key) {
		case "tools":
			tools = val
		case "system":
			system = val
		case "messages":
			messages = val
		case "cache_control":
			if val[0] == '{' {
				auto = val
			}
		}
	}) {
		return Prefix{}, false
	}
	parts := [3][]byte{tools, system, messages}
	last := -1 // the last part with a marker
	cut := 0   // where that marker starts in it
	for i, b := range parts {
		if j := bytes.LastIndex(b, marker); j >= 0 {
			last, cut = i, j
		}
	}
	if last < 0 && auto == nil {
		return Prefix{}, false
	}
	var ttlFrom []byte
	if auto != nil {
		last, cut = 2, len(messages)
		ttlFrom = auto
	} else {
		// The marked block is part of the prefix, whichever of its keys
		// comes first: cut at its end.
		ttlFrom = parts[last][cut:]
		cut = blockEnd(parts[last], cut)
	}
	p.TTL = TTLDefault
	if end := bytes.IndexByte(ttlFrom, '}'); end >= 0 && bytes.Contains(ttlFrom[:end], []byte(`"1h"`)) {
		p.TTL = TTL1h
	}
	var h [2]maphash.Hash
	for k := range h {
		h[k].SetSeed(seeds[k])
		h[k].WriteString(model)
		for i := 0; i <= last; i++ {
			b := parts[i]
			if i == last {
				b = b[:cut]
			}
			h[k].WriteByte(0)
			h[k].WriteByte(byte(i))
			h[k].Write(b)
			if k == 0 {
				p.Bytes += len(b)
			}
		}
	}
	if p.Bytes < MinBytes {
		return Prefix{}, false
	}
	p.Key = Key{h[0].Sum64(), h[1].Sum64()}
	return p, true
}

// MinBytes is the shortest prefix Of reports. The API caches no prefix
// under 1,024 tokens (more for some models), and 1,024 tokens take more
// than 2,048 bytes of JSON for any text but the densest, so a shorter
// prefix would only be written, never read: such a request is placed as
// one without a prefix.
const MinBytes = 2048

// blockEnd returns the index just past the object enclosing b[i] (the
// end of a marked block), or len(b).
func blockEnd(b []byte, i int) int {
	depth := 0
	for ; i < len(b); i++ {
		switch b[i] {
		case '"':
			e := skipString(b, i)
			if e < 0 {
				return len(b)
			}
			i = e - 1
		case '{', '[':
			depth++
		case '}', ']':
			if depth--; depth < 0 {
				return i + 1
			}
		}
	}
	return len(b)
}

// topLevel calls f with each key and raw value of the JSON object b (keys
// undecoded, without their quotes) and reports whether b is one well-nested
// object. It does not check the JSON fully: the API does that.
func topLevel(b []byte, f func(key, val []byte)) bool {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return true
	}
	for i < len(b) {
		if b[i] != '"' {
			return false
		}
		ke := skipString(b, i)
		if ke < 0 {
			return false
		}
		key := b[i+1 : ke-1]
		i = skipSpace(b, ke)
		if i >= len(b) || b[i] != ':' {
			return false
		}
		i = skipSpace(b, i+1)
		ve := skipValue(b, i)
		if ve <= i {
			return false
		}
		f(key, b[i:ve])
		i = skipSpace(b, ve)
		if i >= len(b) {
			return false
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			return true
		default:
			return false
		}
	}
	return false
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index just past the string starting at b[i]
// (a quote), or -1.
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return -1
}

// skipValue returns the index just past the value starting at b[i], or -1.
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				e := skipString(b, i)
				if e < 0 {
					return -1
				}
				i = e - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
		}
		return -1
	}
	j := i
	for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' && b[j] != '\t' && b[j] != '\n' && b[j] != '\r' {
		j++
	}
	if j == i {
		return -1
	}
	return j
}
