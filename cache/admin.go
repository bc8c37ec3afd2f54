package cache

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"io"
	"os"
	"time"
)

// Stats describes a cache file.
type Stats struct {
	Path    string           `json:"path"`
	Format  int              `json:"format"`
	Entries int64            `json:"entries"`
	ByModel map[string]int64 `json:"by_model"`
	// ByOrigin counts entries by the API that answered them: its origin,
	// "sim:" before a simulator's, "unknown" for entries stored before
	// origins were recorded (they answer no run).
	ByOrigin map[string]int64 `json:"by_origin"`
	// BodyBytes is the sum of the stored response bodies; FileBytes the
	// file on disk (with its WAL).
	BodyBytes int64 `json:"body_bytes"`
	FileBytes int64 `json:"file_bytes"`
	// CostUSD is what the stored requests cost when they were sent: what
	// each hit on them saves.
	CostUSD float64    `json:"cost_usd"`
	Oldest  *time.Time `json:"oldest,omitempty"`
	Newest  *time.Time `json:"newest,omitempty"`
}

// Stats reads the file's figures.
func (c *Cache) Stats(ctx context.Context) (Stats, error) {
	s := Stats{Path: c.path, Format: Format, ByModel: map[string]int64{}, ByOrigin: map[string]int64{}}
	orows, err := c.db.QueryContext(ctx, `SELECT origin, simulated, count(*) FROM entries GROUP BY origin, simulated`)
	if err != nil {
		return s, c.errorf(err, "stats")
	}
	for orows.Next() {
		var origin string
		var sim bool
		var n int64
		if err := orows.Scan(&origin, &sim, &n); err != nil {
			orows.Close()
			return s, c.errorf(err, "stats")
		}
		s.ByOrigin[OriginLabel(origin, sim)] += n
	}
	err = orows.Err()
	orows.Close()
	if err != nil {
		return s, c.errorf(err, "stats")
	}
	rows, err := c.db.QueryContext(ctx, `SELECT model, count(*), coalesce(sum(length(body)), 0), coalesce(sum(cost_nanos), 0), min(created_ms), max(created_ms) FROM entries GROUP BY model`)
	if err != nil {
		return s, c.errorf(err, "stats")
	}
	defer rows.Close()
	var costN int64
	for rows.Next() {
		var model string
		var n, b, cn, lo, hi int64
		if err := rows.Scan(&model, &n, &b, &cn, &lo, &hi); err != nil {
			return s, c.errorf(err, "stats")
		}
		s.ByModel[model] = n
		s.Entries += n
		s.BodyBytes += b
		costN += cn
		tlo, thi := time.UnixMilli(lo).UTC(), time.UnixMilli(hi).UTC()
		if s.Oldest == nil || tlo.Before(*s.Oldest) {
			s.Oldest = &tlo
		}
		if s.Newest == nil || thi.After(*s.Newest) {
			s.Newest = &thi
		}
	}
	if err := rows.Err(); err != nil {
		return s, c.errorf(err, "stats")
	}
	s.CostUSD = float64(costN) / 1e9
	for _, p := range []string{c.path, c.path + "-wal"} {
		if fi, err := os.Stat(p); err == nil {
			s.FileBytes += fi.Size()
		}
	}
	return s, nil
}

// OriginLabel is how stats and export name an entry's origin: the origin,
// "sim:" and the origin for a simulator's answer, "unknown" when it was
// not recorded.
func OriginLabel(origin string, simulated bool) string {
	switch {
	case origin == OriginUnknown:
		return "unknown"
	case simulated:
		return "sim:" + origin
	}
	return origin
}

// exported is one line of Export.
type exported struct {
	Key        string          `json:"key"`
	Model      string          `json:"model"`
	Origin     string          `json:"origin"`
	Simulated  bool            `json:"simulated"`
	Org        string          `json:"org"`
	RequestID  string          `json:"request_id"`
	CostUSD    float64         `json:"cost_usd"`
	InputTok   int64           `json:"input_tokens"`
	OutputTok  int64           `json:"output_tokens"`
	CacheRead  int64           `json:"cache_read_input_tokens"`
	CacheWrite int64           `json:"cache_creation_input_tokens"`
	CreatedAt  time.Time       `json:"created_at"`
	Response   json.RawMessage `json:"response,omitempty"`
	// Damaged is set, and Response left out, for an entry whose body fails
	// its checksum.
	Damaged bool `json:"damaged,omitempty"`
}

// Export writes every entry as one JSON line, oldest first, streaming.
// It returns how many it wrote.
func (c *Cache) Export(ctx context.Context, w io.Writer) (int64, error) {
	rows, err := c.db.QueryContext(ctx, `SELECT key, origin, simulated, model, body, body_sum, cost_nanos, input_tok, output_tok, cache_read, cache_write, org, request_id, created_ms FROM entries ORDER BY created_ms, key, origin`)
	if err != nil {
		return 0, c.errorf(err, "export")
	}
	defer rows.Close()
	bw := bufio.NewWriterSize(w, 256<<10)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	var n int64
	for rows.Next() {
		var k, body, sum []byte
		var e exported
		var cn, ms int64
		if err := rows.Scan(&k, &e.Origin, &e.Simulated, &e.Model, &body, &sum, &cn, &e.InputTok, &e.OutputTok, &e.CacheRead, &e.CacheWrite, &e.Org, &e.RequestID, &ms); err != nil {
			return n, c.errorf(err, "export")
		}
		var key Key
		copy(key[:], k)
		e.Key, e.CostUSD, e.CreatedAt = key.String(), float64(cn)/1e9, time.UnixMilli(ms).UTC()
		got := sha256.Sum256(body)
		var buf bytes.Buffer
		if !bytes.Equal(got[:], sum) || json.Compact(&buf, body) != nil {
			e.Damaged = true
		} else {
			e.Response = buf.Bytes()
		}
		if err := enc.Encode(e); err != nil {
			return n, err
		}
		n++
	}
	if err := rows.Err(); err != nil {
		return n, c.errorf(err, "export")
	}
	return n, bw.Flush()
}

// Prune deletes the entries stored before cutoff and returns how many.
func (c *Cache) Prune(ctx context.Context, cutoff time.Time) (int64, error) {
	r, err := c.db.ExecContext(ctx, `DELETE FROM entries WHERE created_ms < ?`, cutoff.UnixMilli())
	if err != nil {
		return 0, c.errorf(err, "prune")
	}
	n, _ := r.RowsAffected()
	return n, nil
}

// Mode says whether a run reads the cache, writes it, both, or neither.
type Mode string

// Modes of --cache-mode.
const (
	ModeReadWrite Mode = "readwrite"
	ModeRead      Mode = "read"
	ModeWrite     Mode = "write"
	ModeOff       Mode = "off"
)

// ParseMode reads a --cache-mode value; "" is readwrite.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case "":
		return ModeReadWrite, nil
	case ModeReadWrite, ModeRead, ModeWrite, ModeOff:
		return m, nil
	}
	return "", &ModeError{s}
}

// ModeError is an unknown --cache-mode.
type ModeError struct{ Value string }

func (e *ModeError) Error() string {
	return "cache: mode " + e.Value + " is not read, write, readwrite or off"
}

// Reads reports whether hits are answered from the cache.
func (m Mode) Reads() bool { return m == ModeReadWrite || m == ModeRead }

// Writes reports whether successes are stored.
func (m Mode) Writes() bool { return m == ModeReadWrite || m == ModeWrite }
