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
// The package has no code outside its tests.
package campaign
