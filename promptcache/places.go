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

// WritingFor bounds how long (API time) a prefix sent to an org and not
// yet answered counts as Warming there: about ten times a typical
// answer's latency, so that one stalled writer cannot hold back every
// request of its prefix.
const WritingFor = 30 * time.Second

// sweepEvery: every so many new prefixes, the expired ones are dropped.
const sweepEvery = 4096

// Places remembers, per prefix, the orgs where our requests sent it and
// until when it stays warm there. Times are wall times; a prefix's
// lifetime (API time) is divided by the server's speed. It is safe for
// concurrent use; make it with NewPlaces.
type Places struct {
	speed   float64
	writing time.Duration // WritingFor at speed

	mu    sync.Mutex
	m     map[Key]*place
	added int
}

// place is one prefix's orgs.
type place struct {
	orgs []orgPlace
	// plain: an answer showed the API caches none of the prefix (it is
	// below the model's minimum, which the key's model fixes): it is
	// placed as a request without one.
	plain bool
	// touched is when it was last sent or looked up.
	touched time.Time
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
	return &Places{speed: speed, writing: time.Duration(float64(WritingFor) / speed), m: map[Key]*place{}}
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
		if pl.added++; pl.added%sweepEvery == 0 {
			pl.sweepLocked(now)
		}
		pc = &place{touched: now}
		pl.m[p.Key] = pc
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
// entry has expired (a plain one once untouched for a default lifetime).
// pl.mu is held.
func (pl *Places) sweepLocked(now time.Time) {
	for k, pc := range pl.m {
		live := pc.plain && now.Sub(pc.touched) < pl.life(Prefix{})
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
		pl.m[p.Key].touched = now
		o.pending++
		o.sentAt = now
	}
}

// Answered records the end of a request Sent with p to org: ok when it
// succeeded, with cached the prompt tokens its usage shows read from or
// written to the cache. A success that cached nothing marks p as not
// worth placing; a failure only ends the request.
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
			pc.plain = true
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
	pc.touched = now
	if pc.plain {
		return false
	}
	for _, o := range pc.orgs {
		w := Cold
		switch {
		case now.Before(o.warmUntil):
			w = Warm
		case o.pending > 0 && now.Sub(o.sentAt) < pl.writing:
			// A writer slower than that (a stall, a long answer) no
			// longer holds the prefix as being written: requests that
			// would wait for it go elsewhere.
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

// The placement rule both front doors follow (Rank). A request whose
// prefix is warm in an org with headroom goes there; otherwise to the next
// with headroom, which it warms; an org warming it comes before a cold
// one. A request that can wait its turn (the sync engine's, with other
// work to send meanwhile) also waits while its prefix is being written
// somewhere (Waits), since until that answer begins a second request would
// write it again; the gateway's requests, first come first served, do not.

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

// Waits reports whether a request whose prefix has warmth w[i] at lane i
// should wait, when its sender has other work to send meanwhile and an
// answer on the way: the prefix is being written somewhere and is warm in
// no lane with headroom (full[i] says lane i has none).
func Waits(w []Warmth, full []bool) bool {
	writing := false
	for i, x := range w {
		switch {
		case x == Warm && !full[i]:
			return false
		case x == Warming:
			writing = true
		}
	}
	return writing
}
