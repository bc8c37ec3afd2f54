package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/cost"
)

// The features of issue 15, each as the official Go SDK sees them.

// featureConfig is testConfig with every pool served and zero latency.
func featureConfig() Config {
	cfg := testConfig()
	cfg.Orgs[0].Limits[AnyPool] = Limits{RPM: 600, ITPM: 600000, OTPM: 300000}
	return cfg
}

// wantAPIError asserts err is the SDK's *Error with status and a message
// containing msg.
func wantAPIError(t *testing.T, err error, status int, msg string) {
	t.Helper()
	var apiErr *sdk.Error
	if !errors.As(err, &apiErr) {
		t.Fatalf("err %v (%T): want *anthropic.Error %d", err, err, status)
	}
	if apiErr.StatusCode != status || !strings.Contains(apiErr.Error(), msg) {
		t.Errorf("got %d %v, want %d containing %q", apiErr.StatusCode, apiErr, status, msg)
	}
}

var weatherSchema = map[string]any{
	"type": "object",
	"properties": map[string]any{
		"city":  map[string]any{"type": "string", "minLength": 3},
		"days":  map[string]any{"type": "integer", "minimum": 1, "maximum": 7},
		"unit":  map[string]any{"type": "string", "enum": []any{"celsius", "fahrenheit"}},
		"hours": map[string]any{"type": "array", "items": map[string]any{"type": "number"}, "minItems": 2},
	},
	"required": []any{"city", "days"},
}

func weatherTools() []sdk.ToolUnionParam {
	props := weatherSchema["properties"]
	return []sdk.ToolUnionParam{
		sdk.ToolUnionParamOfTool(sdk.ToolInputSchemaParam{Properties: map[string]any{"q": map[string]any{"type": "string"}}}, "search"),
		sdk.ToolUnionParamOfTool(sdk.ToolInputSchemaParam{Properties: props, Required: []string{"city", "days"}}, "get_weather"),
	}
}

// checkSchema reports why v does not satisfy the subset of JSON Schema the
// test schemas use (type, properties, required, enum, minLength, minimum,
// maximum, items, minItems), or "".
func checkSchema(schema map[string]any, v any) string {
	if en, ok := schema["enum"].([]any); ok {
		for _, e := range en {
			if e == v {
				return ""
			}
		}
		return fmt.Sprintf("%v not in enum %v", v, en)
	}
	switch schema["type"] {
	case "object":
		obj, ok := v.(map[string]any)
		if !ok {
			return fmt.Sprintf("%v is not an object", v)
		}
		req, _ := schema["required"].([]any)
		for _, r := range req {
			if _, ok := obj[r.(string)]; !ok {
				return fmt.Sprintf("required %q missing", r)
			}
		}
		props, _ := schema["properties"].(map[string]any)
		for k, pv := range obj {
			ps, ok := props[k].(map[string]any)
			if !ok {
				return fmt.Sprintf("unknown property %q", k)
			}
			if why := checkSchema(ps, pv); why != "" {
				return k + ": " + why
			}
		}
	case "string":
		s, ok := v.(string)
		if !ok {
			return fmt.Sprintf("%v is not a string", v)
		}
		if ml, ok := schema["minLength"].(int); ok && len(s) < ml {
			return fmt.Sprintf("%q shorter than %d", s, ml)
		}
	case "integer", "number":
		f, ok := v.(float64)
		if !ok || (schema["type"] == "integer" && f != float64(int64(f))) {
			return fmt.Sprintf("%v is not a %s", v, schema["type"])
		}
		if lo, ok := schema["minimum"].(int); ok && f < float64(lo) {
			return fmt.Sprintf("%v < %d", f, lo)
		}
		if hi, ok := schema["maximum"].(int); ok && f > float64(hi) {
			return fmt.Sprintf("%v > %d", f, hi)
		}
	case "array":
		a, ok := v.([]any)
		if !ok {
			return fmt.Sprintf("%v is not an array", v)
		}
		if mi, ok := schema["minItems"].(int); ok && len(a) < mi {
			return fmt.Sprintf("%d items < %d", len(a), mi)
		}
		for _, e := range a {
			if why := checkSchema(schema["items"].(map[string]any), e); why != "" {
				return why
			}
		}
	}
	return ""
}

func TestSDKForcedToolUse(t *testing.T) {
	t.Parallel()
	run := startSim(t, featureConfig())
	c := sdkClient(run, soloKey)
	ctx := context.Background()
	for _, choice := range []struct {
		name string
		tc   sdk.ToolChoiceUnionParam
		tool string
	}{
		{"tool", sdk.ToolChoiceParamOfTool("get_weather"), "get_weather"},
		{"any", sdk.ToolChoiceUnionParam{OfAny: &sdk.ToolChoiceAnyParam{}}, "search"},
	} {
		t.Run(choice.name, func(t *testing.T) {
			p := sdkParams("claude-sonnet-4-6", 512, "What is the weather in Paris?")
			p.Tools, p.ToolChoice = weatherTools(), choice.tc
			msg, err := c.Messages.New(ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			if msg.StopReason != sdk.StopReasonToolUse || len(msg.Content) != 1 {
				t.Fatalf("stop %q content %+v: want one tool_use block", msg.StopReason, msg.Content)
			}
			tu, ok := msg.Content[0].AsAny().(sdk.ToolUseBlock)
			if !ok {
				t.Fatalf("block %T, want ToolUseBlock", msg.Content[0].AsAny())
			}
			if !strings.HasPrefix(tu.ID, "toolu_") || len(tu.ID) != 30 || tu.Name != choice.tool {
				t.Errorf("id %q name %q", tu.ID, tu.Name)
			}
			var input any
			if err := json.Unmarshal(tu.Input, &input); err != nil {
				t.Fatalf("input %s: %v", tu.Input, err)
			}
			schema := weatherSchema
			if choice.tool == "search" {
				schema = map[string]any{"type": "object", "properties": map[string]any{"q": map[string]any{"type": "string"}}}
			}
			if why := checkSchema(schema, input); why != "" {
				t.Errorf("input %s is not valid against the schema: %s", tu.Input, why)
			}
			if msg.Usage.OutputTokens <= 0 {
				t.Errorf("output tokens %d", msg.Usage.OutputTokens)
			}

			// Deterministic: the same request gets the same input.
			again, err := c.Messages.New(ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			if got := again.Content[0].AsToolUse(); string(got.Input) != string(tu.Input) || got.ID == tu.ID {
				t.Errorf("second call: input %s id %s; first %s %s", got.Input, got.ID, tu.Input, tu.ID)
			}

			// The tool_result answering it is accepted.
			p.ToolChoice = sdk.ToolChoiceUnionParam{}
			p.Messages = append(p.Messages, msg.ToParam(), sdk.NewUserMessage(sdk.NewToolResultBlock(tu.ID, "sunny", false)))
			if _, err := c.Messages.New(ctx, p); err != nil {
				t.Errorf("tool_result after the tool_use: %v", err)
			}
		})
	}

	t.Run("400s", func(t *testing.T) {
		p := sdkParams("claude-sonnet-4-6", 512, "weather?")
		p.Tools, p.ToolChoice = weatherTools(), sdk.ToolChoiceParamOfTool("get_time")
		_, err := c.Messages.New(ctx, p)
		wantAPIError(t, err, 400, "Tool 'get_time' not found")

		p = sdkParams("claude-sonnet-4-6", 512, "weather?")
		p.Messages = append(p.Messages, sdk.NewAssistantMessage(sdk.NewTextBlock("ok")),
			sdk.NewUserMessage(sdk.NewToolResultBlock("toolu_01234567890123456789abcd", "sunny", false)))
		_, err = c.Messages.New(ctx, p)
		wantAPIError(t, err, 400, "Each `tool_result` block must have a corresponding `tool_use` block in the previous message")
	})
}

func TestSDKStopSequence(t *testing.T) {
	t.Parallel()
	run := startSim(t, featureConfig())
	c := sdkClient(run, soloKey)
	p := sdkParams("claude-sonnet-4-5", 1024, "Write a long note.")
	p.System = nil
	p.StopSequences = []string{"zzz-never", "e"}
	msg, err := c.Messages.New(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if msg.StopReason != sdk.StopReasonStopSequence || msg.StopSequence != "e" {
		t.Fatalf("stop %q sequence %q, want stop_sequence \"e\"", msg.StopReason, msg.StopSequence)
	}
	text := msg.Content[0].Text
	if strings.Contains(text, "e") || msg.Usage.OutputTokens < 1 {
		t.Errorf("text %q (output %d) should end before the first \"e\"", text, msg.Usage.OutputTokens)
	}

	// Without the stop sequence the text goes on: it starts with the
	// stopped text followed by the sequence.
	p.StopSequences = nil
	full, err := c.Messages.New(context.Background(), p, option.WithJSONSet("stop_sequences", []string{"zzz-never"}))
	if err != nil {
		t.Fatal(err)
	}
	if full.StopReason != sdk.StopReasonEndTurn || full.StopSequence != "" || full.Usage.OutputTokens <= msg.Usage.OutputTokens {
		t.Errorf("unmatched stop sequence: stop %q seq %q output %d", full.StopReason, full.StopSequence, full.Usage.OutputTokens)
	}
}

func TestSDKPromptCachingOnInPresets(t *testing.T) {
	t.Parallel()
	for _, name := range PresetNames() {
		cfg, err := Preset(name)
		if err != nil {
			t.Fatal(err)
		}
		if !cfg.PromptCaching {
			t.Errorf("preset %s: prompt caching off", name)
		}
	}
	cfg, _ := Preset(PresetOrigin3Org)
	cfg.Latency = LatencyConfig{Zero: true}
	cfg.Faults = nil
	run := startSim(t, cfg)
	c := sdkClient(run, run.Server.Keys()["high_prio"][0])
	long := strings.Repeat("This rubric sentence is long enough to be cached. ", 120) // ~1,700 tokens
	p := sdk.MessageNewParams{
		Model: "claude-sonnet-4-5", MaxTokens: 64,
		System:   []sdk.TextBlockParam{{Text: long, CacheControl: sdk.NewCacheControlEphemeralParam()}},
		Messages: []sdk.MessageParam{sdk.NewUserMessage(sdk.NewTextBlock("Item 1."))},
	}
	first, err := c.Messages.New(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	p.Messages = []sdk.MessageParam{sdk.NewUserMessage(sdk.NewTextBlock("Item 2."))}
	second, err := c.Messages.New(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if first.Usage.CacheCreationInputTokens < 1024 || first.Usage.CacheCreation.Ephemeral5mInputTokens != first.Usage.CacheCreationInputTokens {
		t.Errorf("first call usage %+v: want a 5m cache write", first.Usage)
	}
	if second.Usage.CacheReadInputTokens != first.Usage.CacheCreationInputTokens || second.Usage.CacheCreationInputTokens != 0 {
		t.Errorf("second call usage %+v: want a read of %d", second.Usage, first.Usage.CacheCreationInputTokens)
	}
}

func TestSDKMaxTokensZero(t *testing.T) {
	t.Parallel()
	run := startSim(t, featureConfig())
	msg, err := sdkClient(run, soloKey).Messages.New(context.Background(), sdkParams("claude-sonnet-4-5", 0, "warm the cache"))
	if err != nil {
		t.Fatal(err)
	}
	if len(msg.Content) != 0 || msg.Usage.OutputTokens != 0 || msg.Usage.InputTokens <= 0 || msg.StopReason != sdk.StopReasonMaxTokens {
		t.Errorf("content %+v usage %+v stop %q: want no content, no output", msg.Content, msg.Usage, msg.StopReason)
	}
}

func TestSDKUnknownMetadataKey(t *testing.T) {
	t.Parallel()
	run := startSim(t, featureConfig())
	c := sdkClient(run, soloKey)
	p := sdkParams("claude-sonnet-4-5", 64, "hi")
	p.Metadata = sdk.MetadataParam{UserID: sdk.String("user-1")}
	if _, err := c.Messages.New(context.Background(), p); err != nil {
		t.Fatalf("metadata.user_id refused: %v", err)
	}
	_, err := c.Messages.New(context.Background(), p, option.WithJSONSet("metadata.team", "x"))
	wantAPIError(t, err, 400, "metadata.team: Extra inputs are not permitted")
}

func TestSDKThinking(t *testing.T) {
	t.Parallel()
	run := startSim(t, featureConfig())
	c := sdkClient(run, soloKey)
	ctx := context.Background()
	p := sdkParams("claude-sonnet-4-6", 4096, "Think, then answer.")
	p.Thinking = sdk.ThinkingConfigParamOfEnabled(2048)
	msg, err := c.Messages.New(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if len(msg.Content) != 2 {
		t.Fatalf("content %+v: want thinking then text", msg.Content)
	}
	th, ok := msg.Content[0].AsAny().(sdk.ThinkingBlock)
	if !ok || th.Thinking == "" || len(th.Signature) < 64 {
		t.Fatalf("first block %+v: want a thinking block with a signature", msg.Content[0])
	}
	text := msg.Content[1].AsText().Text
	// Thinking is billed as output: output covers both blocks (~4 bytes a token).
	if min := int64(len(th.Thinking)+len(text)) / 5; msg.Usage.OutputTokens < min {
		t.Errorf("output tokens %d for %d bytes of thinking and text", msg.Usage.OutputTokens, len(th.Thinking)+len(text))
	}

	for _, tc := range []struct {
		name string
		mod  func(*sdk.MessageNewParams)
		msg  string
	}{
		{"temperature", func(p *sdk.MessageNewParams) {}, "`temperature` may only be set to 1 when thinking is enabled"},
		{"budget ≥ max_tokens", func(p *sdk.MessageNewParams) { p.Thinking = sdk.ThinkingConfigParamOfEnabled(4096) }, "`max_tokens` must be greater than `thinking.budget_tokens`"},
		{"budget < 1024", func(p *sdk.MessageNewParams) { p.Thinking = sdk.ThinkingConfigParamOfEnabled(1000) }, "budget_tokens: Input should be greater than or equal to 1024"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := sdkParams("claude-sonnet-4-6", 4096, "Think, then answer.")
			q.Thinking = sdk.ThinkingConfigParamOfEnabled(2048)
			tc.mod(&q)
			var opts []option.RequestOption
			if tc.name == "temperature" {
				// This SDK version has no temperature field; send it raw.
				opts = append(opts, option.WithJSONSet("temperature", 0.3))
			}
			_, err := c.Messages.New(ctx, q, opts...)
			wantAPIError(t, err, 400, tc.msg)
		})
	}
}

func TestSDKInferenceGeoPricing(t *testing.T) {
	t.Parallel()
	run := startSim(t, featureConfig())
	c := sdkClient(run, soloKey)
	ctx := context.Background()
	p := sdkParams("claude-opus-4-6", 256, "Where are you?")
	global, err := c.Messages.New(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	p.InferenceGeo = sdk.String("us")
	us, err := c.Messages.New(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if global.Usage.InferenceGeo != "global" || us.Usage.InferenceGeo != "us" {
		t.Fatalf("inference_geo %q and %q", global.Usage.InferenceGeo, us.Usage.InferenceGeo)
	}
	led := run.Server.Ledger()
	if len(led) != 2 || led[0].USGeo || !led[1].USGeo {
		t.Fatalf("ledger %+v", led)
	}
	toUsage := func(m *sdk.Message) anthropic.Usage {
		var u anthropic.Usage
		if err := json.Unmarshal([]byte(m.Usage.RawJSON()), &u); err != nil {
			t.Fatal(err)
		}
		return u
	}
	for i, m := range []*sdk.Message{global, us} {
		want, err := cost.Default().Cost("claude-opus-4-6", toUsage(m), false)
		if err != nil {
			t.Fatal(err)
		}
		if int64(want) != led[i].CostNanos {
			t.Errorf("%s: ledger bills %d n$, the cost package %d", m.Usage.InferenceGeo, led[i].CostNanos, want)
		}
		if simCost, _ := CostNanos("claude-opus-4-6", toUsage(m)); simCost != led[i].CostNanos {
			t.Errorf("%s: CostNanos %d, ledger %d", m.Usage.InferenceGeo, simCost, led[i].CostNanos)
		}
	}
	u := toUsage(us)
	base := u
	base.InferenceGeo = ""
	b, _ := CostNanos("claude-opus-4-6", base)
	if g, _ := CostNanos("claude-opus-4-6", u); g*10 != b*11 {
		t.Errorf("us costs %d, global %d: want ×1.1", g, b)
	}

	p = sdkParams("claude-sonnet-4-5", 256, "Where are you?")
	p.InferenceGeo = sdk.String("us")
	_, err = c.Messages.New(ctx, p)
	wantAPIError(t, err, http.StatusBadRequest, "inference_geo: not supported for model claude-sonnet-4-5")
}

func TestSDKModelsListPaginatedAndRetrieve(t *testing.T) {
	t.Parallel()
	cfg, _ := Preset(PresetOrigin3Org) // Sonnet 4.x, Haiku 4.5, Opus 4.x: 10 of the models
	cfg.Latency = LatencyConfig{Zero: true}
	run := startSim(t, cfg)
	c := sdkClient(run, run.Server.Keys()["batch"][0])
	ctx := context.Background()
	want := []string{}
	for _, m := range models {
		switch m.pool {
		case anthropic.PoolSonnet4, anthropic.PoolHaiku45, anthropic.PoolOpus4:
			want = append(want, m.id)
		}
	}

	// Pages of 3, forwards with after_id.
	var got []string
	params := sdk.ModelListParams{Limit: sdk.Int(3)}
	for pages := 0; ; pages++ {
		page, err := c.Models.List(ctx, params)
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Data) == 0 || page.FirstID != page.Data[0].ID || page.LastID != page.Data[len(page.Data)-1].ID {
			t.Fatalf("page %+v: first_id/last_id do not match data", page)
		}
		for _, m := range page.Data {
			got = append(got, m.ID)
			if m.MaxTokens != modelByID[m.ID].maxOutput || m.MaxInputTokens != modelByID[m.ID].context || m.CreatedAt.IsZero() {
				t.Errorf("%s: max_tokens %d max_input_tokens %d created %v", m.ID, m.MaxTokens, m.MaxInputTokens, m.CreatedAt)
			}
			if !m.Capabilities.Batch.Supported || !m.Capabilities.Thinking.Supported || m.Capabilities.JSON.Thinking.Raw() == "" {
				t.Errorf("%s: capabilities %s", m.ID, m.Capabilities.RawJSON())
			}
		}
		if !page.HasMore {
			break
		}
		if pages > len(want) {
			t.Fatal("has_more never ends")
		}
		params.AfterID = sdk.String(page.LastID)
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("listed %v, want the org's models %v", got, want)
	}

	// Auto-paging agrees; before_id pages backwards.
	var auto []string
	it := c.Models.ListAutoPaging(ctx, sdk.ModelListParams{Limit: sdk.Int(4)})
	for it.Next() {
		auto = append(auto, it.Current().ID)
	}
	if it.Err() != nil || len(auto) != len(want) {
		t.Errorf("auto-paging: %v, %v", auto, it.Err())
	}
	back, err := c.Models.List(ctx, sdk.ModelListParams{Limit: sdk.Int(2), BeforeID: sdk.String(want[4])})
	if err != nil {
		t.Fatal(err)
	}
	if len(back.Data) != 2 || back.Data[0].ID != want[2] || back.Data[1].ID != want[3] || !back.HasMore {
		t.Errorf("before_id %s: %+v", want[4], back)
	}

	// Retrieve: a served model, and one of a pool the org does not serve.
	m, err := c.Models.Get(ctx, "claude-haiku-4-5", sdk.ModelGetParams{})
	if err != nil || m.ID != "claude-haiku-4-5" || m.DisplayName != "Claude Haiku 4.5" || m.MaxTokens != 64000 {
		t.Errorf("get claude-haiku-4-5: %+v, %v", m, err)
	}
	_, err = c.Models.Get(ctx, "claude-opus-5", sdk.ModelGetParams{})
	wantAPIError(t, err, 404, "claude-opus-5")
	_, err = c.Models.List(ctx, sdk.ModelListParams{Limit: sdk.Int(0)}, option.WithQuery("limit", "1001"))
	wantAPIError(t, err, 400, "limit")
}

// sameMessage reports how a streamed message assembled by the SDK's
// accumulator differs from the unstreamed one, ids aside.
func sameMessage(streamed, plain *sdk.Message) string {
	if streamed.Model != plain.Model || streamed.Role != plain.Role || streamed.StopReason != plain.StopReason ||
		streamed.StopSequence != plain.StopSequence || !strings.HasPrefix(streamed.ID, "msg_") {
		return fmt.Sprintf("header: %s %s %q %q vs %s %s %q %q", streamed.Model, streamed.Role, streamed.StopReason, streamed.StopSequence,
			plain.Model, plain.Role, plain.StopReason, plain.StopSequence)
	}
	su, pu := streamed.Usage, plain.Usage
	if su.InputTokens != pu.InputTokens || su.OutputTokens != pu.OutputTokens || su.CacheCreationInputTokens != pu.CacheCreationInputTokens ||
		su.CacheReadInputTokens != pu.CacheReadInputTokens || su.ServiceTier != pu.ServiceTier || su.InferenceGeo != pu.InferenceGeo {
		return fmt.Sprintf("usage %s vs %s", su.RawJSON(), pu.RawJSON())
	}
	if len(streamed.Content) != len(plain.Content) {
		return fmt.Sprintf("%d blocks vs %d", len(streamed.Content), len(plain.Content))
	}
	for i := range plain.Content {
		a, b := streamed.Content[i], plain.Content[i]
		if a.Type != b.Type || a.Text != b.Text || a.Thinking != b.Thinking || a.Signature != b.Signature || a.Name != b.Name {
			return fmt.Sprintf("block %d: %s vs %s", i, a.RawJSON(), b.RawJSON())
		}
		if a.Type == "tool_use" && (string(a.Input) != string(b.Input) || !strings.HasPrefix(a.ID, "toolu_")) {
			return fmt.Sprintf("block %d input %s (id %s) vs %s", i, a.Input, a.ID, b.Input)
		}
	}
	return ""
}

func TestSDKStreamAccumulatesToTheUnstreamedMessage(t *testing.T) {
	t.Parallel()
	run := startSim(t, featureConfig())
	c := sdkClient(run, soloKey)
	ctx := context.Background()
	judge := sdkParams("claude-sonnet-4-5", 256, "Rate this. Provide your evaluation as a JSON object.")
	prose := sdkParams("claude-sonnet-4-6", 1024, "Write a note.")
	prose.System = nil
	stop := prose
	stop.StopSequences = []string{"e"}
	cut := sdkParams("claude-sonnet-4-5", 20, "Write a long note.")
	tool := sdkParams("claude-sonnet-4-6", 512, "Weather in Paris?")
	tool.Tools, tool.ToolChoice = weatherTools(), sdk.ToolChoiceParamOfTool("get_weather")
	think := sdkParams("claude-sonnet-4-6", 4096, "Think first.")
	think.Thinking = sdk.ThinkingConfigParamOfEnabled(1024)
	think.InferenceGeo = sdk.String("us")
	zero := sdkParams("claude-sonnet-4-5", 0, "warm")
	for _, tc := range []struct {
		name string
		p    sdk.MessageNewParams
	}{{"judge", judge}, {"prose", prose}, {"stop sequence", stop}, {"max_tokens", cut}, {"tool use", tool}, {"thinking", think}, {"max_tokens 0", zero}} {
		t.Run(tc.name, func(t *testing.T) {
			plain, err := c.Messages.New(ctx, tc.p)
			if err != nil {
				t.Fatal(err)
			}
			var raw *http.Response
			stream := c.Messages.NewStreaming(ctx, tc.p, option.WithResponseInto(&raw))
			var acc sdk.Message
			var kinds []string
			for stream.Next() {
				ev := stream.Current()
				if len(kinds) == 0 || kinds[len(kinds)-1] != ev.Type {
					kinds = append(kinds, ev.Type)
				}
				if err := acc.Accumulate(ev); err != nil {
					t.Fatal(err)
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatal(err)
			}
			if why := sameMessage(&acc, plain); why != "" {
				t.Errorf("streamed message differs: %s\nevents %v", why, kinds)
			}
			seq := strings.Join(kinds, " ")
			// (The SDK drops ping events; TestStreamEventOrder sees them.)
			if !strings.HasPrefix(seq, "message_start ") || !strings.HasSuffix(seq, " message_delta message_stop") {
				t.Errorf("events %s", seq)
			}
			if len(plain.Content) > 0 && !strings.HasPrefix(seq, "message_start content_block_start content_block_delta") {
				t.Errorf("events %s", seq)
			}
			if ct := raw.Header.Get("content-type"); !strings.HasPrefix(ct, "text/event-stream") || raw.Header.Get("anthropic-ratelimit-requests-remaining") == "" || raw.Header.Get("request-id") == "" {
				t.Errorf("stream headers %v", raw.Header)
			}
		})
	}
	// Both forms are billed alike: same body hash, same cost.
	led := run.Server.Ledger()
	for i := 0; i+1 < len(led); i += 2 {
		if led[i].BodySHA256 != led[i+1].BodySHA256 || led[i].CostNanos != led[i+1].CostNanos || !led[i+1].Duplicate {
			t.Errorf("ledger %d and %d: %+v vs %+v", i, i+1, led[i], led[i+1])
		}
	}
	if st := run.Server.Stats().Org("solo"); st.ByStatus["200"] != int64(len(led)) {
		t.Errorf("stats %v for %d billed", st.ByStatus, len(led))
	}
}

func TestSDKStreamMidStreamOverload(t *testing.T) {
	t.Parallel()
	cfg := featureConfig()
	cfg.Faults = []Fault{{Kind: FaultStreamOverloaded, Org: "solo"}}
	run := startSim(t, cfg)
	c := sdkClient(run, soloKey)
	stream := c.Messages.NewStreaming(context.Background(), sdkParams("claude-sonnet-4-5", 256, "hi"))
	var kinds []string
	for stream.Next() {
		kinds = append(kinds, stream.Current().Type)
	}
	err := stream.Err()
	if err == nil || !strings.Contains(err.Error(), "overloaded_error") {
		t.Fatalf("err %v after %v: want the overloaded_error event", err, kinds)
	}
	if len(kinds) == 0 || kinds[0] != "message_start" {
		t.Errorf("events before the error: %v", kinds)
	}
	if len(run.Server.Ledger()) != 0 {
		t.Error("an interrupted stream was billed")
	}
	// Unstreamed requests do not meet it.
	if _, err := c.Messages.New(context.Background(), sdkParams("claude-sonnet-4-5", 256, "hi")); err != nil {
		t.Errorf("unstreamed: %v", err)
	}
}

// The wire order of a stream, ping included, as the API sends it.
func TestStreamEventOrder(t *testing.T) {
	t.Parallel()
	run := startSim(t, featureConfig())
	r := post(t, run, soloKey, []byte(`{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{"role":"user","content":"hi"}],"stream":true}`))
	if r.status != 200 || !strings.HasPrefix(r.header.Get("content-type"), "text/event-stream") {
		t.Fatalf("status %d %v", r.status, r.header)
	}
	var names []string
	for _, ev := range strings.Split(strings.TrimSpace(string(r.body)), "\n\n") {
		lines := strings.SplitN(ev, "\n", 2)
		name := strings.TrimPrefix(lines[0], "event: ")
		data := strings.TrimPrefix(lines[1], "data: ")
		var typed struct{ Type string }
		if err := json.Unmarshal([]byte(data), &typed); err != nil || typed.Type != name {
			t.Errorf("event %q data %s", name, data)
		}
		if len(names) == 0 || names[len(names)-1] != name {
			names = append(names, name)
		}
	}
	want := "message_start content_block_start ping content_block_delta content_block_stop message_delta message_stop"
	if got := strings.Join(names, " "); got != want {
		t.Errorf("events %s, want %s", got, want)
	}
}

func TestWithoutStreamKey(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		`{"a":1,"stream":true}`:            `{"a":1}`,
		`{"stream":true,"a":1}`:            `{"a":1}`,
		`{"a":1, "stream" : true , "b":2}`: `{"a":1 , "b":2}`,
		`{"stream":true}`:                  `{}`,
		`{"a":1}`:                          `{"a":1}`,
		`not json`:                         `not json`,
	} {
		if got := string(withoutStreamKey([]byte(in))); got != want {
			t.Errorf("withoutStreamKey(%s) = %s, want %s", in, got, want)
		}
	}
}
