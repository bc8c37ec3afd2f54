//go:build race

package dispatch_test

// The race detector slows the client several times over: at K=20 a 50 ms
// stall of the scheduler is a whole API second of pacing error, which a
// client at K=1 never sees. Timing-bound tests run slower there.
func init() { raceBuild = true }
