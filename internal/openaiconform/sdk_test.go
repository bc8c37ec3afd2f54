package openaiconform

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/respjson"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/openai"
	"github.com/apidispatch/apidispatch/sim"
)

var testClient = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}

func startSim(t *testing.T, cfg sim.Config) *sim.Running {
	t.Helper()
	run, err := sim.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { run.Close() })
	return run
}

const oaKey = "sk-proj-sim-oa-test"

// oaTestConfig is an Anthropic org "solo" and an OpenAI org "oa" whose
// gpt-4.1-mini has roomy limits and whose o4-mini has a TPM of 3,000.
func oaTestConfig() sim.Config {
	return sim.Config{
		Seed: 1, Latency: sim.LatencyConfig{Zero: true},
		Orgs: []sim.OrgConfig{
			{Name: "solo", Limits: map[anthropic.Pool]sim.Limits{anthropic.PoolSonnet4: {RPM: 600, ITPM: 60000, OTPM: 30000}}},
			{Name: "oa", Provider: sim.ProviderOpenAI, Keys: []string{oaKey}, Projects: []string{"proj_judge"},
				ModelLimits: map[string]sim.OpenAILimits{
					"gpt-4.1-mini": {RPM: 6000, TPM: 10_000_000},
					"o4-mini":      {RPM: 600, TPM: 3000},
				},
				// 40 requests take 120 API seconds (0.6 s at K = 200): long
				// enough for a loaded machine's polls to see them in progress.
				Batch: sim.BatchLimits{PerMinute: 20, CancelS: 2}},
		},
	}
}

func oaClient(run *sim.Running, retries int) oai.Client {
	return oai.NewClient(option.WithBaseURL(run.URL+"/v1/"), option.WithAPIKey(oaKey),
		option.WithOrganization(run.Server.OpenAIOrgs()[0].ID), option.WithProject("proj_judge"),
		option.WithMaxRetries(retries), option.WithHTTPClient(testClient))
}

// sdkDiffer lists how an object the SDK decoded differs from the shape the
// SDK declares: a required field absent (or null when it is not
// nullable), or a field the SDK does not know. It walks nested objects
// and lists of objects; unions and maps are checked at their own level.
func sdkDiffer(path string, v reflect.Value) []string {
	for v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return nil
		}
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return nil
	}
	meta := v.FieldByName("JSON")
	if !meta.IsValid() || meta.Kind() != reflect.Struct {
		return nil
	}
	var out []string
	if ex := meta.FieldByName("ExtraFields"); ex.IsValid() && ex.Len() > 0 {
		for _, k := range ex.MapKeys() {
			out = append(out, path+"."+k.String()+": a field the SDK does not know")
		}
	}
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.Name == "JSON" || name == "" || name == "-" {
			continue
		}
		fm := meta.FieldByName(f.Name)
		if !fm.IsValid() {
			continue
		}
		jf := fm.Interface().(respjson.Field)
		// The SDK's "required" means present; null is how the API writes
		// an empty required object or string (logprobs, refusal).
		if strings.Contains(f.Tag.Get("api"), "required") && jf.Raw() == respjson.Omitted {
			out = append(out, path+"."+name+": required, absent")
		}
		if jf.Raw() != respjson.Omitted && jf.Raw() != respjson.Null && !jf.Valid() {
			out = append(out, path+"."+name+": not of the SDK's type: "+jf.Raw())
		}
		if !jf.Valid() {
			continue // an absent or null object has no fields to check
		}
		fv := v.Field(i)
		switch {
		case strings.HasSuffix(f.Type.Name(), "Union"):
		case fv.Kind() == reflect.Slice:
			for j := range fv.Len() {
				out = append(out, sdkDiffer(path+"."+name+"["+strconv.Itoa(j)+"]", fv.Index(j))...)
			}
		default:
			out = append(out, sdkDiffer(path+"."+name, fv)...)
		}
	}
	return out
}

// noDiffer fails t when v differs from the SDK's shape, except for the
// fields named in documented: members the API reference documents that
// the SDK's type does not model (a cursor page's object, first_id and
// last_id).
func noDiffer(t *testing.T, what string, v any, documented ...string) {
	t.Helper()
	var d []string
	for _, x := range sdkDiffer(what, reflect.ValueOf(v)) {
		name, _, _ := strings.Cut(strings.TrimPrefix(x, what+"."), ":")
		if !slices.Contains(documented, name) {
			d = append(d, x)
		}
	}
	if len(d) > 0 {
		t.Errorf("%d differ:\n  %s", len(d), strings.Join(d, "\n  "))
	}
}

func judgeParams(i int) oai.ChatCompletionNewParams {
	return oai.ChatCompletionNewParams{
		Model: "gpt-4.1-mini",
		Messages: []oai.ChatCompletionMessageParamUnion{
			oai.SystemMessage("You are an impartial judge. Evaluate the answer for correctness."),
			oai.UserMessage("Question: what is 2+2? Answer: 4. Item " + strings.Repeat("x", i%7) + ". Reply with a JSON object."),
		},
		MaxCompletionTokens: oai.Int(200),
	}
}

// TestOpenAISDKJudgeWorkflow drives the official Go SDK through a judge
// workflow against the simulator over loopback: models, a completion, the
// same streamed with usage, n choices, a reasoning model, the batch
// lifecycle (upload, create, retrieve, list, cancel, results), and the
// errors: a 500 and a rate-limit 429 the SDK retries through, the quota
// 429 it gives up on. Every object the SDK decodes has every field it
// requires and none it does not know (0 differ), and the ledger equals
// the SDK's usage priced by package cost to the nano-dollar.
func TestOpenAISDKJudgeWorkflow(t *testing.T) {
	cfg := oaTestConfig()
	cfg.Speed = 200
	cfg.PromptCaching = true
	run := startSim(t, cfg)
	cl := oaClient(run, 0)
	ctx := context.Background()
	var billed cost.Nanos
	price := func(model string, u oai.CompletionUsage, batch bool) {
		n, err := cost.OpenAI().Cost(model, openai.Usage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens,
			PromptTokensDetails:     openai.PromptTokensDetails{CachedTokens: u.PromptTokensDetails.CachedTokens},
			CompletionTokensDetails: openai.CompletionTokensDetails{ReasoningTokens: u.CompletionTokensDetails.ReasoningTokens}}, batch)
		if err != nil {
			t.Fatal(err)
		}
		billed += n
	}

	// Models.
	models, err := cl.Models.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(models.Data) != 4 || models.Data[0].ID != "gpt-4.1-mini" {
		t.Errorf("models: %+v", models.Data)
	}
	noDiffer(t, "models", models)
	m, err := cl.Models.Get(ctx, "o4-mini")
	if err != nil || m.ID != "o4-mini" || m.OwnedBy == "" {
		t.Errorf("model: %+v, %v", m, err)
	}

	// A completion, with its headers.
	var raw *http.Response
	c1, err := cl.Chat.Completions.New(ctx, judgeParams(1), option.WithResponseInto(&raw))
	if err != nil {
		t.Fatal(err)
	}
	noDiffer(t, "completion", c1)
	if c1.Object != "chat.completion" || c1.Model != "gpt-4.1-mini-2025-04-14" || len(c1.Choices) != 1 || c1.Choices[0].FinishReason != "stop" ||
		!strings.HasPrefix(c1.Choices[0].Message.Content, "{") || c1.Usage.TotalTokens != c1.Usage.PromptTokens+c1.Usage.CompletionTokens {
		t.Errorf("completion: %s", c1.RawJSON())
	}
	var verdict map[string]any
	if json.Unmarshal([]byte(c1.Choices[0].Message.Content), &verdict) != nil {
		t.Errorf("a judge's answer is not a JSON verdict: %q", c1.Choices[0].Message.Content)
	}
	price(c1.Model, c1.Usage, false)
	for _, h := range []string{"x-request-id", "openai-organization", "openai-processing-ms", "openai-version",
		"x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests",
		"x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"} {
		if raw.Header.Get(h) == "" {
			t.Errorf("header %s missing", h)
		}
	}
	rl := openai.ParseRateLimits(raw.Header, time.Now())
	if !rl.Requests.Present || rl.Requests.Limit != 6000*200 || !rl.Tokens.Present || rl.Organization != run.Server.OpenAIOrgs()[0].ID {
		t.Errorf("rate limits %+v", rl)
	}

	// The same request streamed, with usage: the same answer and bill.
	sp := judgeParams(1)
	sp.StreamOptions = oai.ChatCompletionStreamOptionsParam{IncludeUsage: oai.Bool(true)}
	stream := cl.Chat.Completions.NewStreaming(ctx, sp)
	acc := oai.ChatCompletionAccumulator{}
	chunks, usageChunks := 0, 0
	for stream.Next() {
		ch := stream.Current()
		chunks++
		noDiffer(t, "chunk", ch)
		acc.AddChunk(ch)
		if ch.JSON.Usage.Valid() {
			usageChunks++
			if len(ch.Choices) != 0 {
				t.Errorf("the usage chunk has choices")
			}
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if usageChunks != 1 || chunks < 4 {
		t.Errorf("%d chunks, %d with usage", chunks, usageChunks)
	}
	if acc.Choices[0].Message.Content != c1.Choices[0].Message.Content || acc.Usage.CompletionTokens != c1.Usage.CompletionTokens ||
		acc.Usage.PromptTokens != c1.Usage.PromptTokens || acc.Choices[0].FinishReason != "stop" {
		t.Errorf("stream %q %+v differs from %q %+v", acc.Choices[0].Message.Content, acc.Usage, c1.Choices[0].Message.Content, c1.Usage)
	}
	price(acc.Model, acc.Usage, false)

	// n choices; a reasoning model with its reasoning tokens; a long
	// shared prefix read from the cache the second time.
	np := judgeParams(2)
	np.N = oai.Int(3)
	c3, err := cl.Chat.Completions.New(ctx, np)
	if err != nil || len(c3.Choices) != 3 || c3.Choices[2].Index != 2 {
		t.Fatalf("n=3: %v %v", c3, err)
	}
	noDiffer(t, "n=3", c3)
	price(c3.Model, c3.Usage, false)
	rp := oai.ChatCompletionNewParams{Model: "o4-mini", Messages: []oai.ChatCompletionMessageParamUnion{oai.DeveloperMessage("Be brief."), oai.UserMessage("Why is the sky blue?")},
		MaxCompletionTokens: oai.Int(1000)}
	cr, err := cl.Chat.Completions.New(ctx, rp)
	if err != nil {
		t.Fatal(err)
	}
	noDiffer(t, "reasoning", cr)
	if r := cr.Usage.CompletionTokensDetails.ReasoningTokens; r < 64 || r >= cr.Usage.CompletionTokens {
		t.Errorf("reasoning tokens %d of %d", r, cr.Usage.CompletionTokens)
	}
	price(cr.Model, cr.Usage, false)
	long := strings.Repeat("The rubric: judge accuracy, clarity and tone carefully. ", 120)
	for i, wantCached := range []bool{false, true} {
		p := oai.ChatCompletionNewParams{Model: "gpt-4.1-mini", MaxCompletionTokens: oai.Int(50),
			Messages: []oai.ChatCompletionMessageParamUnion{oai.SystemMessage(long), oai.UserMessage("Answer " + string(rune('a'+i)))}}
		cc, err := cl.Chat.Completions.New(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		got := cc.Usage.PromptTokensDetails.CachedTokens
		if (got > 0) != wantCached || got%128 != 0 || got > cc.Usage.PromptTokens {
			t.Errorf("call %d: cached %d of %d prompt tokens", i, got, cc.Usage.PromptTokens)
		}
		price(cc.Model, cc.Usage, false)
	}

	// Errors: a 400 the SDK surfaces as *oai.Error with every field.
	bad := judgeParams(3)
	bad.Temperature = oai.Float(3)
	_, err = cl.Chat.Completions.New(ctx, bad)
	var apiErr *oai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Type != "invalid_request_error" || apiErr.Param != "temperature" || apiErr.Message == "" {
		t.Errorf("400: %v", err)
	} else {
		noDiffer(t, "error", apiErr)
	}

	// A 500 and a rate-limit 429, each once: the SDK retries through both.
	retrying := oaClient(run, 2)
	for _, kind := range []sim.FaultKind{sim.FaultServerError, sim.FaultRateLimitStorm} {
		fs, err := run.Server.AddFault(sim.Fault{Kind: kind, Org: "oa", FromNow: true, RetryAfter: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		var hits int
		mw := option.WithMiddleware(func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
			hits++
			if hits == 2 {
				run.Server.ClearFaults(fs[0].ID)
			}
			return next(r)
		})
		cc, err := retrying.Chat.Completions.New(ctx, judgeParams(4), mw)
		if err != nil || hits < 2 {
			t.Fatalf("%s: %v after %d attempts", kind, err, hits)
		}
		price(cc.Model, cc.Usage, false)
	}
	// A token-rate 429: o4-mini's TPM is 3,000 and each of two requests
	// reserves 2,500 of it.
	big := rp
	big.MaxCompletionTokens = oai.Int(2500)
	cb, err := cl.Chat.Completions.New(ctx, big)
	if err != nil {
		t.Fatal(err)
	}
	price(cb.Model, cb.Usage, false)
	_, err = cl.Chat.Completions.New(ctx, big)
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 429 || apiErr.Type != "tokens" || apiErr.Code != "rate_limit_exceeded" ||
		apiErr.Response.Header.Get("retry-after") == "" || apiErr.Response.Header.Get("x-ratelimit-remaining-tokens") == "" {
		t.Errorf("TPM 429: %v", err)
	}
	// The quota 429: terminal for the org; the SDK retries it like any 429
	// and gives up with the same error.
	if _, err := run.Server.AddFault(sim.Fault{Kind: sim.FaultSpendCap, Org: "oa", ID: "quota"}); err != nil {
		t.Fatal(err)
	}
	_, err = retrying.Chat.Completions.New(ctx, judgeParams(5))
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 429 || apiErr.Code != "insufficient_quota" || apiErr.Response.Header.Get("retry-after") != "" {
		t.Errorf("quota 429: %v", err)
	} else if o := openai.Classify(429, apiErr.Response.Header, []byte(`{"error":`+apiErr.RawJSON()+`}`), nil, time.Now()); o.Kind != openai.LaneFatal || !o.Quota {
		t.Errorf("quota 429 classified %+v", o)
	}
	run.Server.ClearFaults("quota")

	// The batch lifecycle.
	var in bytes.Buffer
	const items = 40
	for i := range items {
		body, _ := json.Marshal(judgeParams(100 + i))
		line, _ := json.Marshal(openai.BatchInputLine{CustomID: fmt.Sprintf("item-%03d", i), Method: "POST", URL: "/v1/chat/completions", Body: body})
		in.Write(append(line, '\n'))
	}
	f, err := cl.Files.New(ctx, oai.FileNewParams{File: oai.File(bytes.NewReader(in.Bytes()), "judge.jsonl", "application/jsonl"), Purpose: oai.FilePurposeBatch})
	if err != nil {
		t.Fatal(err)
	}
	noDiffer(t, "file", f)
	if f.Bytes != int64(in.Len()) || f.Purpose != "batch" || f.Filename != "judge.jsonl" {
		t.Errorf("file %+v", f)
	}
	if g, err := cl.Files.Get(ctx, f.ID); err != nil || g.ID != f.ID {
		t.Errorf("file get: %v %v", g, err)
	}
	b, err := cl.Batches.New(ctx, oai.BatchNewParams{InputFileID: f.ID, Endpoint: oai.BatchNewParamsEndpointV1ChatCompletions,
		CompletionWindow: oai.BatchNewParamsCompletionWindow24h, Metadata: map[string]string{"job": "judge"}})
	if err != nil {
		t.Fatal(err)
	}
	noDiffer(t, "batch", b)
	if b.Status != "validating" || b.RequestCounts.Total != items || b.Metadata["job"] != "judge" {
		t.Errorf("created batch %s", b.RawJSON())
	}
	// A second batch, cancelled.
	b2, err := cl.Batches.New(ctx, oai.BatchNewParams{InputFileID: f.ID, Endpoint: oai.BatchNewParamsEndpointV1ChatCompletions, CompletionWindow: oai.BatchNewParamsCompletionWindow24h})
	if err != nil {
		t.Fatal(err)
	}
	b2, err = cl.Batches.Cancel(ctx, b2.ID)
	if err != nil || b2.Status != "cancelling" {
		t.Fatalf("cancel: %v %v", b2, err)
	}
	seen := map[oai.BatchStatus]bool{}
	deadline := time.Now().Add(30 * time.Second)
	for !(b.Status == "completed" && b2.Status == "cancelled") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		if b, err = cl.Batches.Get(ctx, b.ID); err != nil {
			t.Fatal(err)
		}
		if b2, err = cl.Batches.Get(ctx, b2.ID); err != nil {
			t.Fatal(err)
		}
		seen[b.Status] = true
		noDiffer(t, "polled batch", b)
	}
	if b.Status != "completed" || b2.Status != "cancelled" || !seen["in_progress"] {
		t.Fatalf("batches %s and %s; statuses seen %v", b.Status, b2.Status, seen)
	}
	if b.RequestCounts.Completed != items || b.OutputFileID == "" || b.ErrorFileID != "" || b.CompletedAt == 0 || b.FinalizingAt == 0 || b.InProgressAt == 0 {
		t.Errorf("completed batch %s", b.RawJSON())
	}
	if b2.OutputFileID != "" || b2.ErrorFileID == "" || b2.CancelledAt == 0 || b2.RequestCounts.Failed != items {
		t.Errorf("cancelled batch %s", b2.RawJSON())
	}
	page, err := cl.Batches.List(ctx, oai.BatchListParams{Limit: oai.Int(1)})
	if err != nil || len(page.Data) != 1 || page.Data[0].ID != b2.ID || !page.HasMore {
		t.Fatalf("list: %v %v", page, err)
	}
	noDiffer(t, "list", page, "object", "first_id", "last_id")
	next, err := page.GetNextPage()
	if err != nil || len(next.Data) != 1 || next.Data[0].ID != b.ID {
		t.Fatalf("list page 2: %v %v", next, err)
	}
	resp, err := cl.Files.Content(ctx, b.OutputFileID)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	lines := bytes.Split(bytes.TrimSpace(out), []byte("\n"))
	ids := map[string]bool{}
	for _, l := range lines {
		var ol openai.BatchOutputLine
		if err := json.Unmarshal(l, &ol); err != nil || ol.Response == nil || ol.Response.StatusCode != 200 || ol.Error != nil {
			t.Fatalf("output line %s: %v", l, err)
		}
		var cc oai.ChatCompletion
		if err := json.Unmarshal(ol.Response.Body, &cc); err != nil {
			t.Fatal(err)
		}
		noDiffer(t, "batch completion", cc)
		ids[ol.CustomID] = true
		price(cc.Model, cc.Usage, true)
	}
	if len(ids) != items {
		t.Errorf("%d distinct custom_ids in %d output lines, want %d", len(ids), len(lines), items)
	}
	resp, err = cl.Files.Content(ctx, b2.ErrorFileID)
	if err != nil {
		t.Fatal(err)
	}
	errs, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if n := bytes.Count(errs, []byte(`"code":"batch_cancelled"`)); n != items {
		t.Errorf("%d cancelled lines in the error file, want %d", n, items)
	}

	// The ledger is what the SDK saw, priced by package cost.
	var ledger int64
	for _, e := range run.Server.Ledger() {
		if e.Org == "oa" {
			if e.Provider != sim.ProviderOpenAI {
				t.Errorf("entry without provider: %+v", e)
			}
			ledger += e.CostNanos
		}
	}
	if ledger != int64(billed) || billed == 0 {
		t.Errorf("ledger %d n$, the SDK's usage priced %d n$", ledger, billed)
	}
}
