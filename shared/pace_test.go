package shared

import (
	"context"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/internal/testredis"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/ratelimit"
)

// Issue 22, three processes on one key: each mirrors its share of the
// org's buckets (1/n of them for n processes with work). A process that
// learnt the headers while it was alone mirrors the whole bucket; when two
// more join, its mirror must shrink to a third, or the three together
// believe the bucket holds two thirds more than it does and drain it (the
// start of a three-process run, in which every org saw 429s in the first
// API second).
func TestSharedMirrorsFollowTheShareOfTheBuckets(t *testing.T) {
	url := testredis.URL(t)
	o := freshOrg("a")
	// 60 requests per API minute at K=20: the headers say 1,200 and the
	// bucket holds 60.
	lc := gate.LaneConfig{Org: "a", Pool: anthropic.PoolSonnet4, Cap: 100, StartFraction: 1, Speed: 20}
	const bucket = 60
	hdr := anthropic.RateLimits{
		Requests: anthropic.Limit{Present: true, Limit: 1200, Remaining: bucket - 1},
		Input:    anthropic.Limit{Present: true, Limit: 100_000_000, Remaining: 100_000_000},
		Output:   anthropic.Limit{Present: true, Limit: 100_000_000, Remaining: 100_000_000},
	}
	ctx := context.Background()
	a := openIdle(t, url, []org.Org{o})
	ga := a.NewGate(lc)
	a.renewAll(ctx)
	// Alone, A sends one request and learns the buckets from its answer.
	p, _, ok := ga.TryAdmit(time.Now(), one)
	if !ok {
		t.Fatal("A alone admitted nothing")
	}
	fb := ok200
	fb.Limits, fb.Billed, fb.Actual = hdr, true, ratelimit.Need{Requests: 1, Input: 100, Output: 50}
	ga.Done(time.Now(), p, fb)
	a.renewAll(ctx)
	// B and C join; every process renews until the slots are split evenly.
	b := openIdle(t, url, []org.Org{o})
	c := openIdle(t, url, []org.Org{o})
	gb, gc := b.NewGate(lc), c.NewGate(lc)
	gates := []gate.Gate{ga, gb, gc}
	for range 3 {
		for _, x := range []*Budget{a, b, c} {
			x.renewAll(ctx)
		}
	}
	// B and C joined A, which drew on the key: past their first renewal
	// period (when A has learnt of them) they send more than a probe.
	time.Sleep(2 * b.every)
	for _, x := range []*Budget{a, b, c} {
		x.renewAll(ctx)
	}
	// Together they admit what the bucket holds, not more.
	total := 0
	for i, g := range gates {
		n := len(fill(g))
		t.Logf("process %c admitted %d", 'A'+i, n)
		total += n
	}
	if total > bucket {
		t.Errorf("the three processes admitted %d at once; the bucket holds %d", total, bucket)
	}
	if total < bucket/2 {
		t.Errorf("the three processes admitted %d at once; the bucket holds %d", total, bucket)
	}
}
