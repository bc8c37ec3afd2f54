package cache

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Claims make the cache's first-writer-wins rule hold before the request
// is sent, across processes: the first process (a gateway, a run) that
// misses a key claims it in the file, in the same write transaction as
// the look-up, and sends it; another that misses the same key while the
// claim lives sends nothing and waits for the entry. A claim has an owner
// and a lease: its owner renews every claim it holds while they live, a
// stored entry ends every claim on its key (Put, in the same
// transaction), a failure releases it (Release), and a claim whose owner
// stopped renewing (it died) is taken over once its lease ends.
//
// The claims table is not part of the file's format: an apidispatch that
// does not know it leaves it alone, and Open creates it when it is not
// there.
const claimsSchema = `
CREATE TABLE IF NOT EXISTS claims (
	key        BLOB NOT NULL,
	origin     TEXT NOT NULL,
	owner      TEXT NOT NULL,    -- the Claimer holding it (random per process use)
	expires_ms INTEGER NOT NULL, -- unix milliseconds: taken over after it
	PRIMARY KEY (key, origin)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS claims_owner ON claims(owner);
`

// DefaultLease is the lease of a claim when NewClaimer is given none: how
// long the requests waiting for a key wait past the last renewal of a
// claim whose owner died.
const DefaultLease = 15 * time.Second

// Claimer claims keys of one cache file for one owner and renews its
// claims while it is open. It is safe for concurrent use. The zero value
// is not usable: call NewClaimer, and Close it.
type Claimer struct {
	c     *Cache
	owner string
	lease time.Duration

	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// NewClaimer starts an owner of claims on c with the given lease (0:
// DefaultLease). Its claims are renewed every third of the lease until
// Close.
func (c *Cache) NewClaimer(lease time.Duration) *Claimer {
	var id [12]byte
	rand.Read(id[:])
	return c.NewClaimerAs(hex.EncodeToString(id[:]), lease)
}

// NewClaimerAs is NewClaimer for a named owner: the claims it finds of
// that owner (left by an earlier process that died, or whose release
// failed) are its own, claimed again at once rather than after their
// lease. No two live Claimers may share an owner: each would send the
// keys the other holds. RunOwner names the owner of a run directory,
// which one process at a time holds (its lock).
func (c *Cache) NewClaimerAs(owner string, lease time.Duration) *Claimer {
	if lease <= 0 {
		lease = DefaultLease
	}
	cl := &Claimer{c: c, owner: owner, lease: lease, stop: make(chan struct{}), done: make(chan struct{})}
	go cl.renewing()
	return cl
}

// RunOwner is the claim owner of the run directory dir (its absolute
// path, hashed): a resumed run takes over at once the claims its killed
// predecessor left, instead of waiting out their lease with its items
// held (campaign seed 173: a resume after kill -9 sent little for the
// 15 s lease).
func RunOwner(dir string) string {
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	sum := sha256.Sum256([]byte(dir))
	return "run:" + hex.EncodeToString(sum[:12])
}

// Cache is the file the claims are in.
func (cl *Claimer) Cache() *Cache { return cl.c }

// Lease is how long a claim lives past its last renewal.
func (cl *Claimer) Lease() time.Duration { return cl.lease }

// renewing renews the owner's claims every third of the lease until Close.
func (cl *Claimer) renewing() {
	defer close(cl.done)
	tick := time.NewTicker(cl.lease / 3)
	defer tick.Stop()
	for {
		select {
		case <-cl.stop:
			return
		case now := <-tick.C:
			// A failed renewal is retried at the next tick; a claim that
			// lapses meanwhile lets one waiter send too, which the
			// first-writer-wins rule keeps to one entry.
			ctx, cancel := context.WithTimeout(context.Background(), cl.lease/3)
			cl.c.db.ExecContext(ctx, `UPDATE claims SET expires_ms = ? WHERE owner = ?`, now.Add(cl.lease).UnixMilli(), cl.owner)
			cancel()
		}
	}
}

// Close stops the renewals and releases every claim the owner holds.
func (cl *Claimer) Close() error {
	var err error
	cl.once.Do(func() {
		close(cl.stop)
		<-cl.done
		ctx, cancel := context.WithTimeout(context.Background(), busyTimeout)
		defer cancel()
		_, err = cl.c.db.ExecContext(ctx, `DELETE FROM claims WHERE owner = ?`, cl.owner)
		err = cl.c.errorf(err, "releasing claims")
	})
	return err
}

// Claims is what Claim found.
type Claims struct {
	// Hits are the keys stored with the origin's answer (as Get); Bad the
	// damaged entries among them (a miss each, claimed like one).
	Hits map[Key]Entry
	Bad  []Bad
	// Claimed are the missed keys this owner holds now, its own until a
	// Put stores them or Release lets them go.
	Claimed []Key
	// Held are the missed keys another owner holds, with when its claim
	// ends unless renewed: the caller waits for their entries, and claims
	// them again after that time.
	Held map[Key]time.Time
}

// Claim looks keys up for origin and claims the missed ones, in one write
// transaction: a key without a live claim of another owner (none, its own,
// or one whose lease ended at now) is claimed until now plus the lease. A
// damaged entry is a miss here and claimed (the owner's Put does not
// replace it: the first entry stays; its requests are sent each time, as
// without claims).
func (cl *Claimer) Claim(ctx context.Context, now time.Time, keys []Key, origin string) (Claims, error) {
	out := Claims{Hits: map[Key]Entry{}, Held: map[Key]time.Time{}}
	tx, err := cl.c.db.BeginTx(ctx, nil) // immediate: the write lock is taken here
	if err != nil {
		return out, cl.c.errorf(err, "claim")
	}
	defer tx.Rollback()
	hits, bad, err := getIn(ctx, tx, keys, origin)
	if err != nil {
		return out, cl.c.errorf(err, "claim")
	}
	out.Hits, out.Bad = hits, bad
	var missed []Key
	for _, k := range keys {
		if _, hit := hits[k]; !hit {
			missed = append(missed, k)
		}
	}
	held, err := claimsOf(ctx, tx, missed, origin, cl.owner, now)
	if err != nil {
		return out, cl.c.errorf(err, "claim")
	}
	st, err := tx.PrepareContext(ctx, `INSERT OR REPLACE INTO claims (key, origin, owner, expires_ms) VALUES (?, ?, ?, ?)`)
	if err != nil {
		return out, cl.c.errorf(err, "claim")
	}
	defer st.Close()
	exp := now.Add(cl.lease).UnixMilli()
	for _, k := range missed {
		if until, ok := held[k]; ok {
			out.Held[k] = until
			continue
		}
		if _, err := st.ExecContext(ctx, k[:], origin, cl.owner, exp); err != nil {
			return out, cl.c.errorf(err, "claim")
		}
		out.Claimed = append(out.Claimed, k)
	}
	if err := tx.Commit(); err != nil {
		return Claims{Hits: map[Key]Entry{}, Held: map[Key]time.Time{}}, cl.c.errorf(err, "claim")
	}
	return out, nil
}

// Release lets the owner's claims on keys go (for origin), so that a
// request waiting for one of them sends it. Keys it does not hold are left
// alone.
func (cl *Claimer) Release(ctx context.Context, keys []Key, origin string) error {
	for len(keys) > 0 {
		n := min(len(keys), lookupChunk)
		args := []any{origin, cl.owner}
		for i := range keys[:n] {
			args = append(args, keys[i][:])
		}
		keys = keys[n:]
		if _, err := cl.c.db.ExecContext(ctx, `DELETE FROM claims WHERE origin = ? AND owner = ? AND key IN (?`+strings.Repeat(",?", n-1)+`)`, args...); err != nil {
			return cl.c.errorf(err, "releasing claims")
		}
	}
	return nil
}

// claimsOf returns, of keys, those another owner than owner holds with a
// lease that has not ended at now, with its end.
func claimsOf(ctx context.Context, q querier, keys []Key, origin, owner string, now time.Time) (map[Key]time.Time, error) {
	out := map[Key]time.Time{}
	for len(keys) > 0 {
		n := min(len(keys), lookupChunk)
		args := []any{origin, owner, now.UnixMilli()}
		for i := range keys[:n] {
			args = append(args, keys[i][:])
		}
		keys = keys[n:]
		rows, err := q.QueryContext(ctx, `SELECT key, expires_ms FROM claims WHERE origin = ? AND owner != ? AND expires_ms > ? AND key IN (?`+strings.Repeat(",?", n-1)+`)`, args...)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var k []byte
			var ms int64
			if err := rows.Scan(&k, &ms); err != nil {
				rows.Close()
				return nil, err
			}
			var key Key
			if copy(key[:], k) == len(key) {
				out[key] = time.UnixMilli(ms)
			}
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}
