package campaign

import (
	"fmt"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/sim"
)

// The gateway checker reads only the simulator's ledger and per-second
// stats, the clients' answers (what each send got) and how each gateway
// process ended: never a gateway counter, ledger or status file.
//
// Promises:
//  1. every request answered at most once and with its own answer: a
//     success holds a message the simulator billed for that request's
//     body; a batch's results hold each custom_id once (every one, once it
//     ended), a succeeded one with its own item's answer;
//  2. billed at most once per answer: the simulator's billings of a
//     request's body, but those it never delivered whole (a reset, a
//     truncated body: the API has no idempotency key, so their retry bills
//     again), at most the sends of it written whole to a gateway (each
//     send may end in one billed answer; a gateway killed after it was
//     billed cannot pass it on, and the client's retry is a new send); a
//     batch item at most once per create of its batch, plus, for its sync
//     billings, what a kill -9 of its gateway may leave (as 'run's crash
//     allowance: the requests in flight and one group commit); never by
//     the batch tier twice for one create;
//  3. the simulator's in-flight count on every key at most the cap: --cap
//     with --shared (one budget for every gateway), --cap × gateways
//     without it (each its own budget); without --shared, the latency after
//     a gateway process exited is exempt (its successor cannot know what
//     it had in flight, as a 'run' killed without --shared). With --shared
//     only these are exempt: requests the API runs longer than the attempt
//     timeout (a slow fault past 10 API minutes), which every client gives
//     up on and sends again while the API may still run them; and after a
//     kill -9, a SIGSTOP or a partition from Redis during a slow fault, the
//     silent gateway's requests for the fault's extra latency (a gateway
//     restarted after a kill -9 holds the slots of the attempts its
//     predecessor's journal holds open while the API may run them at its
//     documented pace, and Redis keeps a silent gateway's slots for a
//     grace of 1.25 × its longest recent request: a slow fault outruns
//     both; docs/shared-budget.md, "Worst case");
//  4. per client and gateway, what the simulator billed for the client's
//     requests sent to that gateway at most the client's max_cost; per
//     gateway, what it billed for every request sent to it at most
//     --max-cost. EXEMPT, and only this: a client's bill summed over
//     several gateways may pass its max_cost, because each gateway keeps
//     its own ledger and gate (issue 27, "a client's max_cost is per
//     replica", open); the sum is logged;
//  5. no client harms another: every request of a well-behaved client ends
//     answered (a success, or a refusal for a spend cap) within the clients'
//     window, whatever the hostile clients do; a request naming a beta the
//     orgs refuse gets the API's 403 permission_error (or, when an org
//     allows it, that org's answer), not a 5xx of orgs taken out of rotation;
//  6. the lifecycle: a gateway exits 0 after SIGTERM or SIGINT, within
//     gwSecondSignal of a second signal; it never exits or hangs by itself.

// gwSecondSignal bounds the exit after a second SIGTERM/SIGINT (it should
// be at once; the margin is for a loaded 2-core machine under -race).
const gwSecondSignal = 5 * time.Second

// gwOwner is what sent a body: a client's request, or an item of its batch.
type gwOwner struct {
	client  int
	gateway int
	req     *gwReq
	batch   *gwBatch
	item    int
}

func (o gwOwner) String(w *gwWorld) string {
	name := w.clients[o.client].c.Name
	if o.req != nil {
		return fmt.Sprintf("%s's request %d", name, o.req.k)
	}
	return fmt.Sprintf("%s's batch %d item %s", name, o.batch.j, o.batch.items[o.item].id)
}

func checkGateway(w *gwWorld) []string {
	var v []string
	bad := func(format string, a ...any) { v = append(v, fmt.Sprintf(format, a...)) }
	sc := w.sc

	// 6. How every gateway process ended.
	kills := make([]int, len(w.gws))
	for _, g := range w.gws {
		if g.startFailed != "" {
			bad("gateway %d: could not be started again within %s:\n%s", g.i, gwStartTimeout, tail(g.startFailed))
		}
		for _, inc := range g.incs {
			if strings.Contains(inc.out, "WARNING: DATA RACE") {
				bad("gateway %d (pid %d): the race detector fired:\n%s", g.i, inc.pid, tail(inc.out))
			}
			if strings.Contains(inc.out, "panic:") || strings.Contains(inc.out, "fatal error:") {
				bad("gateway %d (pid %d): crashed:\n%s", g.i, inc.pid, tail(inc.out))
			}
			if inc.hung != "" {
				bad("lifecycle: gateway %d (pid %d): still running %s after its first signal: a hang (its goroutines: %s)", g.i, inc.pid, gwHangAfter, inc.hung)
			}
			if inc.killed || inc.hung != "" {
				kills[g.i]++
				continue
			}
			if !inc.served {
				continue // refused at start (Redis cut off): started again
			}
			var terms []sigAt
			for _, s := range inc.sigs {
				if s.sig == syscall.SIGTERM || s.sig == syscall.SIGINT {
					terms = append(terms, s)
				}
			}
			switch {
			case len(terms) == 0:
				bad("lifecycle: gateway %d (pid %d) exited %d by itself at %.2fs:\n%s", g.i, inc.pid, inc.code, inc.to.Seconds(), tail(inc.out))
			case inc.code != 0:
				bad("lifecycle: gateway %d (pid %d) exited %d after %s:\n%s", g.i, inc.pid, inc.code, terms[0].sig, tail(inc.out))
			}
			if len(terms) >= 2 {
				// A stopped process reads its signals at SIGCONT.
				second := terms[1].at
				stopped := false
				for _, s := range inc.sigs {
					switch {
					case s.sig == syscall.SIGSTOP && s.at <= terms[1].at:
						stopped = true
					case s.sig == syscall.SIGCONT && s.at <= terms[1].at:
						stopped = false
					case s.sig == syscall.SIGCONT && stopped:
						second, stopped = s.at, false
					}
				}
				if inc.to-second > gwSecondSignal {
					bad("lifecycle: gateway %d (pid %d): a second signal must end it at once: it exited %s after the second (%s after the first)",
						g.i, inc.pid, (inc.to - second).Round(100*time.Millisecond), (inc.to - terms[0].at).Round(100*time.Millisecond))
				}
			}
		}
	}

	// The bodies the clients sent.
	byHash := map[sim.BodyHash]gwOwner{}
	own := func(h sim.BodyHash, o gwOwner) {
		if prev, dup := byHash[h]; dup {
			w.t.Fatalf("campaign bug: %s and %s have the same body", prev.String(w), o.String(w))
		}
		byHash[h] = o
	}
	for ci, c := range w.clients {
		for _, q := range c.reqs {
			if q.kind != "count" {
				own(q.hash, gwOwner{client: ci, gateway: q.gateway, req: q})
			}
		}
		for _, b := range c.batches {
			for k, it := range b.items {
				own(it.hash, gwOwner{client: ci, gateway: b.gateway, batch: b, item: k})
			}
		}
	}
	ledger := w.sim.Server.Ledger()
	byMsg := map[string]sim.LedgerEntry{}
	for _, e := range ledger {
		byMsg[e.MessageID] = e
	}

	// 1. Answers.
	var wrong []string
	for _, c := range w.clients {
		for _, q := range c.reqs {
			if q.outcome != "success" || q.msgID == "" {
				continue
			}
			e, ok := byMsg[q.msgID]
			switch {
			case !ok:
				wrong = append(wrong, fmt.Sprintf("%s's request %d got message %s, which the simulator never billed", c.c.Name, q.k, q.msgID))
			case e.BodySHA256 != q.hash:
				o, known := byHash[e.BodySHA256]
				who := "a body no client sent"
				if known {
					who = o.String(w)
				}
				wrong = append(wrong, fmt.Sprintf("%s's request %d got the answer to %s", c.c.Name, q.k, who))
			}
		}
		for _, b := range c.batches {
			if b.outcome != "ended" {
				continue
			}
			ids := map[string]int{}
			for k, it := range b.items {
				ids[it.id] = k
			}
			for id, rs := range b.results {
				k, ok := ids[id]
				if !ok {
					wrong = append(wrong, fmt.Sprintf("%s's batch %d (%s): results hold %q, not one of its custom_ids", c.c.Name, b.j, b.id, id))
					continue
				}
				if len(rs) > 1 {
					wrong = append(wrong, fmt.Sprintf("%s's batch %d (%s): custom_id %s has %d results", c.c.Name, b.j, b.id, id, len(rs)))
				}
				for _, r := range rs {
					if r.typ != "succeeded" {
						continue
					}
					if e, ok := byMsg[r.msgID]; !ok || e.BodySHA256 != b.items[k].hash {
						wrong = append(wrong, fmt.Sprintf("%s's batch %d (%s): %s holds message %s, not its own item's answer", c.c.Name, b.j, b.id, id, r.msgID))
					}
				}
			}
			missing := 0
			for _, it := range b.items {
				if len(b.results[it.id]) == 0 {
					missing++
				}
			}
			if missing > 0 {
				wrong = append(wrong, fmt.Sprintf("%s's batch %d (%s) ended with %d of %d custom_ids without a result", c.c.Name, b.j, b.id, missing, len(b.items)))
			}
			if b.lost404 > 0 {
				wrong = append(wrong, fmt.Sprintf("%s's batch %d (%s): %d retrieves of the acknowledged batch answered 404", c.c.Name, b.j, b.id, b.lost404))
			}
		}
	}
	sort.Strings(wrong)
	if len(wrong) > 0 {
		bad("promise 1 (answered once, with its own answer): %s", firstFew(wrong))
	}

	// 2. Billings; 4. spend.
	type billing struct{ n, lost, batch int }
	billed := map[sim.BodyHash]*billing{}
	spent := make([][]int64, len(w.clients)) // [client][gateway]
	for i := range spent {
		spent[i] = make([]int64, len(w.gws))
	}
	spentG := make([]int64, len(w.gws))
	// lost sums, per client and gateway, what the simulator billed but
	// never delivered whole, by request kind: the report of a max_cost
	// overrun names them.
	lost := make([][]undelivered, len(w.clients))
	for i := range lost {
		lost[i] = make([]undelivered, len(w.gws))
	}
	var strangers []string
	for _, e := range ledger {
		o, ok := byHash[e.BodySHA256]
		if !ok {
			strangers = append(strangers, fmt.Sprintf("%s %s seq %d", e.Model, e.ServiceTier, e.Seq))
			continue
		}
		b := billed[e.BodySHA256]
		if b == nil {
			b = &billing{}
			billed[e.BodySHA256] = b
		}
		b.n++
		if e.ServiceTier == "batch" {
			b.batch++
		}
		if e.Delivery == sim.DeliveryReset || e.Delivery == sim.DeliveryTruncated {
			b.lost++
			kind := "batch item"
			if o.req != nil {
				kind = o.req.kind
			}
			lost[o.client][o.gateway].add(kind, e)
		}
		if e.USGeo {
			lost[o.client][o.gateway].geo += e.CostNanos
		}
		spent[o.client][o.gateway] += e.CostNanos
		spentG[o.gateway] += e.CostNanos
	}
	if len(strangers) > 0 {
		bad("promise 2: the simulator billed %d bodies no client sent: %s", len(strangers), firstFew(strangers))
	}
	var twice []string
	extraSync := make([]int, len(w.gws))
	var extraEx [][]string = make([][]string, len(w.gws))
	for h, b := range billed {
		o := byHash[h]
		if q := o.req; q != nil {
			if b.n-b.lost > q.sends {
				twice = append(twice, fmt.Sprintf("%s billed %d times (%d undelivered) for %d sends", o.String(w), b.n, b.lost, q.sends))
			}
			continue
		}
		creates := o.batch.creates
		if b.batch > creates {
			twice = append(twice, fmt.Sprintf("%s billed %d times by the batch tier for %d creates", o.String(w), b.batch, creates))
		}
		if x := b.n - b.lost - max(creates, b.batch); x > 0 {
			extraSync[o.gateway] += x
			extraEx[o.gateway] = append(extraEx[o.gateway], fmt.Sprintf("%s ×%d (undelivered %d, batch tier %d)", o.String(w), b.n, b.lost, b.batch))
		}
	}
	for g, x := range extraSync {
		if allowed := kills[g] * (3*sc.Cap + crashSlack); x > allowed {
			sort.Strings(extraEx[g])
			twice = append(twice, fmt.Sprintf("gateway %d's batches: %d extra sync billings beyond the %d its %d kill(s) may leave: %s", g, x, allowed, kills[g], firstFew(extraEx[g])))
		}
	}
	sort.Strings(twice)
	if len(twice) > 0 {
		bad("promise 2 (billed at most once per answer): %s", firstFew(twice))
	}

	for ci, c := range w.clients {
		var total int64
		over, used := false, 0
		for g, n := range spent[ci] {
			total += n
			if n > 0 {
				used++
			}
			if c.c.MaxCost > 0 && n > int64(c.c.MaxCost*1e9+0.5) {
				over = true
				bad("promise 4 (max_cost): client %s via gateway %d: the simulator billed $%.6f for its requests, over its max_cost $%.6f (%s; the gateway killed -9 %d times)",
					c.c.Name, g, float64(n)/1e9, c.c.MaxCost, lost[ci][g], kills[g])
			}
		}
		if c.c.MaxCost > 0 && !over && used > 1 && total > int64(c.c.MaxCost*1e9+0.5) {
			w.logf("EXEMPT (issue 27, a client's max_cost is per gateway): client %s billed $%.6f over %d gateways on max_cost $%.6f",
				c.c.Name, float64(total)/1e9, used, c.c.MaxCost)
		}
		w.logf("client %s: billed $%.6f (by gateway: %s); %s", c.c.Name, float64(total)/1e9, usdList(spent[ci]), c.outcomes())
	}
	if sc.MaxCost > 0 {
		for g, n := range spentG {
			if n > int64(sc.MaxCost*1e9+0.5) {
				bad("promise 4 (--max-cost): gateway %d: the simulator billed $%.6f for the requests sent to it, over --max-cost $%.6f", g, float64(n)/1e9, sc.MaxCost)
			}
		}
	}

	// 3. In flight per key (one key per org), second by second.
	limit := sc.Cap
	if !sc.Shared {
		limit = sc.Cap * sc.Gateways
	}
	var windows []window
	if !sc.Shared {
		for _, g := range w.gws {
			for _, inc := range g.incs {
				if inc.served && !inc.final {
					windows = append(windows, window{inc.to, inc.to + w.latencyReal() + time.Second/2, fmt.Sprintf("gateway %d pid %d exited", g.i, inc.pid)})
				}
			}
		}
	}
	// A request the API runs longer than the gateway's attempt timeout
	// (10 API minutes) is given up and sent again while the API may still
	// run it: no client can know when the API ends it. The slow faults
	// whose extra latency passes the timeout are exempt from the timeout
	// after their first request to the end of their last.
	for _, f := range sc.Faults {
		if f.Kind != sim.FaultSlow || f.ExtraLatency <= gwAttemptTimeoutAPI {
			continue
		}
		real := func(api time.Duration) time.Duration { return time.Duration(float64(api) / sc.Speed) }
		windows = append(windows, window{real(f.Start + gwAttemptTimeoutAPI), real(f.Start+f.Duration+f.ExtraLatency) + w.latencyReal() + time.Second/2,
			fmt.Sprintf("slow fault +%s past the attempt timeout", f.ExtraLatency)})
	}
	// A gateway restarted after a kill -9 holds its predecessor's slots
	// while the API may run those requests at its documented pace for
	// their max_tokens; a slow fault runs them far longer, so after a kill
	// while one is on, the killed gateway's requests are exempt for the
	// fault's extra latency.
	// The same for a gateway stopped or cut off from Redis: Redis keeps
	// its slots for its lease and a grace of 1.25 × its longest recent
	// request (docs/shared-budget.md, "Worst case"), which a slow fault
	// outruns.
	type gone struct {
		why      string
		from, to time.Duration
	}
	var gones []gone
	for _, g := range w.gws {
		for _, inc := range g.incs {
			if inc.killed {
				gones = append(gones, gone{fmt.Sprintf("gateway %d pid %d killed", g.i, inc.pid), inc.to, inc.to})
			}
		}
	}
	w.mu.Lock()
	for _, x := range w.silences {
		gones = append(gones, gone{fmt.Sprintf("gateway %d stopped or cut off", x.gw), x.from, x.to})
	}
	w.mu.Unlock()
	for _, x := range gones {
		for _, f := range sc.Faults {
			if f.Kind != sim.FaultSlow {
				continue
			}
			from, to := time.Duration(float64(f.Start)/sc.Speed), time.Duration(float64(f.Start+f.Duration+f.ExtraLatency)/sc.Speed)
			if x.to < from || x.from > to {
				continue
			}
			windows = append(windows, window{x.from, x.to + time.Duration(float64(f.ExtraLatency)/sc.Speed) + w.latencyReal() + time.Second/2,
				x.why + " during a slow fault"})
		}
	}
	var peaks []string
	for _, o := range w.sim.Server.Stats().Orgs {
		var over []string
		peaks = append(peaks, fmt.Sprintf("%s %d", o.Name, o.MaxInFlight))
		for _, pt := range o.Series {
			if pt.InFlightMax <= int64(limit) {
				continue
			}
			from, to := time.Duration(pt.T)*time.Second, time.Duration(pt.T+1)*time.Second
			exempt := false
			for _, x := range windows {
				exempt = exempt || (x.from < to && x.to > from)
			}
			if !exempt {
				over = append(over, fmt.Sprintf("%d in flight at %ds", pt.InFlightMax, pt.T))
			}
		}
		if len(over) > 0 {
			bad("promise 3 (cap): key of %s above its cap %d: %s", o.Name, limit, firstFew(over))
		}
	}

	w.logf("in flight at most, per key: %s (cap %d)", strings.Join(peaks, ", "), limit)

	// 5. No client harms another.
	for _, c := range w.clients {
		var unanswered []string
		switch c.c.Hostile {
		case "":
			for _, q := range c.reqs {
				if q.outcome != "success" && q.outcome != "cap" {
					unanswered = append(unanswered, fmt.Sprintf("request %d (%s, gateway %d) %s after %d tries, %s–%s; last: %s",
						q.k, q.kind, q.gateway, q.outcome, q.tries, q.first.Round(10*time.Millisecond), q.end.Round(10*time.Millisecond), q.last))
				}
			}
			for _, b := range c.batches {
				if b.outcome != "ended" && b.outcome != "cap" {
					unanswered = append(unanswered, fmt.Sprintf("batch %d (%s, gateway %d) %s; last: %s", b.j, b.id, b.gateway, b.outcome, b.last))
				}
			}
			if len(unanswered) > 0 {
				bad("promise 5 (no client harms another): well-behaved client %s: %d of its requests not answered: %s", c.c.Name, len(unanswered), firstFew(unanswered))
			}
		case hBeta:
			for _, q := range c.reqs {
				ok := q.outcome == "success" || (q.outcome == "terminal" && q.status == 403 && q.errType == anthropic.ErrPermission)
				// Once the gateway's --max-cost is reached it refuses
				// every Messages request before any goes upstream: on
				// tier-1 orgs this client's requests can wait behind the
				// others' until then.
				ok = ok || (sc.MaxCost > 0 && q.kind == "sync" && q.outcome == "cap" && strings.Contains(q.last, "the gateway's --max-cost"))
				if !ok {
					unanswered = append(unanswered, fmt.Sprintf("request %d (%s): %s, last %s", q.k, q.kind, q.outcome, q.last))
				}
			}
			if len(unanswered) > 0 {
				bad("promise 5 (isolation): client %s's requests naming a beta the orgs refuse must get the API's 403 permission_error: %s", c.c.Name, firstFew(unanswered))
			}
		}
	}
	v = append(v, checkGatewayLiveness(w, ledger)...)
	return v
}

// outcomes sums how the client's requests ended.
func (c *gwClientRun) outcomes() string {
	n := map[string]int{}
	sends := 0
	for _, q := range c.reqs {
		n[q.kind+" "+q.outcome]++
		sends += q.sends
	}
	for _, b := range c.batches {
		n["batch "+b.outcome]++
		sends += b.creates
	}
	var parts []string
	for k, x := range n {
		parts = append(parts, fmt.Sprintf("%s %d", k, x))
	}
	sort.Strings(parts)
	return fmt.Sprintf("%s; %d sends", strings.Join(parts, ", "), sends)
}

func usdList(n []int64) string {
	var parts []string
	for _, x := range n {
		parts = append(parts, fmt.Sprintf("$%.6f", float64(x)/1e9))
	}
	return strings.Join(parts, ", ")
}

// undelivered sums the billings of one client through one gateway that
// never reached the gateway whole, by request kind, and what its
// inference_geo "us" requests cost.
type undelivered struct {
	n    map[string]int
	cost map[string]int64
	geo  int64
}

func (u *undelivered) add(kind string, e sim.LedgerEntry) {
	if u.n == nil {
		u.n, u.cost = map[string]int{}, map[string]int64{}
	}
	u.n[kind]++
	u.cost[kind] += e.CostNanos
}

func (u undelivered) String() string {
	var parts []string
	for k, n := range u.n {
		parts = append(parts, fmt.Sprintf("%d %s billings never delivered whole, $%.6f", n, k, float64(u.cost[k])/1e9))
	}
	sort.Strings(parts)
	if u.geo > 0 {
		parts = append(parts, fmt.Sprintf("inference_geo us billed $%.6f", float64(u.geo)/1e9))
	}
	if len(parts) == 0 {
		return "every billing delivered whole"
	}
	return strings.Join(parts, "; ")
}
