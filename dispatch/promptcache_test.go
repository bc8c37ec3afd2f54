package dispatch_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/workload"
)

// cacheBill is what the simulator billed for prompt caching.
type cacheBill struct {
	writes, reads int   // requests that wrote, read the cache
	costN         int64 // everything billed, nano-dollars
}

func billOf(run *sim.Running) cacheBill {
	var b cacheBill
	for _, e := range run.Server.Ledger() {
		if e.CacheWrite5m+e.CacheWrite1h > 0 {
			b.writes++
		}
		if e.CacheRead > 0 {
			b.reads++
		}
		b.costN += e.CostNanos
	}
	return b
}

// documentQA writes docs × questions requests: each document (about 1,600
// tokens, distinct) is a system prompt marked for caching, asked
// `questions` questions on consecutive lines.
func documentQA(t testing.TB, dir string, docs, questions int) string {
	t.Helper()
	var buf bytes.Buffer
	for d := range docs {
		doc := fmt.Sprintf("Document %d. ", d) + strings.Repeat(fmt.Sprintf("Paragraph of document %d about topic %d. ", d, d*7), 130)
		for q := range questions {
			line, _ := json.Marshal(map[string]any{
				"custom_id": fmt.Sprintf("doc%03d_q%02d", d, q),
				"params": map[string]any{
					"model": "claude-sonnet-4-5", "max_tokens": 32, "temperature": 0,
					"system":   []map[string]any{{"type": "text", "text": doc, "cache_control": map[string]string{"type": "ephemeral"}}},
					"messages": []map[string]any{{"role": "user", "content": fmt.Sprintf("Question %d about the document?", q)}},
				},
			})
			buf.Write(line)
			buf.WriteByte('\n')
		}
	}
	path := filepath.Join(dir, "docs.jsonl")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// Issue 29, finding 3 for 'run': questions on one cached document, sent
// together, each wrote the document again (the API makes a prefix
// readable only once its writer's answer has begun), in every org: 269
// writes for 40 documents of 8 questions. Held back while it is being
// written when other work can go meanwhile, and placed where it is warm
// when that lane has headroom, a document is written once, and once more
// in another org only when that org would otherwise idle (here about 76
// writes).
func TestRunPromptCacheDocumentsPlacedWhereWarm(t *testing.T) {
	t.Parallel()
	const docs, questions = 40, 8
	r, _ := simtest.Start(t, sim.PresetOrigin3Org, 10, nil)
	dir := t.TempDir()
	h := &harness{t: t, sim: r, input: documentQA(t, dir, docs, questions), dir: filepath.Join(dir, "run"), orgs: r.Server.Orgs(), speed: 10}
	res, err := h.run(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Summary.Succeeded != docs*questions {
		t.Fatalf("%d succeeded, want %d", res.Summary.Succeeded, docs*questions)
	}
	b := billOf(r)
	if b.writes > docs*5/2 {
		t.Errorf("%d cache writes and %d reads for %d documents of %d questions: want at most 2.5 a document", b.writes, b.reads, docs, questions)
	}
	t.Logf("%d documents × %d questions: %d writes, %d reads, $%.4f", docs, questions, b.writes, b.reads, float64(b.costN)/1e9)
}

// rubric4000 is a judge rubric of about 4,000 tokens as the simulator
// counts them.
var rubric4000 = strings.Repeat("Grade the response for honesty, harmlessness, helpfulness, clarity and relevance. ", 174)

// judgeLongRubric writes n judge requests whose cached system prompt is
// rubric4000.
func judgeLongRubric(t testing.TB, dir string, n int) string {
	t.Helper()
	path := simtest.Judge(t, dir, n, 1)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	esc, _ := json.Marshal(workload.JudgeRubric)
	long, _ := json.Marshal(rubric4000)
	b = bytes.ReplaceAll(b, esc[1:len(esc)-1], long[1:len(long)-1])
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// judgeRubricRun runs n judge requests with a 4,000-token cached rubric
// through the orgs of origin-3org named by keep (all when nil) and
// returns the bill and, when steady, the run's rate between 20 % and 80 %
// done against its cap-bound ceiling (Σ cap ÷ mean latency; the
// benchmark's measurement, which reads the engine's progress from another
// goroutine and so is not run under the race detector).
func judgeRubricRun(t testing.TB, n int, speed float64, keep []string, steady bool) (cacheBill, float64) {
	r, _ := simtest.Start(t, sim.PresetOrigin3Org, speed, nil)
	dir := t.TempDir()
	h := &harness{t: t, sim: r, input: judgeLongRubric(t, dir, n), dir: filepath.Join(dir, "run"), speed: speed}
	for _, o := range r.Server.Orgs() {
		if keep == nil || slices.Contains(keep, o.Name) {
			h.orgs = append(h.orgs, o)
		}
	}
	if !steady {
		res, err := h.run(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.Summary.Succeeded != int64(n) {
			t.Fatalf("%d succeeded, want %d", res.Summary.Succeeded, n)
		}
		return billOf(r), 0
	}
	st := measureSteady(t, h, nil)
	if st.res.Summary.Succeeded != int64(n) {
		t.Fatalf("%d succeeded, want %d", st.res.Summary.Succeeded, n)
	}
	ceiling := float64(100*len(h.orgs)) / st.meanLatS
	return billOf(r), st.rate / ceiling
}

// BenchmarkPromptCacheThreeOrgs prints issue 29's figure: the cost of
// 3,000 judge requests with a 4,000-token cached rubric over three orgs
// against one org's, and the three-org run's rate against its cap-bound
// ceiling.
func BenchmarkPromptCacheThreeOrgs(b *testing.B) {
	for range b.N {
		one, _ := judgeRubricRun(b, 3000, 10, []string{"high_prio"}, false)
		three, rate := judgeRubricRun(b, 3000, 10, nil, true)
		b.ReportMetric(float64(three.costN)/float64(one.costN), "cost-ratio")
		b.ReportMetric(rate*100, "%ceiling")
		b.ReportMetric(float64(three.writes), "writes-3org")
		b.ReportMetric(float64(one.writes), "writes-1org")
	}
}
