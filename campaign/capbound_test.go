package campaign

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/sim"
)

// A process's --cap bounds a key until the process hands the key's lane
// back to Redis, which a finished process does before it exits, not until
// it is seen to exit. Seed 4 under load (three processes, caps 4, 6 and
// 4, all three finishing within 2 s): the cap-4 processes handed their
// lanes back at 41.52 and 42.03 s and were seen to exit at 42.58 and
// 43.10 s; the cap-6 process, alone in Redis from 42.03 s and told a cap
// of 6 at 42.26 s, had 5 requests in flight on the batch key at 42.52 s,
// every one its own. The checker held second 42 to a cap of 4 (the second
// pass's span ran to its exit) and reported promise 3 broken. A lane
// without a record of its hand-back (a request still out at the end)
// keeps the span to the end of the pass.
func TestCapSpanEndsWhenTheLaneIsHandedBack(t *testing.T) {
	start := time.Now().Add(-time.Minute)
	sc := Scenario{Seed: 4, Speed: 10, Procs: 3, Cap: 4, CapStep: 2}
	w := &world{t: t, sc: sc, start: start}
	var ledger []sim.LedgerEntry
	byHash := map[sim.BodyHash]item{}
	// pass: process i, seen to exit at exit s, its first request billed
	// at 1 s, and the orgs whose lanes it handed back at back s.
	pass := func(i int, exit float64, back float64, orgs ...string) {
		dir := t.TempDir()
		var lines []byte
		for _, o := range orgs {
			b, err := json.Marshal(rundir.Event{TS: start.Add(seconds(back)).UTC(), Kind: rundir.EventLane,
				Note: "shared budget: " + o + "/sonnet-4 handed its slots and its cap back (the run is over)",
				Data: map[string]any{"org": o, "pool": "sonnet-4", "handed_back": true}})
			if err != nil {
				t.Fatal(err)
			}
			lines = append(append(lines, b...), '\n')
		}
		if err := os.WriteFile(filepath.Join(dir, rundir.EventsFile), lines, 0o644); err != nil {
			t.Fatal(err)
		}
		h := sim.BodyHash{byte(i + 1)}
		byHash[h] = item{proc: i, id: "first"}
		ledger = append(ledger, sim.LedgerEntry{BodySHA256: h, APISeconds: 1 * sc.Speed})
		w.procs = append(w.procs, &proc{i: i, runDir: dir, passes: []*pass{{runDir: dir, from: 0, to: seconds(exit)}}})
	}
	pass(0, 42.58, 41.52, "high_prio", "batch", "low_prio")
	pass(1, 44.58, 43.38, "high_prio", "batch", "low_prio")
	pass(2, 43.10, 42.03, "batch", "low_prio") // high_prio: a request still out
	capAt := w.liveCap(ledger, byHash)
	for _, c := range []struct {
		org  string
		t    int64
		want int
	}{
		{"batch", 41, 4},     // process 2 still in Redis
		{"batch", 42, 6},     // both cap-4 lanes handed back by 42.03 s
		{"low_prio", 42, 6},  // the same
		{"high_prio", 42, 4}, // process 2 kept its lane to its exit at 43.10 s
		{"high_prio", 43, 6}, // process 2 has exited
		{"batch", 2, 6},      // before any process surely reached Redis
		{"batch", 3, 4},
	} {
		if got := capAt(c.org, c.t); got != c.want {
			t.Errorf("cap of %s at %d s: %d, want %d", c.org, c.t, got, c.want)
		}
	}
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
