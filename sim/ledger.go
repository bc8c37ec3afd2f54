package sim

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"
)

// BodyHash is the SHA-256 of a request body. It marshals as lower-case hex.
type BodyHash [32]byte

// String returns the hash in hex.
func (h BodyHash) String() string { return hex.EncodeToString(h[:]) }

// MarshalText writes the hash in hex.
func (h BodyHash) MarshalText() ([]byte, error) { return []byte(h.String()), nil }

// UnmarshalText reads the hash from hex.
func (h *BodyHash) UnmarshalText(b []byte) error {
	if len(b) != 64 {
		return fmt.Errorf("body hash: want 64 hex digits, got %d", len(b))
	}
	_, err := hex.Decode(h[:], b)
	return err
}

// Delivery says how a billed response reached the client.
const (
	DeliveryOK        = "ok"               // the full 200 response was sent
	DeliveryReset     = "connection_reset" // billed, then the connection was reset
	DeliveryTruncated = "truncated_body"   // billed, then half the body was sent
)

// LedgerEntry is one billed request: a request the simulator processed and
// charged, whether or not the client received the answer. It names the key
// only by its fingerprint.
type LedgerEntry struct {
	Seq            int64     `json:"seq"` // billing order, from 1
	RequestID      string    `json:"request_id"`
	MessageID      string    `json:"message_id"`
	Org            string    `json:"org"`
	KeyFingerprint string    `json:"key_fingerprint"`
	Model          string    `json:"model"`
	BodySHA256     BodyHash  `json:"body_sha256"`
	InputTokens    int64     `json:"input_tokens"`
	OutputTokens   int64     `json:"output_tokens"`
	CacheWrite5m   int64     `json:"cache_creation_5m_input_tokens"`
	CacheWrite1h   int64     `json:"cache_creation_1h_input_tokens"`
	CacheRead      int64     `json:"cache_read_input_tokens"`
	CostNanos      int64     `json:"cost_nanos"` // exact, 1e-9 USD
	CostUSD        float64   `json:"cost_usd"`
	Time           time.Time `json:"time"`  // wall clock at billing
	APISeconds     float64   `json:"api_s"` // API-equivalent seconds since server start (µs precision)
	// USGeo: inference_geo "us", billed ×1.1 (CostNanos includes it).
	USGeo    bool   `json:"us_geo,omitempty"`
	Status   int    `json:"status"`
	Delivery string `json:"delivery"`
	// Duplicate: the same body had been billed before (by any org or key).
	Duplicate bool `json:"duplicate"`
	// ServiceTier is "batch" for a Message Batches request (billed at the
	// batch price, BodySHA256 the hash of its params); empty for a
	// POST /v1/messages request (standard).
	ServiceTier string `json:"service_tier,omitempty"`
	// BatchID and CustomID name a Message Batches request (or an OpenAI
	// batch's).
	BatchID  string `json:"batch_id,omitempty"`
	CustomID string `json:"custom_id,omitempty"`
	// Provider is "openai" for a request to the OpenAI surface, empty for
	// one to the Anthropic surface. An OpenAI entry's InputTokens are its
	// uncached prompt tokens, CacheRead its cached_tokens, OutputTokens
	// its completion_tokens (ReasoningTokens among them), MessageID the
	// chat completion's id and Model the snapshot it named.
	Provider        string `json:"provider,omitempty"`
	ReasoningTokens int64  `json:"reasoning_tokens,omitempty"`
}

// appendJSON appends the entry as one JSON line (with the newline). It is
// the hot path of --ledger, so it does not use reflection.
func (e *LedgerEntry) appendJSON(b []byte) []byte {
	b = append(b, `{"seq":`...)
	b = strconv.AppendInt(b, e.Seq, 10)
	b = append(b, `,"request_id":`...)
	b = appendJSONString(b, e.RequestID)
	b = append(b, `,"message_id":`...)
	b = appendJSONString(b, e.MessageID)
	b = append(b, `,"org":`...)
	b = appendJSONString(b, e.Org)
	b = append(b, `,"key_fingerprint":`...)
	b = appendJSONString(b, e.KeyFingerprint)
	b = append(b, `,"model":`...)
	b = appendJSONString(b, e.Model)
	b = append(b, `,"body_sha256":"`...)
	b = hex.AppendEncode(b, e.BodySHA256[:])
	b = append(b, '"')
	for _, f := range []struct {
		k string
		v int64
	}{{"input_tokens", e.InputTokens}, {"output_tokens", e.OutputTokens},
		{"cache_creation_5m_input_tokens", e.CacheWrite5m}, {"cache_creation_1h_input_tokens", e.CacheWrite1h},
		{"cache_read_input_tokens", e.CacheRead}, {"cost_nanos", e.CostNanos}} {
		b = append(b, `,"`...)
		b = append(b, f.k...)
		b = append(b, `":`...)
		b = strconv.AppendInt(b, f.v, 10)
	}
	b = append(b, `,"cost_usd":`...)
	b = strconv.AppendFloat(b, e.CostUSD, 'f', -1, 64)
	b = append(b, `,"time":"`...)
	b = e.Time.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","api_s":`...)
	b = strconv.AppendFloat(b, e.APISeconds, 'f', -1, 64)
	if e.USGeo {
		b = append(b, `,"us_geo":true`...)
	}
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(e.Status), 10)
	b = append(b, `,"delivery":`...)
	b = appendJSONString(b, e.Delivery)
	b = append(b, `,"duplicate":`...)
	b = strconv.AppendBool(b, e.Duplicate)
	for _, f := range [...][2]string{{"service_tier", e.ServiceTier}, {"batch_id", e.BatchID}, {"custom_id", e.CustomID}, {"provider", e.Provider}} {
		if f[1] != "" {
			b = append(b, `,"`...)
			b = append(b, f[0]...)
			b = append(b, `":`...)
			b = appendJSONString(b, f[1])
		}
	}
	if e.ReasoningTokens != 0 {
		b = append(b, `,"reasoning_tokens":`...)
		b = strconv.AppendInt(b, e.ReasoningTokens, 10)
	}
	return append(b, "}\n"...)
}

// Totals sums billed requests.
type Totals struct {
	Requests     int64   `json:"requests"`
	InputTokens  int64   `json:"input_tokens"`
	OutputTokens int64   `json:"output_tokens"`
	CacheWrite   int64   `json:"cache_creation_input_tokens"`
	CacheRead    int64   `json:"cache_read_input_tokens"`
	CostNanos    int64   `json:"cost_nanos"`
	CostUSD      float64 `json:"cost_usd"`
	// Duplicates counts billings of a body that had been billed before.
	Duplicates int64 `json:"duplicates"`
}

func (t *Totals) add(e *LedgerEntry) {
	t.Requests++
	t.InputTokens += e.InputTokens
	t.OutputTokens += e.OutputTokens
	t.CacheWrite += e.CacheWrite5m + e.CacheWrite1h
	t.CacheRead += e.CacheRead
	t.CostNanos += e.CostNanos
	t.CostUSD = nanosToUSD(t.CostNanos)
	if e.Duplicate {
		t.Duplicates++
	}
}

// merge adds the totals o to t.
func (t *Totals) merge(o Totals) {
	t.Requests += o.Requests
	t.InputTokens += o.InputTokens
	t.OutputTokens += o.OutputTokens
	t.CacheWrite += o.CacheWrite
	t.CacheRead += o.CacheRead
	t.CostNanos += o.CostNanos
	t.Duplicates += o.Duplicates
	t.CostUSD = nanosToUSD(t.CostNanos)
}

func nanosToUSD(n int64) float64 { return float64(n) / 1e9 }

// LedgerTotals are the totals of every billed request since the start,
// overall, per org name and per key fingerprint. Duplicates counts
// billings of a body SHA-256 billed before (anywhere); DuplicateBodies the
// distinct bodies billed more than once.
type LedgerTotals struct {
	Totals
	DuplicateBodies int64             `json:"duplicate_bodies"`
	ByOrg           map[string]Totals `json:"by_org"`
	ByKey           map[string]Totals `json:"by_key"`
}

// BatchBilling sums the Message Batches entries of a ledger: their cost in
// nano-dollars, how many there are, and how many requests (params, by
// their hash) were billed more than once (a batch created twice for the
// same items). Requests are told apart by their params rather than their
// custom_ids: a client may send one item under a new custom_id in each
// batch, and two jobs may use the same custom_ids.
func BatchBilling(entries []LedgerEntry) (nanos int64, billed, twice int) {
	seen := map[BodyHash]int{}
	for _, e := range entries {
		if e.ServiceTier != "batch" {
			continue
		}
		nanos += e.CostNanos
		billed++
		if seen[e.BodySHA256]++; seen[e.BodySHA256] == 2 {
			twice++
		}
	}
	return nanos, billed, twice
}

// TotalsOf sums entries (for example those of LedgerSince, one arm of an
// A/B), counting as duplicates the repeats of a body within entries only.
func TotalsOf(entries []LedgerEntry) LedgerTotals {
	t := LedgerTotals{ByOrg: map[string]Totals{}, ByKey: map[string]Totals{}}
	seen := make(map[BodyHash]int, len(entries))
	for i := range entries {
		e := entries[i]
		seen[e.BodySHA256]++
		e.Duplicate = seen[e.BodySHA256] > 1
		if seen[e.BodySHA256] == 2 {
			t.DuplicateBodies++
		}
		t.add(&e)
		o := t.ByOrg[e.Org]
		o.add(&e)
		t.ByOrg[e.Org] = o
		k := t.ByKey[e.KeyFingerprint]
		k.add(&e)
		t.ByKey[e.KeyFingerprint] = k
	}
	return t
}

// dupIndex remembers every billed body hash, sharded so that billing from
// many goroutines does not contend on one lock. It keeps 16 bytes of each
// hash (collisions are out of reach at any run size).
type dupIndex struct {
	shards [64]struct {
		mu sync.Mutex
		m  map[[16]byte]uint32
	}
}

// add records one billing of h and reports whether h was billed before and
// whether this is its second billing.
func (d *dupIndex) add(h BodyHash) (dup, second bool) {
	var k [16]byte
	copy(k[:], h[:16])
	s := &d.shards[h[0]&63]
	s.mu.Lock()
	if s.m == nil {
		s.m = make(map[[16]byte]uint32)
	}
	n := s.m[k] + 1
	s.m[k] = n
	s.mu.Unlock()
	return n > 1, n == 2
}

// ledgerFile streams entries to a JSONL file from one writer goroutine, which
// flushes whenever it has caught up. Close drains it and waits.
type ledgerFile struct {
	mu     sync.RWMutex // write holds it shared, close exclusively
	closed bool
	ch     chan *LedgerEntry
	done   chan error
}

func openLedgerFile(path string) (*ledgerFile, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("sim: ledger: %w", err)
	}
	lf := &ledgerFile{ch: make(chan *LedgerEntry, 4096), done: make(chan error, 1)}
	go lf.run(f)
	return lf, nil
}

func (lf *ledgerFile) run(f *os.File) {
	w := bufio.NewWriterSize(f, 256<<10)
	var buf []byte
	var werr error
	for e := range lf.ch {
		buf = e.appendJSON(buf[:0])
		if _, err := w.Write(buf); err != nil && werr == nil {
			werr = err
		}
		if len(lf.ch) == 0 {
			if err := w.Flush(); err != nil && werr == nil {
				werr = err
			}
		}
	}
	if err := w.Flush(); err != nil && werr == nil {
		werr = err
	}
	if err := f.Close(); err != nil && werr == nil {
		werr = err
	}
	lf.done <- werr
}

// write queues e; after close it does nothing.
func (lf *ledgerFile) write(e *LedgerEntry) {
	lf.mu.RLock()
	if !lf.closed {
		lf.ch <- e
	}
	lf.mu.RUnlock()
}

func (lf *ledgerFile) close() error {
	lf.mu.Lock()
	lf.closed = true
	close(lf.ch)
	lf.mu.Unlock()
	return <-lf.done
}

// WriteLedgerJSONL writes entries as JSON lines.
func WriteLedgerJSONL(w io.Writer, entries []LedgerEntry) error {
	bw := bufio.NewWriter(w)
	var buf []byte
	for i := range entries {
		buf = entries[i].appendJSON(buf[:0])
		if _, err := bw.Write(buf); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// ReadLedgerJSONL reads entries written by the simulator (a --ledger file or
// GET /sim/ledger).
func ReadLedgerJSONL(r io.Reader) ([]LedgerEntry, error) {
	var out []LedgerEntry
	d := json.NewDecoder(r)
	for {
		var e LedgerEntry
		if err := d.Decode(&e); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return out, fmt.Errorf("sim: ledger line %d: %w", len(out)+1, err)
		}
		out = append(out, e)
	}
}

func sortBySeq(es []LedgerEntry) {
	slices.SortFunc(es, func(a, b LedgerEntry) int { return int(a.Seq - b.Seq) })
}
