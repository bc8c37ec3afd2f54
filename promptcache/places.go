package promptcache

import (
	"sync"
	"time"
)

// Warmth is what one org holds of a prefix, as far as our own requests
// tell.
type Warmth uint8

const (
	// Cold: nothing known; a request there writes the prefix.
	Cold Warmth = iota
	// Warming: a request with the prefix is on its way there and none has
	// been answered yet. The API makes an entry readable only once its
	// writer's response has begun, so a request sent there now writes it
	// again; one sent after the answer reads it.
	Warming
	// Warm: a request with the prefix was answered there within the
	// prefix's lifetime; a request there now reads it.
	Warm
)

// MaxPlaces bounds how many prefixes Places tracks at once; past it a new
// prefix is not tracked (its requests are placed by headroom alone) until
// expired ones are dropped.
const MaxPlaces = 1 << 20

// sweepEvery: every so many new prefixes, the expired ones are dropped.
const sweepEvery = 4096

// Places remembers, per prefix, the orgs where our requests sent it and
// until when it stays warm there. Times are wall times; a prefix's
// lifetime (API time) is divided by the server's speed. It is safe for
// concurrent use; make it with NewPlaces.
type Places struct {
	speed float64

	mu    sync.Mutex
	m     map[Key]*place
	added int
}

// place is one prefix's orgs.
type place struct {
	orgs []orgPlace
	// plainUntil: an answer showed the API caches none of the prefix (it
	// is below the model's minimum): until then it is placed as a request
	// without one.
	plainUntil time.Time
}

type orgPlace struct {
	org       string
	pending   int       // requests sent there, not yet answered
	sentAt    time.Time // the last one sent
	warmUntil time.Time // answered there: read until then
}

// NewPlaces returns an empty Places for a server running at speed (the
// simulator's K; 1 for the real API; ≤ 0 means 1).
func NewPlaces(speed float64) *Places {
	if speed <= 0 {
		speed = 1
	}
	return &Places{speed: speed, m: map[Key]*place{}}
}

func (pl *Places) life(p Prefix) time.Duration {
	ttl := p.TTL
	if ttl <= 0 {
		ttl = TTLDefault
	}
	return time.Duration(float64(ttl) / pl.speed)
}

// orgLocked returns p's entry for org, creating it (nil when Places is
// full). pl.mu is held.
func (pl *Places) orgLocked(now time.Time, p Prefix, org string) *orgPlace {
	pc := pl.m[p.Key]
	if pc == nil {
		if len(pl.m) >= MaxPlaces {
			pl.sweepLocked(now)
			if len(pl.m) >= MaxPlaces {
				return nil
			}
		}
		pc = &place{}
		pl.m[p.Key] = pc
		if pl.added++; pl.added%sweepEvery == 0 {
			pl.sweepLocked(now)
		}
	}
	for i := range pc.orgs {
		if pc.orgs[i].org == org {
			return &pc.orgs[i]
		}
	}
	pc.orgs = append(pc.orgs, orgPlace{org: org})
	return &pc.orgs[len(pc.orgs)-1]
}

// sweepLocked drops the prefixes nothing is pending on and whose every
// entry has expired. pl.mu is held.
func (pl *Places) sweepLocked(now time.Time) {
	for k, pc := range pl.m {
		live := now.Before(pc.plainUntil)
		for _, o := range pc.orgs {
			live = live || o.pending > 0 || now.Before(o.warmUntil)
		}
		if !live {
			delete(pl.m, k)
		}
	}
}

// Sent records that a request with p went to org at now.
func (pl *Places) Sent(now time.Time, p Prefix, org string) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if o := pl.orgLocked(now, p, org); o != nil {
		o.pending++
		o.sentAt = now
	}
}

// Answered records the end of a request Sent with p to org: ok when it
// succeeded, with cached the prompt tokens its usage shows read from or
// written to the cache. A success that cached nothing marks p as not
// worth placing for its lifetime; a failure only ends the request.
func (pl *Places) Answered(now time.Time, p Prefix, org string, ok bool, cached int64) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	pc := pl.m[p.Key]
	if pc == nil {
		return
	}
	for i := range pc.orgs {
		o := &pc.orgs[i]
		if o.org != org {
			continue
		}
		if o.pending > 0 {
			o.pending--
		}
		switch {
		case !ok:
		case cached > 0:
			o.warmUntil = now.Add(pl.life(p))
		default:
			pc.plainUntil = now.Add(pl.life(p))
		}
		return
	}
}

// Where writes p's warmth at each of orgs into out (len(out) ≥ len(orgs))
// and reports whether p is worth placing: false when the API showed it
// caches none of it, or p is not tracked.
func (pl *Places) Where(now time.Time, p Prefix, orgs []string, out []Warmth) bool {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	for i := range orgs {
		out[i] = Cold
	}
	pc := pl.m[p.Key]
	if pc == nil {
		return len(pl.m) < MaxPlaces
	}
	if now.Before(pc.plainUntil) {
		return false
	}
	life := pl.life(p)
	for _, o := range pc.orgs {
		w := Cold
		switch {
		case now.Before(o.warmUntil):
			w = Warm
		case o.pending > 0 && now.Sub(o.sentAt) < life:
			// A request lost without an answer (a bug) cannot hold the
			// prefix as warming past its lifetime.
			w = Warming
		}
		for i, name := range orgs {
			if name == o.org {
				out[i] = w
			}
		}
	}
	return true
}

// Len is how many prefixes are tracked.
func (pl *Places) Len() int {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return len(pl.m)
}

// The placement rule both front doors follow. A request whose prefix is
// warm in an org with headroom goes there; otherwise to the next with
// headroom, which it warms. A request that can wait its turn (the sync
// engine has other work to send meanwhile) also waits while its prefix is
// being written somewhere, since until that answer begins a second request
// would write it again; a request that cannot wait (the gateway's, first
// come first served) prefers an org warming its prefix to a cold one.

// Rank orders lanes for a request whose prefix has warmth w[i] at lane
// i: the Warm ones first, then the Warming, then the rest, each group in
// the order given. It reorders order in place.
func Rank(w []Warmth, order []int) {
	n := 0
	for _, want := range [...]Warmth{Warm, Warming} {
		for i := n; i < len(order); i++ {
			if w[order[i]] == want {
				x := order[i]
				copy(order[n+1:i+1], order[n:i])
				order[n] = x
				n++
			}
		}
	}
}

// Take reports whether lane i, which has headroom, should send now a
// request whose prefix has warmth w[j] at lane j, when other work could go
// instead; open[j] says whether lane j has headroom too. It says no while
// the prefix is warm in another open lane (that lane will take it) or is
// being written somewhere (the answer will make it warm), unless it is
// already warm at i.
func Take(w []Warmth, open []bool, i int) bool {
	if w[i] == Warm {
		return true
	}
	for j, x := range w {
		if x == Warming || j != i && x == Warm && open[j] {
			return false
		}
	}
	return true
}
