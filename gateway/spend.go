package gateway

import (
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/spend"
)

// The gateway's spend is kept by package spend: one gate for the whole
// gateway (--max-cost, or Config.Spend) and one child gate per client (its
// max_cost), so a request passes only when both have room. Sync requests
// reserve their worst case in their client's gate; a gateway batch holds
// its worst case there from its create (or the gateway's start) until
// runner's batch route holds the upstream batches its run left open, then
// runner reserves each request and each upstream batch in a child of the
// same client gate (capped at the batch's worst case): a client's batches
// and sync requests share one cap. The ledger is the durable record the gates
// are seeded from at start.

// clientGate returns client's spend gate, or the gateway's for a client
// no longer in the clients file (a batch it left open, resumed).
func (g *Gateway) clientGate(client string) *spend.Gate {
	if cg := g.gates[client]; cg != nil {
		return cg
	}
	return g.gate
}

// hold is one reservation in a client's gate, recorded in the ledger when
// it is settled.
type hold struct {
	g      *Gateway
	client string
	res    *spend.Reservation
}

// reserve reserves worst in client's gate (and the gateway's), or returns
// the *spend.CapError of the gate that refused.
func (g *Gateway) reserve(client string, worst cost.Nanos) (*hold, error) {
	return g.reserveTagged(client, worst, "")
}

// reserveTagged is reserve with a tag for the shared spend budget
// (sharedspend.go).
func (g *Gateway) reserveTagged(client string, worst cost.Nanos, tag string) (*hold, error) {
	res, err := g.clientGate(client).ReserveTagged(worst, tag)
	if err != nil {
		return nil, err
	}
	return &hold{g: g, client: client, res: res}, nil
}

// Settle ends the reservation at e's cost and records e in the ledger. A
// zero-cost entry without a request or batch id (nothing was answered)
// only frees the reservation. A nil hold records e all the same.
func (h *hold) Settle(e Entry) {
	if h == nil {
		return
	}
	if e.Cost == 0 && e.RequestID == "" && e.BatchID == "" {
		h.res.Release()
		return
	}
	h.res.Settle(e.Cost)
	h.g.ledger.record(h.client, e)
}

// release frees the reservation without a ledger entry.
func (h *hold) release() {
	if h != nil {
		h.res.Release()
	}
}
