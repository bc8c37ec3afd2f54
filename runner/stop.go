package runner

import (
	"errors"
	"fmt"

	"github.com/apidispatch/apidispatch/plan"
)

// Exit codes (docs/design.md §10). StopKind.ExitCode is the one place a stop
// becomes one of them.
const (
	ExitOK         = 0 // complete, data-loss check passed
	ExitUsage      = 1 // usage, configuration or input error; nothing sent
	ExitPaused     = 2 // paused by a cost gate
	ExitRefused    = 3 // --confirm missing or a precondition failed
	ExitIncomplete = 4 // stopped early; resumable
	ExitDataLoss   = 5 // data-loss check failed
	// ExitNeedsPerson: a failure that would repeat on every resume (a
	// batch whose results hold custom_ids it was not given, a batch the
	// API has not known for an hour, a lost create whose candidates never
	// end); the error says what to do (docs/design.md §13).
	ExitNeedsPerson = 6
)

// StopKind is how a run (or an A/B, or a plan's gates) ended. Callers
// switch on it; ExitCode maps it to the process's exit code. The zero value
// is Complete.
type StopKind int

// The kinds of stop.
const (
	// Complete: every item ended and the data-loss check passed (or a
	// plan's gates passed).
	Complete StopKind = iota
	// Usage: a usage, configuration or input error; nothing was sent.
	Usage
	// Paused: the budget gate paused the run; nothing (more) was sent.
	Paused
	// Refused: --confirm is missing or a precondition failed (the run
	// directory busy, batches open for a sync run, too few orgs).
	Refused
	// Incomplete: the run stopped early (a signal, the deadline,
	// --max-cost, no usable lane, a failed write) or did only the items it
	// was given; it is resumable.
	Incomplete
	// DataLoss: the data-loss check failed.
	DataLoss
	// NeedsPerson: a failure every resume would repeat (docs/design.md §13).
	NeedsPerson
)

var kindNames = [...]string{
	Complete: "complete", Usage: "usage", Paused: "paused", Refused: "refused",
	Incomplete: "incomplete", DataLoss: "data_loss", NeedsPerson: "needs_person",
}

var exitCodes = [...]int{
	Complete: ExitOK, Usage: ExitUsage, Paused: ExitPaused, Refused: ExitRefused,
	Incomplete: ExitIncomplete, DataLoss: ExitDataLoss, NeedsPerson: ExitNeedsPerson,
}

// ExitCode is the process exit code of a stop of this kind (docs/design.md
// §10); an unknown kind is ExitIncomplete (nothing is lost: rerun).
func (k StopKind) ExitCode() int {
	if k < 0 || int(k) >= len(exitCodes) {
		return ExitIncomplete
	}
	return exitCodes[k]
}

func (k StopKind) String() string {
	if k < 0 || int(k) >= len(kindNames) {
		return fmt.Sprintf("StopKind(%d)", int(k))
	}
	return kindNames[k]
}

// Stop is why a run ended: a kind to switch on and a reason for people.
type Stop struct {
	Kind StopKind
	// Halted (with Incomplete): a stop condition ended the run (a
	// signal, the deadline, --max-cost, no usable lane, the API out of
	// reach, a failed write), not the end of the items it was given (a
	// pilot, auto's share of the sync route).
	Halted bool
	// Reason says why, for people (the summary's stop_reason); never
	// branch on it.
	Reason string
}

// StopError is an error that says what kind of stop it causes. A front
// door's sentinel errors are StopErrors (or wrap one), so StopOf maps them
// to a kind without the caller knowing each sentinel.
type StopError struct {
	Kind StopKind
	Err  error
}

func (e *StopError) Error() string { return e.Err.Error() }
func (e *StopError) Unwrap() error { return e.Err }

// StopOf is the kind of stop err causes: Complete for nil, the kind of a
// StopError it wraps, and Incomplete for anything else (a resume goes on
// from what the store holds).
func StopOf(err error) StopKind {
	var se *StopError
	switch {
	case err == nil:
		return Complete
	case errors.As(err, &se):
		return se.Kind
	}
	return Incomplete
}

// GateStop is the stop a budget gate's decision demands: Complete (go on)
// for a pass, Paused over budget, Refused when --confirm is required.
func GateStop(decision string) StopKind {
	switch decision {
	case plan.Pause:
		return Paused
	case plan.ConfirmRequired:
		return Refused
	}
	return Complete
}
