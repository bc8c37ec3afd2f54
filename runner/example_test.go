package runner_test

import (
	"errors"
	"fmt"

	"github.com/apidispatch/apidispatch/runner"
)

// A front door's error says what kind of stop it is; the exit code comes
// from the kind, in one place.
func ExampleStopOf() {
	errPaused := &runner.StopError{Kind: runner.Paused, Err: errors.New("paused by the budget gate")}
	for _, err := range []error{nil, fmt.Errorf("A/B: %w", errPaused), errors.New("connection reset")} {
		k := runner.StopOf(err)
		fmt.Println(k, k.ExitCode())
	}
	// Output:
	// complete 0
	// paused 2
	// incomplete 4
}
