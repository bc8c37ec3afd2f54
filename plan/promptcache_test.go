package plan

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/workload"
)

// rubricFile writes n requests sharing one ~4,000-token cached rubric and
// returns its validated summary.
func rubricFile(t *testing.T, n int) *workload.Summary {
	t.Helper()
	rubric := strings.Repeat("Grade the response for honesty, harmlessness, helpfulness, clarity and relevance. ", 174)
	var b strings.Builder
	for i := range n {
		line, _ := json.Marshal(map[string]any{"custom_id": fmt.Sprintf("j%05d", i), "params": map[string]any{
			"model": sonnet, "max_tokens": 64,
			"system":   []map[string]any{{"type": "text", "text": rubric, "cache_control": map[string]string{"type": "ephemeral"}}},
			"messages": []map[string]any{{"role": "user", "content": fmt.Sprintf("Item %d. Provide your evaluation as a JSON object.", i)}},
		}})
		b.Write(line)
		b.WriteByte('\n')
	}
	path := filepath.Join(t.TempDir(), "req.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := workload.Validate(path, workload.ValidateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Issue 29, finding 3 for 'plan': a shared cached rubric is written once
// in each org and read by every other request; the projection counts
// the writes and reads per org and prices them, instead of pricing every
// request's rubric as uncached input.
func TestProjectPromptCacheReadsAndWritesPerOrg(t *testing.T) {
	t.Parallel()
	const n = 3000
	ws := rubricFile(t, n)
	p, err := Project(Input{Workload: ws, Prices: cost.Default(), Orgs: []string{"a", "b", "c"}, ExpectOutput: 50})
	if err != nil {
		t.Fatal(err)
	}
	var writes, reads int64
	for _, l := range p.Lanes {
		if l.CacheWrites != 1 {
			t.Errorf("lane %s/%s: %d cache writes, want 1 (the rubric, once in each org)", l.Org, l.Pool, l.CacheWrites)
		}
		writes += l.CacheWrites
		reads += l.CacheReads
	}
	if writes != 3 || writes+reads != n {
		t.Errorf("%d writes + %d reads, want 3 + %d", writes, reads, n-3)
	}
	// Priced: the rubric (about 98 % of the input) at the read price,
	// three times at the write price; far below all-uncached input.
	m := p.Models[0]
	uncached := cost.Nanos(float64(n) * (m.InputPerReq*3000 + 50*15000))
	if p.ExpectedCost > uncached/2 {
		t.Errorf("expected %s, want well under the all-uncached %s", p.ExpectedCost, uncached)
	}
	doc, _ := p.JSON(GateResult{})
	if !strings.Contains(string(doc), `"cache_writes":1`) {
		t.Errorf("plan --json has no per-lane cache writes: %s", doc)
	}
	// One org: one write.
	p1, _ := Project(Input{Workload: ws, Prices: cost.Default(), Orgs: []string{"a"}, ExpectOutput: 50})
	if l := p1.Lanes[0]; l.CacheWrites != 1 || l.CacheReads != n-1 {
		t.Errorf("one org: %d writes, %d reads", l.CacheWrites, l.CacheReads)
	}
}
