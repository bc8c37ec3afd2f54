// Package plan projects what a run will cost and how long it will take
// before anything is sent, and decides whether the spend gates let it start.
//
// The flow is:
//
//	limits, _ := plan.LoadLimits("limits.json")     // optional: from 'apidispatch probe'
//	p, _ := plan.Project(plan.Input{Workload: ws, Prices: prices, Orgs: names, Limits: limits})
//	g := plan.Gate(p, ws.N, plan.GateConfig{Budget: budget, Tolerance: 0.5, Confirm: confirm})
//	p.WriteText(os.Stdout, g)                        // or p.JSON(g) for 'plan --json'
//
// A Projection holds three costs, each exact nano-dollar arithmetic over
// per-request token figures:
//
//   - expected: every request at the expected input (the local estimate,
//     corrected by count_tokens or a pilot) and the expected output
//     (--expect-output, a pilot's measurement, or min(max_tokens, 100));
//   - all max_tokens: the same input, and every request generating its
//     max_tokens;
//   - worst case: every request at max_tokens and its input at an upper
//     bound (four times the local estimate, which bounds the UTF-8 bytes of
//     the text, and tokens never outnumber bytes), so the bill cannot pass
//     it for text requests.
//
// Wall-clock is projected per lane (org × model pool) as the lowest of the
// polite concurrency cap over the mean latency and the org's three rate
// limits (requests, input and output tokens per minute) over the per-request
// demand; the lowest is the lane's binding limit. Lanes of a pool add up;
// the run lasts as long as its slowest pool.
//
// ProjectRoutes puts the routes side by side: sync, by the lanes, and the
// Message Batches route at the price table's batch rates with a wall-clock
// from a BatchModel (the simulator's batch timing, an assumption); with a
// deadline it decides the split --route auto sends (Routes.Split).
//
// Gate applies the two pre-flight rules of docs/design.md §7: pause when the
// expected cost is over budget × (1 + tolerance), and require --confirm when
// the expected cost is at least $100 or N is at least 50,000. Every decision
// carries its arithmetic.
//
// Probe reads each org's real limits with one max_tokens 1 request per
// (org, model), and CountTokens asks the free count_tokens endpoint to
// replace the local input estimate; both talk HTTP. Everything else here is
// pure computation, safe for concurrent use.
package plan
