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

// sixty is the headers of an answer from a key of 60 requests per API
// minute at K=20 (the headers say 1,200; the bucket holds 60) with
// remaining requests left.
func sixty(remaining int64) gate.Feedback {
	fb := ok200
	fb.Billed, fb.Actual = true, ratelimit.Need{Requests: 1, Input: 100, Output: 50}
	fb.Limits = anthropic.RateLimits{
		Requests: anthropic.Limit{Present: true, Limit: 1200, Remaining: remaining},
		Input:    anthropic.Limit{Present: true, Limit: 100_000_000, Remaining: 100_000_000},
		Output:   anthropic.Limit{Present: true, Limit: 100_000_000, Remaining: 100_000_000},
	}
	return fb
}

// Three --shared processes started together (the engine's and the
// gateway's lanes probe first): a process that joins others on a key took
// the buckets' level from the headers another process had left in Redis,
// however much that one had drawn since, and sent its share of a bucket
// already drained; and a process whose first answer came back before it
// had renewed since others joined mirrored the whole bucket and sent it.
// Together they sent more than the bucket held before their mirrors
// agreed (the polite test's 429s, all in the first API second). Each
// process sends its probe alone until its own answer has shown it the
// buckets and a renewal since has told it its share.
func TestSharedNewcomersProbeBeforeTheirShare(t *testing.T) {
	url := testredis.URL(t)
	o := freshOrg("a")
	lc := gate.LaneConfig{Org: "a", Pool: anthropic.PoolSonnet4, Cap: 100, StartFraction: 1, Speed: 20, ProbeFirst: true}
	ctx := context.Background()

	// A alone learns the bucket from its probe and draws it all.
	a := openIdle(t, url, []org.Org{o})
	ga := a.NewGate(lc)
	a.renewAll(ctx)
	p, _, ok := ga.TryAdmit(time.Now(), one)
	if !ok {
		t.Fatal("A alone admitted nothing")
	}
	ga.Done(time.Now(), p, sixty(59))
	a.renewAll(ctx)
	b := openIdle(t, url, []org.Org{o})
	gb := b.NewGate(lc)
	ps := fill(ga)
	if len(ps) < 40 {
		t.Fatalf("A alone admitted %d of a bucket of 60", len(ps))
	}
	// The first of them is answered before the server has seen the
	// others, and A leaves its headers in Redis; then B joins: those
	// headers (58 left) no longer say what the bucket holds. Past its
	// join period B still sends only its probe until its own answer.
	ga.Done(time.Now(), ps[0], sixty(58))
	a.renewAll(ctx)
	b.renewAll(ctx)
	time.Sleep(2 * b.every)
	a.renewAll(ctx)
	b.renewAll(ctx)
	if gb.(*Gate).buckets.Mirror().Synced() {
		t.Errorf("B took the buckets from headers A left in Redis (a level of %.1f of its share) before its own answer",
			gb.(*Gate).buckets.Mirror().Requests.Level(time.Now()))
	}
	if n := len(fill(gb)); n > 1 {
		t.Errorf("B, joining A who drained the bucket, admitted %d before its own answer, want its probe alone", n)
	}

	// C and D start together on a fresh key: D renews after C, so C
	// learns of D only at its next renewal. C's first answer must not be
	// read as the whole bucket's being C's.
	o2 := freshOrg("b")
	lc.Org = "b"
	c, d := openIdle(t, url, []org.Org{o2}), openIdle(t, url, []org.Org{o2})
	gc := c.NewGate(lc)
	d.NewGate(lc)
	c.renewAll(ctx)
	d.renewAll(ctx)
	p, _, ok = gc.TryAdmit(time.Now(), one)
	if !ok {
		t.Fatal("C admitted nothing")
	}
	gc.Done(time.Now(), p, sixty(59))
	if n := len(fill(gc)); n > 1 {
		t.Errorf("C admitted %d on its first answer before renewing, want one request (it does not know D shares the key yet)", n)
	}
	time.Sleep(2 * d.every)
	c.renewAll(ctx)
	d.renewAll(ctx)
	if n := len(fill(gc)); n > 31 {
		t.Errorf("C admitted %d once it knew D shares the key, want at most half the bucket", n)
	}
}
