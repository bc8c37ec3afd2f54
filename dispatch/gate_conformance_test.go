package dispatch_test

import (
	"testing"

	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/dispatch/gatetest"
)

// The in-process lane passes the suite every gate passes.
func TestLaneGateConformance(t *testing.T) {
	gatetest.Run(t, func(t *testing.T, lc dispatch.LaneConfig) (dispatch.Gate, func()) {
		return dispatch.NewLane(lc), func() {}
	})
}
