package openaiconform

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/gateway"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/openai"
	"github.com/apidispatch/apidispatch/sim"
)

// The official openai Go SDK through 'apidispatch serve': the gateway in
// front of a simulator with Anthropic and OpenAI orgs, the SDK given only
// the gateway's base URL and a gateway token.

const (
	tokA = "sk-gw-test-openai-client-alpha-01"
	tokB = "sk-gw-test-openai-client-bravo-02"
)

// serve starts a gateway over every org of run (its OpenAI orgs too) with
// clients a and b, changed by mutate, until the test ends.
func serve(t testing.TB, run *sim.Running, mutate func(*gateway.Config)) (*gateway.Gateway, string, string) {
	t.Helper()
	cfg := gateway.Config{Orgs: run.Server.AllOrgs(), BaseURL: run.URL, Speed: run.Server.Speed(), Prices: cost.Default(),
		Clients:  []gateway.Client{{Name: "a", Token: tokA}, {Name: "b", Token: tokB}},
		StateDir: t.TempDir(), RetryFor: time.Minute}
	if mutate != nil {
		mutate(&cfg)
	}
	g, err := gateway.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(g.Handler())
	t.Cleanup(func() {
		srv.Close()
		g.Close()
	})
	return g, srv.URL, cfg.StateDir
}

// gwClient is the SDK as a gateway client configures it.
func gwClient(url, tok string) oai.Client {
	return oai.NewClient(option.WithBaseURL(url+"/v1/"), option.WithAPIKey(tok), option.WithMaxRetries(0), option.WithHTTPClient(testClient))
}

// priceOf is the cost of an SDK usage at the OpenAI price table.
func priceOf(t testing.TB, model string, u oai.CompletionUsage) cost.Nanos {
	t.Helper()
	n, err := cost.OpenAI().Cost(model, openai.Usage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens,
		PromptTokensDetails:     openai.PromptTokensDetails{CachedTokens: u.PromptTokensDetails.CachedTokens},
		CompletionTokensDetails: openai.CompletionTokensDetails{ReasoningTokens: u.CompletionTokensDetails.ReasoningTokens}}, false)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// openAIBill is what the simulator billed its OpenAI orgs.
func openAIBill(run *sim.Running, names ...string) cost.Nanos {
	var n cost.Nanos
	for _, o := range run.Server.Stats().Orgs {
		for _, name := range names {
			if o.Name == name {
				n += cost.Nanos(o.CostNanos)
			}
		}
	}
	return n
}

// spentOn is what g's ledger holds for orgs, once every answer is settled:
// an openai SDK ends a stream at its "data: [DONE]", before the gateway
// has settled it, so it waits (up to 10 s) until the ledger agrees with
// the simulator's bill or stops changing.
func spentOn(g *gateway.Gateway, run *sim.Running, orgs ...string) cost.Nanos {
	sum := func() cost.Nanos {
		var n cost.Nanos
		by := g.Ledger().ByOrg()
		for _, o := range orgs {
			n += by[o]
		}
		return n
	}
	last, since := sum(), time.Now()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		n := sum()
		if n != last {
			last, since = n, time.Now()
		}
		if n == openAIBill(run, orgs...) || time.Since(since) > 2*time.Second {
			return n
		}
	}
	return last
}

// TestOpenAISDKThroughServe: every call of a judge workflow through the
// gateway 0 differ from the SDK's declared shapes, as against the API:
// the models list (of the OpenAI orgs, for an OpenAI client), a
// completion, the same streamed with the usage (accumulated = the
// completion) and without it (the client gets no usage chunk, the gateway
// still settles it exactly), n choices, a 400 passed on as the API's, a
// bad gateway token's 401 in OpenAI's envelope; the ledger is the
// simulator's bill to the nano-dollar.
func TestOpenAISDKThroughServe(t *testing.T) {
	cfg := oaTestConfig()
	cfg.Speed = 200
	run := startSim(t, cfg)
	g, url, _ := serve(t, run, nil)
	cl := gwClient(url, tokA)
	ctx := context.Background()
	var billed cost.Nanos

	models, err := cl.Models.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(models.Data) != 4 || models.Data[0].ID != "gpt-4.1-mini" || models.Data[0].Object != "model" {
		t.Errorf("models through serve: %s", models.RawJSON())
	}
	noDiffer(t, "models", models)
	if m, err := cl.Models.Get(ctx, "o4-mini"); err != nil || m.ID != "o4-mini" {
		t.Errorf("model through serve: %+v, %v", m, err)
	}

	var raw *http.Response
	c1, err := cl.Chat.Completions.New(ctx, judgeParams(1), option.WithResponseInto(&raw))
	if err != nil {
		t.Fatal(err)
	}
	noDiffer(t, "completion", c1)
	if c1.Object != "chat.completion" || len(c1.Choices) != 1 || c1.Choices[0].FinishReason != "stop" || c1.Usage.CompletionTokens == 0 {
		t.Errorf("completion: %s", c1.RawJSON())
	}
	n1 := priceOf(t, c1.Model, c1.Usage)
	billed += n1
	if got := raw.Header.Get("x-apidispatch-cost-usd"); got != strconv.FormatFloat(n1.USD(), 'f', -1, 64) {
		t.Errorf("cost header %s, want %v", got, n1.USD())
	}
	if raw.Header.Get("x-request-id") == "" || raw.Header.Get("openai-organization") != "" {
		t.Errorf("headers: x-request-id %q, openai-organization %q (the upstream org's id must not reach a client)",
			raw.Header.Get("x-request-id"), raw.Header.Get("openai-organization"))
	}

	for _, withUsage := range []bool{true, false} {
		sp := judgeParams(1)
		if withUsage {
			sp.StreamOptions = oai.ChatCompletionStreamOptionsParam{IncludeUsage: oai.Bool(true)}
		}
		stream := cl.Chat.Completions.NewStreaming(ctx, sp)
		acc := oai.ChatCompletionAccumulator{}
		chunks, usageChunks := 0, 0
		for stream.Next() {
			ch := stream.Current()
			chunks++
			noDiffer(t, "chunk", ch)
			acc.AddChunk(ch)
			if ch.JSON.Usage.Raw() != "" {
				usageChunks++
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if withUsage && usageChunks != chunks || !withUsage && usageChunks != 0 || chunks < 4 {
			t.Errorf("include_usage %v: %d chunks, %d with a usage field", withUsage, chunks, usageChunks)
		}
		if acc.Choices[0].Message.Content != c1.Choices[0].Message.Content || acc.Choices[0].FinishReason != "stop" {
			t.Errorf("include_usage %v: stream %q differs from %q", withUsage, acc.Choices[0].Message.Content, c1.Choices[0].Message.Content)
		}
		if withUsage && (acc.Usage.CompletionTokens != c1.Usage.CompletionTokens || acc.Usage.PromptTokens != c1.Usage.PromptTokens) {
			t.Errorf("stream usage %+v, completion's %+v", acc.Usage, c1.Usage)
		}
		billed += n1 // the same request: the same answer and bill
	}

	np := judgeParams(2)
	np.N = oai.Int(3)
	c3, err := cl.Chat.Completions.New(ctx, np)
	if err != nil || len(c3.Choices) != 3 {
		t.Fatalf("n=3: %v %v", c3, err)
	}
	noDiffer(t, "n=3", c3)
	billed += priceOf(t, c3.Model, c3.Usage)

	bad := judgeParams(3)
	bad.Temperature = oai.Float(3)
	_, err = cl.Chat.Completions.New(ctx, bad)
	var apiErr *oai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Type != "invalid_request_error" || apiErr.Param != "temperature" {
		t.Errorf("400 through serve: %v", err)
	} else {
		noDiffer(t, "error", apiErr)
	}

	unpriced := judgeParams(3)
	unpriced.Model = "gpt-not-in-the-price-table"
	_, err = cl.Chat.Completions.New(ctx, unpriced)
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != "model" || !strings.Contains(apiErr.Message, "no price") {
		t.Errorf("a model without a price: %v", err)
	}

	stranger := gwClient(url, "sk-gw-not-a-token-of-this-gateway")
	_, err = stranger.Chat.Completions.New(ctx, judgeParams(1))
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 401 || apiErr.Type != "invalid_request_error" || apiErr.Code != "invalid_api_key" || apiErr.Message == "" {
		t.Errorf("401 of a bad gateway token: %v", err)
	} else {
		noDiffer(t, "401", apiErr)
	}
	if _, err = stranger.Models.List(ctx); !errors.As(err, &apiErr) || apiErr.StatusCode != 401 || apiErr.Code != "invalid_api_key" {
		t.Errorf("401 of models: %v", err)
	}

	sim := openAIBill(run, "oa")
	if got := spentOn(g, run, "oa"); got != billed || got != sim {
		t.Errorf("ledger %d, the SDK's usage priced %d, the simulator billed %d (nano-dollars)", got, billed, sim)
	}
}

// oaOrgs adds two OpenAI orgs (gpt_a, gpt_b) with roomy limits to a
// preset's Anthropic orgs.
func oaOrgs(c *sim.Config) {
	for _, n := range []string{"gpt_a", "gpt_b"} {
		c.Orgs = append(c.Orgs, sim.OrgConfig{Name: n, Provider: sim.ProviderOpenAI, ServiceCapacity: 120,
			ModelLimits: map[string]sim.OpenAILimits{"*": {RPM: 100_000, TPM: 100_000_000}}})
	}
}

// The cap per key holds for OpenAI lanes: with a cap of 2 for the
// gpt-mini family, 24 requests at once never have more than 2 in flight
// on either org (the simulator's count), and do reach 2.
func TestOpenAIServeCapPerKeyHeld(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 100, oaOrgs)
	_, url, _ := serve(t, run, func(c *gateway.Config) { c.Caps = map[string]int{"gpt-mini": 2} })
	cl := gwClient(url, tokA)
	var wg sync.WaitGroup
	errs := make(chan error, 24)
	for i := range 24 {
		wg.Go(func() {
			p := judgeParams(i)
			if i%2 == 1 {
				_, err := cl.Chat.Completions.New(context.Background(), p)
				errs <- err
				return
			}
			s := cl.Chat.Completions.NewStreaming(context.Background(), p)
			for s.Next() {
			}
			errs <- s.Err()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	top := int64(0)
	for _, o := range run.Server.Stats().Orgs {
		if o.Name == "gpt_a" || o.Name == "gpt_b" {
			if o.MaxInFlight > 2 {
				t.Errorf("org %s had %d requests in flight, above the cap of 2", o.Name, o.MaxInFlight)
			}
			top = max(top, o.MaxInFlight)
			t.Logf("org %s: at most %d in flight (cap 2)", o.Name, o.MaxInFlight)
		}
	}
	if top < 2 {
		t.Errorf("no org reached the cap (at most %d in flight): the load proves nothing", top)
	}
}

// A client's max_cost holds for chat completions whose answers are cut:
// non-streamed answers reset or truncated after the API billed them, and
// streams ended by an error event after they began, are each counted at
// their worst case, so what the simulator billed never passes what the
// ledger holds, which never passes max_cost.
func TestOpenAIServeMaxCostHeldWithCutAnswers(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 100, oaOrgs)
	worst, err := cost.OpenAI().WorstCase("gpt-4.1-mini", 400, 200, 1, false)
	if err != nil {
		t.Fatal(err)
	}
	maxCost := worst * 30
	g, url, _ := serve(t, run, func(c *gateway.Config) {
		c.Clients[0].MaxCost = maxCost
		c.RetryFor = 5 * time.Second
	})
	for _, k := range []sim.FaultKind{sim.FaultTruncatedBody, sim.FaultConnectionReset, sim.FaultStreamOverloaded} {
		if _, err := run.Server.AddFault(sim.Fault{Kind: k, Probability: 0.25}); err != nil {
			t.Fatal(err)
		}
	}
	cl := gwClient(url, tokA)
	// Four workers, each sending until the cap refuses it: most requests
	// are settled before the cap is reached, so undercounted cuts would
	// let more through.
	var wg sync.WaitGroup
	var mu sync.Mutex
	refused, ok, sent := 0, 0, 0
	for w := range 4 {
		wg.Go(func() {
			for i := w; i < 400; i += 4 {
				var err error
				if i%2 == 0 {
					_, err = cl.Chat.Completions.New(context.Background(), judgeParams(i))
				} else {
					s := cl.Chat.Completions.NewStreaming(context.Background(), judgeParams(i))
					for s.Next() {
					}
					err = s.Err()
				}
				mu.Lock()
				sent++
				var apiErr *oai.Error
				stop := false
				switch {
				case err == nil:
					ok++
				case errors.As(err, &apiErr) && apiErr.StatusCode == 429 && apiErr.Code == "insufficient_quota":
					refused++
					stop = true
				}
				mu.Unlock()
				if stop {
					return
				}
			}
		})
	}
	wg.Wait()
	spent, bill := spentOn(g, run, "gpt_a", "gpt_b"), openAIBill(run, "gpt_a", "gpt_b")
	t.Logf("max_cost %d, ledger %d, simulator bill %d (nano-dollars); %d sent, %d answered, %d refused by the cap", maxCost, spent, bill, sent, ok, refused)
	if bill > spent {
		t.Errorf("the simulator billed %d, the ledger holds %d: cut answers were undercounted", bill, spent)
	}
	if spent > maxCost {
		t.Errorf("ledger %d passes max_cost %d", spent, maxCost)
	}
	if refused == 0 || ok == 0 {
		t.Errorf("%d answered, %d refused by max_cost: the cap was not reached, the test proves nothing", ok, refused)
	}
}

// Two clients share the OpenAI lanes fairly: b, with 4 requests at a time
// against a's 20, gets about half of the 4 slots (2 orgs × a cap of 2)
// while both wait, not the fifth that arrival order would give it.
func TestOpenAIServeFairShares(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 100, oaOrgs)
	_, url, _ := serve(t, run, func(c *gateway.Config) { c.Caps = map[string]int{"gpt-mini": 2} })
	var mu sync.Mutex
	done := map[string]int{}
	total := 0
	stop := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	var failed []error
	worker := func(tok string, w int) {
		cl := gwClient(url, tok)
		for i := w; ; i += 24 {
			select {
			case <-stop:
				return
			default:
			}
			_, err := cl.Chat.Completions.New(context.Background(), judgeParams(i))
			mu.Lock()
			if err != nil {
				failed = append(failed, err)
			} else if total++; total > 40 { // the first 40 warm up
				done[tok]++
			}
			if total >= 240 {
				once.Do(func() { close(stop) })
			}
			mu.Unlock()
		}
	}
	for w := range 20 {
		wg.Go(func() { worker(tokA, w) })
	}
	for w := range 4 {
		wg.Go(func() { worker(tokB, 20+w) })
	}
	wg.Wait()
	if len(failed) > 0 {
		t.Fatalf("%d failed, first: %v", len(failed), failed[0])
	}
	share := float64(done[tokB]) / float64(done[tokA]+done[tokB])
	t.Logf("b's share of the answers: %.3f (a %d, b %d)", share, done[tokA], done[tokB])
	if share < 0.35 {
		t.Errorf("b got %.3f of the answers with 4 requests against a's 20 at equal weight; a fair share is 0.5", share)
	}
}

// The gateway's own answers to an OpenAI client are OpenAI's: its 429 when
// no lane admitted a request within --retry-for (type requests, code
// rate_limit_exceeded, retry-after, x-should-retry true: the SDKs retry
// it), and a stopping gateway's 503 (retried too), each with every field
// the SDK declares.
func TestOpenAIServeOwnErrorsInOpenAIsForm(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 100, oaOrgs)
	if _, err := run.Server.AddFault(sim.Fault{Kind: sim.FaultSlow, ExtraLatency: 200 * time.Second}); err != nil {
		t.Fatal(err)
	}
	g, url, _ := serve(t, run, func(c *gateway.Config) {
		c.Caps = map[string]int{"gpt-mini": 1}
		c.RetryFor = 300 * time.Millisecond
	})
	cl := gwClient(url, tokA)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var own []*oai.Error
	var heads []http.Header
	for i := range 6 {
		wg.Go(func() {
			var raw *http.Response
			_, err := cl.Chat.Completions.New(context.Background(), judgeParams(i), option.WithResponseInto(&raw))
			var apiErr *oai.Error
			if errors.As(err, &apiErr) {
				mu.Lock()
				own = append(own, apiErr)
				heads = append(heads, apiErr.Response.Header)
				mu.Unlock()
			} else if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if len(own) < 3 {
		t.Fatalf("%d of 6 requests refused on 2 slots held 2 s each with --retry-for 300 ms", len(own))
	}
	for i, e := range own {
		h := heads[i]
		if e.StatusCode != 429 || e.Type != "requests" || e.Code != "rate_limit_exceeded" || h.Get("retry-after") == "" || h.Get("x-should-retry") != "true" {
			t.Errorf("the gateway's 429: %d %q %q, retry-after %q, x-should-retry %q: %s", e.StatusCode, e.Type, e.Code, h.Get("retry-after"), h.Get("x-should-retry"), e.RawJSON())
		}
		noDiffer(t, "429", e)
	}

	g.Drain()
	_, err := cl.Chat.Completions.New(context.Background(), judgeParams(1))
	var apiErr *oai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 503 || apiErr.Type != "server_error" || apiErr.Response.Header.Get("x-should-retry") != "true" {
		t.Errorf("a stopping gateway's answer: %v", err)
	} else {
		noDiffer(t, "503", apiErr)
	}
}

// BenchmarkOpenAIServeOverhead compares chat completions sent by the SDK
// straight to the simulator (answering at once) with the same sent
// through the gateway, in one run: 8 at a time, streamed every other one.
// It reports each route's wall time per request and their ratio.
func BenchmarkOpenAIServeOverhead(b *testing.B) {
	cfg := oaTestConfig()
	cfg.Speed = 1000
	run, err := sim.Start(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { run.Close() })
	_, url, _ := serve(b, run, nil)
	direct := oaClient(run, 0)
	through := gwClient(url, tokA)
	drive := func(cl oai.Client, n int) time.Duration {
		t0 := time.Now()
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Go(func() {
				for i := w; i < n; i += 8 {
					if i%2 == 0 {
						if _, err := cl.Chat.Completions.New(context.Background(), judgeParams(i)); err != nil {
							b.Error(err)
						}
						continue
					}
					s := cl.Chat.Completions.NewStreaming(context.Background(), judgeParams(i))
					for s.Next() {
					}
					if s.Err() != nil {
						b.Error(s.Err())
					}
				}
			})
		}
		wg.Wait()
		return time.Since(t0)
	}
	drive(direct, 64) // warm both
	drive(through, 64)
	b.ResetTimer()
	var d, s time.Duration
	for b.Loop() {
		d += drive(direct, 400)
		s += drive(through, 400)
	}
	n := float64(b.N * 400)
	b.ReportMetric(float64(d.Microseconds())/n, "direct-µs/req")
	b.ReportMetric(float64(s.Microseconds())/n, "serve-µs/req")
	b.ReportMetric(float64(s)/float64(d), "serve/direct")
}

// An OpenAI client through the gateway reads OpenAI's rate-limit headers
// summed over the OpenAI orgs in rotation (here two of 100,000 RPM, at
// speed 100), not the headers of the one org that answered, and no
// Anthropic ones.
func TestOpenAIServeRateLimitHeadersAreTheGatewaysWhole(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 100, oaOrgs)
	_, url, _ := serve(t, run, nil)
	cl := gwClient(url, tokA)
	var raw *http.Response
	for i := range 4 { // the orgs take turns: both answer
		if _, err := cl.Chat.Completions.New(context.Background(), judgeParams(i), option.WithResponseInto(&raw)); err != nil {
			t.Fatal(err)
		}
	}
	rl := openai.ParseRateLimits(raw.Header, time.Now())
	if !rl.Requests.Present || rl.Requests.Limit != 2*100_000*100 || !rl.Tokens.Present || rl.Tokens.Limit != 2*100_000_000*100 || rl.Requests.Reset.IsZero() {
		t.Errorf("rate limits through serve %+v; want the two orgs' sum", rl)
	}
	for k := range raw.Header {
		if strings.HasPrefix(strings.ToLower(k), "anthropic-") {
			t.Errorf("an Anthropic header to an OpenAI client: %s", k)
		}
	}
}

// A stream cut after it began (an error event mid-stream, no usage chunk,
// no [DONE]) reaches the client as an error and is counted at its worst
// case, all of it unread: the gateway cannot know what the API billed.
func TestOpenAIServeCutStreamCountedAtWorstCase(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 100, oaOrgs)
	if _, err := run.Server.AddFault(sim.Fault{Kind: sim.FaultStreamOverloaded}); err != nil {
		t.Fatal(err)
	}
	g, url, _ := serve(t, run, nil)
	cl := gwClient(url, tokA)
	s := cl.Chat.Completions.NewStreaming(context.Background(), judgeParams(1))
	n := 0
	for s.Next() {
		n++
	}
	if n == 0 || s.Err() == nil {
		t.Fatalf("%d chunks, error %v: want chunks, then the cut's error", n, s.Err())
	}
	// The worst case of the request: at least its 200 completion tokens.
	floor, _ := cost.OpenAI().WorstCase("gpt-4.1-mini", 1, 200, 1, false)
	// The gateway writes the ledger entry as the attempt ends, which can
	// come just after the client read the cut's error (a CI run found the
	// ledger empty at once; the reservation holds the worst case meanwhile).
	var spent cost.Nanos
	var cs []gateway.ClientSpend
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		cs, _ = g.Ledger().Totals()
		spent = spentOn(g, run, "gpt_a", "gpt_b")
		if len(cs) > 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(cs) == 0 {
		t.Fatalf("a cut stream not in the ledger 10 s after its error reached the client (%d nano-dollars spent)", spent)
	}
	if spent < floor || cs[0].UnreadUSD != cs[0].SpentUSD {
		t.Errorf("a cut stream counted %d nano-dollars (unread %v of %v USD); want its worst case (≥ %d), all unread", spent, cs[0].UnreadUSD, cs[0].SpentUSD, floor)
	}
}
