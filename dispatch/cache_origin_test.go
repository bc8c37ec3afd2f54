package dispatch_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apidispatch/apidispatch/cache"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/sim"
)

// warnings are the warning notes of a run directory's events.
func warnings(t *testing.T, dir string) []string {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, rundir.EventsFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var ev rundir.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Kind == rundir.EventWarning {
			out = append(out, ev.Note)
		}
	}
	return out
}

// TestCacheHitFromAnotherOriginIsAMiss pins issue #19 case 7: the cache
// keyed answers by the request alone, so a cache filled from the simulator
// answered a run against another API with simulated text marked cached.
// Now an entry records its origin and whether the simulator answered; a
// run against another origin sends those items, says so once with the
// count, and each origin keeps its own answer.
func TestCacheHitFromAnotherOriginIsAMiss(t *testing.T) {
	t.Parallel()
	const n = 120
	h := newHarness(t, sim.PresetOrigin3Org, 50, n, nil)
	other, _ := simtest.Start(t, sim.PresetOrigin3Org, 50, nil)
	c := openCache(t, filepath.Join(t.TempDir(), "cache.db"))
	h.runInto(h.input, "sim", c, nil)

	// The other API: another host, and not marked as the simulator (as
	// the real API's answers are not).
	real := func(cfg *dispatch.Config) {
		cfg.BaseURL, cfg.Orgs = other.URL, other.Server.Orgs()
		cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return unmarked{rt} }
	}
	s := h.runInto(h.input, "real", c, real)
	if got := other.Server.LedgerTotals().Requests; got != n {
		t.Fatalf("the run against another origin sent %d requests, want %d (a simulated answer served as a hit?)", got, n)
	}
	if s.Cache.Hits != 0 || s.Cache.Misses != n || s.Cache.OtherOrigin != n || s.Cache.Origin != mustOrigin(t, other.URL) {
		t.Fatalf("cache summary of the run against another origin: %+v", s.Cache)
	}
	for id, r := range readResults(t, h.dir) {
		if r.Dispatch.Cached {
			t.Fatalf("%s: answered from the cache in a run against another origin", id)
		}
	}
	ws := warnings(t, h.dir)
	var about []string
	for _, w := range ws {
		if strings.Contains(w, "another API") {
			about = append(about, w)
		}
	}
	simAt := "the simulator at " + mustOrigin(t, h.sim.URL)
	if len(about) != 1 || !strings.Contains(about[0], "120 items") || !strings.Contains(about[0], simAt) {
		t.Fatalf("want one warning with the count and %q; warnings: %q", simAt, ws)
	}

	// Each origin keeps its answer: both now answer their own runs.
	st, err := c.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Entries != 2*n || st.ByOrigin["sim:"+mustOrigin(t, h.sim.URL)] != n || st.ByOrigin[mustOrigin(t, other.URL)] != n {
		t.Fatalf("cache stats: %+v", st)
	}
	if s := h.runInto(h.input, "real-again", c, real); s.Cache.Hits != n || s.Cache.OtherOrigin != 0 || other.Server.LedgerTotals().Requests != n {
		t.Fatalf("second run against the other origin: %+v, %d sent there", s.Cache, other.Server.LedgerTotals().Requests)
	}
	if s := h.runInto(h.input, "sim-again", c, nil); s.Cache.Hits != n || h.sim.Server.LedgerTotals().Requests != n {
		t.Fatalf("second run against the simulator: %+v, %d sent there", s.Cache, h.sim.Server.LedgerTotals().Requests)
	}
}

// unmarked drops the simulator's mark from responses: an API that is not
// apidispatch's simulator.
type unmarked struct{ rt http.RoundTripper }

func (u unmarked) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := u.rt.RoundTrip(r)
	if resp != nil {
		resp.Header.Del(cache.SimulatorHeader)
	}
	return resp, err
}

// A hit served on the sync route says so: route sync, cached true
// (docs/design.md §12).
func TestCacheHitCarriesItsRoute(t *testing.T) {
	t.Parallel()
	const n = 20
	h := newHarness(t, sim.PresetOrigin3Org, 50, n, nil)
	c := openCache(t, filepath.Join(t.TempDir(), "cache.db"))
	h.runInto(h.input, "one", c, nil)
	h.runInto(h.input, "two", c, nil)
	b, err := os.ReadFile(filepath.Join(h.dir, rundir.ResultsFile))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	for _, l := range lines {
		var r struct {
			Dispatch struct {
				Route  string `json:"route"`
				Cached bool   `json:"cached"`
			} `json:"dispatch"`
		}
		if err := json.Unmarshal([]byte(l), &r); err != nil || r.Dispatch.Route != "sync" || !r.Dispatch.Cached {
			t.Fatalf("hit's line: %v\n%s", err, l)
		}
	}
	if len(lines) != n {
		t.Fatalf("%d lines, want %d", len(lines), n)
	}
}
