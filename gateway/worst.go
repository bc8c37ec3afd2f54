package gateway

import (
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/workload"
)

// worstCase is the most a Messages request with params body can cost:
// cost.Table.WorstCase of its workload.BoundOf (its input bounded by its
// estimate and its length, all max_tokens, every multiplier its params
// ask for); a model without a price is cost.Unpriceable, which no cap
// admits.
func (g *Gateway) worstCase(model string, body []byte, maxTokens int64, batch bool) cost.Nanos {
	p, err := g.cfg.Prices.Lookup(model)
	if err != nil {
		return cost.Unpriceable
	}
	return worstAt(p, model, body, maxTokens, batch)
}

// worstAt is worstCase at price p: the model's own, or the estimate a
// model missing from the table is priced at (priceFor).
func worstAt(p *cost.Price, model string, body []byte, maxTokens int64, batch bool) cost.Nanos {
	n, err := p.WorstCase(workload.BoundOf(model, body, maxTokens, batch))
	if err != nil {
		return cost.Unpriceable
	}
	return n
}
