package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/workload"
)

// ledgerEntries flushes g's ledger and reads every entry of its file.
func ledgerEntries(t testing.TB, g *Gateway) []Entry {
	t.Helper()
	if err := g.ledger.Flush(); err != nil {
		t.Fatal(err)
	}
	return readLedgerFile(t, filepath.Join(g.cfg.StateDir, ledgerFile))
}

// readLedgerFile reads every entry of the ledger file at path.
func readLedgerFile(t testing.TB, path string) []Entry {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []Entry
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if len(sc.Bytes()) == 0 {
			continue
		}
		var e Entry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("ledger line %q: %v", sc.Bytes(), err)
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// splitLedger sums the entries' cost of the answers read (Cost − Unread)
// and their worst cases of answers never read (Unread).
func splitLedger(es []Entry) (read, unread cost.Nanos) {
	for _, e := range es {
		read += e.Cost - e.Unread
		unread += e.Unread
	}
	return read, unread
}

// gwPost sends body to the gateway's path with token and reads the whole
// answer; cost is the x-apidispatch-cost-usd header or, for a stream, its
// trailer.
func gwPost(t testing.TB, url, token string, body []byte) (status int, answer []byte, paid cost.Nanos) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/v1/messages", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("x-api-key", token)
	req.Header.Set("content-type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	answer, _ = io.ReadAll(resp.Body) // a cut stream may end in an error
	v := resp.Trailer.Get(headerCost)
	if v == "" {
		v = resp.Header.Get(headerCost)
	}
	if v != "" {
		if paid, err = cost.ParseUSD(v); err != nil {
			t.Fatalf("cost %q: %v", v, err)
		}
	}
	return resp.StatusCode, answer, paid
}

// refusedByCap reports whether an answer is the gateway's spend-cap 400.
func refusedByCap(status int, answer []byte) bool {
	return status == http.StatusBadRequest && bytes.Contains(answer, []byte(anthropic.SpendLimitMessagePrefix))
}

// Bodies of long answers (the simulator answers "at length" with 1,200 to
// 2,400 tokens, so every answer fills max_tokens), each one distinct.
func longPlain(i int) string {
	return fmt.Sprintf(`{"model":"claude-sonnet-4-5","max_tokens":1024,"stream":true,"messages":[{"role":"user","content":"Item %d: explain the judging rubric at length."}]}`, i)
}

func longGeoUS(i int) string {
	return fmt.Sprintf(`{"model":"claude-sonnet-4-6","max_tokens":1024,"stream":true,"inference_geo":"us","messages":[{"role":"user","content":"Item %d: explain the judging rubric at length."}]}`, i)
}

// longCached writes a distinct prefix of about 1,100 tokens (over the
// simulator's 1,024-token minimum) to the 1-hour cache.
func longCached(i int) string {
	sys := fmt.Sprintf("Rubric %d. ", i) + strings.Repeat("Score the answer for accuracy and tone. ", 100)
	return fmt.Sprintf(`{"model":"claude-sonnet-4-5","max_tokens":1024,"stream":true,"system":[{"type":"text","text":%q,"cache_control":{"type":"ephemeral","ttl":"1h"}}],"messages":[{"role":"user","content":"Item %d: explain the judging rubric at length."}]}`, sys, i)
}

func longThinking(i int) string {
	return fmt.Sprintf(`{"model":"claude-sonnet-4-5","max_tokens":2048,"stream":true,"thinking":{"type":"enabled","budget_tokens":1024},"messages":[{"role":"user","content":"Item %d: explain the judging rubric at length."}]}`, i)
}

// Issue 28: the simulator cuts every stream after billing it; client alice
// (max_cost $0.05) streams long answers one at a time until the gateway
// refuses her. Each cut stream used to be recorded at its message_start
// usage ($0.0001), so she was never refused: 334 streams billed $5.16.
// Now each counts at its worst case (input and all of max_tokens at every
// multiplier its params ask for), in her spend, the gateway's and the
// stream's cost trailer: the simulator's bill stays within $0.05, plain,
// with inference_geo "us", with 1-hour cache writes and with thinking.
func TestCutStreamsCountedAtWorstCase(t *testing.T) {
	const capN = 50_000_000 // $0.05
	for _, tc := range []struct {
		name  string
		fault sim.FaultKind
		body  func(int) string
	}{
		{"truncated_body", sim.FaultTruncatedBody, longPlain},
		{"connection_reset", sim.FaultConnectionReset, longPlain},
		{"inference_geo us", sim.FaultTruncatedBody, longGeoUS},
		{"1-hour cache writes", sim.FaultConnectionReset, longCached},
		{"thinking", sim.FaultTruncatedBody, longThinking},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
			if err := run.Server.SetFaults(sim.Fault{Kind: tc.fault, Probability: 1}); err != nil {
				t.Fatal(err)
			}
			g, srv := startGW(t, run, func(c *Config) {
				c.Clients = []Client{{Name: "alice", Token: tokA, MaxCost: capN}}
			})
			streams, refused := 0, false
			var paid cost.Nanos
			for streams < 60 && !refused {
				status, answer, c := gwPost(t, srv.URL, tokA, []byte(tc.body(streams)))
				switch {
				case refusedByCap(status, answer):
					refused = true
				case status == http.StatusOK:
					if !bytes.Contains(answer, []byte("event: error")) {
						t.Fatalf("stream %d was not cut: %.300s", streams, answer)
					}
					streams++
					paid += c
				default:
					t.Fatalf("stream %d: %d %.300s", streams, status, answer)
				}
			}
			waitIdle(t, g)
			billed := cost.Nanos(run.Server.LedgerTotals().CostNanos)
			spent := g.gates["alice"].Spent()
			read, unread := splitLedger(ledgerEntries(t, g))
			t.Logf("%d cut streams, refused %v: the simulator billed %v on the $0.05 cap; alice's spend %v, her streams' cost trailers %v, the ledger %v read + %v unread",
				streams, refused, billed, spent, paid, read, unread)
			if streams == 0 || !refused {
				t.Fatalf("%d streams, refused %v: want some streams, then the cap's refusal", streams, refused)
			}
			if billed > capN {
				t.Errorf("the simulator billed %v, past alice's max_cost $0.05", billed)
			}
			if spent < billed || paid != spent || read != 0 || unread != spent {
				t.Errorf("alice's spend %v, trailers %v, ledger %v read + %v unread: each must be the streams' worst cases, at least the bill %v", spent, paid, read, unread, billed)
			}
			// Her status says so: all of her spend is worst cases.
			if v := g.ClientStatus("alice"); len(v.Clients) != 1 || v.Clients[0].SpentUSD != spent.USD() || v.Clients[0].UnreadUSD != spent.USD() {
				t.Errorf("alice's status %+v, want spent and unread %v", v.Clients, spent)
			}
		})
	}
}

// Issue 28: inference_geo "us" is billed ×1.1, and the worst case a
// request reserved left it out: 64 clients at once, each sending long
// answers on the plain (non-streaming) path until the cap of $1.00
// refuses them, were billed $1.0527. Each reservation now counts the ×1.1.
func TestInferenceGeoUSNearTheCapHolds(t *testing.T) {
	const capN = 1_000_000_000 // $1.00
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	g, srv := startGW(t, run, func(c *Config) {
		c.Clients = []Client{{Name: "alice", Token: tokA, MaxCost: capN}}
	})
	var next, answered atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for {
				i := next.Add(1)
				body := strings.Replace(longGeoUS(int(i)), `"stream":true,`, "", 1)
				status, answer, _ := gwPost(t, srv.URL, tokA, []byte(body))
				switch {
				case refusedByCap(status, answer):
					return
				case status != http.StatusOK:
					t.Errorf("request %d: %d %.300s", i, status, answer)
					return
				}
				answered.Add(1)
			}
		})
	}
	wg.Wait()
	waitIdle(t, g)
	billed := run.Server.LedgerTotals()
	t.Logf("%d answers with inference_geo us: the simulator billed %v on the $1.00 cap; alice's spend %v", answered.Load(), cost.Nanos(billed.CostNanos), g.gates["alice"].Spent())
	if answered.Load() < 40 {
		t.Fatalf("only %d answers before the cap: the test proves little", answered.Load())
	}
	if billed.CostNanos > capN {
		t.Errorf("the simulator billed %v, past alice's max_cost $1.00", cost.Nanos(billed.CostNanos))
	}
}

// Every front door of the gateway reserves the one worst case
// (cost.Table.WorstCase) with every multiplier the request asks for: a
// Messages request, streaming or not, holds it in its client's gate while
// upstream, and a gateway batch holds the sum over its requests (at the
// batch rates on the batch route). They used to leave out inference_geo
// "us" and cache writes.
func TestEveryRouteReservesTheWorstCaseWithItsMultipliers(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	if err := run.Server.SetFaults(sim.Fault{Kind: sim.FaultSlow, ExtraLatency: 40 * time.Second}); err != nil { // 0.2 s at K=200
		t.Fatal(err)
	}
	g, srv := startGW(t, run, nil)
	tab := cost.Default()
	msg := `"messages":[{"role":"user","content":"Item 7. Provide your evaluation as a JSON object."}]`
	long := `"messages":[{"role":"user","content":"` + strings.Repeat("evidence ", 25_000) + `"}]`
	for _, tc := range []struct {
		name   string
		params string
		want   cost.Bound // Input is filled in
	}{
		{"plain", `{"model":"claude-sonnet-4-5","max_tokens":256,` + msg + `}`,
			cost.Bound{Model: "claude-sonnet-4-5", MaxTokens: 256}},
		{"inference_geo us", `{"model":"claude-sonnet-4-6","max_tokens":256,"inference_geo":"us",` + msg + `}`,
			cost.Bound{Model: "claude-sonnet-4-6", MaxTokens: 256, GeoUS: true}},
		{"5-minute cache write", `{"model":"claude-sonnet-4-5","max_tokens":256,"system":[{"type":"text","text":"Rubric.","cache_control":{"type":"ephemeral"}}],` + msg + `}`,
			cost.Bound{Model: "claude-sonnet-4-5", MaxTokens: 256, CacheWrite: cost.CacheWrite5m}},
		{"1-hour cache write", `{"model":"claude-opus-4-6","max_tokens":256,"cache_control":{"type":"ephemeral","ttl":"1h"},` + msg + `}`,
			cost.Bound{Model: "claude-opus-4-6", MaxTokens: 256, CacheWrite: cost.CacheWrite1h}},
		{"thinking", `{"model":"claude-sonnet-4-5","max_tokens":2048,"thinking":{"type":"enabled","budget_tokens":1024},` + msg + `}`,
			cost.Bound{Model: "claude-sonnet-4-5", MaxTokens: 2048}},
		// Over 200,000 bytes: an input that may pass Sonnet 4.5's
		// long-context threshold, with every other multiplier too.
		{"all of them", `{"model":"claude-sonnet-4-5","max_tokens":2048,"thinking":{"type":"enabled","budget_tokens":1024},"system":[{"type":"text","text":"Rubric.","cache_control":{"type":"ephemeral","ttl":"1h"}}],` + long + `}`,
			cost.Bound{Model: "claude-sonnet-4-5", MaxTokens: 2048, CacheWrite: cost.CacheWrite1h}},
		{"all of them on a 4.6 model", `{"model":"claude-sonnet-4-6","max_tokens":2048,"inference_geo":"us","thinking":{"type":"enabled","budget_tokens":1024},"system":[{"type":"text","text":"Rubric.","cache_control":{"type":"ephemeral","ttl":"1h"}}],` + msg + `}`,
			cost.Bound{Model: "claude-sonnet-4-6", MaxTokens: 2048, GeoUS: true, CacheWrite: cost.CacheWrite1h}},
	} {
		for _, stream := range []bool{false, true} {
			params := tc.params
			if stream {
				params = `{"stream":true,` + params[1:]
			}
			b := tc.want
			b.Input = max(workload.EstimateInputTokens([]byte(params)), int64(len(params)))
			want, err := tab.WorstCase(b)
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				if status, answer, _ := gwPost(t, srv.URL, tokA, []byte(params)); status != http.StatusOK {
					t.Errorf("%s (stream %v): %d %.300s", tc.name, stream, status, answer)
				}
			}()
			var got cost.Nanos
			for end := time.Now().Add(10 * time.Second); got == 0 && time.Now().Before(end); time.Sleep(time.Millisecond) {
				got = g.gates["a"].Reserved()
			}
			<-done
			if got != want {
				t.Errorf("%s (stream %v): reserved %v, want the worst case %v of %+v", tc.name, stream, got, want, b)
			}
		}
		// A gateway batch of three such requests on the batch route, by
		// client b (its requests, run in the background, are reserved in
		// b's gate, not a's).
		var reqs []string
		for i := range 3 {
			reqs = append(reqs, fmt.Sprintf(`{"custom_id":"r%d","params":%s}`, i, tc.params))
		}
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/messages/batches", strings.NewReader(`{"requests":[`+strings.Join(reqs, ",")+`]}`))
		req.Header.Set("x-api-key", tokB)
		req.Header.Set(headerRoute, "batch")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var created struct {
			ID string `json:"id"`
		}
		json.NewDecoder(resp.Body).Decode(&created)
		resp.Body.Close()
		g.batches.mu.Lock()
		gb := g.batches.byID[created.ID]
		g.batches.mu.Unlock()
		if resp.StatusCode != http.StatusOK || gb == nil {
			t.Fatalf("%s: batch create %d %q", tc.name, resp.StatusCode, created.ID)
		}
		b := tc.want
		b.Batch = true
		// Params are held compacted: their bound is that of the bytes sent.
		gb.mu.Lock()
		worst := gb.meta.WorstNanos
		gb.mu.Unlock()
		b.Input = max(workload.EstimateInputTokens([]byte(tc.params)), int64(len(tc.params)))
		one, _ := tab.WorstCase(b)
		if worst != 3*one {
			t.Errorf("%s: the batch holds %v, want 3 × %v", tc.name, worst, one)
		}
	}
}

// Issue 28: the ledger records every attempt the API may have billed, so
// it is never below the API's bill, and the answers it read are priced to
// the nano-dollar. The sync route with 2 % connection resets and 2 % 529s
// upstream: Messages requests, and a gateway batch on the sync route. The
// batch's ledger entry used to sum its answers only (1,500 requests:
// $2.0593 for a bill of $2.1032), every re-send after a reset missing.
func TestLedgerIsTheBillWithResetsAnd529s(t *testing.T) {
	faults := []sim.Fault{{Kind: sim.FaultConnectionReset, Probability: 0.02}, {Kind: sim.FaultOverloaded, Probability: 0.02}}
	// check compares the gateway's ledger with the simulator's: the
	// answers read (Cost − Unread) are the bill of the answers delivered
	// whole, to the nano-dollar; the unread part is at least the bill of
	// the others; so the ledger is at least the bill.
	check := func(t *testing.T, run *sim.Running, es []Entry) {
		t.Helper()
		read, unread := splitLedger(es)
		var delivered, cut cost.Nanos
		var cuts int
		for _, e := range run.Server.Ledger() {
			if e.Delivery == sim.DeliveryOK {
				delivered += cost.Nanos(e.CostNanos)
			} else {
				cut += cost.Nanos(e.CostNanos)
				cuts++
			}
		}
		t.Logf("the simulator billed %v (%v delivered, %v in %d answers cut); the ledger %v (%v read, %v unread)",
			delivered+cut, delivered, cut, cuts, read+unread, read, unread)
		if cuts == 0 {
			t.Fatal("no answer was cut: the test proves nothing")
		}
		if read != delivered {
			t.Errorf("the ledger priced the answers read at %v, the simulator billed them %v", read, delivered)
		}
		if unread < cut || read+unread < delivered+cut {
			t.Errorf("the ledger %v (%v unread) is below the bill %v (%v cut)", read+unread, unread, delivered+cut, cut)
		}
	}
	// Every answer delivered whole is read: an attempt's timeout (10 min
	// of API time, 3 s at K=200) is raised so that a machine slowed by the
	// race detector does not give up on answers on their way.
	long := func(c *Config) { c.Timeout = time.Minute }
	const n = 500
	t.Run("messages", func(t *testing.T) {
		run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
		if err := run.Server.SetFaults(faults...); err != nil {
			t.Fatal(err)
		}
		g, srv := startGW(t, run, long)
		var next atomic.Int64
		var wg sync.WaitGroup
		for range 30 {
			wg.Go(func() {
				for i := next.Add(1); i <= n; i = next.Add(1) {
					body := fmt.Sprintf(`{"model":"claude-sonnet-4-5","max_tokens":256,"messages":[{"role":"user","content":"Item %d. Provide your evaluation as a JSON object."}]}`, i)
					if status, answer, _ := gwPost(t, srv.URL, tokA, []byte(body)); status != http.StatusOK {
						t.Errorf("request %d: %d %.300s", i, status, answer)
					}
				}
			})
		}
		wg.Wait()
		waitIdle(t, g)
		es := ledgerEntries(t, g)
		check(t, run, es)
		unreadEntries := 0
		for _, e := range es {
			if e.Unread > 0 {
				unreadEntries++
			}
		}
		if cuts := len(run.Server.Ledger()) - n; unreadEntries != cuts {
			t.Errorf("%d ledger entries unread, %d answers cut", unreadEntries, cuts)
		}
	})
	t.Run("gateway batch on the sync route", func(t *testing.T) {
		run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
		if err := run.Server.SetFaults(faults...); err != nil {
			t.Fatal(err)
		}
		g, srv := startGW(t, run, long)
		c := sdkClient(srv.URL, tokA)
		var reqs []sdk.MessageBatchNewParamsRequest
		for i := range n {
			reqs = append(reqs, batchReq(fmt.Sprintf("item-%d", i), i))
		}
		b, err := c.Messages.Batches.New(context.Background(), sdk.MessageBatchNewParams{Requests: reqs}, option.WithHeader(headerRoute, "sync"))
		if err != nil {
			t.Fatal(err)
		}
		if e := waitEnded(t, &c, b.ID); e.RequestCounts.Succeeded != n {
			t.Fatalf("batch ended %s", e.RawJSON())
		}
		check(t, run, ledgerEntries(t, g))
	})
}

// A client that hangs up while its request is upstream, whose answer is
// then lost to a connection reset: the API billed it, so the ledger
// counts its worst case (it used to count nothing: the exchange ended
// with the client before the may-have-billed check).
func TestResetAfterTheClientLeftIsCounted(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	if err := run.Server.SetFaults(sim.Fault{Kind: sim.FaultSlow, ExtraLatency: 100 * time.Second}, // 0.5 s at K=200
		sim.Fault{Kind: sim.FaultConnectionReset, Probability: 1}); err != nil {
		t.Fatal(err)
	}
	g, srv := startGW(t, run, nil)
	c := sdkClient(srv.URL, tokA)
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	_, err := c.Messages.New(ctx, judgeParams(1))
	cancel()
	if err == nil {
		t.Fatal("the request was answered: the test proves nothing")
	}
	for end := time.Now().Add(10 * time.Second); len(run.Server.Ledger()) == 0 && time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
	}
	waitIdle(t, g)
	billed := cost.Nanos(run.Server.LedgerTotals().CostNanos)
	es := ledgerEntries(t, g)
	read, unread := splitLedger(es)
	if billed == 0 || read != 0 || unread < billed || len(es) != 1 || !es[0].Abandoned {
		t.Errorf("the simulator billed %v; the ledger %+v (%v read, %v unread): want the abandoned request's worst case", billed, es, read, unread)
	}
}

// A stream whose message_start cannot be read, then ended by an error
// event, began all the same: it counts at its worst case (the usage of a
// malformed message_start is not needed to know the API started it).
func TestStreamWithAnUnreadableStartCountedAtWorstCase(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("content-type", "text/event-stream")
		w.Header().Set("request-id", "req_upstream_1")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":\n\n"+
			"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n")
	}))
	defer up.Close()
	g, srv := startGW(t, run, func(c *Config) { c.BaseURL = up.URL })
	status, answer, paid := gwPost(t, srv.URL, tokA, []byte(longPlain(1)))
	if status != http.StatusOK || !bytes.Contains(answer, []byte("overloaded_error")) {
		t.Fatalf("%d %s", status, answer)
	}
	waitIdle(t, g)
	es := ledgerEntries(t, g)
	if len(es) != 1 || es[0].Unread == 0 || es[0].Unread != es[0].Cost || paid != es[0].Cost || es[0].RequestID != "req_upstream_1" {
		t.Errorf("ledger %+v, cost trailer %v: want the stream's worst case, unread", es, paid)
	}
}
