//go:build race

package runner_test

// The race detector slows the engine several times over, so a deadline of
// seconds is a figure of the machine, not of the router (see runAuto).
func init() { raceBuild = true }
