package ratelimit

import (
	"math"
	"slices"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
)

// Need is what one request will draw from the buckets.
type Need struct {
	Requests float64
	Input    float64 // input + cache-creation tokens (cache reads are free)
	Output   float64 // expected output tokens
}

// MirrorConfig tunes a Mirror. The zero value is usable: it is filled with
// the defaults below.
type MirrorConfig struct {
	// Reserve is the fraction of each limit left free while others are
	// seen drawing on the org. Default 0.15.
	Reserve float64
	// OthersThreshold: others are present when unexplained consumption runs
	// above this fraction of the limit per minute. Default 0.03.
	OthersThreshold float64
	// Window is the time constant over which unexplained consumption is
	// averaged, and how long the reserve is kept after others were last seen
	// (in the server's time; divide by the speed factor). Default 10 s.
	Window time.Duration
	// Speed is how many times faster than the wall clock the server's
	// time runs (a simulator's K; 0 means 1). Its limit headers are K times
	// the API's while its buckets hold one minute of its own time.
	Speed float64
	// Confirm is how long (server time, like Window) and over how many
	// syncs (at least 3) the others' draw must show before the reserve is
	// kept: a late response looks like someone else's draw until the next
	// ones cancel it. Default Window/4.
	Confirm time.Duration
	// Margin is the share of the refill left to us that the pace keeps
	// back (the mirror refills at (limit/60 − others) × (1 − Margin)).
	// Default 0.03.
	Margin float64
}

func (c *MirrorConfig) defaults() {
	if c.Reserve == 0 {
		c.Reserve = 0.15
	}
	if c.OthersThreshold == 0 {
		c.OthersThreshold = 0.03
	}
	if c.Window == 0 {
		c.Window = 10 * time.Second
	}
	if c.Confirm == 0 {
		c.Confirm = c.Window / 4
	}
	if c.Margin == 0 {
		c.Margin = 0.03
	}
}

// transitMargin is kept free above the reserve (as a share of the bucket),
// and is the floor kept free at all times: a colleague not yet seen, or
// between two sightings, draws lumps of about 1 % of the bucket, and the
// first of them comes before we can tell it from our own draws.
const transitMargin = 0.05

// paceWindows is the time constant of the others' rate, in windows: each
// answer's headers may or may not count our requests still on their way,
// an error that cancels out only over many answers.
const paceWindows = 6

// maxOthers caps the others' estimated share of a limit: the level, synced
// from every answer, keeps us off the bottom; the pace only has to keep
// the mirror from running ahead between answers, and must not stop us.
const maxOthers = 0.8

// priorOthers is the share of a limit others are assumed to draw before
// the mirror has watched the bucket bind (see SyncSince).
const priorOthers = 0.5

// Mirror mirrors an org's three buckets for one model pool and decides
// whether a request fits. The zero value is not usable; call NewMirror.
type Mirror struct {
	cfg                     MirrorConfig
	Requests, Input, Output Bucket
	// unexplained consumption per dimension, exponentially decayed
	unexp [3]float64
	// unsure: how much of unexp the headers' rounding may account for
	// (see sync), decayed like it.
	unsure [3]float64
	// pace: the same over a longer time constant, for the others' rate.
	pace    [3]float64
	paceT   [3]float64 // the decayed length of those intervals, seconds
	full    [3]bool    // the bucket was nearly full at the last sync
	primed  [3]bool    // the prior is in the sums
	unexpAt time.Time
	above   [3]int       // consecutive syncs with the rate above the threshold
	since   [3]time.Time // when the current run of such syncs began
	// othersUntil: the reserve is kept until this time.
	othersUntil time.Time
	othersSeen  int // number of times others were detected
	// inFlight is what our admissions not yet answered drew (requests
	// and input tokens, charged by the server on arrival): see Sync.
	inFlight Need
	// sent are those admissions, oldest first: when, and what each drew.
	sent []admission
	// The longest an answer took (admission to answer), in two rotating
	// windows of paceWindows × Window: see SyncSince.
	tailCur, tailPrev time.Duration
	tailSince         time.Time
}

// admission is one admission in flight (see Mirror.sent).
type admission struct {
	at time.Time
	n  Need
}

// NewMirror returns an empty mirror (unknown limits: everything fits until
// the first Sync).
func NewMirror(cfg MirrorConfig) *Mirror {
	cfg.defaults()
	m := &Mirror{cfg: cfg}
	if cfg.Speed > 0 {
		for _, b := range []*Bucket{&m.Requests, &m.Input, &m.Output} {
			b.SetScale(1 / cfg.Speed)
		}
	}
	return m
}

// Take reserves need at admission; a negative need gives back. An
// admission (a positive request count) is in flight until Landed.
func (m *Mirror) Take(now time.Time, n Need) {
	m.Requests.Take(now, n.Requests)
	m.Input.Take(now, n.Input)
	m.Output.Take(now, n.Output)
	if n.Requests > 0 {
		m.inFlight.Requests += n.Requests
		m.inFlight.Input += n.Input
		i := len(m.sent)
		for i > 0 && m.sent[i-1].at.After(now) {
			i--
		}
		m.sent = slices.Insert(m.sent, i, admission{now, n})
	}
}

// Landed reports that the admission that took n has been answered (call it
// before Correct and Sync with its answer). LandedAt says which, when
// several took the same.
func (m *Mirror) Landed(n Need) { m.LandedAt(time.Time{}, n) }

// LandedAt reports that the admission that took n at at has been
// answered (see Landed); a zero at names the oldest that took n.
func (m *Mirror) LandedAt(at time.Time, n Need) {
	m.inFlight.Requests = math.Max(0, m.inFlight.Requests-n.Requests)
	m.inFlight.Input = math.Max(0, m.inFlight.Input-n.Input)
	first := -1
	for i, a := range m.sent {
		if a.n != n {
			continue
		}
		if a.at.Equal(at) {
			first = i
			break
		}
		if first < 0 {
			first = i
		}
	}
	if first >= 0 {
		m.sent = slices.Delete(m.sent, first, first+1)
	}
}

// Correct replaces an earlier reservation by the actual draw, once known.
func (m *Mirror) Correct(now time.Time, reserved, actual Need) {
	m.Take(now, Need{
		Requests: actual.Requests - reserved.Requests,
		Input:    actual.Input - reserved.Input,
		Output:   actual.Output - reserved.Output,
	})
}

// Sync refreshes the mirror from a response's headers. outstanding is what
// this client has reserved and the server has not yet charged: the expected
// output of requests still in flight (input and requests are charged by the
// server at admission, so nothing is outstanding for them). It reports
// whether others are (still) seen drawing on the org.
func (m *Mirror) Sync(now time.Time, rl anthropic.RateLimits, outstandingOutput float64) bool {
	return m.sync(now, time.Time{}, Need{}, rl, outstandingOutput)
}

// SyncSince is Sync for the answer to a request admitted at sentAt. Our
// admissions still unanswered may or may not be in the headers (the
// server counts a request when it arrives, and charges output when it
// finishes): the bucket holds what the headers show less up to what they
// drew (see Bucket.Read), and the mirror, which took them at admission,
// keeps its own level where it is in that range.
//
// The output of those on their way for longer than any answer lately
// took, and than twice this one, is not taken as outstanding: no answer
// says when, or whether, it will be charged. A storm of timeouts left its
// requests in flight until the timeout, long after the storm ended, and
// the mirror took the output bucket for empty by as much all the while.
func (m *Mirror) SyncSince(now, sentAt time.Time, rl anthropic.RateLimits, outstandingOutput float64) bool {
	if !sentAt.IsZero() {
		took := max(0, now.Sub(sentAt))
		if m.tailSince.IsZero() || now.Sub(m.tailSince) >= paceWindows*m.cfg.Window {
			m.tailPrev, m.tailCur, m.tailSince = m.tailCur, 0, now
		}
		m.tailCur = max(m.tailCur, took)
		stalled := now.Add(-max(2*took, m.tailCur, m.tailPrev))
		for _, a := range m.sent {
			if !a.at.Before(stalled) {
				break
			}
			outstandingOutput = math.Max(0, outstandingOutput-a.n.Output)
		}
	}
	return m.sync(now, sentAt, m.inFlight, rl, outstandingOutput)
}

// reading is what l shows of a bucket (see Reading): a count rounded
// down, or for tokens, which the API rounds to the thousand, a whole
// thousand taken as rounded; output tokens, charged after the fact, may
// be below zero (input tokens too, past a request larger than the
// bucket).
func reading(l anthropic.Limit, tokens bool, sent time.Time) Reading {
	return Reading{Limit: l.Limit, Remaining: l.Remaining, Reset: l.Reset,
		Rounded: tokens && l.Remaining%1000 == 0, MayBeNegative: tokens, Sent: sent}
}

// sync refreshes the mirror from headers that may not count t yet, the
// answer to a request sent at sentAt (zero: unknown).
func (m *Mirror) sync(now, sentAt time.Time, t Need, rl anthropic.RateLimits, outstandingOutput float64) bool {
	var u [3]float64
	// What was outstanding when a bucket is first synced: the server may
	// have counted it already, and each of those answers will then read
	// as one unit less than predicted when it lands. Its arrival was
	// never seen as a drop, so count it in the pace's sum now, or the sum
	// starts low by a whole concurrency window and the estimate of others
	// reads zero for a minute while a colleague is drawing.
	first := [3]float64{-1, -1, -1}
	if !m.Requests.Known() {
		first[0] = t.Requests
	}
	if !m.Input.Known() {
		first[1] = t.Input
	}
	if !m.Output.Known() {
		first[2] = outstandingOutput
	}
	if rl.Requests.Present {
		u[0] = m.Requests.Read(now, reading(rl.Requests, false, sentAt), t.Requests)
	}
	if rl.Input.Present {
		u[1] = m.Input.Read(now, reading(rl.Input, true, sentAt), t.Input)
	}
	if rl.Output.Present {
		u[2] = m.Output.Read(now, reading(rl.Output, true, sentAt), outstandingOutput)
	}
	// Decay the running sums, then add this sync's surprise. The sums
	// telescope, so header rounding cancels out over a window and what
	// remains is the others' real draw.
	// An answer heard of after one of a later time adds its surprise at
	// the later time: the sums' clock, like the buckets', never goes back
	// (a negative interval grew them instead of decaying them).
	decay, paceDecay, dt := 1.0, 1.0, 0.0
	if !m.unexpAt.IsZero() {
		dt = max(0, now.Sub(m.unexpAt).Seconds())
		decay = math.Exp(-dt / m.cfg.Window.Seconds())
		paceDecay = math.Exp(-dt / (paceWindows * m.cfg.Window.Seconds()))
	}
	if now.After(m.unexpAt) {
		m.unexpAt = now
	}
	limits := [3]float64{m.Requests.Limit(), m.Input.Limit(), m.Output.Limit()}
	// Requests and input tokens are charged when the server admits a
	// request, so what they show beyond our own draw is someone else's.
	// Output tokens are charged when a request finishes: every answer
	// still on its way to us shows up as a surprise, which a busy client
	// cannot tell from a colleague. Anyone sharing the org also sends
	// requests, so the first two dimensions see them.
	buckets := [3]*Bucket{&m.Requests, &m.Input, &m.Output}
	rem := [3]anthropic.Limit{rl.Requests, rl.Input, rl.Output}
	var width [3]float64
	for i, r := range [3]Reading{reading(rl.Requests, false, sentAt), reading(rl.Input, true, sentAt), reading(rl.Output, true, sentAt)} {
		if rem[i].Present {
			lo, hi := r.interval()
			width[i] = hi - math.Max(lo, float64(r.Remaining)-500)
		}
	}
	for i := range 3 {
		m.unexp[i] = m.unexp[i]*decay + u[i]
		m.pace[i] *= paceDecay
		m.paceT[i] *= paceDecay
		if rem[i].Present {
			// Every interval counts, or the sum would not telescope. (A
			// nearly full bucket spills refill, which reads as others
			// drawing: the pace is low while the bucket does not bind,
			// which costs nothing, and recovers within the window once
			// it does.)
			m.pace[i] += u[i]
			m.paceT[i] += dt
		}
		if limits[i] <= 0 {
			continue
		}
		// The pace: the refill left to us is the limit's less what others
		// drew over the window (a decayed sum telescopes, so our own
		// rounding cancels), less the margin. The rate is over the
		// (decayed) time the sum covers, so it is right from the first
		// intervals and across those left out.
		if !m.primed[i] {
			// Until the sum covers some time, a prior of others drawing
			// half the limit (worth a quarter of the sum's time constant,
			// and decaying like the rest) keeps the mirror from running ahead of a bucket it
			// has not watched yet.
			m.primed[i] = true
			t0 := paceWindows * m.cfg.Window.Seconds() / 4
			m.pace[i], m.paceT[i] = priorOthers*limits[i]/60*t0+max(0, first[i]), t0
		}
		others := math.Min(maxOthers*limits[i]/60, math.Max(0, m.pace[i]/m.paceT[i]))
		buckets[i].SetOthers(now, others+m.cfg.Margin*math.Max(0, limits[i]/60-others))
		// Output tokens are charged when a request finishes; what is
		// still on its way to us is outstanding, taken off above, so the
		// output bucket shows others too.
		// rate ≈ sum / window; compare with threshold × limit per minute.
		// A shown level is a range (rounding), inside which the mirror
		// keeps its own: a difference hidden there shows as one lump when
		// it leaves the range, others' or not. Only what is above the
		// range's width counts; the sum decays, and so does the width
		// it may hold, the widest of any answer in the window.
		m.unsure[i] = math.Max(m.unsure[i]*decay, width[i])
		rate := (m.unexp[i] - m.unsure[i]) / m.cfg.Window.Seconds()
		if rate <= m.cfg.OthersThreshold*limits[i]/60 {
			m.above[i] = 0
			continue
		}
		if m.above[i] == 0 {
			m.since[i] = now
		}
		m.above[i]++
		if m.above[i] >= 3 && now.Sub(m.since[i]) >= m.cfg.Confirm {
			if !now.Before(m.othersUntil) {
				m.othersSeen++
			}
			// Kept for the pace's time constant: a colleague drawing in
			// bursts pauses longer than a window between them.
			if until := now.Add(paceWindows * m.cfg.Window); until.After(m.othersUntil) {
				m.othersUntil = until
			}
		}
	}
	return m.Others(now)
}

// Rescale changes the share of the org's buckets the mirror stands for by
// the factor f (see Bucket.Rescale): the levels, limits and the estimate
// of others, so that the estimate carries over instead of reading the
// change as others drawing (or giving back) the difference.
// outstandingOutput is as for Sync.
func (m *Mirror) Rescale(now time.Time, f, outstandingOutput float64) {
	if f <= 0 || f == 1 {
		return
	}
	m.Requests.Rescale(now, f, m.inFlight.Requests)
	m.Input.Rescale(now, f, m.inFlight.Input)
	m.Output.Rescale(now, f, outstandingOutput)
	for i := range 3 {
		m.unexp[i] *= f
		m.pace[i] *= f
	}
}

// Others reports whether others have been seen drawing on the org within the
// window before now; while they have, Wait keeps the reserve free.
func (m *Mirror) Others(now time.Time) bool { return now.Before(m.othersUntil) }

// OthersUntil is when the reserve stops being kept (zero or past: it is not).
func (m *Mirror) OthersUntil() time.Time { return m.othersUntil }

// NoteOthers keeps the reserve until at least until: others were seen by
// someone else sharing this mirror's budget (another process on the key).
func (m *Mirror) NoteOthers(now, until time.Time) {
	if !until.After(m.othersUntil) {
		return
	}
	if !now.Before(m.othersUntil) {
		m.othersSeen++
	}
	m.othersUntil = until
}

// Synced reports whether the mirror has learnt any limit from headers.
func (m *Mirror) Synced() bool {
	return m.Requests.Limit() > 0 || m.Input.Limit() > 0 || m.Output.Limit() > 0
}

// OthersSeen counts the separate occasions others were detected.
func (m *Mirror) OthersSeen() int { return m.othersSeen }

// Wait returns how long until n fits (0: now), keeping the reserve free
// while others are present.
func (m *Mirror) Wait(now time.Time, n Need) time.Duration {
	r := transitMargin
	if m.Others(now) {
		// Requests on their way to the server are not in its remaining
		// yet, and a colleague draws in lumps: keep a margin (5% of the bucket) on top
		// of the reserve so the server never sees less than the reserve.
		r = m.cfg.Reserve + transitMargin
	}
	// The reserve is a share of what the bucket holds: one minute of the
	// limit.
	w := m.Requests.Wait(now, n.Requests, r*m.Requests.Capacity())
	w = max(w, m.Input.Wait(now, n.Input, r*m.Input.Capacity()))
	w = max(w, m.Output.Wait(now, n.Output, r*m.Output.Capacity()))
	return w
}
