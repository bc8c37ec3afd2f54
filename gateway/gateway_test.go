package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/sim"
)

const (
	tokA = "sk-gw-test-client-alpha-0001"
	tokB = "sk-gw-test-client-bravo-0002"
)

// startGW serves a gateway in front of run with two clients (a, b), changed
// by mutate, until the test ends.
func startGW(t testing.TB, run *sim.Running, mutate func(*Config)) (*Gateway, *httptest.Server) {
	t.Helper()
	cfg := Config{
		Orgs: run.Server.Orgs(), BaseURL: run.URL, Speed: run.Server.Speed(), Prices: cost.Default(),
		Clients:  []Client{{Name: "a", Token: tokA}, {Name: "b", Token: tokB}},
		StateDir: t.TempDir(), RetryFor: time.Minute,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(g.Handler())
	t.Cleanup(func() {
		srv.Close()
		g.Close()
	})
	return g, srv
}

func sdkClient(url, tok string, opts ...option.RequestOption) sdk.Client {
	return sdk.NewClient(append([]option.RequestOption{option.WithBaseURL(url), option.WithAPIKey(tok), option.WithMaxRetries(0)}, opts...)...)
}

func judgeParams(i int) sdk.MessageNewParams {
	return sdk.MessageNewParams{
		Model:     "claude-sonnet-4-5",
		MaxTokens: 256,
		System:    []sdk.TextBlockParam{{Text: "You are a judge. Evaluate the answer."}},
		Messages:  []sdk.MessageParam{sdk.NewUserMessage(sdk.NewTextBlock(fmt.Sprintf("Item %d. Provide your evaluation as a JSON object.", i)))},
	}
}

func upstreamRequests(run *sim.Running) int64 {
	var n int64
	for _, o := range run.Server.Stats().Orgs {
		n += o.Requests
	}
	return n
}

// The official Go SDK works against the gateway with only the base URL and
// key changed: create (with the gateway's headers and the ledger),
// stream (the accumulated message equals the unstreamed one),
// count_tokens, models list and retrieve.
func TestSDKMessagesThroughGateway(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	g, srv := startGW(t, run, nil)
	c := sdkClient(srv.URL, tokA)
	ctx := context.Background()

	var raw *http.Response
	plain, err := c.Messages.New(ctx, judgeParams(1), option.WithResponseInto(&raw))
	if err != nil {
		t.Fatal(err)
	}
	if plain.Usage.OutputTokens == 0 || len(plain.Content) == 0 {
		t.Fatalf("message %s", plain.RawJSON())
	}
	h := raw.Header
	if h.Get("request-id") == "" || h.Get(headerOrg) == "" || h.Get(headerAttempts) != "1" || h.Get("anthropic-organization-id") != "" {
		t.Errorf("headers %v", h)
	}
	want, _ := cost.Default().Cost("claude-sonnet-4-5", usageOf(plain), false)
	if got := h.Get(headerCost); got != strconv.FormatFloat(want.USD(), 'f', -1, 64) {
		t.Errorf("cost header %s, want %v", got, want.USD())
	}
	if got := h.Get("anthropic-ratelimit-requests-limit"); got == "" {
		t.Errorf("no aggregate rate-limit headers: %v", h)
	}

	stream := c.Messages.NewStreaming(ctx, judgeParams(1), option.WithResponseInto(&raw))
	var acc sdk.Message
	for stream.Next() {
		if err := acc.Accumulate(stream.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if acc.Model != plain.Model || acc.StopReason != plain.StopReason || len(acc.Content) != len(plain.Content) ||
		acc.Content[0].Text != plain.Content[0].Text || acc.Usage.InputTokens != plain.Usage.InputTokens || acc.Usage.OutputTokens != plain.Usage.OutputTokens {
		t.Errorf("streamed %s\nplain %s", acc.RawJSON(), plain.RawJSON())
	}
	if !strings.HasPrefix(raw.Header.Get("content-type"), "text/event-stream") || raw.Header.Get(headerOrg) == "" {
		t.Errorf("stream headers %v", raw.Header)
	}

	n, err := c.Messages.CountTokens(ctx, sdk.MessageCountTokensParams{Model: "claude-sonnet-4-5",
		Messages: []sdk.MessageParam{sdk.NewUserMessage(sdk.NewTextBlock("Hello there"))}})
	if err != nil || n.InputTokens <= 0 {
		t.Errorf("count_tokens %+v %v", n, err)
	}
	page, err := c.Models.List(ctx, sdk.ModelListParams{})
	if err != nil || len(page.Data) == 0 {
		t.Fatalf("models list %v %v", page, err)
	}
	m, err := c.Models.Get(ctx, "claude-haiku-4-5", sdk.ModelGetParams{})
	if err != nil || m.ID != "claude-haiku-4-5" {
		t.Errorf("models get %+v %v", m, err)
	}
	_, err = c.Models.Get(ctx, "claude-nonexistent-9", sdk.ModelGetParams{})
	wantStatus(t, err, 404)

	// The ledger holds both answers at the simulator's prices.
	g.Ledger().Flush()
	cl, tot := g.Ledger().Totals()
	simCost := run.Server.LedgerTotals().CostNanos
	if len(cl) == 0 || tot.Requests != 2 || cost.Nanos(simCost).USD() != tot.SpentUSD {
		t.Errorf("ledger %+v total %+v; simulator billed %d n$", cl, tot, simCost)
	}
}

func usageOf(m *sdk.Message) anthropic.Usage {
	return anthropic.Usage{InputTokens: m.Usage.InputTokens, OutputTokens: m.Usage.OutputTokens,
		CacheCreationInputTokens: m.Usage.CacheCreationInputTokens, CacheReadInputTokens: m.Usage.CacheReadInputTokens}
}

func wantStatus(t *testing.T, err error, status int) *sdk.Error {
	t.Helper()
	var apiErr *sdk.Error
	if !errors.As(err, &apiErr) {
		t.Fatalf("err %v (%T): want an API error %d", err, err, status)
	}
	if apiErr.StatusCode != status {
		t.Errorf("status %d (%v), want %d", apiErr.StatusCode, apiErr, status)
	}
	return apiErr
}

// Hostile input gets the API's error and sends nothing upstream: a wrong
// token (x-api-key and Bearer), no token, a body over 32 MB, malformed
// JSON, a missing model.
func TestHostileInputSendsNothingUpstream(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	_, srv := startGW(t, run, nil)
	post := func(path string, body []byte, hdr map[string]string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+path, bytes.NewReader(body))
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	good := []byte(`{"model":"claude-sonnet-4-5","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`)
	for _, tc := range []struct {
		name, path string
		body       []byte
		hdr        map[string]string
		status     int
		typ        string
	}{
		{"wrong token", "/v1/messages", good, map[string]string{"x-api-key": "sk-gw-wrong-token-000000000"}, 401, "authentication_error"},
		{"wrong bearer", "/v1/messages", good, map[string]string{"Authorization": "Bearer sk-gw-wrong-token-000000000"}, 401, "authentication_error"},
		{"no token", "/v1/messages", good, nil, 401, "authentication_error"},
		{"upstream key as token", "/v1/messages", good, map[string]string{"x-api-key": run.Server.Orgs()[0].Key.Reveal()}, 401, "authentication_error"},
		{"over 32 MB", "/v1/messages", bytes.Repeat([]byte("a"), MaxMessagesBytes+1), map[string]string{"x-api-key": tokA}, 413, "request_too_large"},
		{"malformed JSON", "/v1/messages", []byte(`{"model":"claude-sonnet-4-5",`), map[string]string{"x-api-key": tokA}, 400, "invalid_request_error"},
		{"no model", "/v1/messages", []byte(`{"max_tokens":16,"messages":[]}`), map[string]string{"x-api-key": tokA}, 400, "invalid_request_error"},
		{"count_tokens malformed", "/v1/messages/count_tokens", []byte(`[`), map[string]string{"Authorization": "Bearer " + tokA}, 400, "invalid_request_error"},
		{"batch malformed", "/v1/messages/batches", []byte(`{"requests":`), map[string]string{"x-api-key": tokA}, 400, "invalid_request_error"},
		{"batch over 256 MB", "/v1/messages/batches", bytes.Repeat([]byte(" "), MaxBatchBytes+1), map[string]string{"x-api-key": tokA}, 413, "request_too_large"},
		{"batch over 100,000", "/v1/messages/batches", manyRequests(MaxBatchRequests + 1), map[string]string{"x-api-key": tokA}, 400, "invalid_request_error"},
	} {
		status, body := post(tc.path, tc.body, tc.hdr)
		if status != tc.status || !strings.Contains(body, `"type":"`+tc.typ+`"`) || !strings.HasPrefix(body, `{"type":"error","error":`) {
			t.Errorf("%s: %d %.200s, want %d %s", tc.name, status, body, tc.status, tc.typ)
		}
	}
	if n := upstreamRequests(run); n != 0 {
		t.Errorf("%d requests reached the simulator", n)
	}
}

func manyRequests(n int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"requests":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"custom_id":"r%d","params":{"model":"claude-haiku-4-5","max_tokens":1,"messages":[{"role":"user","content":"x"}]}}`, i)
	}
	b.WriteString(`]}`)
	return b.Bytes()
}

// A client over its max_cost gets a 400 invalid_request_error (which the
// SDKs never retry) naming the cap; the reservation of the worst case
// means the cap is never passed even at concurrency.
func TestClientMaxCostNeverPassed(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	capN := cost.Nanos(20_000_000) // $0.02: a few judge calls at worst case
	g, srv := startGW(t, run, func(c *Config) { c.Clients[0].MaxCost = capN })
	c := sdkClient(srv.URL, tokA)
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok, refused := 0, 0
	for i := range 40 {
		wg.Go(func() {
			_, err := c.Messages.New(context.Background(), judgeParams(i))
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				ok++
				return
			}
			var apiErr *sdk.Error
			if errors.As(err, &apiErr) && apiErr.StatusCode == 400 && strings.Contains(apiErr.Error(), "max_cost $0.02") &&
				apiErr.Response.Header.Get("x-should-retry") == "false" {
				refused++
				return
			}
			t.Errorf("request %d: %v", i, err)
		})
	}
	wg.Wait()
	if ok == 0 || refused == 0 {
		t.Errorf("%d answered, %d refused: want both", ok, refused)
	}
	billed := cost.Nanos(run.Server.LedgerTotals().CostNanos)
	if billed > capN {
		t.Errorf("billed %s over the cap %s", billed, capN)
	}
	// Client b has no cap of its own.
	if _, err := sdkClientB(srv.URL).Messages.New(context.Background(), judgeParams(99)); err != nil {
		t.Errorf("client b: %v", err)
	}
	_ = g
}

func sdkClientB(url string) *sdk.Client {
	c := sdkClient(url, tokB)
	return &c
}

// A 429 storm on every org shorter than --retry-for is absorbed inside the
// gateway: the client (max retries 0) sees only 200s.
func TestStormShorterThanRetryForReachesNoClient(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	_, srv := startGW(t, run, nil)
	if _, err := run.Server.AddFault(sim.Fault{ID: "storm", Kind: sim.FaultRateLimitStorm, FromNow: true, Duration: 60 * time.Second, RetryAfter: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	c := sdkClient(srv.URL, tokA)
	var wg sync.WaitGroup
	for i := range 30 {
		wg.Go(func() {
			var raw *http.Response
			if _, err := c.Messages.New(context.Background(), judgeParams(i), option.WithResponseInto(&raw)); err != nil {
				t.Errorf("request %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	var s429 int64
	for _, o := range run.Server.Stats().Orgs {
		s429 += o.RateLimited429
	}
	if s429 == 0 {
		t.Errorf("the storm sent no 429: the test proves nothing")
	}
}

// When the storm outlasts --retry-for, the last 429 is passed on with its
// retry-after.
func TestStormLongerThanRetryForPassesTheLast429(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	_, srv := startGW(t, run, func(c *Config) { c.RetryFor = 300 * time.Millisecond })
	if _, err := run.Server.AddFault(sim.Fault{ID: "storm", Kind: sim.FaultRateLimitStorm, RetryAfter: 20 * time.Second}); err != nil {
		t.Fatal(err)
	}
	c := sdkClient(srv.URL, tokA)
	_, err := c.Messages.New(context.Background(), judgeParams(1))
	e := wantStatus(t, err, 429)
	if e != nil && (e.Response.Header.Get("retry-after") == "" || e.Response.Header.Get(headerAttempts) == "") {
		t.Errorf("429 headers %v", e.Response.Header)
	}
}

// An upstream key's 401 is not the client's error: the org leaves the
// rotation and the request is answered by another.
func TestRevokedUpstreamKeyTakesItsOrgOut(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	g, srv := startGW(t, run, nil)
	bad := run.Server.Orgs()[0]
	if _, err := run.Server.AddFault(sim.Fault{ID: "revoked", Kind: sim.FaultKeyRevoked, Org: bad.Name}); err != nil {
		t.Fatal(err)
	}
	c := sdkClient(srv.URL, tokA)
	for i := range 12 {
		var raw *http.Response
		if _, err := c.Messages.New(context.Background(), judgeParams(i), option.WithResponseInto(&raw)); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if raw.Header.Get(headerOrg) == bad.Name {
			t.Errorf("answered by the revoked org")
		}
	}
	if r := g.Status().Orgs[bad.Name]; r == "" {
		t.Errorf("org %s still in rotation: %+v", bad.Name, g.Status().Orgs)
	}
	// count_tokens and models go to the orgs left.
	if _, err := c.Models.List(context.Background(), sdk.ModelListParams{}); err != nil {
		t.Error(err)
	}
}

// A stream whose upstream fails before its first byte is retried; one that
// fails after is forwarded as the API's error event.
func TestStreamRetriedOnlyBeforeItsFirstByte(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	_, srv := startGW(t, run, nil)
	c := sdkClient(srv.URL, tokA)
	// 529s before the stream: retried inside.
	if _, err := run.Server.AddFault(sim.Fault{ID: "ol", Kind: sim.FaultOverloaded, Probability: 0.5}); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		stream := c.Messages.NewStreaming(context.Background(), judgeParams(i))
		var acc sdk.Message
		for stream.Next() {
			acc.Accumulate(stream.Current())
		}
		if err := stream.Err(); err != nil || acc.StopReason == "" {
			t.Errorf("stream %d: %v %s", i, err, acc.RawJSON())
		}
	}
	run.Server.ClearFaults("ol")
	// An error event mid-stream reaches the client as the API's error.
	if _, err := run.Server.AddFault(sim.Fault{ID: "mid", Kind: sim.FaultStreamOverloaded}); err != nil {
		t.Fatal(err)
	}
	stream := c.Messages.NewStreaming(context.Background(), judgeParams(1))
	for stream.Next() {
	}
	if err := stream.Err(); err == nil || !strings.Contains(err.Error(), "overloaded") {
		t.Errorf("mid-stream error: %v", err)
	}
}

// A stream that an error event ends after its message_start: whether the
// API bills it is not documented (the simulator does not), and what
// message_start announced is only its start. The ledger counts its worst
// case, marked unread, so it is never below the bill; the request read
// whole is priced exactly.
func TestStreamErrorEventCountedAtWorstCase(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	g, srv := startGW(t, run, nil)
	c := sdkClient(srv.URL, tokA)
	if _, err := c.Messages.New(context.Background(), judgeParams(1)); err != nil {
		t.Fatal(err)
	}
	if _, err := run.Server.AddFault(sim.Fault{ID: "mid", Kind: sim.FaultStreamOverloaded}); err != nil {
		t.Fatal(err)
	}
	stream := c.Messages.NewStreaming(context.Background(), judgeParams(2))
	for stream.Next() {
	}
	if stream.Err() == nil {
		t.Fatal("no mid-stream error: the test proves nothing")
	}
	waitIdle(t, g)
	es := ledgerEntries(t, g)
	billed := run.Server.LedgerTotals()
	read, unread := splitLedger(es)
	// The worst case of 256 output tokens alone is 256 × $15/M.
	if len(es) != 2 || read != cost.Nanos(billed.CostNanos) || billed.Requests != 1 || unread < 256*15_000 {
		t.Errorf("ledger %+v: read %v unread %v; the simulator billed %d requests, %d n$", es, read, unread, billed.Requests, billed.CostNanos)
	}
}

// A client that goes away while its request is upstream: the request is
// let finish and billed in the ledger, counted abandoned; one that goes
// away while its request is being retried stops the retries.
func TestClientGoneRequestBilledAbandonedRetriesStop(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	g, srv := startGW(t, run, nil)
	if _, err := run.Server.AddFault(sim.Fault{ID: "slow", Kind: sim.FaultSlow, ExtraLatency: 300 * time.Second}); err != nil { // 1.5 s at K=200
		t.Fatal(err)
	}
	c := sdkClient(srv.URL, tokA)
	// The client leaves once its request is upstream (a fixed 150 ms was
	// spent, on a loaded machine, before the gateway had learnt the org
	// and sent it: nothing to bill then).
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		defer cancel()
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
			for _, o := range run.Server.Stats().Orgs {
				if o.InFlight > 0 {
					return
				}
			}
		}
	}()
	_, err := c.Messages.New(ctx, judgeParams(1))
	cancel()
	if err == nil {
		t.Fatal("the slow request answered before the client left")
	}
	deadline := time.Now().Add(10 * time.Second)
	for g.Status().Abandoned == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	g.Ledger().Flush()
	_, tot := g.Ledger().Totals()
	billed := run.Server.LedgerTotals()
	if tot.Abandoned != 1 || tot.Requests != 1 || billed.Requests != 1 || cost.Nanos(billed.CostNanos).USD() != tot.SpentUSD {
		t.Errorf("ledger %+v; simulator billed %d requests, %d n$", tot, billed.Requests, billed.CostNanos)
	}
	run.Server.ClearFaults("slow")

	// Every org answers 529 without retry-after: the gateway backs off and
	// retries until the client leaves, then sends nothing more.
	if _, err := run.Server.AddFault(sim.Fault{ID: "ol", Kind: sim.FaultOverloaded}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err = c.Messages.New(ctx, judgeParams(2))
	cancel()
	if err == nil {
		t.Fatal("answered during a 529 storm")
	}
	// The exchange ends (its reservation freed) once it sees the client
	// gone; a loaded machine may take longer than the 50 ms that were
	// waited here to see it, and an attempt begun meanwhile is not one
	// after the client left.
	for end := time.Now().Add(10 * time.Second); g.Status().Total.InFlight != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the request still runs 10 s after its client left (%d attempts)", g.Status().Attempts)
		}
	}
	at := g.Status().Attempts
	time.Sleep(500 * time.Millisecond)
	if later := g.Status().Attempts; later != at || at < 2 {
		t.Errorf("attempts %d then %d: want retries (≥2) that stop when the client leaves", at, later)
	}
}

// waitIdle waits until no request is in flight on any lane (the handler
// has settled its ledger entry after the client read its last byte).
func waitIdle(t *testing.T, g *Gateway) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		busy := 0
		for _, l := range g.Status().Lanes {
			busy += l.InFlight
		}
		if busy == 0 {
			return
		}
	}
	t.Fatal("requests still in flight")
}
