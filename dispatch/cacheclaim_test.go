package dispatch_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/cache"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/workload"
)

// keysOf is the cache key of each request line's params.
func keysOf(t *testing.T, lines []string) []cache.Key {
	t.Helper()
	keys := make([]cache.Key, len(lines))
	for i, l := range lines {
		var it struct {
			Params json.RawMessage `json:"params"`
		}
		if err := json.Unmarshal([]byte(l), &it); err != nil {
			t.Fatal(err)
		}
		k, err := cache.KeyOf(it.Params)
		if err != nil {
			t.Fatal(err)
		}
		keys[i] = k
	}
	return keys
}

// Another process holds the keys of some of a run's items: the run waits
// for their answers, out of its queues, and answers them from the cache
// when that process stores them (sending none of them); the keys of a
// process that died (its claims left, never renewed) are taken over once
// their lease ends and sent once.
func TestCacheRunWaitsForAnotherProcessesKeys(t *testing.T) {
	t.Parallel()
	const n, held, dead = 40, 10, 5
	h := newHarness(t, sim.PresetOrigin3Org, 50, 1, nil)
	path := filepath.Join(t.TempDir(), "cache.db")
	c := openCache(t, path)
	lines := judgeLines(t, n, workload.GenOptions{})
	keys := keysOf(t, lines)
	in := filepath.Join(filepath.Dir(h.dir), "claimed.jsonl")
	writeLines(t, in, lines)
	origin := mustOrigin(t, h.sim.URL)

	other := openCache(t, path).NewClaimer(time.Minute)
	defer other.Close()
	if got, err := other.Claim(context.Background(), time.Now(), keys[:held], origin); err != nil || len(got.Claimed) != held {
		t.Fatalf("the other process's claims: %+v, %v", got, err)
	}
	gone, err := cache.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	const lease = 1500 * time.Millisecond
	deadOwner := gone.NewClaimer(lease)
	defer deadOwner.Close()
	claimedAt := time.Now()
	if got, err := deadOwner.Claim(context.Background(), claimedAt, keys[held:held+dead], origin); err != nil || len(got.Claimed) != dead {
		t.Fatalf("the dead process's claims: %+v, %v", got, err)
	}
	gone.Close() // dies: nothing renews or releases its claims

	// The other process answers its keys a moment after the run starts.
	answered := make(chan error, 1)
	go func() {
		time.Sleep(500 * time.Millisecond)
		var es []cache.Entry
		for i, k := range keys[:held] {
			es = append(es, cache.Entry{Key: k, Origin: origin, Simulated: true, Model: "claude-sonnet-4-5",
				Body:      fmt.Appendf(nil, `{"id":"msg_other_%d","type":"message","role":"assistant","content":[{"type":"text","text":"{}"}],"usage":{"input_tokens":1,"output_tokens":1}}`, i),
				CostNanos: 1000, RequestID: fmt.Sprintf("req_other_%d", i)})
		}
		_, err := other.Cache().Put(context.Background(), es)
		answered <- err
	}()
	s := h.runInto(in, "claimed", c, nil)
	took := time.Since(claimedAt)
	if err := <-answered; err != nil {
		t.Fatal(err)
	}
	if got := h.sim.Server.LedgerTotals().Requests; got != n-held {
		t.Errorf("billed %d, want %d (the other process answered %d)", got, n-held, held)
	}
	if s.Succeeded != n || s.Cache == nil || s.Cache.Hits != held {
		t.Errorf("%d succeeded, cache %+v; want %d, %d hits", s.Succeeded, s.Cache, n, held)
	}
	if took < lease-50*time.Millisecond {
		t.Errorf("the run ended %v after the dead process's claims; it must wait out their lease of %v", took, lease)
	}
	rs := readResults(t, h.dir)
	for i := range held {
		var it struct {
			CustomID string `json:"custom_id"`
		}
		json.Unmarshal([]byte(lines[i]), &it)
		if r := rs[it.CustomID]; !r.Dispatch.Cached || r.Dispatch.RequestID != fmt.Sprintf("req_other_%d", i) {
			t.Errorf("item %s: %+v; want the other process's answer", it.CustomID, r.Dispatch)
		}
	}
}

// Campaign seed 173: a run killed -9 leaves its claims in the cache for
// their lease (15 s); its resume in the same run directory, a new process,
// found its own items held by "another owner" and sent almost nothing until
// the lease ended (0.77 of the orgs' limits over the run). The claims of a
// run directory are now its own, whichever process made them: the resume
// takes them over at once and sends each item once.
func TestCacheResumeTakesOverItsKilledPassesClaims(t *testing.T) {
	t.Parallel()
	const n = 40
	h := newHarness(t, sim.PresetOrigin3Org, 50, 1, nil)
	path := filepath.Join(t.TempDir(), "cache.db")
	c := openCache(t, path)
	lines := judgeLines(t, n, workload.GenOptions{})
	keys := keysOf(t, lines)
	in := filepath.Join(filepath.Dir(h.dir), "resumed.jsonl")
	writeLines(t, in, lines)
	runDir := filepath.Join(filepath.Dir(h.dir), "resumed")

	// The killed pass: its claims on every key, with a lease far longer
	// than the run takes, never renewed nor released.
	gone, err := cache.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	const lease = 2 * time.Minute
	killed := gone.NewClaimerAs(cache.RunOwner(runDir), lease)
	if got, err := killed.Claim(context.Background(), time.Now(), keys, mustOrigin(t, h.sim.URL)); err != nil || len(got.Claimed) != n {
		t.Fatalf("the killed pass's claims: %+v, %v", got, err)
	}
	gone.Close() // dies: nothing renews or releases its claims
	if killed.Close() == nil {
		t.Fatal("the killed pass released its claims on a closed file")
	}

	start := time.Now()
	s := h.runInto(in, "resumed", c, nil)
	if took := time.Since(start); took > lease/4 {
		t.Errorf("the resume took %v: it waited for its own killed pass's claims (lease %v)", took, lease)
	}
	if got := h.sim.Server.LedgerTotals().Requests; got != n || s.Succeeded != n {
		t.Errorf("billed %d, %d succeeded; want %d each", got, s.Succeeded, n)
	}
}
