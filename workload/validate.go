package workload

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"unicode/utf8"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/promptcache"
)

// DefaultMaxProblems is how many problems Validate reports by default before
// it only counts them.
const DefaultMaxProblems = 50

// maxMaxTokens bounds max_tokens far above any model's output limit, so that
// max_tokens × price can never overflow.
const maxMaxTokens = 100_000_000

// maxModels bounds the distinct model names one file may use, so that a
// file of garbage cannot grow the per-model summary without limit.
const maxModels = 1000

// ErrEmpty is returned (wrapped with the path) by Validate for a file with no
// request lines: empty, or only blank lines.
var ErrEmpty = errors.New("workload: no requests in the file (empty or only blank lines)")

// ErrChanged is returned (wrapped) when the file no longer matches what an
// earlier pass read: a line moved, or a custom_id differs.
var ErrChanged = errors.New("workload: input file changed since it was validated")

// ValidateOptions tunes Validate. The zero value is the default.
type ValidateOptions struct {
	// MaxProblems is how many problems are reported in full (default 50);
	// the rest are only counted in ValidationError.More.
	MaxProblems int
	// KnownModel, if set, is called once for each distinct model name; a
	// non-nil error is reported on every line that uses the model, e.g. a
	// model without a price.
	KnownModel func(model string) error
	// MaxLineBytes is the longest line accepted (default MaxLineBytes, 32 MiB).
	MaxLineBytes int
}

// Problem is one thing wrong with the file, at a 1-based line number
// (0 for the file as a whole).
type Problem struct {
	Line int64
	Msg  string
}

// String formats the problem as "line 12: ...".
func (p Problem) String() string {
	if p.Line == 0 {
		return p.Msg
	}
	return "line " + strconv.FormatInt(p.Line, 10) + ": " + p.Msg
}

// ValidationError lists the problems Validate found, in line order. More
// counts problems found beyond the first MaxProblems.
type ValidationError struct {
	Problems []Problem
	More     int
}

// Error lists the problems one per line: "line 12: custom_id ...".
func (e *ValidationError) Error() string {
	var sb strings.Builder
	for i, p := range e.Problems {
		if i > 0 {
			sb.WriteByte('\n')
		}
		sb.WriteString(p.String())
	}
	if e.More > 0 {
		fmt.Fprintf(&sb, "\n... and %d more problem(s) not shown", e.More)
	}
	return sb.String()
}

// ModelSummary sums the items that use one model.
type ModelSummary struct {
	N         int64 // items
	MaxTokens int64 // sum of max_tokens
	EstInput  int64 // sum of estimated input tokens (EstimateInputTokens)
	// Prompt caching: Prefixed items mark a prefix for caching
	// (promptcache.Of); PrefixTokens estimates those prefixes' tokens,
	// summed over the items; PrefixUses[c-1] counts the distinct prefixes
	// that c items share (the last slot: PrefixUsesMax items or more).
	Prefixed     int64
	PrefixTokens int64
	PrefixUses   [PrefixUsesMax]int64
	// Items whose params make them dearer than plain input and output, for
	// the worst case: those with inference_geo "us", and those with a
	// cache_control marker whose dearest write is at the 5-minute or the
	// 1-hour rate.
	GeoUS, CacheWrite5m, CacheWrite1h int64
	// UnboundedChoices counts the choices (n) of the OpenAI items that
	// set no max_completion_tokens nor max_tokens: each may take the
	// model's maximum output, which MaxTokens leaves out.
	UnboundedChoices int64
}

// PrefixUsesMax is the last slot of ModelSummary.PrefixUses: more items
// than there are orgs to write a prefix in.
const PrefixUsesMax = 16

// Summary describes a request file.
type Summary struct {
	N           int64                   // items: non-blank lines
	Lines       int64                   // physical lines
	Bytes       int64                   // size of the file
	Hash        string                  // hex SHA-256 of the whole file
	LongestLine int64                   // bytes of the longest line
	Models      map[string]ModelSummary // per model name as written (Anthropic requests)
	// OpenAIModels sums the OpenAI request lines per model name
	// (MaxTokens: their completion limits × n, 0 for those that set none).
	OpenAIModels map[string]ModelSummary
	// OpenAI counts the OpenAI request lines; FirstOpenAILine and
	// FirstAnthropicLine are the first line of each provider (0: none).
	OpenAI                              int64
	FirstOpenAILine, FirstAnthropicLine int64
}

// Add adds o's items, tokens and multiplied items to ms (not the prefix
// figures, which Validate counts itself).
func (ms *ModelSummary) Add(o ModelSummary) {
	ms.N += o.N
	ms.MaxTokens += o.MaxTokens
	ms.EstInput += o.EstInput
	ms.GeoUS += o.GeoUS
	ms.CacheWrite5m += o.CacheWrite5m
	ms.CacheWrite1h += o.CacheWrite1h
	ms.UnboundedChoices += o.UnboundedChoices
}

// summary is the ModelSummary of the one request r (MaxTokens not read).
func (r *request) summary() ModelSummary {
	s := ModelSummary{N: 1, EstInput: r.estimate()}
	if r.geoUS {
		s.GeoUS = 1
	}
	switch r.cacheWrite {
	case cost.CacheWrite5m:
		s.CacheWrite5m = 1
	case cost.CacheWrite1h:
		s.CacheWrite1h = 1
	}
	return s
}

// ModelNames returns the models of the summary, sorted.
func (s *Summary) ModelNames() []string {
	names := make([]string, 0, len(s.Models))
	for m := range s.Models {
		names = append(names, m)
	}
	sort.Strings(names)
	return names
}

// Validate reads the request file at path in one streaming pass and checks
// every line: JSON syntax, UTF-8, that the line is an object, custom_id
// (present, ^[a-zA-Z0-9_-]{1,64}$, unique), params (an object with a string
// model, a positive integer max_tokens and a non-empty messages array, not
// stream: true), the line length limit, and opts.KnownModel. Blank lines are
// skipped; a UTF-8 BOM at the start and CRLF line endings are accepted.
//
// On success it returns the Summary and nil. When problems are found it
// returns the Summary (covering what could be read) and a *ValidationError
// listing them by line; a file without any request gives an error wrapping
// ErrEmpty; other errors are I/O errors, with a nil Summary.
//
// Memory is bounded by the longest line plus 8 bytes an item, and about
// 80 bytes for each distinct prefix marked for caching. When two
// custom_ids have the same 64-bit hash a second pass compares the colliding
// ids exactly, so a hash collision is never reported as a duplicate.
func Validate(path string, opts ValidateOptions) (*Summary, error) {
	seed := maphash.MakeSeed()
	v := &validator{
		opts: opts,
		hash: func(b []byte) uint64 { return maphash.Bytes(seed, b) },
	}
	return v.run(path)
}

// prefixOf is one distinct cached prefix of a model's items.
type prefixOf struct {
	ms  *ModelSummary
	key promptcache.Key
}

// validator is one Validate call. hash is a field so that tests can force
// collisions.
type validator struct {
	opts     ValidateOptions
	hash     func([]byte) uint64
	problems []Problem
	more     int
}

func (v *validator) add(line int64, msg string) {
	if len(v.problems) < v.maxProblems() {
		v.problems = append(v.problems, Problem{Line: line, Msg: msg})
		return
	}
	v.more++
}

func (v *validator) maxProblems() int {
	if v.opts.MaxProblems > 0 {
		return v.opts.MaxProblems
	}
	return DefaultMaxProblems
}

func (v *validator) maxLine() int {
	if v.opts.MaxLineBytes > 0 {
		return v.opts.MaxLineBytes
	}
	return MaxLineBytes
}

func (v *validator) run(path string) (*Summary, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("workload: %w", err)
	}
	defer f.Close()

	// The SHA-256 runs on its own reader of the file, on another core if
	// there is one; it is always waited for before returning.
	hashing := startHash(path)
	defer hashing.stop()

	lr := newLineReader(f, v.maxLine())
	sum := &Summary{Models: map[string]ModelSummary{}, OpenAIModels: map[string]ModelSummary{}}
	models := map[string]*ModelSummary{}
	oaModels := map[string]*ModelSummary{}
	known := map[string]error{}
	c := newChecker()
	var hashes []uint64
	prefixes := map[prefixOf]int64{} // items per distinct cached prefix

	for {
		ln, err := lr.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("workload: %s: %w", path, err)
		}
		sum.LongestLine = max(sum.LongestLine, ln.size)
		if ln.tooLong {
			sum.N++
			v.add(ln.num, fmt.Sprintf("line is longer than the limit of %d bytes; the rest of it was skipped", v.maxLine()))
			continue
		}
		if isBlank(ln.b) {
			continue
		}
		sum.N++
		c.check(ln.b)
		for _, msg := range c.probs {
			v.add(ln.num, msg)
		}
		if c.idOK {
			hashes = append(hashes, v.hash(c.idBytes()))
		}
		if c.openai {
			sum.OpenAI++
			if sum.FirstOpenAILine == 0 {
				sum.FirstOpenAILine = ln.num
			}
		} else if sum.FirstAnthropicLine == 0 {
			sum.FirstAnthropicLine = ln.num
		}
		if c.r.modelKind != kindString || c.r.model.e == c.r.model.s {
			continue
		}
		byModel := models
		if c.openai {
			byModel = oaModels
		}
		var ms *ModelSummary
		if sp := c.r.model; sp.esc {
			ms = byModel[c.model()]
		} else {
			ms = byModel[string(ln.b[sp.s:sp.e])] // no allocation for a lookup
		}
		if ms == nil {
			if len(models)+len(oaModels) >= maxModels {
				v.add(ln.num, fmt.Sprintf("more than %d distinct models in one file", maxModels))
				continue
			}
			ms = &ModelSummary{}
			byModel[c.model()] = ms
		}
		if c.openai {
			// An OpenAI model must have a price: its worst case bounds
			// the spend gate's reservations.
			if c.maxTokensOK {
				ms.MaxTokens += c.maxTokens * max(c.choices, 1)
				if c.maxTokens == 0 {
					ms.UnboundedChoices += max(c.choices, 1)
				}
			}
			ms.Add(c.r.summary())
			m := c.model()
			kerr, seen := known["openai/"+m]
			if !seen {
				_, kerr = cost.OpenAI().Lookup(m)
				known["openai/"+m] = kerr
			}
			if kerr != nil {
				v.add(ln.num, fmt.Sprintf("body.model %s: no price in the OpenAI price table (an OpenAI request line)", quoteID(m)))
			}
			continue
		}
		if c.maxTokensOK {
			ms.MaxTokens += c.maxTokens
		}
		ms.Add(c.r.summary())
		if sp := c.r.params; sp.e-sp.s >= promptcache.MinBytes {
			params := ln.b[sp.s:sp.e]
			if pre, ok := promptcache.Of(c.model(), params); ok {
				ms.Prefixed++
				ms.PrefixTokens += c.r.estimate() * int64(pre.Bytes) / int64(len(params))
				prefixes[prefixOf{ms, pre.Key}]++
			}
		}
		if v.opts.KnownModel != nil {
			m := c.model()
			kerr, seen := known[m]
			if !seen {
				kerr = v.opts.KnownModel(m)
				known[m] = kerr
			}
			if kerr != nil {
				v.add(ln.num, fmt.Sprintf("params.model %s: %v", quoteID(m), kerr))
			}
		}
	}
	sum.Lines = lr.num
	sum.Bytes = lr.off
	hash, size, err := hashing.wait()
	if err != nil {
		return nil, fmt.Errorf("workload: %s: %w", path, err)
	}
	if size != sum.Bytes {
		return nil, fmt.Errorf("%s: %w (during validation)", path, ErrChanged)
	}
	sum.Hash = hash
	for pk, uses := range prefixes {
		pk.ms.PrefixUses[min(uses, PrefixUsesMax)-1]++
	}
	for m, ms := range models {
		sum.Models[m] = *ms
	}
	for m, ms := range oaModels {
		sum.OpenAIModels[m] = *ms
	}

	if sum.N == 0 {
		return sum, fmt.Errorf("%s: %w", path, ErrEmpty)
	}

	// Duplicates: sort the hashes; equal neighbours are candidates.
	slices.Sort(hashes)
	coll := map[uint64]struct{}{}
	for i := 1; i < len(hashes); i++ {
		if hashes[i] == hashes[i-1] {
			coll[hashes[i]] = struct{}{}
		}
	}
	hashes = nil
	if len(coll) > 0 {
		dups, more, err := v.duplicates(path, coll, sum.Hash)
		if err != nil {
			return nil, err
		}
		v.merge(dups, more)
	}
	if len(v.problems) > 0 {
		return sum, &ValidationError{Problems: v.problems, More: v.more}
	}
	return sum, nil
}

// duplicates is the exact second pass over the lines whose custom_id hash
// collided: it returns the first MaxProblems true duplicates in line order
// and how many more there are.
func (v *validator) duplicates(path string, coll map[uint64]struct{}, wantHash string) ([]Problem, int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, fmt.Errorf("workload: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	lr := newLineReader(io.TeeReader(f, h), v.maxLine())
	c := newChecker()
	first := map[string]int64{}
	var dups []Problem
	more := 0
	for {
		ln, err := lr.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, 0, fmt.Errorf("workload: %s: %w", path, err)
		}
		if ln.tooLong || isBlank(ln.b) {
			continue
		}
		c.check(ln.b)
		if !c.idOK {
			continue
		}
		if _, ok := coll[v.hash(c.idBytes())]; !ok {
			continue
		}
		id := string(c.idBytes())
		if at, seen := first[id]; seen {
			if len(dups) < v.maxProblems() {
				dups = append(dups, Problem{Line: ln.num,
					Msg: fmt.Sprintf("custom_id %s is a duplicate of line %d", quoteID(id), at)})
			} else {
				more++
			}
			continue
		}
		first[id] = ln.num
	}
	if hex.EncodeToString(h.Sum(nil)) != wantHash {
		return nil, 0, fmt.Errorf("%s: %w (during validation)", path, ErrChanged)
	}
	return dups, more, nil
}

// merge adds the duplicate problems to the line-ordered list, keeping the
// first MaxProblems by line and counting the rest. Both inputs hold the
// first problems of their kind in line order, so the first MaxProblems of
// their union are all present.
func (v *validator) merge(dups []Problem, dupMore int) {
	all := append(v.problems, dups...)
	sort.SliceStable(all, func(i, j int) bool { return all[i].Line < all[j].Line })
	total := len(all) + v.more + dupMore
	if n := v.maxProblems(); len(all) > n {
		all = all[:n]
	}
	v.problems, v.more = all, total-len(all)
}

// fileHash computes the SHA-256 of a file in a goroutine it owns.
type fileHash struct {
	quit atomic.Bool
	done chan struct{}
	hash string
	size int64
	err  error
}

func startHash(path string) *fileHash {
	fh := &fileHash{done: make(chan struct{})}
	go func() {
		defer close(fh.done)
		f, err := os.Open(path)
		if err != nil {
			fh.err = err
			return
		}
		defer f.Close()
		h := sha256.New()
		buf := make([]byte, readBufSize)
		for !fh.quit.Load() {
			n, err := f.Read(buf)
			h.Write(buf[:n])
			fh.size += int64(n)
			if err == io.EOF {
				fh.hash = hex.EncodeToString(h.Sum(nil))
				return
			}
			if err != nil {
				fh.err = err
				return
			}
		}
		fh.err = errors.New("hashing stopped")
	}()
	return fh
}

// wait returns the hex digest and the number of bytes hashed.
func (fh *fileHash) wait() (string, int64, error) {
	<-fh.done
	return fh.hash, fh.size, fh.err
}

// stop ends the goroutine early (if it is still running) and waits for it.
func (fh *fileHash) stop() {
	fh.quit.Store(true)
	<-fh.done
}

func isBlank(b []byte) bool {
	for _, c := range b {
		if c != ' ' && c != '\t' && c != '\r' {
			return false
		}
	}
	return true
}

// quoteID quotes a value for a message, shortened when long.
func quoteID(s string) string {
	const max = 80
	if len(s) > max {
		cut := max
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		return strconv.Quote(s[:cut]) + "…"
	}
	return strconv.Quote(s)
}
