package spend

import (
	"errors"

	"github.com/apidispatch/apidispatch/cost"
)

// ErrUnavailable: the backend of a shared gate could not be asked, so a
// capped reservation is refused rather than admitted unjudged.
var ErrUnavailable = errors.New("spend: the shared spend budget is unreachable")

// Budget is one shared gate of a reservation's chain, as its backend
// sees it: its key, its name (for CapError) and its cap (0: none).
type Budget struct {
	Key  string
	Name string
	Cap  cost.Nanos
}

// Op is how a reservation's part in a backend changes.
type Op int

const (
	// OpCharge: amount of the work's cost is known and spent; the rest
	// stays reserved (Reservation.Charge).
	OpCharge Op = iota
	// OpSettle: the work cost amount in all, charges included; the rest
	// of the worst case is free (Reservation.Settle).
	OpSettle
	// OpRelease: nothing more was billed (Reservation.Release).
	OpRelease
	// OpKeep: the cost is not known; what is left of the worst case stays
	// counted for good (Reservation.Keep).
	OpKeep
)

// Backend keeps the caps and figures of shared gates for every process
// that shares them. Its methods are safe for concurrent use.
type Backend interface {
	// Reserve reserves worst in every budget at once, or refuses: a
	// *CapError naming the first budget it would pass, or an error
	// matching ErrUnavailable. With force it reserves whatever the caps
	// say and never refuses (an unreachable backend gets it later). It
	// returns the reservation's id. tag (a word, may be empty) says what
	// the reservation is for, to whoever reconciles it after a crash.
	Reserve(budgets []Budget, worst cost.Nanos, force bool, tag string) (id string, err error)
	// End applies op to reservation id of budgets. It does not fail: what
	// the backend cannot take now it takes later, and until then the
	// reservation stays counted at its worst case.
	End(id string, budgets []Budget, op Op, amount cost.Nanos)
}
