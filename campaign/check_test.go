package campaign

import (
	"bufio"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/sim"
)

// item is one request of one process's input, as the simulator hashes it.
type item struct {
	proc int
	id   string
}

// The checker reads only the simulator's ledger and stats and the files the
// runs wrote (results.jsonl) and the inputs: never a dispatcher counter.
//
// Promises (docs/design.md §13):
//  1. every custom_id of an input ends with exactly one result line in its
//     run directory, or stays pending when the run stopped at --max-cost;
//  2. no prompt billed twice, except possible duplicates of a crash (kill
//     -9, full disk) of the process sending it, bounded per crash by the
//     requests the process may have had in flight plus one group commit,
//     and the retry of a billing the ledger says never reached the client
//     (a reset or a truncated body); never a batch request billed twice;
//  3. the simulator's in-flight count on every key at most --cap, outside
//     the windows after a process or Redis was cut off;
//  4. what the ledger billed for a run directory's items at most --max-cost.
//
// With --cache, an item that succeeded in a first run directory is not
// billed again by the second.

// crashSlack is the possible duplicates of one crash beyond the requests
// in flight: successes not yet durable (a group commit waits ≤20 ms).
const crashSlack = 32

func check(w *world) []string {
	var v []string
	bad := func(format string, a ...any) { v = append(v, fmt.Sprintf(format, a...)) }

	// The inputs: body hash → item.
	byHash := map[sim.BodyHash]item{}
	ids := make([]map[string]bool, len(w.procs))
	for _, p := range w.procs {
		ids[p.i] = map[string]bool{}
		f, err := os.Open(p.input)
		if err != nil {
			w.t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<24)
		for sc.Scan() {
			var line struct {
				CustomID string          `json:"custom_id"`
				Params   json.RawMessage `json:"params"`
				Body     json.RawMessage `json:"body"` // an OpenAI line's
			}
			if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
				w.t.Fatal(err)
			}
			req := line.Params
			if req == nil {
				req = line.Body
			}
			h := sim.BodyHash(sha256.Sum256(req))
			if o, dup := byHash[h]; dup {
				w.t.Fatalf("campaign bug: items %s and %s have the same body", o.id, line.CustomID)
			}
			byHash[h] = item{p.i, line.CustomID}
			ids[p.i][line.CustomID] = true
		}
		f.Close()
	}

	// How each pass ended.
	for _, p := range w.procs {
		for k, ps := range p.passes {
			if ps.hung != "" {
				bad("process %d pass %d: still running after %s: a hang (its goroutines: %s)", p.i, k+1, passTimeout, ps.hung)
			}
			if ps.code == exitDataLoss {
				bad("process %d pass %d: exit 5, data-loss check failed:\n%s", p.i, k+1, tail(ps.out))
			}
			if strings.Contains(ps.out, "WARNING: DATA RACE") {
				bad("process %d pass %d: the race detector fired:\n%s", p.i, k+1, tail(ps.out))
			}
			if !ps.crashed && !ps.noRedis && ps.code != exitComplete && ps.code != exitIncomplete && ps.code != exitDataLoss {
				bad("process %d pass %d: exit %d:\n%s", p.i, k+1, ps.code, tail(ps.out))
			}
		}
	}

	// Promise 1: results.
	for _, p := range w.procs {
		main := p.passes[0].runDir
		last := p.passes[len(p.passes)-1]
		for _, dir := range runDirs(p) {
			lines, err := readResults(filepath.Join(dir, "results.jsonl"))
			if err != nil && !os.IsNotExist(err) {
				bad("process %d %s: %v", p.i, filepath.Base(dir), err)
			}
			for id := range lines {
				if !ids[p.i][id] {
					bad("promise 1: process %d %s: results hold %q, which is not in its input", p.i, filepath.Base(dir), id)
				}
			}
			pending := 0
			for id := range ids[p.i] {
				switch n := lines[id]; {
				case n > 1:
					bad("promise 1: process %d %s: custom_id %s has %d result lines", p.i, filepath.Base(dir), id, n)
				case n == 0:
					pending++
				}
			}
			finished := dir != main || last.code == exitComplete
			if dir == main && last.cachePass {
				finished = true
			}
			switch {
			case finished && pending > 0:
				bad("promise 1: process %d %s ended complete with %d of %d custom_ids without a result", p.i, filepath.Base(dir), pending, len(ids[p.i]))
			case !finished && pending > 0 && w.sc.MaxCost == 0:
				bad("promise 1: process %d: %d of %d custom_ids still pending after %d passes (last exit %d), with no --max-cost to stop it:\n%s",
					p.i, pending, len(ids[p.i]), len(p.passes), last.code, tail(last.out))
			}
		}
	}

	ledger := w.sim.Server.Ledger()
	// Promise 1, continued: a succeeded line holds its own item's answer.
	byMsg := map[string]sim.BodyHash{}
	for _, e := range ledger {
		byMsg[e.MessageID] = e.BodySHA256
	}
	for _, p := range w.procs {
		for _, dir := range runDirs(p) {
			var wrong []string
			for id, msg := range succeededIDs(filepath.Join(dir, "results.jsonl")) {
				h, ok := byMsg[msg]
				if !ok {
					wrong = append(wrong, fmt.Sprintf("%s holds message %s, which the simulator never billed", id, msg))
					continue
				}
				if it := byHash[h]; it != (item{p.i, id}) {
					wrong = append(wrong, fmt.Sprintf("%s holds the answer to process %d's %s", id, it.proc, it.id))
				}
			}
			sort.Strings(wrong)
			if len(wrong) > 0 {
				bad("promise 1: process %d %s: %d results hold another item's answer: %s", p.i, filepath.Base(dir), len(wrong), firstFew(wrong))
			}
		}
	}

	// Promises 2 and 4: the ledger.
	type billing struct {
		n, batch int
		// lost counts billings whose answer never reached the client
		// whole (a reset or a truncated body): the client cannot know it
		// was billed, and the API has no idempotency key, so a retry
		// bills again. Each allows one more billing.
		lost int
	}
	cachePassFrom := int64(-1)
	for _, ps := range w.procs[0].passes {
		if ps.cachePass {
			cachePassFrom = ps.ledgerFrom
		}
	}
	billed := [2]map[item]*billing{{}, {}} // first run directories; the cache pass
	spent := [2][]int64{make([]int64, len(w.procs)), make([]int64, len(w.procs))}
	for _, e := range ledger {
		it, ok := byHash[e.BodySHA256]
		if !ok {
			bad("promise 2: the simulator billed a body in no input (%s %s, seq %d)", e.Model, e.ServiceTier, e.Seq)
			continue
		}
		g := 0
		if cachePassFrom >= 0 && e.Seq > cachePassFrom {
			g = 1
		}
		b := billed[g][it]
		if b == nil {
			b = &billing{}
			billed[g][it] = b
		}
		b.n++
		if e.ServiceTier == "batch" {
			b.batch++
		}
		if e.Delivery == sim.DeliveryReset || e.Delivery == sim.DeliveryTruncated {
			b.lost++
		}
		spent[g][it.proc] += e.CostNanos
	}
	dups := make([]int, len(w.procs))
	var batchTwice []string
	for it, b := range billed[0] {
		if b.n < 2 {
			continue
		}
		if b.batch >= 2 {
			batchTwice = append(batchTwice, it.id)
		}
		dups[it.proc] += max(0, b.n-1-b.lost)
	}
	sort.Strings(batchTwice)
	if len(batchTwice) > 0 {
		bad("promise 2: %d custom_ids billed twice by batches: %s", len(batchTwice), firstFew(batchTwice))
	}
	for _, p := range w.procs {
		crashes := 0
		for _, ps := range p.passes {
			if ps.crashed {
				crashes++
			}
		}
		allowed := crashes * (3*w.sc.Cap + crashSlack)
		if dups[p.i] > allowed {
			var ex []string
			for it, b := range billed[0] {
				if it.proc == p.i && b.n-b.lost > 1 {
					ex = append(ex, fmt.Sprintf("%s×%d(batch %d, undelivered %d)", it.id, b.n, b.batch, b.lost))
				}
			}
			sort.Strings(ex)
			bad("promise 2: process %d: %d extra billings of its items, beyond the %d a crash may leave (%d crashes): %s",
				p.i, dups[p.i], allowed, crashes, firstFew(ex))
		}
	}
	if cachePassFrom >= 0 {
		// An item that succeeded in the first run directory is answered
		// by the cache in the second. Exempt, and only with evidence: a
		// success whose cache write failed on a full disk while its
		// result was kept (the run keeps a result that is paid for; the
		// cache misses it). The evidence is the first run directory's
		// summary counting that many such successes (cache.write_failed),
		// and the item's billing in that directory falling in a pass
		// whose disk was full.
		succeeded := succeededIDs(filepath.Join(w.procs[0].runDir, "results.jsonl"))
		var again, unwritten []string
		for it := range billed[1] {
			if _, ok := succeeded[it.id]; it.proc == 0 && ok {
				if w.billedInDiskFullPass(ledger, byHash, it, cachePassFrom) {
					unwritten = append(unwritten, it.id)
				} else {
					again = append(again, it.id)
				}
			}
		}
		if failed := cacheWriteFailed(w.procs[0].runDir); int64(len(unwritten)) > failed {
			again = append(again, unwritten...) // more than the run says it missed
		} else if len(unwritten) > 0 {
			w.logf("promise 2 (--cache): %d items billed again whose cache write failed on the full disk (the summary's cache.write_failed is %d): %s", len(unwritten), failed, firstFew(unwritten))
		}
		sort.Strings(again)
		if len(again) > 0 {
			bad("promise 2 (--cache): %d items that succeeded in the first run directory were billed again by the second: %s", len(again), firstFew(again))
		}
	}
	if w.sc.MaxCost > 0 {
		capN := int64(w.sc.MaxCost*1e9 + 0.5)
		for g := range 2 {
			for i, n := range spent[g] {
				if n > capN {
					where := "its run directory"
					if g == 1 {
						where = "the cache pass's run directory"
					}
					bad("promise 4: process %d: the ledger billed $%.6f for %s, over --max-cost $%.6f", i, float64(n)/1e9, where, w.sc.MaxCost)
				}
			}
		}
	}

	// Promise 3: in flight per key (one key per org), second by second.
	capAt := w.capBound(ledger, byHash)
	st := w.sim.Server.Stats()
	for _, o := range st.Orgs {
		var over []string
		for _, pt := range o.Series {
			c := capAt(o.Name, pt.T)
			if pt.InFlightMax <= int64(c) {
				continue
			}
			if w.exempted(pt.T) {
				continue
			}
			over = append(over, fmt.Sprintf("%d in flight at %ds (cap %d)", pt.InFlightMax, pt.T, c))
		}
		if len(over) > 0 {
			bad("promise 3: key of %s above --cap outside the exempt windows: %s", o.Name, firstFew(over))
		}
	}
	v = append(v, checkLiveness(w, ledger)...)
	return v
}

// capBound returns the cap of the key of the org named org in the real
// second [t, t+1) since the simulator started. The cap of a key is the
// smallest --cap of the live processes (docs/design.md §13;
// docs/shared-budget.md): with one --cap for all it is that. With
// different ones, a process's --cap holds the key down from when it surely
// reached Redis (its first request billed in the pass, by which it had
// renewed) and the others' requests admitted under a larger cap have
// ended, to when the pass handed the key's lane back to Redis (its events
// say when: a finished process does so before it exits, and the others may
// take their larger cap from then) or, without that record, the end of its
// pass, except while it may be missing from Redis (stopped or cut off past
// its lease, or Redis restarted empty); outside every such span the cap
// is the largest asked for. A pass run on the start fallback's local share
// adds that share.
func (w *world) capBound(ledger []sim.LedgerEntry, byHash map[sim.BodyHash]item) func(org string, t int64) int {
	base := w.liveCap(ledger, byHash)
	extra := w.fallbackShares()
	return func(org string, t int64) int { return base(org, t) + extra(t) }
}

// fallbackShares returns, per real second, what the key may carry above its
// cap by the documented exceptions other than requests in flight when a
// process was cut off (those are exempt windows): the local shares of the passes
// that started while their process could not reach Redis, with
// --shared-fallback local: such a pass runs on a conservative local share,
// a quarter of the start limit (docs/shared-budget.md; at least one request),
// not counted in Redis, until it joins. It cannot know what the others
// hold, so the key may carry that share above its cap meanwhile.
func (w *world) fallbackShares() func(t int64) int {
	type span struct {
		from, to time.Duration
		share    int
	}
	var spans []span
	w.mu.Lock()
	for _, p := range w.procs {
		if !w.sc.Fallback {
			break
		}
		startLimit := max(1, w.capOf(p.i)/4)
		share := max(1, startLimit/4)
		for _, ps := range p.passes {
			if ps.noRedis {
				continue
			}
			// A pass that says it fell back (its Redis was cut off before it
			// first reached it, which on a loaded machine can be well after
			// the pass started: seed 373, a partition 0.5 s after the start)
			// runs on the share from its start until it joins after the
			// first outage it overlaps.
			fellBack := strings.Contains(ps.out, "running on a local share") ||
				eventBetween(ps.runDir, w.start.Add(ps.from), w.start.Add(ps.to), "running on a conservative local share")
			for _, a := range w.away {
				if a.proc >= 0 && a.proc != p.i {
					continue
				}
				switch {
				case ps.from >= a.from && ps.from < a.to:
					spans = append(spans, span{ps.from, a.to, share})
				case fellBack && a.from > ps.from && a.from < ps.to:
					spans = append(spans, span{ps.from, a.to, share})
				}
			}
		}
	}
	w.mu.Unlock()
	return func(t int64) int {
		from, to := time.Duration(t)*time.Second, time.Duration(t+1)*time.Second
		n := 0
		for _, s := range spans {
			if s.from < to && s.to > from {
				n += s.share
			}
		}
		return n
	}
}

// liveCap returns, per org and real second, the smallest --cap of the
// processes live and on Redis then (see capBound).
func (w *world) liveCap(ledger []sim.LedgerEntry, byHash map[sim.BodyHash]item) func(org string, t int64) int {
	if w.sc.CapStep == 0 {
		return func(string, int64) int { return w.sc.Cap }
	}
	largest := 0
	for _, p := range w.procs {
		largest = max(largest, w.capOf(p.i))
	}
	// The first sync billing of each process after each start of a pass.
	type span struct {
		proc     int
		from, to time.Duration
		// back is when the pass handed each org's lane back to Redis.
		back map[string]time.Duration
	}
	var spans []span
	for _, p := range w.procs {
		for _, ps := range p.passes {
			first := time.Duration(-1)
			for _, e := range ledger {
				if e.ServiceTier == "batch" || byHash[e.BodySHA256].proc != p.i {
					continue
				}
				at := time.Duration(e.APISeconds / w.sc.Speed * float64(time.Second))
				if at >= ps.from && at <= ps.to && (first < 0 || at < first) {
					first = at
				}
			}
			if first >= 0 {
				back := map[string]time.Duration{}
				for org, at := range handedBack(ps.runDir, w.start.Add(ps.from), w.start.Add(ps.to)) {
					// The run names the simulator's OpenAI org gpt_a
					// "openai-gpt_a" (from OPENAI_API_KEY_GPT_A).
					back[strings.TrimPrefix(org, "openai-")] = at.Sub(w.start)
				}
				spans = append(spans, span{p.i, first + time.Second + w.latencyReal(), ps.to, back})
			}
		}
	}
	return func(org string, t int64) int {
		from, to := time.Duration(t)*time.Second, time.Duration(t+1)*time.Second
		c := largest
		for _, s := range spans {
			end := s.to
			if at, ok := s.back[org]; ok {
				end = min(end, at)
			}
			if s.from > from || end < to {
				continue
			}
			w.mu.Lock()
			away := false
			for _, a := range w.away {
				if (a.proc < 0 || a.proc == s.proc) && a.from < to && a.to > from {
					away = true
				}
			}
			w.mu.Unlock()
			if !away {
				c = min(c, w.capOf(s.proc))
			}
		}
		return c
	}
}

// exempted reports whether the real second t (since the simulator's start)
// touches an exempt window.
func (w *world) exempted(t int64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	from, to := float64(t), float64(t+1)
	for _, x := range w.windows {
		if x.from.Seconds() < to && x.to.Seconds() > from {
			return true
		}
	}
	return false
}

// runDirs are the run directories of p's passes, each once.
func runDirs(p *proc) []string {
	var out []string
	seen := map[string]bool{}
	for _, ps := range p.passes {
		if !seen[ps.runDir] {
			seen[ps.runDir] = true
			out = append(out, ps.runDir)
		}
	}
	return out
}

// readResults counts the result lines of each custom_id in path.
func readResults(path string) (map[string]int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	lines := map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	for sc.Scan() {
		var r struct {
			CustomID string `json:"custom_id"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return lines, fmt.Errorf("results line %d: %v", len(lines)+1, err)
		}
		lines[r.CustomID]++
	}
	return lines, sc.Err()
}

// succeededIDs are the custom_ids with a succeeded result in path, each
// with the id of the message it holds: a Message Batches line's succeeded
// result, or an OpenAI output line's response of status 200 (its body a
// chat completion, whose id the ledger names).
func succeededIDs(path string) map[string]string {
	out := map[string]string{}
	f, err := os.Open(path)
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	for sc.Scan() {
		var r struct {
			CustomID string `json:"custom_id"`
			Result   struct {
				Type    string `json:"type"`
				Message struct {
					ID string `json:"id"`
				} `json:"message"`
			} `json:"result"`
			Response *struct {
				StatusCode int `json:"status_code"`
				Body       struct {
					ID string `json:"id"`
				} `json:"body"`
			} `json:"response"`
		}
		if json.Unmarshal(sc.Bytes(), &r) != nil {
			continue
		}
		if r.Result.Type == "succeeded" {
			out[r.CustomID] = r.Result.Message.ID
		}
		if r.Response != nil && r.Response.StatusCode == 200 {
			out[r.CustomID] = r.Response.Body.ID
		}
	}
	return out
}

func firstFew(s []string) string {
	if len(s) > 6 {
		return strings.Join(s[:6], ", ") + fmt.Sprintf(" … (%d in all)", len(s))
	}
	return strings.Join(s, ", ")
}

// tail is the end of a pass's output: its last 12 lines, or from a
// panic's message on (a panic's stack would push its cause out of them).
func tail(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "panic: ") {
			lines = lines[i:min(len(lines), i+12)]
			break
		}
	}
	if len(lines) > 12 {
		lines = lines[len(lines)-12:]
	}
	return "    | " + strings.Join(lines, "\n    | ")
}

// eventBetween reports whether the events file of runDir holds an event
// whose note contains text, stamped between from and to (a second's slack
// either side).
func eventBetween(runDir string, from, to time.Time, text string) bool {
	b, err := os.ReadFile(filepath.Join(runDir, rundir.EventsFile))
	if err != nil {
		return false
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		var e rundir.Event
		if json.Unmarshal([]byte(line), &e) != nil || !strings.Contains(e.Note, text) {
			continue
		}
		if e.TS.After(from.Add(-time.Second)) && e.TS.Before(to.Add(time.Second)) {
			return true
		}
	}
	return false
}

// handedBack returns, per org, when the events file of runDir says the
// pass that ran from from to to handed the org's lane back to Redis at its
// end (shared.Budget.Close): from then on its --cap no longer bounds the
// key. A lane that still had requests out is not handed back and has no
// such event; of several lanes of one org the last one counts.
func handedBack(runDir string, from, to time.Time) map[string]time.Time {
	out := map[string]time.Time{}
	b, err := os.ReadFile(filepath.Join(runDir, rundir.EventsFile))
	if err != nil {
		return out
	}
	for line := range strings.Lines(string(b)) {
		var e struct {
			TS   time.Time `json:"ts"`
			Kind string    `json:"kind"`
			Data struct {
				Org        string `json:"org"`
				HandedBack bool   `json:"handed_back"`
			} `json:"data"`
		}
		if json.Unmarshal([]byte(line), &e) != nil || e.Kind != rundir.EventLane || !e.Data.HandedBack || e.Data.Org == "" {
			continue
		}
		if e.TS.Before(from) || e.TS.After(to) {
			continue
		}
		if at, ok := out[e.Data.Org]; !ok || e.TS.After(at) {
			out[e.Data.Org] = e.TS
		}
	}
	return out
}

// billedInDiskFullPass reports whether every billing of it before the
// cache pass (ledger sequence up to cachePassFrom) fell in a pass of its
// process whose disk the scenario filled.
func (w *world) billedInDiskFullPass(ledger []sim.LedgerEntry, byHash map[sim.BodyHash]item, it item, cachePassFrom int64) bool {
	passes := w.procs[it.proc].passes
	found := false
	for _, e := range ledger {
		if e.Seq > cachePassFrom || byHash[e.BodySHA256] != it {
			continue
		}
		found = true
		full := false
		for i, ps := range passes {
			end := int64(math.MaxInt64)
			if i+1 < len(passes) {
				end = passes[i+1].ledgerFrom
			}
			if e.Seq > ps.ledgerFrom && e.Seq <= end {
				full = ps.diskFull
				break
			}
		}
		if !full {
			return false
		}
	}
	return found
}

// cacheWriteFailed is the cache.write_failed of runDir's summary: its
// successes whose cache entry could not be written.
func cacheWriteFailed(runDir string) int64 {
	b, err := os.ReadFile(filepath.Join(runDir, rundir.SummaryFile))
	if err != nil {
		return 0
	}
	var s rundir.Summary
	if json.Unmarshal(b, &s) != nil || s.Cache == nil {
		return 0
	}
	return s.Cache.WriteFailed
}
