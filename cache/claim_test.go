package cache

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func openT(t *testing.T, path string) *Cache {
	t.Helper()
	c, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func claimer(t *testing.T, c *Cache, lease time.Duration) *Claimer {
	t.Helper()
	cl := c.NewClaimer(lease)
	t.Cleanup(func() { cl.Close() })
	return cl
}

func mustClaim(t *testing.T, cl *Claimer, now time.Time, keys []Key, origin string) Claims {
	t.Helper()
	got, err := cl.Claim(context.Background(), now, keys, origin)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// Two owners on one file (two connections, as two processes): the first
// to miss a key holds it; the second is told when the claim ends and
// claims nothing; the first's Put ends the claim and is the second's hit.
// Claims are per origin.
func TestClaimOneOwnerAtATimeUntilPut(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "c.db")
	a := claimer(t, openT(t, path), time.Minute)
	bc := openT(t, path)
	b := claimer(t, bc, time.Minute)
	now := time.Now()
	e1, e2 := entry(t, 1), entry(t, 2)
	keys := []Key{e1.Key, e2.Key}
	if got := mustClaim(t, a, now, keys, "o"); len(got.Claimed) != 2 || len(got.Held) != 0 || len(got.Hits) != 0 {
		t.Fatalf("first owner: %+v", got)
	}
	// Its own claim again: still its own.
	if got := mustClaim(t, a, now, keys[:1], "o"); len(got.Claimed) != 1 {
		t.Fatalf("first owner again: %+v", got)
	}
	got := mustClaim(t, b, now, keys, "o")
	if len(got.Claimed) != 0 || len(got.Held) != 2 || !got.Held[e1.Key].Equal(time.UnixMilli(now.Add(time.Minute).UnixMilli())) {
		t.Fatalf("second owner: %+v", got)
	}
	if got := mustClaim(t, b, now, keys, "other"); len(got.Claimed) != 2 {
		t.Fatalf("second owner, another origin: %+v", got)
	}
	e1.Origin = "o"
	if _, err := a.c.Put(context.Background(), []Entry{e1}); err != nil {
		t.Fatal(err)
	}
	got = mustClaim(t, b, now, keys, "o")
	if _, hit := got.Hits[e1.Key]; !hit || len(got.Held) != 1 || len(got.Claimed) != 0 {
		t.Fatalf("second owner after the first's Put: %+v", got)
	}
}

// A released claim is free at once; a claim whose lease ended (its owner
// died: nothing renewed it) is taken over; Close releases every claim.
func TestClaimReleasedExpiredClosed(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "c.db")
	a := claimer(t, openT(t, path), time.Minute)
	b := claimer(t, openT(t, path), time.Minute)
	now := time.Now()
	k1, k2, k3 := entry(t, 1).Key, entry(t, 2).Key, entry(t, 3).Key
	mustClaim(t, a, now, []Key{k1, k2, k3}, "o")
	if err := a.Release(context.Background(), []Key{k1}, "o"); err != nil {
		t.Fatal(err)
	}
	// b does not release a's claim.
	if err := b.Release(context.Background(), []Key{k2}, "o"); err != nil {
		t.Fatal(err)
	}
	if got := mustClaim(t, b, now, []Key{k1, k2}, "o"); !slices.Equal(got.Claimed, []Key{k1}) || len(got.Held) != 1 {
		t.Fatalf("after a released k1: %+v", got)
	}
	later := now.Add(time.Minute + time.Millisecond)
	if got := mustClaim(t, b, later, []Key{k2}, "o"); !slices.Equal(got.Claimed, []Key{k2}) {
		t.Fatalf("after a's lease ended: %+v", got)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if got := mustClaim(t, b, now, []Key{k3}, "o"); !slices.Equal(got.Claimed, []Key{k3}) {
		t.Fatalf("after a closed: %+v", got)
	}
}

// An owner that lives renews its claims: past its first lease another
// still finds the key held, with a later end.
func TestClaimRenewedWhileOwnerLives(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "c.db")
	const lease = 2 * time.Second
	a := claimer(t, openT(t, path), lease)
	b := claimer(t, openT(t, path), time.Minute)
	k := entry(t, 1).Key
	start := time.Now()
	mustClaim(t, a, start, []Key{k}, "o")
	time.Sleep(lease + lease/2)
	got := mustClaim(t, b, time.Now(), []Key{k}, "o")
	if len(got.Claimed) != 0 || !got.Held[k].After(start.Add(lease)) {
		t.Fatalf("a living owner's claim past its first lease: %+v", got)
	}
}
