// Package sim is a simulator of the Anthropic Messages API, faithful enough
// that every test and benchmark of apidispatch runs against it over real HTTP
// on loopback instead of the real API (docs/design.md §8, §14–§20).
//
// A Server is an http.Handler serving
//
//	POST /v1/messages               the Messages API
//	POST /v1/messages/count_tokens  free token count
//	GET  /v1/models                 the models the key's org can call (paginated)
//	GET  /v1/models/{id}            one of them
//	POST|GET /v1/messages/batches   create or list Message Batches (batch.go)
//	GET|DELETE /v1/messages/batches/{id}, POST …/{id}/cancel, GET …/{id}/results
//	GET  /sim/stats                 per-org statistics and time series (JSON)
//	GET  /sim/ledger                every billed request (JSONL)
//	GET|POST|PUT|DELETE /sim/faults list, add, replace or clear faults (JSON)
//	GET  /sim/batches               per-org Message Batches stats (JSON)
//
// It authenticates x-api-key against its orgs' keys, validates requests like
// the API does, and admits a request only when the org's three token buckets
// for the model's pool (requests, input tokens, output tokens per minute) all
// have room; a refusal is a 429 rate_limit_error with retry-after and the
// full anthropic-ratelimit-* header set. Every response carries request-id
// (the envelope's request_id on errors), and every response to a known key
// anthropic-organization-id. Keys are read from x-api-key or from
// "Authorization: Bearer", which the current official SDKs send. Latency follows a seeded long-tailed
// model calibrated to measurements of the real API (see CALIBRATION.md), and
// the tokens and text of a response derive only from a hash of the request
// body, so the same request costs the same in every run. Every billed request
// is written to a ledger with its exact cost in integer nano-dollars.
//
// # Speed factor
//
// Config.Speed (K) compresses time: the limit headers and the buckets'
// refill (limit/60 per real second) are multiplied by K, latencies and waits
// are divided by K, and retry-after is the API-equivalent wait divided by K
// (whole seconds, at least 1, plus an exact retry-after-ms when K > 1). The
// reset headers are in real time. A bucket holds what the API's holds (one
// minute of the limit, times BurstFraction), which is one minute of server
// time at any K, so a sped-up run meets its limits as early, in server time,
// as a real one. A client mirrors the simulator by refilling at the header's
// limit/60 per second into a bucket of limit/K, and an hour of API traffic
// runs in 60/K minutes with the same rates and the same bursts.
// Every response carries x-sim-speed-factor: K. Fault
// schedules and windows, and latencies in the config, are API-equivalent
// time.
//
// # Typical use
//
//	cfg, _ := sim.Preset("origin-3org")
//	cfg.Speed = 20
//	run, _ := sim.Start(cfg)
//	defer run.Close()
//	// point a client at run.URL with one of run.Server.Keys()["high_prio"]
//
// All methods of Server are safe for concurrent use.
package sim
