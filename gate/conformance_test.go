package gate_test

import (
	"testing"

	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/gate/gatetest"
)

// The in-process lane passes the suite every gate passes.
func TestLaneGateConformance(t *testing.T) {
	gatetest.Run(t, func(t *testing.T, lc gate.LaneConfig) (gate.Gate, func()) {
		return gate.NewLane(lc), func() {}
	})
}
