package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/shared"
	"github.com/apidispatch/apidispatch/spend"
)

// One spend budget for the gateways on one Redis. Without --shared the
// state directory's ledger is the authority for the caps (and one gateway
// holds it: lock.go). With --shared, the gateway's --max-cost and each
// client's max_cost are kept in Redis (shared.Spend behind the spend
// gates): every reservation of a worst case is admitted there, atomically
// against what every gateway on that Redis spent, holds and has reserved,
// and settled there from usage. Each gateway's reservations are recorded
// under its state directory's id (spendIDFile): when it dies they stay
// counted at their worst case, and a gateway started again on that state
// directory keeps each at its worst for good (its answer can never be
// read), as it does with its journal. Redis out of reach refuses a capped
// request (529) rather than sending it unjudged.

// spendIDFile holds the state directory's id in the shared spend budget.
const spendIDFile = "spend-id"

// batchHoldTag tags the hold of a gateway batch's worst case before runner
// takes it over, which its batch store makes again when it reopens.
const batchHoldTag = "batch"

// budget keys of the shared spend budget.
const gatewayBudget = "gateway"

func clientBudget(name string) string { return "client:" + url.QueryEscape(name) }

// openGates makes the gateway's spend gate and one per client: in
// process, seeded from the ledger, or (Config.SharedSpend) shared on Redis.
func (g *Gateway) openGates() error {
	cfg := g.cfg
	g.gates = map[string]*spend.Gate{}
	if g.gate = cfg.Spend; g.gate != nil || cfg.SharedSpend == nil {
		if g.gate == nil {
			g.gate = spend.New("the gateway's --max-cost", cfg.MaxCost, g.ledger.totalSpent())
		}
		for _, c := range cfg.Clients {
			g.gates[c.Name] = g.gate.Child("client "+c.Name+"'s max_cost", c.MaxCost, g.ledger.spent(c.Name))
		}
		return nil
	}
	id, err := stateDirID(cfg.StateDir)
	if err != nil {
		return err
	}
	ss := cfg.SharedSpend.Spend(id)
	capped := cfg.MaxCost > 0
	for _, c := range cfg.Clients {
		capped = capped || c.MaxCost > 0
	}
	// Redis out of reach at the start: with a cap to keep the gateway does
	// not start (it could not judge it); without one it starts, and what
	// this state directory left open stays counted until a later start.
	fail := func(err error) error {
		if !capped {
			g.log.Warn("the shared spend budget (--shared) cannot be reached: spend is counted here alone until it answers", "error", err)
			return nil
		}
		ss.Close()
		return fmt.Errorf("gateway: the shared spend budget (--shared) holds the spend caps: %w", err)
	}
	// A gateway batch's hold is made again when its batch store reopens
	// (batches.go); every other reservation is kept at its worst case.
	n, sum, err := ss.Reconcile(func(tag string) bool { return tag == batchHoldTag })
	if err != nil {
		if err := fail(err); err != nil {
			return err
		}
	}
	if n > 0 {
		g.log.Warn("this state directory's last gateway left reservations open in the shared spend budget: each kept at its worst case", "reservations", n, "worst_case_usd", sum.USD())
	}
	// Each budget is brought up to what the ledger holds (what it gained
	// while this state directory ran without --shared or counted spend
	// here alone is added), and again whenever Redis is found to have
	// lost it.
	seeds := func() map[string]cost.Nanos {
		m := map[string]cost.Nanos{gatewayBudget: g.ledger.totalSpent()}
		for _, c := range cfg.Clients {
			m[clientBudget(c.Name)] = g.ledger.spent(c.Name)
		}
		return m
	}
	if err := ss.SeedFrom(seeds); err != nil {
		if err := fail(err); err != nil {
			return err
		}
	}
	g.gate = spend.NewShared("the gateway's --max-cost", cfg.MaxCost, g.ledger.totalSpent(), ss, gatewayBudget)
	for _, c := range cfg.Clients {
		g.gates[c.Name] = g.gate.SharedChild("client "+c.Name+"'s max_cost", c.MaxCost, g.ledger.spent(c.Name), ss, clientBudget(c.Name))
	}
	g.sharedSpend = ss
	return nil
}

// stateDirID returns the id of dir in the shared spend budget, made (at
// random) the first time.
func stateDirID(dir string) (string, error) {
	p := filepath.Join(dir, spendIDFile)
	b, err := os.ReadFile(p)
	if err == nil {
		id := strings.TrimSpace(string(b))
		if id == "" || strings.ContainsAny(id, " \t\n") {
			return "", fmt.Errorf("gateway: %s holds no usable id (%q): delete it only if no reservation of this state directory is open in Redis", p, b)
		}
		return id, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("gateway: reading %s: %w", p, err)
	}
	var r [8]byte
	rand.Read(r[:])
	id := hex.EncodeToString(r[:])
	if err := os.WriteFile(p, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("gateway: writing %s: %w", p, err)
	}
	return id, nil
}

// The shared figures in Status are read from Redis by the gateway in the
// background (sharedFiguresLoop), every sharedStatusEvery, each read
// bounded by sharedStatusTimeout: Status (the status file, written by the
// ledger's flush loop, the metrics and GET /apidispatch/status) never
// waits for Redis, and shows the latest read, or why it failed.
const (
	sharedStatusEvery   = 500 * time.Millisecond
	sharedStatusTimeout = time.Second
)

// sharedFigures is the latest read of the shared figures: budget key →
// figures, or err.
type sharedFigures struct {
	at  time.Time
	fig map[string]shared.SpendFigures
	err error
}

// readSharedFigures reads the shared figures of the gateway's budget and
// of every client's, the configured ones and any the ledger holds.
func (g *Gateway) readSharedFigures() {
	keys := []string{gatewayBudget}
	seen := map[string]bool{}
	for _, c := range g.cfg.Clients {
		seen[c.Name] = true
		keys = append(keys, clientBudget(c.Name))
	}
	for _, name := range g.ledger.clientNames() {
		if !seen[name] {
			keys = append(keys, clientBudget(name))
		}
	}
	// Under the gateway's context: Close does not wait for a read
	// (Redis out of reach holds one for its whole timeout).
	ctx, cancel := context.WithTimeout(g.ctx, sharedStatusTimeout)
	defer cancel()
	f, err := g.sharedSpend.FiguresOf(ctx, keys...)
	sf := &sharedFigures{at: time.Now(), err: err}
	if err == nil {
		sf.fig = make(map[string]shared.SpendFigures, len(keys))
		for i, k := range keys {
			sf.fig[k] = f[i]
		}
	}
	g.sharedFig.Store(sf)
}

// sharedFiguresLoop reads the shared figures every sharedStatusEvery until
// the gateway stops.
func (g *Gateway) sharedFiguresLoop() {
	t := time.NewTicker(sharedStatusEvery)
	defer t.Stop()
	for {
		select {
		case <-g.ctx.Done():
			return
		case <-t.C:
			g.readSharedFigures()
		}
	}
}

// sharedStatus fills in the latest shared figures (--shared) of the
// clients cl and of the gateway (tot); when that read failed they are
// unavailable, with why.
func (g *Gateway) sharedStatus(cl []ClientSpend, tot *ClientSpend) {
	sf := g.sharedFig.Load()
	if sf == nil {
		return
	}
	set := func(line *ClientSpend, key string) {
		f, ok := sf.fig[key]
		switch {
		case sf.err != nil:
			line.Shared = &SharedSpend{Unavailable: sf.err.Error()}
		case !ok:
			line.Shared = &SharedSpend{Unavailable: "not read from Redis yet"}
		default:
			line.Shared = &SharedSpend{SpentUSD: f.Spent.USD(), ReservedUSD: (f.Reserved + f.Held).USD(), HeldUSD: f.Held.USD()}
		}
	}
	set(tot, gatewayBudget)
	for i := range cl {
		set(&cl[i], clientBudget(cl[i].Client))
	}
}
