package gateway

import (
	"fmt"

	"github.com/apidispatch/apidispatch/cost"
)

// Models the price table does not know. The API answers an unknown model
// with 404 not_found_error, and a model released after our table is served
// by the API at its own price: the gateway passes such a request on (the
// upstream's 404, or its answer) whenever no spend cap applies to it,
// pricing its answer as its pool's most expensive known model (an estimate,
// marked so in the ledger, with a warning). A cap (--max-cost, or the
// client's max_cost) is kept only with an exact price: then the request is
// refused, saying so.

// priceFor returns the price to reserve and bill client's request for
// model at, whether it is an estimate, or why the request is refused.
func (g *Gateway) priceFor(client, model string) (*cost.Price, bool, string) {
	if p, err := g.cfg.Prices.Lookup(model); err == nil {
		return p, false, ""
	}
	if g.clientGate(client).Capped() {
		return nil, false, fmt.Sprintf("model %q has no price in the gateway's price table, and a spend cap applies to this client "+
			"(the gateway's --max-cost or the client's max_cost), which needs an exact price to be kept: add the model with --prices", model)
	}
	p, as, ok := g.cfg.Prices.EstimateFor(model)
	if !ok {
		return nil, false, fmt.Sprintf("model %q has no price in the gateway's price table (add it with --prices)", model)
	}
	if _, warned := g.estimated.LoadOrStore(model, as); !warned {
		g.log.Warn("model not in the price table: its cost is estimated at the prices of its pool's most expensive known model (ledger entries marked estimated)",
			"model", model, "priced_as", as)
	}
	return p, true, ""
}

// strictPrice is why a batch of model is refused ("" when the table
// prices it): a gateway batch is capped by its worst case, which needs an
// exact price.
func (g *Gateway) strictPrice(model string) string {
	if _, err := g.cfg.Prices.Lookup(model); err != nil {
		return fmt.Sprintf("model: %q has no price in the gateway's price table, so a batch's cost cannot be capped (add it with --prices)", model)
	}
	return ""
}
