package plan

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/internal/numfmt"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/upstream"
	"github.com/apidispatch/apidispatch/workload"
)

// BindTPM names an OpenAI lane bound by its tokens per minute: one bucket
// charged at admission with a request's prompt and its max_completion_tokens
// × n (its completion when it sets none).
const BindTPM = "tpm"

// tenths is a per-token price in tenths of a nano-dollar as nano-dollars.
func tenths(t cost.Tenths) float64 { return float64(t) / 10 }

// perMTenths formats a per-token price in tenths of a nano-dollar as
// dollars per million tokens: 4000 → "$0.40", 125 → "$0.0125".
func perMTenths(t cost.Tenths) string {
	s := strconv.FormatFloat(float64(t)/10_000, 'f', 4, 64)
	s = strings.TrimRight(s, "0")
	if i := strings.IndexByte(s, '.'); i >= 0 && len(s)-i < 3 {
		s += strings.Repeat("0", 3-(len(s)-i))
	}
	return "$" + s
}

// projectOpenAI projects the OpenAI items of one model, one arm, at the
// OpenAI price table's standard and Batch API rates: their prompts at the
// local estimate, uncached (OpenAI's prompt cache is automatic and not
// projected), their completions at min(the mean completion limit, the
// expected output), and the worst case at InputBoundFactor × the estimate
// and every choice's limit (the model's maximum output for a choice that
// sets none). It returns the model's projection and its expected, all-max
// and worst-case costs at the sync rates, in nano-dollars.
func projectOpenAI(in Input, model string, ms workload.ModelSummary) (mp ModelProjection, e, a, w float64, err error) {
	price, err := cost.OpenAI().Lookup(model)
	if err != nil {
		return mp, 0, 0, 0, err
	}
	mp = ModelProjection{Model: model, Provider: org.OpenAI, Pool: string(upstream.OpenAI.PoolOf(model)), N: ms.N, Remaining: ms.N}
	if ms.N <= 0 {
		return mp, 0, 0, 0, nil
	}
	n := float64(ms.N)
	estPer := float64(ms.EstInput) / n
	mp.InputPerReq, mp.InputSource = estPer, "local estimate"
	mp.MaxTokensPerReq = float64(ms.MaxTokens+ms.UnboundedChoices*price.MaxOutput) / n
	expect, src := float64(DefaultExpectOutput), fmt.Sprintf("default min(max_completion_tokens, %d)", DefaultExpectOutput)
	if in.ExpectOutput > 0 {
		expect, src = float64(in.ExpectOutput), fmt.Sprintf("--expect-output %d", in.ExpectOutput)
	}
	mp.OutputPerReq, mp.OutputSource = math.Min(mp.MaxTokensPerReq, expect), src
	mp.InputBoundPerReq = estPer * InputBoundFactor
	// The tokens bucket is charged the prompt and the completion limit at
	// admission (the completion itself for a choice without a limit).
	mp.ITPMPerReq = estPer + float64(ms.MaxTokens)/n + float64(ms.UnboundedChoices)/n*math.Min(expect, float64(price.MaxOutput))

	// The worst case is at the dearest tier an item may be served at: the
	// projection does not read the items' service_tier, so priority's
	// rates where the model offers it (as for any request not read).
	costs := func(r, worst cost.OpenAIRates) (e, a, w float64) {
		in := mp.InputPerReq * tenths(r.Input)
		e = n * (in + mp.OutputPerReq*tenths(r.Output))
		a = n * (in + mp.MaxTokensPerReq*tenths(r.Output))
		w = n * (mp.InputBoundPerReq*tenths(worst.Input) + mp.MaxTokensPerReq*tenths(worst.Output))
		return e, a, w
	}
	e, a, w = costs(price.Standard, price.WorstRatesFor(cost.TierUnknown, false))
	eb, _, wb := costs(price.Batch, price.Batch)
	mp.Rates = cost.Rates{Input: price.Standard.Input.Nanos(), Output: price.Standard.Output.Nanos(), CacheRead: price.Standard.CachedInput.Nanos()}
	mp.BatchRates = cost.Rates{Input: price.Batch.Input.Nanos(), Output: price.Batch.Output.Nanos(), CacheRead: price.Batch.CachedInput.Nanos()}
	mp.Expected, mp.AllMaxTokens, mp.WorstCase = nanos(e), nanos(a), nanos(w)
	mp.BatchExpected, mp.BatchWorstCase = nanos(eb), nanos(wb)
	mp.Arithmetic = fmt.Sprintf("%s × (%s prompt × %s/M + %s completion × %s/M) = %s (OpenAI)",
		numfmt.Commas(ms.N), tok(mp.InputPerReq), perMTenths(price.Standard.Input), tok(mp.OutputPerReq), perMTenths(price.Standard.Output), usd(mp.Expected))
	return mp, e, a, w, nil
}

// openAIPool reports whether pool is an OpenAI model's.
func openAIPool(pool anthropic.Pool) bool { return upstream.OfPool(pool) == upstream.OpenAI }
