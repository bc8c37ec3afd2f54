// Package campaign holds the randomised promise-checking campaign (issue 21):
// its test draws scenarios from seeds over the routes, --max-cost, --shared,
// --cache, --pilot, the simulator's faults and process disturbances (SIGSTOP,
// kill -9, Redis restart and partition, a full disk), runs each against the
// simulator with real child processes of the built binary, and checks the
// four promises with one checker that reads only the simulator's ledger and
// stats and the results files.
//
//	go test ./campaign                            # quick: seeds 1-4
//	go test -tags long ./campaign                 # the CI size (seeds 1-24)
//	go test ./campaign -seeds 500 -timeout 0      # the large run
//	go test ./campaign -seeds 100 -first 501      # another range
//	go test ./campaign -run 'TestCampaign/seed=17$' -seed 17 -v   # one seed alone
//
// # OpenAI orgs and mixed files
//
// A third of the seeds (issue 30; drawOpenAI, from a random stream of its
// own, so a seed that draws no OpenAI part runs the scenario it always did)
// add one to three OpenAI orgs to the simulator, beside the Anthropic ones
// or instead of them (the run then gets only the OpenAI keys), with limits
// per model from roomy to binding (RPM or TPM; on the batch routes sometimes
// an enqueued-token limit of about two batches), and give every process a
// file of GPT judge lines in the OpenAI batch-input format or a file of both
// providers' lines interleaved, on each route. Their faults strike the
// OpenAI surface: rate_limit_exceeded storms, insufficient_quota on one org
// when another is left, 500s (JSON and HTML), 503s, resets, truncated bodies
// and the batch faults; the other draws' faults that name no org strike it
// too. --cap names the OpenAI families as well (gpt, gpt-mini, o-series,
// openai-other), and a --max-cost is drawn as a share of what the file
// costs. A file's GPT items have only the OpenAI orgs (as few as one key,
// where the Anthropic items have three orgs): a seed draws fewer items per
// process when its GPT requests would need more than a third of a pass's
// time limit at those orgs' throughput (the --cap over a judge answer's
// latency, the RPM, the TPM). The checker judges an OpenAI item as it does a
// Claude item: its input body's hash is what the simulator's ledger records,
// its result line is the OpenAI batch output line (a response of status 200
// holds the chat completion the ledger names), each key's requests in flight
// stay under the --cap of its one model's family, and the ledger's cost
// across both providers stays under --max-cost. The liveness check leaves
// these seeds out, and they draw no --pilot (run refuses it for a file with
// OpenAI lines, saying so).
//
// # Gateway scenarios
//
// TestGatewayCampaign draws, for seeds 1-3 (1-12 with -tags long, as CI
// runs it), or with -seeds for every seed of that range divisible by
// -gateway-every (default 3; 1: every seed; 0: none), a second scenario from the seed (a random stream of its own, so the
// run scenario of the seed is unchanged): 1–3 'apidispatch serve' gateways
// (child processes of the built binary, each its own state directory and
// port; --shared on a private Redis behind a proxy the test can cut, or
// not), one clients file with 1–4 well-behaved clients (with and without
// max_cost; on one gateway, or each request to the next gateway as behind a
// load balancer) sending sync and streaming Messages requests and Message
// Batches (routes batch, sync, auto), and hostile clients (streams never
// read, requests naming a beta the orgs refuse — the simulator's
// beta_forbidden fault answers 403 — and body dribblers); the simulator's
// faults (a third of the seeds on tier-1 orgs, half of those with a storm
// of one kind, and a liveness check after it: issue 29); and disturbances
// of gateways: SIGTERM, SIGTERM then SIGINT, kill
// -9, SIGSTOP/SIGCONT and partitions from Redis. A gateway that exits is
// started again on its state directory and port, as a supervisor would.
// Clients are goroutines speaking plain HTTP with their tokens and retrying
// as the SDKs do (connection errors, x-should-retry, 408/409/429/5xx, with
// retry-after, else a back-off scaled down to the scenario's seconds). Each
// request's body carries a marker of its own (seed, client, request) in
// metadata.user_id and the prompt, so the simulator's ledger, keyed by body
// hash, names the request it billed. The checker (gateway_check_test.go)
// judges from the simulator's ledger and stats, the clients' answers and
// how each gateway process ended: answered with its own answer, billed at
// most once per answer, per key at most the cap at every second, per client
// and gateway at most max_cost (the sum over gateways is exempt, and only
// it: issue 27, a client's max_cost is per replica), no client harming
// another, and the lifecycle (exit 0 after a signal, at once after a
// second).
//
//	go test ./campaign -run TestGatewayCampaign                 # seeds 1-3
//	go test -tags long ./campaign -run TestGatewayCampaign      # seeds 1-12, as CI
//	go test ./campaign -run TestGatewayCampaign -gateway-every 1 -seeds 500 -timeout 0
//	go test ./campaign -run 'TestGatewayCampaign/seed=27$' -seed 27 -v
//
// The package has no code outside its tests.
package campaign
