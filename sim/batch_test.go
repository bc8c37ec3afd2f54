package sim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/cost"
)

// batchConfig is testConfig at speed 1000 (the default 4 min queue wait is
// 240 ms, 2,000 requests per API minute are 33 per real millisecond), plus a
// second org "other" with its own key.
func batchConfig() Config {
	cfg := testConfig()
	cfg.Speed = 1000
	cfg.Orgs = append(cfg.Orgs, OrgConfig{Name: "other", Keys: []string{otherKey},
		Limits: map[anthropic.Pool]Limits{AnyPool: {RPM: 600, ITPM: 60000, OTPM: 30000}}})
	return cfg
}

const otherKey = "sk-ant-sim-other-test"

// batchReq is one request of a create body.
type batchReq struct {
	CustomID string          `json:"custom_id"`
	Params   json.RawMessage `json:"params"`
}

func createBody(reqs ...batchReq) []byte {
	b, err := json.Marshal(map[string]any{"requests": reqs})
	if err != nil {
		panic(err)
	}
	return b
}

// judgeBatch is n judge requests with custom_ids prefix-0 … prefix-(n-1).
func judgeBatch(prefix string, n int) []batchReq {
	reqs := make([]batchReq, n)
	for i := range reqs {
		reqs[i] = batchReq{CustomID: fmt.Sprintf("%s-%d", prefix, i), Params: judgeBody(i, 256)}
	}
	return reqs
}

const batchesPath = "/v1/messages/batches"

// wireBatch is the message_batch object as the tests read it.
type wireBatch struct {
	ID               string `json:"id"`
	Type             string `json:"type"`
	ProcessingStatus string `json:"processing_status"`
	RequestCounts    struct {
		Processing int64 `json:"processing"`
		Succeeded  int64 `json:"succeeded"`
		Errored    int64 `json:"errored"`
		Canceled   int64 `json:"canceled"`
		Expired    int64 `json:"expired"`
	} `json:"request_counts"`
	CreatedAt         *time.Time `json:"created_at"`
	EndedAt           *time.Time `json:"ended_at"`
	ExpiresAt         *time.Time `json:"expires_at"`
	CancelInitiatedAt *time.Time `json:"cancel_initiated_at"`
	ArchivedAt        *time.Time `json:"archived_at"`
	ResultsURL        *string    `json:"results_url"`
}

func (r reply) batch(t testing.TB) wireBatch {
	t.Helper()
	if r.err != nil || r.status != 200 {
		t.Fatalf("status %d err %v: %s", r.status, r.err, r.body)
	}
	var b wireBatch
	if err := json.Unmarshal(r.body, &b); err != nil {
		t.Fatalf("not a batch: %v: %s", err, r.body)
	}
	return b
}

func createBatchT(t testing.TB, run *Running, key string, reqs ...batchReq) wireBatch {
	t.Helper()
	return do(t, http.MethodPost, run.URL+batchesPath, key, createBody(reqs...)).batch(t)
}

// waitEnded polls until the batch has ended.
func waitEnded(t testing.TB, run *Running, key, id string) wireBatch {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		b := do(t, http.MethodGet, run.URL+batchesPath+"/"+id, key, nil).batch(t)
		if b.ProcessingStatus == "ended" {
			return b
		}
		if time.Now().After(deadline) {
			t.Fatalf("batch %s still %s", id, b.ProcessingStatus)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// resultLine is one line of a results stream.
type resultLine struct {
	CustomID string `json:"custom_id"`
	Result   struct {
		Type    string                   `json:"type"`
		Message *anthropic.Message       `json:"message"`
		Error   *anthropic.ErrorEnvelope `json:"error"`
	} `json:"result"`
}

func results(t testing.TB, run *Running, key, id string) map[string]resultLine {
	t.Helper()
	r := do(t, http.MethodGet, run.URL+batchesPath+"/"+id+"/results", key, nil)
	if r.err != nil || r.status != 200 {
		t.Fatalf("results: status %d err %v: %s", r.status, r.err, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/x-jsonl" {
		t.Errorf("results content-type %q", ct)
	}
	out := map[string]resultLine{}
	sc := bufio.NewScanner(bytes.NewReader(r.body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l resultLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("result line %q: %v", sc.Text(), err)
		}
		if _, dup := out[l.CustomID]; dup {
			t.Fatalf("custom_id %q twice in the results", l.CustomID)
		}
		out[l.CustomID] = l
	}
	return out
}

func TestBatchCreateValidation(t *testing.T) {
	t.Parallel()
	run := startSim(t, batchConfig())
	ok := judgeBody(1, 64)
	many := make([]batchReq, MaxBatchRequests+1)
	for i := range many {
		many[i] = batchReq{CustomID: "r" + strconv.Itoa(i), Params: json.RawMessage(`{}`)}
	}
	cases := []struct {
		name, body, want string
	}{
		{"no requests field", `{}`, "requests: Field required"},
		{"empty list", `{"requests":[]}`, "at least 1 item"},
		{"too many", string(createBody(many...)), "at most 100000 items"},
		{"empty custom_id", string(createBody(batchReq{"", ok})), "requests.0.custom_id: String should match pattern"},
		{"65-char custom_id", string(createBody(batchReq{strings.Repeat("a", 65), ok})), "requests.0.custom_id: String should match pattern"},
		{"dot in custom_id", string(createBody(batchReq{"a", ok}, batchReq{"a.b", ok})), "requests.1.custom_id: String should match pattern"},
		{"escaped custom_id", `{"requests":[{"custom_id":"a\u0020b","params":{}}]}`, "requests.0.custom_id: String should match pattern"},
		{"duplicate custom_id", string(createBody(batchReq{"x", ok}, batchReq{"y", ok}, batchReq{"x", ok})), "requests.2.custom_id: custom_id \"x\" is used by requests.0 too"},
		{"missing custom_id", `{"requests":[{"params":{}}]}`, "requests.0.custom_id: Field required"},
		{"missing params", `{"requests":[{"custom_id":"a"}]}`, "requests.0.params: Field required"},
		{"params not an object", `{"requests":[{"custom_id":"a","params":[1]}]}`, "requests.0.params: Input should be a valid dictionary"},
		{"unknown field", `{"requests":[{"custom_id":"a","params":{}}],"extra":1}`, "Extra inputs are not permitted"},
		{"not JSON", `{"requests":`, "invalid JSON"},
		{"trailing data", `{"requests":[{"custom_id":"a","params":{}}]} x`, "unexpected data"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, http.MethodPost, run.URL+batchesPath, soloKey, []byte(tc.body))
			if r.status != 400 {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			e := r.envelope(t)
			if e.Error.Type != anthropic.ErrInvalidRequest || !strings.Contains(e.Error.Message, tc.want) {
				t.Errorf("error %s %q: want invalid_request_error containing %q", e.Error.Type, e.Error.Message, tc.want)
			}
		})
	}
	if n := len(run.Server.batchesOf("solo")); n != 0 {
		t.Errorf("%d batches exist after only invalid creates", n)
	}

	t.Run("64-char custom_id and 100,000 requests are fine", func(t *testing.T) {
		reqs := make([]batchReq, MaxBatchRequests)
		for i := range reqs {
			reqs[i] = batchReq{CustomID: fmt.Sprintf("%064d", i), Params: json.RawMessage(`{}`)}
		}
		b := createBatchT(t, run, otherKey, reqs...)
		if b.RequestCounts.Processing != MaxBatchRequests {
			t.Errorf("processing %d", b.RequestCounts.Processing)
		}
	})
	t.Run("over 256 MB is 413", func(t *testing.T) {
		req := httptest.NewRequest(http.MethodPost, batchesPath, strings.NewReader(`{"requests":[]}`))
		req.ContentLength = MaxBatchBodyBytes + 1
		req.Header.Set("x-api-key", soloKey)
		req.Header.Set("anthropic-version", anthropic.APIVersion)
		rec := httptest.NewRecorder()
		run.Server.ServeHTTP(rec, req)
		var e anthropic.ErrorEnvelope
		json.Unmarshal(rec.Body.Bytes(), &e)
		if rec.Code != 413 || e.Error.Type != anthropic.ErrRequestTooLarge {
			t.Errorf("status %d type %q", rec.Code, e.Error.Type)
		}
	})
}

// batchesOf returns the batches of the named org (for tests).
func (s *Server) batchesOf(org string) []*simBatch {
	ob := s.orgBatches(s.byName[org])
	ob.mu.Lock()
	defer ob.mu.Unlock()
	return append([]*simBatch(nil), ob.list...)
}

// The object, field by field, against docs/design.md §19: in progress
// (at speed 1 a batch waits 4 min in the queue) and ended.
func TestBatchObjectShape(t *testing.T) {
	t.Parallel()
	cfg := batchConfig()
	cfg.Speed = 1
	run := startSim(t, cfg)
	before := time.Now()
	r := do(t, http.MethodPost, run.URL+batchesPath, soloKey, createBody(judgeBatch("shape", 3)...))
	b := r.batch(t)
	var raw map[string]json.RawMessage
	json.Unmarshal(r.body, &raw)
	want := []string{"id", "type", "processing_status", "request_counts", "created_at", "ended_at", "expires_at", "cancel_initiated_at", "archived_at", "results_url"}
	if len(raw) != len(want) {
		t.Errorf("fields %v: want exactly %v", keys(raw), want)
	}
	var counts map[string]int64
	json.Unmarshal(raw["request_counts"], &counts)
	checks := []struct {
		field string
		ok    bool
	}{
		{"id msgbatch_ + 24 base-62", strings.HasPrefix(b.ID, "msgbatch_") && len(b.ID) == 33 && validCustomID([]byte(b.ID))},
		{"type", b.Type == "message_batch"},
		{"processing_status", b.ProcessingStatus == "in_progress"},
		{"request_counts keys", len(counts) == 5},
		{"request_counts", counts["processing"] == 3 && counts["succeeded"]+counts["errored"]+counts["canceled"]+counts["expired"] == 0},
		{"created_at", b.CreatedAt != nil && !b.CreatedAt.Before(before.Add(-time.Millisecond)) && b.CreatedAt.Location() == time.UTC},
		{"expires_at = created_at + 24 h", b.ExpiresAt != nil && b.CreatedAt != nil && b.ExpiresAt.Sub(*b.CreatedAt) == 24*time.Hour},
		{"ended_at null", string(raw["ended_at"]) == "null"},
		{"cancel_initiated_at null", string(raw["cancel_initiated_at"]) == "null"},
		{"archived_at null", string(raw["archived_at"]) == "null"},
		{"results_url null", string(raw["results_url"]) == "null"},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("%s: %s", c.field, r.body)
		}
	}
	// Results and delete are refused while it processes.
	if r := do(t, http.MethodGet, run.URL+batchesPath+"/"+b.ID+"/results", soloKey, nil); r.status != 400 {
		t.Errorf("results while in progress: %d %s", r.status, r.body)
	}
	if r := do(t, http.MethodDelete, run.URL+batchesPath+"/"+b.ID, soloKey, nil); r.status != 400 || r.envelope(t).Error.Type != anthropic.ErrInvalidRequest {
		t.Errorf("delete while in progress: %d %s", r.status, r.body)
	}

	// Ended: at speed 1000 three requests take 240 ms.
	fast := startSim(t, batchConfig())
	b = createBatchT(t, fast, soloKey, judgeBatch("shape", 3)...)
	e := waitEnded(t, fast, soloKey, b.ID)
	if e.RequestCounts.Processing != 0 || e.RequestCounts.Succeeded != 3 {
		t.Errorf("ended counts %+v", e.RequestCounts)
	}
	if e.EndedAt == nil || e.EndedAt.Before(*e.CreatedAt) || e.CancelInitiatedAt != nil || e.ArchivedAt != nil {
		t.Errorf("ended times %+v", e)
	}
	if e.ResultsURL == nil || *e.ResultsURL != fast.URL+batchesPath+"/"+b.ID+"/results" {
		t.Errorf("results_url %v", e.ResultsURL)
	}
}

func keys(m map[string]json.RawMessage) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// The same request returns the same tokens and text through either route;
// params are validated when processed, and a bad one is an errored result.
func TestBatchResultsMatchSyncAndValidateLate(t *testing.T) {
	t.Parallel()
	run := startSim(t, batchConfig())
	reqs := judgeBatch("ok", 4)
	reqs = append(reqs, batchReq{"prose", proseBody(7, 50)})
	bad := map[string]string{
		"bad-model":    `{"model":"claude-nope","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`,
		"stream":       `{"model":"claude-sonnet-4-5","max_tokens":10,"stream":true,"messages":[{"role":"user","content":"hi"}]}`,
		"max-tokens-0": `{"model":"claude-sonnet-4-5","max_tokens":0,"messages":[{"role":"user","content":"hi"}]}`,
		"speed":        `{"model":"claude-sonnet-4-5","max_tokens":10,"speed":"fast","messages":[{"role":"user","content":"hi"}]}`,
		"no-messages":  `{"model":"claude-sonnet-4-5","max_tokens":10}`,
		"not-served":   `{"model":"claude-haiku-4-5","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`,
		"unknown-key":  `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":"hi"}],"nope":1}`,
	}
	for id, p := range bad {
		reqs = append(reqs, batchReq{id, json.RawMessage(p)})
	}
	b := createBatchT(t, run, soloKey, reqs...)
	e := waitEnded(t, run, soloKey, b.ID)
	if e.RequestCounts.Succeeded != 5 || e.RequestCounts.Errored != int64(len(bad)) {
		t.Errorf("counts %+v", e.RequestCounts)
	}
	res := results(t, run, soloKey, b.ID)
	if len(res) != len(reqs) {
		t.Fatalf("%d results for %d requests", len(res), len(reqs))
	}
	for id := range bad {
		l := res[id]
		if l.Result.Type != "errored" || l.Result.Error == nil || l.Result.Error.Type != "error" ||
			l.Result.Error.Error.Type != anthropic.ErrInvalidRequest || l.Result.Error.RequestID == "" {
			t.Errorf("%s: %+v", id, l.Result)
		}
	}
	// Processing and billing the batch drew nothing from the Messages buckets.
	for _, p := range run.Server.Stats().Org("solo").Pools {
		if p.MinRemaining != p.Remaining || p.Remaining != [3]int64{600, 60000, 30000} {
			t.Errorf("pool %s: the batch drew on the Messages buckets: %+v", p.Pool, p)
		}
	}
	for _, rq := range reqs[:5] {
		l := res[rq.CustomID]
		if l.Result.Type != "succeeded" || l.Result.Message == nil {
			t.Fatalf("%s: %+v", rq.CustomID, l.Result)
		}
		sync := post(t, run, soloKey, rq.Params).message(t)
		bm := l.Result.Message
		if bm.Usage.ServiceTier != "batch" || sync.Usage.ServiceTier != "standard" {
			t.Errorf("service tiers batch %q sync %q", bm.Usage.ServiceTier, sync.Usage.ServiceTier)
		}
		if bm.Usage.InputTokens != sync.Usage.InputTokens || bm.Usage.OutputTokens != sync.Usage.OutputTokens ||
			bm.Content[0].Text != sync.Content[0].Text || *bm.StopReason != *sync.StopReason || bm.Model != sync.Model {
			t.Errorf("%s: batch %+v differs from sync %+v", rq.CustomID, bm, sync)
		}
		if !strings.HasPrefix(bm.ID, "msg_") || bm.ID == sync.ID {
			t.Errorf("message ids batch %q sync %q", bm.ID, sync.ID)
		}
	}
	// The prose request was cut at max_tokens 50 in both.
	if sr := res["prose"].Result.Message.StopReason; *sr != "max_tokens" {
		t.Errorf("prose stop %q", *sr)
	}
}

// A key sees only its org's batches.
func TestBatchOrgScoped(t *testing.T) {
	t.Parallel()
	run := startSim(t, batchConfig())
	b := createBatchT(t, run, soloKey, judgeBatch("mine", 1)...)
	for _, path := range []string{"", "/results"} {
		if r := do(t, http.MethodGet, run.URL+batchesPath+"/"+b.ID+path, otherKey, nil); r.status != 404 || r.envelope(t).Error.Type != anthropic.ErrNotFound {
			t.Errorf("other org GET %s: %d %s", path, r.status, r.body)
		}
	}
	for _, m := range []struct{ method, path string }{{http.MethodPost, "/cancel"}, {http.MethodDelete, ""}} {
		if r := do(t, m.method, run.URL+batchesPath+"/"+b.ID+m.path, otherKey, nil); r.status != 404 {
			t.Errorf("other org %s %s: %d", m.method, m.path, r.status)
		}
	}
	var page struct{ Data []wireBatch }
	json.Unmarshal(do(t, http.MethodGet, run.URL+batchesPath, otherKey, nil).body, &page)
	if len(page.Data) != 0 {
		t.Errorf("other org lists %d batches", len(page.Data))
	}
	if r := do(t, http.MethodGet, run.URL+batchesPath+"/"+b.ID, "sk-nope", nil); r.status != 401 {
		t.Errorf("unknown key: %d", r.status)
	}
}

type wirePage struct {
	Data    []wireBatch `json:"data"`
	HasMore bool        `json:"has_more"`
	FirstID *string     `json:"first_id"`
	LastID  *string     `json:"last_id"`
}

func TestBatchListPagination(t *testing.T) {
	t.Parallel()
	cfg := batchConfig()
	cfg.Speed = 1 // they stay in progress
	run := startSim(t, cfg)
	var ids []string // creation order
	for i := range 5 {
		ids = append(ids, createBatchT(t, run, soloKey, judgeBatch("p"+strconv.Itoa(i), 1)...).ID)
	}
	list := func(q string) wirePage {
		r := do(t, http.MethodGet, run.URL+batchesPath+q, soloKey, nil)
		if r.status != 200 {
			t.Fatalf("list %s: %d %s", q, r.status, r.body)
		}
		var p wirePage
		if err := json.Unmarshal(r.body, &p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	idsOf := func(p wirePage) string {
		var s []string
		for _, b := range p.Data {
			s = append(s, b.ID)
		}
		return strings.Join(s, ",")
	}
	newest := func(i ...int) string {
		var s []string
		for _, k := range i {
			s = append(s, ids[k])
		}
		return strings.Join(s, ",")
	}
	cases := []struct {
		q       string
		want    string
		hasMore bool
	}{
		{"", newest(4, 3, 2, 1, 0), false},
		{"?limit=2", newest(4, 3), true},
		{"?limit=2&after_id=" + ids[3], newest(2, 1), true},
		{"?limit=2&after_id=" + ids[1], newest(0), false},
		{"?limit=2&before_id=" + ids[0], newest(2, 1), true},
		{"?limit=2&before_id=" + ids[2], newest(4, 3), false},
		{"?limit=1000&before_id=" + ids[4], "", false},
	}
	for _, tc := range cases {
		p := list(tc.q)
		if got := idsOf(p); got != tc.want || p.HasMore != tc.hasMore {
			t.Errorf("list %s: %s has_more %v, want %s %v", tc.q, got, p.HasMore, tc.want, tc.hasMore)
		}
		if len(p.Data) > 0 && (p.FirstID == nil || *p.FirstID != p.Data[0].ID || *p.LastID != p.Data[len(p.Data)-1].ID) {
			t.Errorf("list %s: first_id %v last_id %v", tc.q, p.FirstID, p.LastID)
		}
		if len(p.Data) == 0 && (p.FirstID != nil || p.LastID != nil) {
			t.Errorf("empty page with first/last ids")
		}
	}
	for _, q := range []string{"?limit=0", "?limit=1001", "?limit=x", "?after_id=msgbatch_nope", "?after_id=" + ids[0] + "&before_id=" + ids[1]} {
		if r := do(t, http.MethodGet, run.URL+batchesPath+q, soloKey, nil); r.status != 400 {
			t.Errorf("list %s: %d %s", q, r.status, r.body)
		}
	}
}

func TestBatchCancelAndDelete(t *testing.T) {
	t.Parallel()
	cfg := batchConfig()
	cfg.Speed = 1
	cfg.Orgs[0].Batch = BatchLimits{CancelS: 0.05}
	run := startSim(t, cfg)
	b := createBatchT(t, run, soloKey, judgeBatch("c", 3)...)
	c := do(t, http.MethodPost, run.URL+batchesPath+"/"+b.ID+"/cancel", soloKey, nil).batch(t)
	if c.ProcessingStatus != "canceling" || c.CancelInitiatedAt == nil || c.RequestCounts.Processing != 3 {
		t.Errorf("after cancel: %+v", c)
	}
	// Canceling again is harmless.
	if again := do(t, http.MethodPost, run.URL+batchesPath+"/"+b.ID+"/cancel", soloKey, nil).batch(t); !again.CancelInitiatedAt.Equal(*c.CancelInitiatedAt) {
		t.Errorf("second cancel moved cancel_initiated_at")
	}
	e := waitEnded(t, run, soloKey, b.ID)
	if e.RequestCounts.Canceled != 3 || e.RequestCounts.Processing != 0 || e.EndedAt == nil {
		t.Errorf("ended: %+v", e.RequestCounts)
	}
	res := results(t, run, soloKey, b.ID)
	for id, l := range res {
		if l.Result.Type != "canceled" {
			t.Errorf("%s: %s", id, l.Result.Type)
		}
	}
	if r := do(t, http.MethodPost, run.URL+batchesPath+"/"+b.ID+"/cancel", soloKey, nil); r.status != 400 {
		t.Errorf("cancel after end: %d", r.status)
	}
	d := do(t, http.MethodDelete, run.URL+batchesPath+"/"+b.ID, soloKey, nil)
	if d.status != 200 || string(d.body) != `{"id":"`+b.ID+`","type":"message_batch_deleted"}` {
		t.Errorf("delete: %d %s", d.status, d.body)
	}
	if r := do(t, http.MethodGet, run.URL+batchesPath+"/"+b.ID, soloKey, nil); r.status != 404 {
		t.Errorf("retrieve after delete: %d", r.status)
	}
	if len(run.Server.Ledger()) != 0 {
		t.Error("canceled requests were billed")
	}
}

// A batch is billed when it ends, whether or not anyone looks at it.
func TestBatchBilledUnpolled(t *testing.T) {
	t.Parallel()
	run := startSim(t, batchConfig())
	createBatchT(t, run, soloKey, judgeBatch("u", 5)...)
	deadline := time.Now().Add(10 * time.Second)
	for run.Server.LedgerTotals().Requests != 5 {
		if time.Now().After(deadline) {
			t.Fatalf("billed %d of 5 without a poll", run.Server.LedgerTotals().Requests)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := run.Server.Mark(); n != 5 {
		t.Errorf("mark %d", n)
	}
}

// The processing-queue cap is per org: a create that would exceed it is a
// 429 with retry-after; batch calls have their own RPM and never draw on
// the Messages buckets.
func TestBatchQueueCapAndRPM(t *testing.T) {
	t.Parallel()
	cfg := batchConfig()
	cfg.Speed = 1
	cfg.Orgs[0].Batch = BatchLimits{Queue: 10, RPM: 5}
	run := startSim(t, cfg)
	createBatchT(t, run, soloKey, judgeBatch("a", 8)...)
	r := do(t, http.MethodPost, run.URL+batchesPath, soloKey, createBody(judgeBatch("b", 3)...))
	if r.status != 429 || r.envelope(t).Error.Type != anthropic.ErrRateLimit || r.header.Get("retry-after") == "" ||
		!strings.Contains(r.envelope(t).Error.Message, "processing queue") {
		t.Errorf("over the queue cap: %d %v %s", r.status, r.header, r.body)
	}
	createBatchT(t, run, soloKey, judgeBatch("c", 2)...) // exactly at the cap
	if st := run.Server.BatchStats()["solo"]; st != (BatchStats{Created: 2, Requests: 10, QueueRefused: 1, InProgress: 2, Queued: 10, MaxQueued: 10, QueueCap: 10,
		Calls: 3, MaxCallsPerMinute: 3, RPM: 5}) {
		t.Errorf("batch stats %+v", st)
	}
	var admin struct{ Orgs map[string]BatchStats }
	if r := do(t, http.MethodGet, run.URL+"/sim/batches", "", nil); r.status != 200 || json.Unmarshal(r.body, &admin) != nil || admin.Orgs["solo"].MaxQueued != 10 {
		t.Errorf("/sim/batches: %d %s", r.status, r.body)
	}
	createBatchT(t, run, otherKey, judgeBatch("d", 50)...) // another org's queue
	// Three calls so far on solo's batch RPM of 5: two more, then a 429.
	for i := 4; i <= 5; i++ {
		if r := do(t, http.MethodGet, run.URL+batchesPath, soloKey, nil); r.status != 200 {
			t.Fatalf("call %d: %d", i, r.status)
		}
	}
	r = do(t, http.MethodGet, run.URL+batchesPath, soloKey, nil)
	if r.status != 429 || r.header.Get("retry-after") == "" || r.header.Get("anthropic-ratelimit-requests-limit") != "5" {
		t.Errorf("sixth call: %d %v", r.status, r.header)
	}
	for _, p := range run.Server.Stats().Org("solo").Pools {
		if p.Remaining[0] != p.Limit[0] || p.MinRemaining[0] != p.Limit[0] {
			t.Errorf("pool %s: batch calls drew on the Messages RPM bucket: %+v", p.Pool, p)
		}
	}
}

// A batch takes queue wait + n / throughput; a later one waits for the
// earlier (FIFO per org). The times are the schedule's, exact to rounding.
func TestBatchProcessingTime(t *testing.T) {
	t.Parallel()
	cfg := batchConfig()
	cfg.Speed = 100
	cfg.Orgs[0].Batch = BatchLimits{PerMinute: 600, QueueWaitS: 1}
	run := startSim(t, cfg)
	a := createBatchT(t, run, soloKey, judgeBatch("a", 1000)...)
	b := createBatchT(t, run, soloKey, judgeBatch("b", 100)...) // created well within a's 101 API s
	ea := waitEnded(t, run, soloKey, a.ID)
	eb := waitEnded(t, run, soloKey, b.ID)
	near := func(d, want time.Duration) bool { return d > want-time.Millisecond && d < want+time.Millisecond }
	// a: 1 s wait + 1000 at 10/s = 101 API s = 1.01 s real at K=100.
	if d := ea.EndedAt.Sub(*ea.CreatedAt); !near(d, 1010*time.Millisecond) {
		t.Errorf("a took %v real, want 1.01 s", d)
	}
	// b starts when a ends (or, if a loaded machine created b only after
	// that, its 1 API s wait after its creation): +10 API s.
	startB := *ea.EndedAt
	if w := eb.CreatedAt.Add(10 * time.Millisecond); w.After(startB) {
		startB = w
	}
	if d := eb.EndedAt.Sub(startB); !near(d, 100*time.Millisecond) {
		t.Errorf("b ended %v after it could start (a ended %v after b's creation), want 100 ms", d, ea.EndedAt.Sub(*eb.CreatedAt))
	}
}

func TestBatchFaults(t *testing.T) {
	t.Parallel()
	t.Run("create lost: 500 after the batch exists", func(t *testing.T) {
		t.Parallel()
		cfg := batchConfig()
		cfg.Faults = []Fault{{Kind: FaultBatchCreateLost500, Org: "solo"}}
		run := startSim(t, cfg)
		r := do(t, http.MethodPost, run.URL+batchesPath, soloKey, createBody(judgeBatch("x", 2)...))
		if r.status != 500 || r.envelope(t).Error.Type != anthropic.ErrAPI {
			t.Fatalf("create: %d %s", r.status, r.body)
		}
		var p wirePage
		json.Unmarshal(do(t, http.MethodGet, run.URL+batchesPath, soloKey, nil).body, &p)
		if len(p.Data) != 1 || p.Data[0].RequestCounts.Processing+p.Data[0].RequestCounts.Succeeded != 2 {
			t.Errorf("after a lost create the list holds %+v, want the batch", p.Data)
		}
	})
	t.Run("create lost: connection reset after the batch exists", func(t *testing.T) {
		t.Parallel()
		cfg := batchConfig()
		cfg.Faults = []Fault{{Kind: FaultBatchCreateLostReset}}
		run := startSim(t, cfg)
		if r := do(t, http.MethodPost, run.URL+batchesPath, soloKey, createBody(judgeBatch("x", 2)...)); r.err == nil {
			t.Fatalf("create answered %d, want a reset", r.status)
		}
		if n := len(run.Server.batchesOf("solo")); n != 1 {
			t.Errorf("%d batches after a reset create, want 1", n)
		}
	})
	t.Run("404 just after create", func(t *testing.T) {
		t.Parallel()
		cfg := batchConfig()
		cfg.Faults = []Fault{{Kind: FaultBatchNotFound, Window: 1000 * time.Second}} // 1 s real
		run := startSim(t, cfg)
		b := createBatchT(t, run, soloKey, judgeBatch("x", 1)...)
		if r := do(t, http.MethodGet, run.URL+batchesPath+"/"+b.ID, soloKey, nil); r.status != 404 || r.envelope(t).Error.Type != anthropic.ErrNotFound {
			t.Errorf("retrieve at once: %d %s", r.status, r.body)
		}
		var p wirePage
		json.Unmarshal(do(t, http.MethodGet, run.URL+batchesPath, soloKey, nil).body, &p)
		if len(p.Data) != 0 {
			t.Error("listed while invisible")
		}
		time.Sleep(1050 * time.Millisecond)
		waitEnded(t, run, soloKey, b.ID)
	})
	t.Run("404 in the middle of polling", func(t *testing.T) {
		t.Parallel()
		run := startSim(t, batchConfig())
		b := createBatchT(t, run, soloKey, judgeBatch("x", 1)...)
		fs, _ := run.Server.AddFault(Fault{Kind: FaultBatchPoll404, Org: "solo"})
		if r := do(t, http.MethodGet, run.URL+batchesPath+"/"+b.ID, soloKey, nil); r.status != 404 || r.envelope(t).Error.Type != anthropic.ErrNotFound {
			t.Errorf("retrieve during the fault: %d %s", r.status, r.body)
		}
		var p wirePage
		json.Unmarshal(do(t, http.MethodGet, run.URL+batchesPath, soloKey, nil).body, &p)
		if len(p.Data) != 1 {
			t.Errorf("the list lost the batch during a poll 404")
		}
		run.Server.ClearFaults(fs[0].ID)
		waitEnded(t, run, soloKey, b.ID)
	})
	t.Run("not finished within 24 h: the rest expire", func(t *testing.T) {
		t.Parallel()
		cfg := batchConfig()
		cfg.Speed = 200000 // 24 h in 0.43 s
		cfg.Faults = []Fault{{Kind: FaultBatchStall, Fraction: 0.25}}
		run := startSim(t, cfg)
		b := createBatchT(t, run, soloKey, judgeBatch("x", 8)...)
		if b.ProcessingStatus != "in_progress" {
			t.Fatalf("status %s", b.ProcessingStatus)
		}
		e := waitEnded(t, run, soloKey, b.ID)
		if e.RequestCounts.Succeeded != 2 || e.RequestCounts.Expired != 6 || !e.EndedAt.Equal(*e.ExpiresAt) {
			t.Errorf("counts %+v ended %v expires %v", e.RequestCounts, e.EndedAt, e.ExpiresAt)
		}
		n := 0
		for _, l := range results(t, run, soloKey, b.ID) {
			if l.Result.Type == "expired" {
				n++
			}
		}
		if n != 6 || len(run.Server.Ledger()) != 2 {
			t.Errorf("%d expired results, %d billed", n, len(run.Server.Ledger()))
		}
	})
	for _, tc := range []struct {
		kind FaultKind
		typ  string
	}{
		{FaultBatchErroredAPI, anthropic.ErrAPI},
		{FaultBatchErroredOverloaded, anthropic.ErrOverloaded},
		{FaultBatchErroredInvalid, anthropic.ErrInvalidRequest},
	} {
		t.Run(string(tc.kind), func(t *testing.T) {
			t.Parallel()
			cfg := batchConfig()
			cfg.Faults = []Fault{{Kind: tc.kind, Probability: 0.5}}
			run := startSim(t, cfg)
			b := createBatchT(t, run, soloKey, judgeBatch("x", 200)...)
			e := waitEnded(t, run, soloKey, b.ID)
			if e.RequestCounts.Errored < 60 || e.RequestCounts.Errored > 140 || e.RequestCounts.Succeeded+e.RequestCounts.Errored != 200 {
				t.Errorf("counts %+v: want about half errored", e.RequestCounts)
			}
			var errored int64
			for id, l := range results(t, run, soloKey, b.ID) {
				if l.Result.Type == "errored" {
					errored++
					if l.Result.Error.Error.Type != tc.typ {
						t.Errorf("%s: %s", id, l.Result.Error.Error.Type)
					}
				}
			}
			if errored != e.RequestCounts.Errored || int64(len(run.Server.Ledger())) != e.RequestCounts.Succeeded {
				t.Errorf("%d errored lines, %d billed, counts %+v", errored, len(run.Server.Ledger()), e.RequestCounts)
			}
		})
	}
	t.Run("results stream cut short", func(t *testing.T) {
		t.Parallel()
		run := startSim(t, batchConfig())
		b := createBatchT(t, run, soloKey, judgeBatch("x", 400)...)
		waitEnded(t, run, soloKey, b.ID)
		if _, err := run.Server.AddFault(Fault{Kind: FaultBatchResultsCut}); err != nil {
			t.Fatal(err)
		}
		r := do(t, http.MethodGet, run.URL+batchesPath+"/"+b.ID+"/results", soloKey, nil)
		if r.status != 200 || r.err == nil {
			t.Fatalf("status %d err %v: want a 200 whose body breaks off", r.status, r.err)
		}
		if n := bytes.Count(r.body, []byte("\n")); n >= 400 {
			t.Errorf("%d lines arrived", n)
		}
		run.Server.ClearFaults()
		if n := len(results(t, run, soloKey, b.ID)); n != 400 {
			t.Errorf("%d results once the fault is cleared", n)
		}
	})
}

// Batch items cost exactly half their sync cost, by the ledger's own
// arithmetic and by the cost package's, and are marked service_tier batch.
func TestBatchLedgerHalfPrice(t *testing.T) {
	t.Parallel()
	cfg := batchConfig()
	cfg.Orgs[0].Limits[anthropic.PoolOpus4] = Limits{RPM: 600, ITPM: 600000, OTPM: 300000}
	run := startSim(t, cfg)
	var reqs []batchReq
	for i := range 30 {
		p := judgeBody(i, 256)
		if i%3 == 1 {
			p = proseBody(i, 200)
		}
		if i%3 == 2 {
			p = bytes.Replace(p, []byte("claude-sonnet-4-5-20250929"), []byte("claude-opus-4-6"), 1)
		}
		reqs = append(reqs, batchReq{"i" + strconv.Itoa(i), p})
	}
	mark := run.Server.Mark()
	for _, r := range reqs {
		post(t, run, soloKey, r.Params).message(t)
	}
	sync := run.Server.LedgerSince(mark)
	mark = run.Server.Mark()
	b := createBatchT(t, run, soloKey, reqs...)
	waitEnded(t, run, soloKey, b.ID)
	batch := run.Server.LedgerSince(mark)
	if len(sync) != 30 || len(batch) != 30 {
		t.Fatalf("%d sync and %d batch entries", len(sync), len(batch))
	}
	byHash := map[BodyHash]LedgerEntry{}
	for _, e := range sync {
		byHash[e.BodySHA256] = e
	}
	prices := cost.Default()
	for _, e := range batch {
		s, ok := byHash[e.BodySHA256]
		if !ok {
			t.Fatalf("batch entry %s has no sync twin", e.CustomID)
		}
		if e.ServiceTier != "batch" || e.BatchID != b.ID || e.CustomID == "" || s.ServiceTier != "" {
			t.Errorf("tiers/ids: batch %+v sync %q", e, s.ServiceTier)
		}
		if e.InputTokens != s.InputTokens || e.OutputTokens != s.OutputTokens || 2*e.CostNanos != s.CostNanos {
			t.Errorf("%s: batch %d/%d tokens %d n$, sync %d/%d %d n$", e.CustomID, e.InputTokens, e.OutputTokens, e.CostNanos, s.InputTokens, s.OutputTokens, s.CostNanos)
		}
		want, err := prices.Cost(e.Model, anthropic.Usage{InputTokens: e.InputTokens, OutputTokens: e.OutputTokens}, true)
		if err != nil || int64(want) != e.CostNanos {
			t.Errorf("%s: cost package says %d (%v), ledger %d", e.CustomID, want, err, e.CostNanos)
		}
	}
	ts, tb := TotalsOf(sync), TotalsOf(batch)
	if tb.CostNanos*2 != ts.CostNanos {
		t.Errorf("batch total %d n$, sync %d n$: want exactly half", tb.CostNanos, ts.CostNanos)
	}
	t.Logf("30 items: sync %d n$, batch %d n$", ts.CostNanos, tb.CostNanos)
	// The JSONL ledger carries the batch fields.
	var buf bytes.Buffer
	WriteLedgerJSONL(&buf, batch[:1])
	back, err := ReadLedgerJSONL(&buf)
	if err != nil || back[0].ServiceTier != "batch" || back[0].BatchID != b.ID || back[0].CustomID != batch[0].CustomID {
		t.Errorf("ledger line round trip: %+v %v", back, err)
	}
}

// A batch request with inference_geo "us" is billed ×1.1 at the batch
// rates (the multipliers stack), and its result's usage says so, as the
// same request sent synchronously is (batches used to bill it at the
// global price).
func TestBatchInferenceGeoUSBilled(t *testing.T) {
	t.Parallel()
	run := startSim(t, batchConfig())
	var reqs []batchReq
	for i := range 4 {
		p := bytes.Replace(proseBody(i, 200), []byte(`"model":"claude-sonnet-4-5"`), []byte(`"model":"claude-sonnet-4-6","inference_geo":"us"`), 1)
		if !bytes.Contains(p, []byte("inference_geo")) {
			t.Fatalf("body %s", p)
		}
		reqs = append(reqs, batchReq{"g" + strconv.Itoa(i), p})
	}
	mark := run.Server.Mark()
	b := createBatchT(t, run, soloKey, reqs...)
	waitEnded(t, run, soloKey, b.ID)
	prices := cost.Default()
	for _, e := range run.Server.LedgerSince(mark) {
		want, err := prices.Cost(e.Model, anthropic.Usage{InputTokens: e.InputTokens, OutputTokens: e.OutputTokens, InferenceGeo: "us"}, true)
		if err != nil || int64(want) != e.CostNanos || !e.USGeo {
			t.Errorf("%s: billed %d n$ (us_geo %v), want %d (%v)", e.CustomID, e.CostNanos, e.USGeo, want, err)
		}
	}
	for id, l := range results(t, run, soloKey, b.ID) {
		if l.Result.Message == nil || l.Result.Message.Usage.InferenceGeo != "us" {
			t.Errorf("%s: result %+v, want usage.inference_geo us", id, l.Result)
		}
	}
}

func TestBatchPricesHalveExactly(t *testing.T) {
	for _, m := range models {
		for _, p := range []price{m.price, m.longPrice} {
			if h := p.half(); h.in*2 != p.in || h.out*2 != p.out || h.write5m*2 != p.write5m || h.write1h*2 != p.write1h || h.read*2 != p.read {
				t.Errorf("%s: price %+v does not halve exactly", m.id, p)
			}
		}
	}
}

func TestBatchConfigLimits(t *testing.T) {
	cfg := testConfig()
	cfg.Orgs[0].Batch = BatchLimits{RPM: -1}
	if _, err := New(cfg); err == nil {
		t.Error("negative batch rpm accepted")
	}
	c, err := parseConfig([]byte(`{"preset":"build-3org","orgs":[{"name":"a","limits":{"*":{"rpm":1}},"batch":{"rpm":7,"queue":9,"per_minute":11,"queue_wait_s":1.5,"cancel_s":2}}]}`), "test")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Orgs[0].Batch; got != (BatchLimits{RPM: 7, Queue: 9, PerMinute: 11, QueueWaitS: 1.5, CancelS: 2}) {
		t.Errorf("batch limits %+v", got)
	}
	p, _ := Preset(PresetBuild3Org)
	if p.Orgs[0].Batch.RPM != 1000 || p.Orgs[1].Batch.Queue != 300000 {
		t.Errorf("build-3org batch limits %+v %+v", p.Orgs[0].Batch, p.Orgs[1].Batch)
	}
	if (BatchLimits{}).withDefaults() != (BatchLimits{RPM: 1000, Queue: 200000, PerMinute: 2000, QueueWaitS: 240, CancelS: 5, RetentionS: 29 * 24 * 3600}) {
		t.Errorf("defaults %+v", BatchLimits{}.withDefaults())
	}
	fs, err := readFaults(strings.NewReader(`[{"kind":"batch_stall","org":"solo","fraction":0.5},{"kind":"batch_not_found","window":"3s"},{"kind":"batch_errored_overloaded","probability":0.1}]`))
	if err != nil || len(fs) != 3 || fs[0].Fraction != 0.5 || fs[1].Window != 3*time.Second || fs[2].Kind != FaultBatchErroredOverloaded {
		t.Errorf("batch faults from JSON: %+v %v", fs, err)
	}
	if err := (&Fault{Kind: FaultBatchStall, Fraction: 1}).check(); err == nil {
		t.Error("batch_stall fraction 1 accepted")
	}
}

// A cancel in the middle: what was processed by then keeps its result, the
// rest is canceled, and the org's next batch no longer waits for it.
func TestBatchCancelMidway(t *testing.T) {
	t.Parallel()
	cfg := batchConfig()
	cfg.Orgs[0].Batch = BatchLimits{PerMinute: 60, QueueWaitS: 1e-6, CancelS: 1e-6} // 10,000 requests: 10 s real, so a loaded machine still cancels it midway
	run := startSim(t, cfg)
	b := createBatchT(t, run, soloKey, judgeBatch("m", 10000)...)
	time.Sleep(100 * time.Millisecond)
	do(t, http.MethodPost, run.URL+batchesPath+"/"+b.ID+"/cancel", soloKey, nil).batch(t)
	next := createBatchT(t, run, soloKey, judgeBatch("n", 10)...)
	e := waitEnded(t, run, soloKey, b.ID)
	rc := e.RequestCounts
	if rc.Succeeded == 0 || rc.Canceled == 0 || rc.Succeeded+rc.Canceled != 10000 || e.CancelInitiatedAt == nil {
		t.Errorf("counts %+v", rc)
	}
	var billed int64
	for _, e := range run.Server.Ledger() {
		if e.BatchID == b.ID {
			billed++
		}
	}
	if billed != rc.Succeeded {
		t.Errorf("%d billed, %d succeeded", billed, rc.Succeeded)
	}
	// The next batch starts when the canceled one ends (or at its own
	// creation, if a loaded machine created it only after that), and its 10
	// requests take 1 ms.
	en := waitEnded(t, run, soloKey, next.ID)
	start := *e.EndedAt
	if en.CreatedAt.After(start) {
		start = *en.CreatedAt
	}
	if d := en.EndedAt.Sub(start); d > 10*time.Millisecond {
		t.Errorf("the next batch ended %v after it could start, want 1 ms", d)
	}
}

// After 29 days a batch is archived: archived_at is set and its results
// are gone, but it can still be retrieved.
func TestBatchArchived(t *testing.T) {
	t.Parallel()
	cfg := batchConfig()
	cfg.Speed = 1e7 // 29 days in 0.25 s
	run := startSim(t, cfg)
	b := createBatchT(t, run, soloKey, judgeBatch("old", 2)...)
	time.Sleep(300 * time.Millisecond)
	e := do(t, http.MethodGet, run.URL+batchesPath+"/"+b.ID, soloKey, nil).batch(t)
	if e.ArchivedAt == nil || e.ArchivedAt.Sub(*e.CreatedAt) != 29*24*time.Hour/1e7 || e.ProcessingStatus != "ended" {
		t.Errorf("archived batch %+v", e)
	}
	if r := do(t, http.MethodGet, run.URL+batchesPath+"/"+b.ID+"/results", soloKey, nil); r.status != 404 {
		t.Errorf("results of an archived batch: %d", r.status)
	}
}

// parseBatchCreate never panics, and whatever the copy-free fast path
// accepts the encoding/json path reads the same: same custom_ids, same
// params bytes.
func FuzzParseBatchCreate(f *testing.F) {
	f.Add(createBody(judgeBatch("a", 2)...))
	f.Add([]byte(`{"requests":[{"custom_id":"x","params":{"model":"m","a":[1,{"b":null}]}}]}`))
	f.Add([]byte(`{"requests":[{"params":{},"custom_id":"x"},{"custom_id":"x","params":{}}]}`))
	f.Add([]byte(`{"requests":[{"custom_id":"a\u0062","params":{}}]}`))
	f.Add([]byte(` { "requests" : [ ] } `))
	f.Fuzz(func(t *testing.T, body []byte) {
		parseBatchCreate(body)
		arena, items, ok := fastParseBatch(body)
		if !ok {
			return
		}
		sArena, sItems, aerr := slowParseBatch(body)
		if aerr != nil {
			t.Fatalf("fast path accepted what the slow path refuses (%s): %s", aerr.msg, body)
		}
		if len(items) != len(sItems) {
			t.Fatalf("%d items fast, %d slow", len(items), len(sItems))
		}
		for i := range items {
			fc, sc := arena[items[i].cid.off:items[i].cid.end], sArena[sItems[i].cid.off:sItems[i].cid.end]
			fp, sp := arena[items[i].params.off:items[i].params.end], sArena[sItems[i].params.off:sItems[i].params.end]
			if !bytes.Equal(fc, sc) || !bytes.Equal(fp, sp) {
				t.Fatalf("item %d: fast %q %q, slow %q %q", i, fc, fp, sc, sp)
			}
		}
	})
}
