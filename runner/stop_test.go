package runner_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/apidispatch/apidispatch/ab"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/runner"
)

// Every kind of stop has its exit code of docs/design.md §10, and an unknown
// kind is resumable (4), never success.
func TestStopKindExitCode(t *testing.T) {
	for _, tc := range []struct {
		kind runner.StopKind
		code int
	}{
		{runner.Complete, 0},
		{runner.Usage, 1},
		{runner.Paused, 2},
		{runner.Refused, 3},
		{runner.Incomplete, 4},
		{runner.DataLoss, 5},
		{runner.NeedsPerson, 6},
		{runner.StopKind(99), 4},
		{runner.StopKind(-1), 4},
	} {
		if got := tc.kind.ExitCode(); got != tc.code {
			t.Errorf("%v.ExitCode() = %d, want %d", tc.kind, got, tc.code)
		}
		if got := (runner.Outcome{Stop: runner.Stop{Kind: tc.kind}}).Code(); got != tc.code {
			t.Errorf("Outcome of %v: Code() = %d, want %d", tc.kind, got, tc.code)
		}
	}
}

// StopOf maps a front door's errors to kinds: ab's sentinels (wrapped, as
// ab returns them) to theirs, anything else to Incomplete.
func TestStopOf(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want runner.StopKind
	}{
		{nil, runner.Complete},
		{fmt.Errorf("%w: N must be positive", ab.ErrConfig), runner.Usage},
		{ab.ErrArms, runner.Usage},
		{ab.ErrPaused, runner.Paused},
		{ab.ErrTooFewOrgs, runner.Refused},
		{ab.ErrConfirmRequired, runner.Refused},
		{fmt.Errorf("arm: %w", ab.ErrStormTest), runner.Refused},
		{fmt.Errorf("dispatcher: %w", ab.ErrDataLoss), runner.DataLoss},
		{fmt.Errorf("%w: stopped by signal", dispatch.ErrIncomplete), runner.Incomplete},
		{errors.New("disk full"), runner.Incomplete},
		{&runner.StopError{Kind: runner.NeedsPerson, Err: errors.New("x")}, runner.NeedsPerson},
	} {
		if got := runner.StopOf(tc.err); got != tc.want {
			t.Errorf("StopOf(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
	// The sentinels keep their messages.
	if got := ab.ErrPaused.Error(); got != "ab: paused by the budget gate" {
		t.Errorf("ab.ErrPaused reads %q", got)
	}
}

// GateStop: a pass goes on, over budget pauses, a large run without
// --confirm is refused.
func TestGateStop(t *testing.T) {
	for d, want := range map[string]runner.StopKind{"pass": runner.Complete, "pause": runner.Paused, "confirm_required": runner.Refused} {
		if got := runner.GateStop(d); got != want {
			t.Errorf("GateStop(%q) = %v, want %v", d, got, want)
		}
	}
}
