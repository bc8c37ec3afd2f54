// Package ab is the A/B harness of apidispatch (docs/design.md §9): the Phase 6
// validation that sends the same judge workload through the legacy
// single-org path and through the dispatcher, back to back in one process,
// and reports both arms honestly — wall-clock, cost from usage, outcomes,
// the data-loss check, 429s, latency and the per-org split — with the
// speed-up (target ≥ 5×).
//
// Most callers want Run: it refuses with fewer than two orgs, projects the
// cost of both arms from the price table and applies the budget gate and
// the --confirm rule to the total, runs a storm self-test of the
// dispatcher on an embedded simulator (no item may be lost under a
// sustained 429 storm), and only then runs the arms. With no orgs, or
// Config.Sim, both arms run against one embedded simulator (preset
// origin-3org) at a speed factor K, and every output says that it is a
// simulation and gives API-equivalent times.
//
// Legacy is the baseline arm on its own (docs/design.md §22): one key, a fixed
// concurrency of 50, the SDK's retries (SDKRetry), failures kept as errors.
//
// An A/B directory holds:
//
//	ab.json            the result JSON (Result)
//	events.jsonl       started, progress, completed | blocked | failure | incomplete
//	report.html        the HTML report, when Config.Report renders it (the command does)
//	requests.jsonl     the workload both arms sent
//	baseline/          the legacy arm's run: results.jsonl, events.jsonl, summary.json, arm.json
//	dispatcher/        the dispatcher arm's run: state.db, results.jsonl, events.jsonl, summary.json, arm.json
//	round2/…           the second round of --order abab
//	selftest/          the storm self-test's workload and run
//
// Rerunning Run on the same directory reuses an arm that completed, lets
// the dispatcher resume a partial run, and runs an incomplete legacy arm
// again from the start (it keeps no state, as the original did not).
package ab
