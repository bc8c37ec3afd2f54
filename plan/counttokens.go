package plan

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/apihttp"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/store"
	"github.com/apidispatch/apidispatch/workload"
)

// TokenCounts are count_tokens results by model. It is plain data.
type TokenCounts struct {
	Models map[string]ModelCount
}

// ModelCount is what count_tokens said about the counted items of one model.
type ModelCount struct {
	// Items counted, their counted input tokens, and their local estimate.
	Items, Counted, Est int64
	// All is true when every item of the model was counted.
	All bool
}

func (c *TokenCounts) model(m string) (ModelCount, bool) {
	if c == nil {
		return ModelCount{}, false
	}
	mc, ok := c.Models[m]
	return mc, ok && mc.Items > 0
}

// DefaultCountSample is how many items CountTokens counts by default.
const DefaultCountSample = 200

// CountConfig configures CountTokens.
type CountConfig struct {
	BaseURL string  // API root; "" is https://api.anthropic.com
	Key     org.Key // the key to count with (count_tokens is free)
	// Sample is how many items to count, spread evenly over the file, the
	// first item of every model always included; 0 counts every item.
	Sample int64
	// Concurrency of the requests (default 4). count_tokens has its own,
	// low rate limit (100 to 8,000 a minute by tier).
	Concurrency int
	// Client defaults to a client with a 60 s timeout.
	Client *http.Client
}

// countBodyFields are the params count_tokens accepts; the others
// (max_tokens, temperature, stop_sequences, metadata, ...) are dropped.
var countBodyFields = []string{"model", "messages", "system", "tools", "tool_choice", "thinking"}

// ErrCount is wrapped by CountTokens when the API refuses to count an item.
var ErrCount = errors.New("plan: count_tokens failed")

// CountTokens asks POST /v1/messages/count_tokens for the input tokens of a
// sample of the Anthropic requests in the file at path (OpenAI requests are
// not counted) (which Validate accepted, with
// summary ws), and returns the counted and estimated sums by model. Project
// scales each model's local estimate by its counted/estimated ratio; when
// every item was counted the worst case uses the counts too. A 429 or 5xx is
// retried after its retry-after (up to 6 attempts); any other failure stops
// the count with an error wrapping ErrCount.
func CountTokens(ctx context.Context, path string, ws *workload.Summary, cfg CountConfig) (*TokenCounts, error) {
	base := strings.TrimRight(cfg.BaseURL, "/")
	if base == "" {
		base = "https://api.anthropic.com"
	}
	client := apihttp.Guard(cfg.Client)
	if client == nil {
		client = newClient()
		defer client.CloseIdleConnections()
	}
	conc := cfg.Concurrency
	if conc <= 0 {
		conc = 4
	}
	stride := int64(1)
	if cfg.Sample > 0 && ws != nil && ws.N > cfg.Sample {
		stride = (ws.N + cfg.Sample - 1) / cfg.Sample
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	defer f.Close()

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	type job struct{ it store.Item }
	jobs := make(chan job)
	out := &TokenCounts{Models: map[string]ModelCount{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for j := range jobs {
				if ctx.Err() != nil {
					continue
				}
				n, err := countOne(ctx, client, base, cfg.Key, f, j.it)
				if err != nil {
					cancel(err)
					continue
				}
				mu.Lock()
				mc := out.Models[j.it.Model]
				mc.Items++
				mc.Counted += n
				mc.Est += j.it.EstInput
				out.Models[j.it.Model] = mc
				mu.Unlock()
			}
		})
	}
	seen := map[string]bool{}
	scanErr := workload.Scan(path, func(it store.Item) error {
		if it.Provider == org.OpenAI {
			// count_tokens is Anthropic's; an OpenAI request keeps its
			// local estimate.
			return nil
		}
		if (it.Seq-1)%stride != 0 && seen[it.Model] {
			return nil
		}
		seen[it.Model] = true
		select {
		case jobs <- job{it}:
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	})
	close(jobs)
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return nil, err
	}
	if scanErr != nil {
		return nil, scanErr
	}
	if ws != nil {
		for m, mc := range out.Models {
			mc.All = mc.Items == ws.Models[m].N
			out.Models[m] = mc
		}
	}
	return out, nil
}

// countOne counts one item, retrying 429 and 5xx.
func countOne(ctx context.Context, client *http.Client, base string, key org.Key, f *os.File, it store.Item) (int64, error) {
	params, err := workload.ReadAt(f, it)
	if err != nil {
		return 0, err
	}
	var all map[string]json.RawMessage
	if err := json.Unmarshal(params, &all); err != nil {
		return 0, fmt.Errorf("%w: line %d: %v", ErrCount, it.Line, err)
	}
	keep := map[string]json.RawMessage{}
	for _, k := range countBodyFields {
		if v, ok := all[k]; ok {
			keep[k] = v
		}
	}
	body, _ := json.Marshal(keep)
	const attempts = 6
	for a := 1; ; a++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/messages/count_tokens", bytes.NewReader(body))
		if err != nil {
			return 0, err
		}
		anthropic.SetHeaders(req.Header, key, true)
		resp, err := client.Do(req)
		var wait time.Duration
		if err == nil {
			b, rerr := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			switch {
			case resp.StatusCode == http.StatusOK && rerr == nil:
				var r struct {
					InputTokens *int64 `json:"input_tokens"`
				}
				if json.Unmarshal(b, &r) == nil && r.InputTokens != nil {
					return *r.InputTokens, nil
				}
				err = fmt.Errorf("%w: line %d (%s): unreadable response", ErrCount, it.Line, it.CustomID)
			case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
				wait, _ = anthropic.ParseRetryAfter(resp.Header, time.Now())
				err = fmt.Errorf("%w: line %d (%s): HTTP %d", ErrCount, it.Line, it.CustomID, resp.StatusCode)
			default:
				return 0, fmt.Errorf("%w: line %d (%s): HTTP %d: %s", ErrCount, it.Line, it.CustomID, resp.StatusCode, errorText(b))
			}
		} else if ctx.Err() != nil {
			return 0, context.Cause(ctx)
		}
		if a >= attempts {
			return 0, err
		}
		if wait <= 0 {
			wait = time.Duration(float64(500*time.Millisecond<<(a-1)) * (1 - 0.25*rand.Float64()))
		}
		t := time.NewTimer(min(wait, time.Minute))
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, context.Cause(ctx)
		case <-t.C:
		}
	}
}
