package shared

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/spend"
	"github.com/redis/go-redis/v9"
)

// spendPrefix starts every Redis key of the shared spend budget (see
// scripts.go); the hash tag keeps them on one shard.
const spendPrefix = "apidispatch:v1:spend:{spend}:"

// Spend is the spend.Backend of the gateways on one Redis: a shared
// gate's cap is judged against what every gateway spent, holds and has
// reserved under its key. owner names the gateway whose reservations these
// are (its state directory's id): a gateway that dies leaves them counted
// at their worst case until one started on its state directory reconciles
// them (Reconcile). A Redis that loses its data (restarted without
// persistence) is rebuilt by each running gateway, from its ledger and its
// open reservations, as soon as that gateway reserves or its heartbeat
// ticks (SeedFrom); a gateway that is not running then adds its ledger at
// its next start. Make it with Budget.Spend; Close when done. Its methods
// are safe for concurrent use.
type Spend struct {
	b     *Budget
	owner string
	run   string // this process's part of its reservations' ids
	n     atomic.Int64

	mu      sync.Mutex
	pending []spendOp // what Redis could not take yet, in order
	// ledger, once SeedFrom set it, says what this gateway's ledger holds
	// under each budget key; Redis found without this owner's counted
	// field (it lost its data) is seeded from it again, and open given the
	// reservations again, before it judges another reservation of ours.
	// Set once, before the first Reserve; guarded by mu.
	ledger func() map[string]cost.Nanos
	// watch: ledger is set (read without mu by Reserve and the loop).
	watch atomic.Bool
	// omu guards open: this process's reservations not ended, as this
	// process knows them, to make them again in a Redis that lost them.
	omu  sync.Mutex
	open map[string]*openRes
	// downUntil: Redis failed; until then a reservation fails at once
	// (UnixNano; 0: up).
	downUntil atomic.Int64
	// rebuildUntil: this process found Redis without its data; until then
	// (UnixNano) a reservation under a cap is refused, while every other
	// running gateway's heartbeat finds it too and adds its ledger and its
	// open reservations back.
	rebuildUntil atomic.Int64
	stop         context.CancelFunc
	done         chan struct{}
}

// spendOp is a reservation forced (Gate.Hold) or ended while Redis was out
// of reach, applied when it answers.
type spendOp struct {
	reserve bool
	tag     string
	id      string
	budgets []spend.Budget
	op      spend.Op
	amount  cost.Nanos
}

// openRes is an open reservation as this process knows it.
type openRes struct {
	budgets       []spend.Budget
	left, charged cost.Nanos
	tag           string
}

// Spend returns the shared spend budget of gateway owner on b's Redis and
// starts renewing its heartbeat (alive:<owner>, which says a gateway runs
// on that state directory) and applying what Redis could not take at once.
func (b *Budget) Spend(owner string) *Spend {
	var r [4]byte
	rand.Read(r[:])
	ctx, cancel := context.WithCancel(context.Background())
	s := &Spend{b: b, owner: owner, run: hex.EncodeToString(r[:]), stop: cancel, done: make(chan struct{}), open: map[string]*openRes{}}
	go s.loop(ctx)
	return s
}

// Owner is the gateway id the reservations are recorded under.
func (s *Spend) Owner() string { return s.owner }

func (s *Spend) resKey() string        { return spendPrefix + "res:" + s.owner }
func (s *Spend) aliveKey() string      { return spendPrefix + "alive:" + s.owner }
func spendBudgetKey(key string) string { return spendPrefix + "budget:" + key }

// ctx bounds one spend script run: longer than a lane's step (a request
// waits for it, and a loaded Redis or machine must not refuse it), short
// enough that a Redis gone refuses capped requests within seconds.
func (s *Spend) ctx() (context.Context, context.CancelFunc) {
	return s.opCtx(context.Background())
}

// opCtx bounds one operation under parent: the loop's operations end when
// Close stops it, rather than hold the exit for a timeout.
func (s *Spend) opCtx(parent context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(parent, max(s.b.opTimeout, spendOpTimeout))
}

const spendOpTimeout = 2 * time.Second

func (s *Spend) keys(budgets []spend.Budget) []string {
	keys := []string{s.resKey()}
	for _, bg := range budgets {
		keys = append(keys, spendBudgetKey(bg.Key))
	}
	return keys
}

// Reserve implements spend.Backend.
// A tag must be one word.
func (s *Spend) Reserve(budgets []spend.Budget, worst cost.Nanos, force bool, tag string) (string, error) {
	id := s.run + ":" + strconv.FormatInt(s.n.Add(1), 10)
	if tag == "" {
		tag = "-"
	}
	if force {
		s.track(id, budgets, worst, tag)
		s.apply(spendOp{reserve: true, id: id, budgets: budgets, amount: worst, tag: tag})
		return id, nil
	}
	if time.Now().UnixNano() < s.downUntil.Load() {
		return "", fmt.Errorf("%w at %s (it failed within the last %s): a request under a max_cost is refused rather than sent unjudged", spend.ErrUnavailable, s.b.host, s.b.every)
	}
	if time.Now().UnixNano() < s.rebuildUntil.Load() {
		return "", s.errRebuilding()
	}
	ctx, cancel := s.ctx()
	defer cancel()
	res, err := s.reserve(ctx, id, budgets, worst, false, tag)
	if err == nil && len(res) > 0 && res[0] < 0 {
		// Redis lost the budget (restarted empty): it is seeded again,
		// and given our open reservations again; this one is refused
		// while the other gateways add theirs.
		if err = s.resync(context.Background()); err == nil {
			return "", s.errRebuilding()
		}
	}
	if err != nil {
		s.downUntil.Store(time.Now().Add(s.b.every).UnixNano())
		return "", fmt.Errorf("%w at %s (%v): a request under a max_cost is refused rather than sent unjudged", spend.ErrUnavailable, s.b.host, err)
	}
	if i := res[0]; i > 0 && int(i) <= len(budgets) {
		bg := budgets[i-1]
		return "", &spend.CapError{Name: bg.Name, Cap: bg.Cap, Spent: cost.Nanos(res[1]), Held: cost.Nanos(res[2]), Reserved: cost.Nanos(res[3]), Want: worst}
	}
	// Tracked once admitted: one admitted just before Redis lost it, and
	// made again by a resync before this line, is missed there (its
	// cost reaches the budget at the next seed from the ledger).
	s.track(id, budgets, worst, tag)
	return id, nil
}

// track records reservation id as open here.
func (s *Spend) track(id string, budgets []spend.Budget, worst cost.Nanos, tag string) {
	s.omu.Lock()
	s.open[id] = &openRes{budgets: budgets, left: worst, tag: tag}
	s.omu.Unlock()
}

// ended applies op to reservation id as this process knows it, as
// spendEndScript does in Redis.
func (s *Spend) ended(id string, op spend.Op, amount cost.Nanos) {
	s.omu.Lock()
	defer s.omu.Unlock()
	o := s.open[id]
	if o == nil {
		return
	}
	charge := func(x cost.Nanos) {
		d := min(x, o.left)
		o.left, o.charged = o.left-d, o.charged+x
	}
	switch op {
	case spend.OpCharge:
		if amount > 0 {
			charge(amount)
		}
		return
	case spend.OpSettle:
		if amount > o.charged {
			charge(amount - o.charged)
		}
	}
	delete(s.open, id)
}

func (s *Spend) reserve(ctx context.Context, id string, budgets []spend.Budget, worst cost.Nanos, force bool, tag string) ([]int64, error) {
	return s.reserveCharged(ctx, id, budgets, worst, 0, force, tag)
}

// reserveCharged runs spendReserveScript; charged is what a reservation
// made again (resync) was charged already.
func (s *Spend) reserveCharged(ctx context.Context, id string, budgets []spend.Budget, worst, charged cost.Nanos, force bool, tag string) ([]int64, error) {
	owner := ""
	if s.watch.Load() {
		owner = s.owner
	}
	args := []any{id, int64(worst), "0", tag, owner, int64(charged)}
	if force {
		args[2] = "1"
	}
	for _, bg := range budgets {
		args = append(args, int64(bg.Cap))
	}
	return spendReserveScript.Run(ctx, s.b.rdb, s.keys(budgets), args...).Int64Slice()
}

var opNames = [...]string{spend.OpCharge: "charge", spend.OpSettle: "settle", spend.OpRelease: "release", spend.OpKeep: "keep"}

// End implements spend.Backend: what Redis cannot take now is applied, in
// order, when it answers; meanwhile the reservation counts at its worst.
func (s *Spend) End(id string, budgets []spend.Budget, op spend.Op, amount cost.Nanos) {
	s.ended(id, op, amount)
	s.apply(spendOp{id: id, budgets: budgets, op: op, amount: amount})
}

// apply runs o now, unless earlier ones wait (o must follow them), or
// queues it when Redis does not answer.
func (s *Spend) apply(o spendOp) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.pending) == 0 {
		ctx, cancel := s.ctx()
		err := s.run1(ctx, o)
		cancel()
		if err == nil {
			return
		}
	}
	s.pending = append(s.pending, o)
}

func (s *Spend) run1(ctx context.Context, o spendOp) error {
	if o.reserve {
		res, err := s.reserve(ctx, o.id, o.budgets, o.amount, true, o.tag)
		if err == nil && len(res) > 0 && res[0] < 0 {
			// Redis lost the budget: it waits for resync, which makes
			// it again with every open reservation.
			err = errors.New("the budget is not seeded")
		}
		return err
	}
	return spendEndScript.Run(ctx, s.b.rdb, s.keys(o.budgets), o.id, opNames[o.op], int64(o.amount), s.owner).Err()
}

// flush applies what waits, in order, until Redis fails again.
func (s *Spend) flush(parent context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.pending) > 0 {
		ctx, cancel := s.opCtx(parent)
		err := s.run1(ctx, s.pending[0])
		cancel()
		if err != nil {
			return
		}
		s.pending = s.pending[1:]
	}
}

// Pending is the number of reservations and ends waiting for Redis.
func (s *Spend) Pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pending)
}

func (s *Spend) loop(ctx context.Context) {
	defer close(s.done)
	hn, _ := os.Hostname()
	alive := fmt.Sprintf("%s pid %d since %s", hn, os.Getpid(), time.Now().UTC().Format(time.RFC3339))
	t := time.NewTicker(s.b.every)
	defer t.Stop()
	for {
		c, cancel := s.opCtx(ctx)
		s.b.rdb.Set(c, s.aliveKey(), alive, 4*s.b.ttl)
		cancel()
		if s.lost(ctx) {
			if err := s.resync(ctx); err != nil && ctx.Err() == nil {
				s.downUntil.Store(time.Now().Add(s.b.every).UnixNano())
			}
		}
		s.flush(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Seed brings the shared budget key up to spent, what this gateway's
// ledger says it spent under key: it adds what the ledger holds beyond
// what the budget counted of this gateway already (its reservations'
// charges and keeps, and earlier seeds). Seeding again adds only what the
// ledger gained meanwhile (while the gateway ran without --shared, or
// counted spend here alone with Redis out of reach). Call it when no
// reservation of this gateway is open: what an open one was charged is
// counted in the budget and not yet in the ledger.
func (s *Spend) Seed(key string, spent cost.Nanos) error {
	ctx, cancel := s.ctx()
	defer cancel()
	if err := spendSeedScript.Run(ctx, s.b.rdb, []string{spendBudgetKey(key)}, s.owner, int64(spent)).Err(); err != nil {
		return fmt.Errorf("%w at %s: seeding %s: %v", spend.ErrUnavailable, s.b.host, key, err)
	}
	return nil
}

// SeedFrom seeds (Seed) every budget key of ledger, which says what this
// gateway's ledger holds under each, and watches them: a Redis found
// without this gateway's part of one (it restarted without its data) is
// seeded from ledger again, and given this process's open reservations
// again (each at what is left of its worst case, what it was charged
// counted as spent), before it judges another reservation of this
// process. Call it once, after Reconcile and before any Reserve.
func (s *Spend) SeedFrom(ledger func() map[string]cost.Nanos) error {
	s.mu.Lock()
	s.ledger = ledger
	s.mu.Unlock()
	for k, v := range ledger() {
		if err := s.Seed(k, v); err != nil {
			return err
		}
	}
	s.watch.Store(true)
	return nil
}

// lost reports whether Redis answers and lacks this gateway's part of a
// budget SeedFrom watches.
func (s *Spend) lost(parent context.Context) bool {
	if !s.watch.Load() {
		return false
	}
	s.mu.Lock()
	ledger := s.ledger
	s.mu.Unlock()
	ctx, cancel := s.opCtx(parent)
	defer cancel()
	p := s.b.rdb.Pipeline()
	var asked []*redis.BoolCmd
	for k := range ledger() {
		asked = append(asked, p.HExists(ctx, spendBudgetKey(k), "counted:"+s.owner))
	}
	if _, err := p.Exec(ctx); err != nil {
		return false // out of reach: nothing to tell
	}
	for _, c := range asked {
		if !c.Val() {
			return true
		}
	}
	return false
}

func (s *Spend) errRebuilding() error {
	return fmt.Errorf("%w at %s: it lost its data and is being rebuilt from every running gateway's ledger (for %s): a request under a max_cost is refused meanwhile", spend.ErrUnavailable, s.b.host, rebuildFor*s.b.every)
}

// rebuildFor is how many heartbeats a gateway that found Redis without
// its data refuses capped reservations: each running gateway's heartbeat
// finds the loss within one.
const rebuildFor = 4

// resync seeds the budgets from the ledger again and makes this process's
// open reservations again in Redis (those it still holds are left as they
// are). What waited for Redis is dropped: the ledger and the open
// reservations say all it would have. An end that reached the ledger and
// still finds its reservation made again counts twice: over, the safe
// side.
func (s *Spend) resync(parent context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ledger == nil {
		return nil
	}
	if now := time.Now(); now.UnixNano() >= s.rebuildUntil.Load() {
		s.rebuildUntil.Store(now.Add(rebuildFor * s.b.every).UnixNano())
	}
	for k, v := range s.ledger() {
		if err := s.Seed(k, v); err != nil {
			return err
		}
	}
	s.omu.Lock()
	type again struct {
		id string
		o  openRes
	}
	var open []again
	for id, o := range s.open {
		open = append(open, again{id, *o})
	}
	s.omu.Unlock()
	ctx, cancel := context.WithTimeout(parent, 10*max(s.b.opTimeout, spendOpTimeout))
	defer cancel()
	for _, a := range open {
		if _, err := s.reserveCharged(ctx, a.id, a.o.budgets, a.o.left, a.o.charged, true, a.o.tag); err != nil {
			return fmt.Errorf("%w at %s: making reservation %s again: %v", spend.ErrUnavailable, s.b.host, a.id, err)
		}
	}
	s.pending = nil
	return nil
}

// Reconcile ends the reservations an earlier process of this owner left
// open (it died, or Redis was gone when it stopped): each is kept at what
// is left of its worst case, for good, since the API may have billed it
// and its cost can no longer be read, unless release says its tag is of
// work this process reserves again itself (then it is released). Call it
// before this process reserves anything. It returns how many were kept
// and their sum.
func (s *Spend) Reconcile(release func(tag string) bool) (int, cost.Nanos, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*s.b.opTimeout)
	defer cancel()
	recs, err := s.b.rdb.HGetAll(ctx, s.resKey()).Result()
	if err != nil {
		return 0, 0, fmt.Errorf("%w at %s: reading the reservations of gateway %s: %v", spend.ErrUnavailable, s.b.host, s.owner, err)
	}
	var sum cost.Nanos
	kept := 0
	for id, rec := range recs {
		f := strings.Fields(rec)
		if len(f) < 4 {
			return 0, 0, fmt.Errorf("shared spend: reservation %s of gateway %s is malformed: %q", id, s.owner, rec)
		}
		left, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("shared spend: reservation %s of gateway %s is malformed: %q", id, s.owner, rec)
		}
		op := "keep"
		if f[2] != "-" && release != nil && release(f[2]) {
			op = "release"
		}
		keys := append([]string{s.resKey()}, f[3:]...)
		if err := spendEndScript.Run(ctx, s.b.rdb, keys, id, op, 0, s.owner).Err(); err != nil {
			return 0, 0, fmt.Errorf("%w at %s: %v", spend.ErrUnavailable, s.b.host, err)
		}
		if op == "keep" {
			kept++
			sum += cost.Nanos(left)
		}
	}
	return kept, sum, nil
}

// SpendFigures is a shared budget's figures, for every gateway sharing it.
type SpendFigures struct {
	Spent, Held, Reserved cost.Nanos
}

// Figures reads budget key's figures.
func (s *Spend) Figures(key string) (SpendFigures, error) {
	ctx, cancel := s.ctx()
	defer cancel()
	f, err := s.FiguresOf(ctx, key)
	if err != nil {
		return SpendFigures{}, err
	}
	return f[0], nil
}

// FiguresOf reads the figures of budgets keys in one round trip to Redis,
// within ctx (and the connection's own timeouts). A budget nothing was
// ever counted in has zero figures. While Redis is known to be out of
// reach (a reservation failed within the last moment) it fails at once.
func (s *Spend) FiguresOf(ctx context.Context, keys ...string) ([]SpendFigures, error) {
	if time.Now().UnixNano() < s.downUntil.Load() {
		return nil, fmt.Errorf("%w at %s (it failed within the last %s)", spend.ErrUnavailable, s.b.host, s.b.every)
	}
	cmds := make([]*redis.SliceCmd, len(keys))
	_, err := s.b.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			cmds[i] = p.HMGet(ctx, spendBudgetKey(k), "spent", "held", "reserved")
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w at %s: %v", spend.ErrUnavailable, s.b.host, err)
	}
	out := make([]SpendFigures, len(keys))
	for i, c := range cmds {
		var n [3]cost.Nanos
		for j, x := range c.Val() {
			if str, ok := x.(string); ok {
				k, _ := strconv.ParseInt(str, 10, 64)
				n[j] = cost.Nanos(k)
			}
		}
		out[i] = SpendFigures{Spent: n[0], Held: n[1], Reserved: n[2]}
	}
	return out, nil
}

// Open is the number of this owner's reservations open in Redis.
func (s *Spend) Open() (int64, error) {
	ctx, cancel := s.ctx()
	defer cancel()
	n, err := s.b.rdb.HLen(ctx, s.resKey()).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return 0, fmt.Errorf("%w at %s: %v", spend.ErrUnavailable, s.b.host, err)
	}
	return n, nil
}

// Close stops the heartbeat after one last try at what waits, and removes
// the heartbeat. What still waits stays counted at its worst case in
// Redis until a gateway on this state directory reconciles it.
func (s *Spend) Close() error {
	s.stop()
	<-s.done
	// While the renewals find Redis out of reach the exit does not wait
	// for it: what waits stays counted at its worst case (below), and
	// the mark that this gateway is alive lapses by itself (4 TTLs).
	if !s.b.outOfReach() {
		s.flush(context.Background())
		if s.Pending() == 0 {
			ctx, cancel := s.ctx()
			s.b.rdb.Del(ctx, s.aliveKey())
			cancel()
		}
	}
	if n := s.Pending(); n > 0 {
		return fmt.Errorf("shared spend: %d reservations or ends could not reach Redis at %s; they stay counted at their worst case until a gateway on this state directory starts", n, s.b.host)
	}
	return nil
}
