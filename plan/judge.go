package plan

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"hash"
	"runtime"
	"sync"

	"github.com/apidispatch/apidispatch/workload"
)

// Phase 6 (docs/design.md §25): the judge workload, sent once by each arm of the A/B.
const (
	Phase6N    = 141_600
	Phase6Arms = 2
)

// errNotRequest: a generated line is not {"custom_id":…,"params":{…}}.
var errNotRequest = errors.New("plan: a generated judge line is not a request line")

// JudgeSummary returns the workload.Summary of the judge workload that
// workload.GenerateJudge(n, seed, opts) would write, without writing it
// anywhere: the lines are generated in memory, summed (on every CPU) and
// dropped, so the Phase 6 shape (141,600 lines, ~200 MB) is planned in
// about a second (BenchmarkJudgeSummary) with no disk. It equals
// workload.Validate's summary of the generated file.
func JudgeSummary(n int, seed int64, opts workload.GenOptions) (*workload.Summary, error) {
	model, maxTok := opts.Model, int64(opts.MaxTokens)
	if model == "" {
		model = workload.DefaultModel
	}
	if maxTok == 0 {
		maxTok = workload.DefaultMaxTokens
	}
	s := &lineSummer{h: sha256.New(), chunks: make(chan []byte, 4)}
	workers := max(1, runtime.GOMAXPROCS(0))
	parts := make([]chunkSum, workers)
	var wg sync.WaitGroup
	for i := range workers {
		wg.Go(func() {
			for c := range s.chunks {
				parts[i].add(c)
			}
		})
	}
	genErr := workload.GenerateJudge(s, n, seed, opts)
	if genErr == nil && len(s.rest) > 0 {
		s.chunks <- s.rest
	}
	close(s.chunks)
	wg.Wait()
	if genErr != nil {
		return nil, genErr
	}
	var tot chunkSum
	for _, p := range parts {
		if p.bad {
			return nil, errNotRequest
		}
		tot.ms.Add(p.ms)
		tot.longest = max(tot.longest, p.longest)
	}
	total := tot.ms.N
	sum := &workload.Summary{
		N: total, Lines: total, Bytes: s.bytes, Hash: hex.EncodeToString(s.h.Sum(nil)),
		LongestLine: tot.longest, Models: map[string]workload.ModelSummary{}, OpenAIModels: map[string]workload.ModelSummary{},
	}
	if total > 0 {
		tot.ms.MaxTokens = total * maxTok
		sum.Models[model] = tot.ms
		sum.FirstAnthropicLine = 1 // every line is an Anthropic request
	}
	return sum, nil
}

// lineSummer is the io.Writer GenerateJudge writes to: it hashes the
// stream and hands runs of whole lines to the summing workers.
type lineSummer struct {
	h      hash.Hash
	bytes  int64
	rest   []byte // a partial line carried to the next Write
	chunks chan []byte
}

func (s *lineSummer) Write(b []byte) (int, error) {
	s.h.Write(b)
	s.bytes += int64(len(b))
	i := bytes.LastIndexByte(b, '\n')
	if i < 0 {
		s.rest = append(s.rest, b...)
		return len(b), nil
	}
	c := make([]byte, 0, len(s.rest)+i+1)
	c = append(append(c, s.rest...), b[:i+1]...)
	s.chunks <- c
	s.rest = append(s.rest[:0:0], b[i+1:]...)
	return len(b), nil
}

// chunkSum sums the lines of the chunks one worker saw.
type chunkSum struct {
	ms      workload.ModelSummary // MaxTokens not summed
	longest int64
	bad     bool
}

var paramsKey = []byte(`,"params":`)

func (c *chunkSum) add(b []byte) {
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		line := b
		if i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		// GenerateJudge writes {"custom_id":"…","params":{…}}: the params
		// object runs from after its key to the line's closing brace.
		k := bytes.Index(line, paramsKey)
		if k < 0 || len(line) < k+len(paramsKey)+2 || line[len(line)-1] != '}' {
			c.bad = true
			continue
		}
		c.longest = max(c.longest, int64(len(line)))
		c.ms.Add(workload.ItemSummary(line[k+len(paramsKey) : len(line)-1]))
	}
}
