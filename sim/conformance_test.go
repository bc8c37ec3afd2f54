package sim

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/apidispatch/apidispatch/anthropic"
)

// The official Go SDK talks to the simulator over HTTP: the simulator must
// look like the API to it.

func sdkClient(run *Running, key string, opts ...option.RequestOption) *sdk.Client {
	c := sdk.NewClient(append([]option.RequestOption{
		option.WithBaseURL(run.URL), option.WithAPIKey(key), option.WithMaxRetries(0),
	}, opts...)...)
	return &c
}

func sdkParams(model string, maxTokens int64, text string) sdk.MessageNewParams {
	return sdk.MessageNewParams{
		Model:     sdk.Model(model),
		MaxTokens: maxTokens,
		System:    []sdk.TextBlockParam{{Text: "You are a judge. Evaluate the answer."}},
		Messages:  []sdk.MessageParam{sdk.NewUserMessage(sdk.NewTextBlock(text))},
	}
}

func TestSDKSuccessParsesWithUsage(t *testing.T) {
	t.Parallel()
	run := startSim(t, testConfig())
	c := sdkClient(run, soloKey)
	var raw *http.Response
	msg, err := c.Messages.New(context.Background(), sdkParams("claude-sonnet-4-5", 256, "Rate this. Provide your evaluation as a JSON object."), option.WithResponseInto(&raw))
	if err != nil {
		t.Fatal(err)
	}
	if msg.ID[:4] != "msg_" || msg.Role != "assistant" || string(msg.Model) != "claude-sonnet-4-5" {
		t.Errorf("message header fields: id %q role %q model %q", msg.ID, msg.Role, msg.Model)
	}
	if msg.Usage.InputTokens <= 0 || msg.Usage.OutputTokens < judgeMinTokens || msg.Usage.OutputTokens > judgeMaxTokens {
		t.Errorf("usage %+v: want input > 0 and judge-sized output", msg.Usage)
	}
	if msg.Usage.ServiceTier != "standard" || msg.StopReason != "end_turn" {
		t.Errorf("service tier %q stop %q", msg.Usage.ServiceTier, msg.StopReason)
	}
	if len(msg.Content) != 1 || msg.Content[0].Text == "" {
		t.Fatalf("content %+v", msg.Content)
	}
	if raw.Header.Get("request-id") == "" || raw.Header.Get("anthropic-organization-id") == "" ||
		raw.Header.Get("anthropic-ratelimit-requests-limit") != "600" {
		t.Errorf("headers %v", raw.Header)
	}
	led := run.Server.Ledger()
	if len(led) != 1 || led[0].InputTokens != msg.Usage.InputTokens || led[0].OutputTokens != msg.Usage.OutputTokens {
		t.Errorf("ledger %+v does not match usage %+v", led, msg.Usage)
	}
}

func TestSDKTypedErrors(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Orgs[0].Limits[anthropic.PoolSonnet4] = Limits{RPM: 1, ITPM: 100000, OTPM: 100000}
	cfg.Orgs = append(cfg.Orgs, OrgConfig{Name: "busy", Keys: []string{"sk-busy"}, Limits: map[anthropic.Pool]Limits{AnyPool: {RPM: 100}}})
	cfg.Faults = []Fault{{Kind: FaultOverloaded, Org: "busy"}}
	run := startSim(t, cfg)
	ctx := context.Background()

	// Use up solo's single request so the next is a 429.
	if _, err := sdkClient(run, soloKey).Messages.New(ctx, sdkParams("claude-sonnet-4-5", 64, "hello")); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		key    string
		params sdk.MessageNewParams
		status int
		typ    string
	}{
		{"400 max_tokens too large", soloKey, sdkParams("claude-3-5-haiku-20241022", 10000, "hi"), 400, anthropic.ErrInvalidRequest},
		{"401 unknown key", "sk-nope", sdkParams("claude-sonnet-4-5", 64, "hi"), 401, anthropic.ErrAuthentication},
		{"404 unknown model", soloKey, sdkParams("claude-3-5-sonnet-20241022", 64, "hi"), 404, anthropic.ErrNotFound},
		{"429 rate limited", soloKey, sdkParams("claude-sonnet-4-5", 64, "hello again"), 429, anthropic.ErrRateLimit},
		{"529 overloaded", "sk-busy", sdkParams("claude-haiku-4-5", 64, "hi"), 529, anthropic.ErrOverloaded},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := sdkClient(run, tc.key).Messages.New(ctx, tc.params)
			var apiErr *sdk.Error
			if !errors.As(err, &apiErr) {
				t.Fatalf("err %v (%T): want *anthropic.Error", err, err)
			}
			if apiErr.StatusCode != tc.status || string(apiErr.Type()) != tc.typ || apiErr.RequestID == "" {
				t.Errorf("status %d type %q request id %q: want %d %q", apiErr.StatusCode, apiErr.Type(), apiErr.RequestID, tc.status, tc.typ)
			}
			if tc.status == 429 && apiErr.Response.Header.Get("retry-after") == "" {
				t.Error("429 without retry-after")
			}
		})
	}
}

// The SDK's own retry honours the simulator's retry-after: a storm of 429s
// with retry-after for a short window, a client with MaxRetries 2 succeeds,
// and its retry arrives no earlier than retry-after said.
func TestSDKRetryHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Speed = 10
	run := startSim(t, cfg)
	// A storm from now for 20 API seconds (2 s real), retry-after 25 API s
	// (2.5 s real): the retry lands after the storm.
	if _, err := run.Server.AddFault(Fault{Kind: FaultRateLimitStorm, FromNow: true, Duration: 20 * time.Second, RetryAfter: 25 * time.Second}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var arrivals []time.Time
	var retryAfterMs []string
	rec := func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		mu.Lock()
		arrivals = append(arrivals, time.Now())
		mu.Unlock()
		resp, err := next(req)
		if err == nil {
			mu.Lock()
			retryAfterMs = append(retryAfterMs, resp.Header.Get("retry-after-ms"))
			mu.Unlock()
		}
		return resp, err
	}
	c := sdkClient(run, soloKey, option.WithMaxRetries(2), option.WithMiddleware(rec))
	msg, err := c.Messages.New(context.Background(), sdkParams("claude-sonnet-4-5", 64, "retry me"))
	if err != nil {
		t.Fatalf("SDK with 2 retries failed: %v", err)
	}
	if msg.Usage.OutputTokens == 0 {
		t.Error("no usage")
	}
	if len(arrivals) != 2 {
		t.Fatalf("%d attempts, want 2 (one 429, one success)", len(arrivals))
	}
	ms, err := strconv.Atoi(retryAfterMs[0])
	if err != nil || ms != 2500 {
		t.Fatalf("retry-after-ms %q, want 2500", retryAfterMs[0])
	}
	if gap := arrivals[1].Sub(arrivals[0]); gap < time.Duration(ms)*time.Millisecond {
		t.Errorf("retry came %v after the 429, before retry-after-ms %d", gap, ms)
	}
	st := run.Server.Stats().Org("solo")
	if st.ByStatus["429"] != 1 || st.ByStatus["200"] != 1 {
		t.Errorf("simulator saw %v, want one 429 and one 200", st.ByStatus)
	}
}
