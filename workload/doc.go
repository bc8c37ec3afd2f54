// Package workload reads, validates and generates request files in the
// Message Batches request format: one JSON object a line,
//
//	{"custom_id": "item_000001", "params": {"model": "...", "max_tokens": 256, "messages": [...]}}
//
// The flow is two streaming passes over the file. Validate checks every line
// (JSON syntax, UTF-8, custom_id rules and uniqueness, the required params,
// line length) and reports every problem with its 1-based line number; it
// also hashes the file and sums, per model, the items, max_tokens and the
// local input-token estimate, so a planner needs no further pass. Scan then
// yields each line as a store.Item (its byte range in the file, not its body),
// and ReadAt reads one item's params back by that range when it is sent.
//
// Memory is bounded by the longest line, not by the number of lines: custom_id
// uniqueness is checked with a sorted set of 64-bit hashes (8 bytes an item),
// and only hashes that collide are compared exactly in a second pass.
//
// Lines are parsed by a small hand-written JSON scanner that checks the full
// JSON grammar but decodes only the few fields apidispatch needs; params are
// passed on to the API byte for byte as they are in the file.
//
// GenerateJudge and GenerateChat write synthetic workloads (the Phase 6 judge
// shape, and short chat prompts) for the simulator, tests and benchmarks.
//
// All functions are safe for concurrent use; none keep state between calls.
package workload
