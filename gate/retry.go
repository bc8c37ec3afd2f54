package gate

import (
	"math"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
)

// The one retry policy of every route (the engine of run and ab, the
// gateway's Messages requests, its passthrough and its batches' items),
// and the hold of a lane after congestion without retry-after, which
// probes one request at a time and so can be shorter (ProbeBackoff). It
// lives here, below every route, because a lane (Lane.congestion) applies
// it too.

// Backoff is the back-off after the nth consecutive failure (n ≥ 1):
// 0.5, 1, 2, 4, then 8 s of server time, less up to a quarter at random
// (jitter u in [0, 1); 0: none), in wall time at speed (the simulator's
// factor; 1 for the API).
func Backoff(n int, speed, u float64) time.Duration {
	if speed <= 0 {
		speed = 1
	}
	sec := math.Min(8, 0.5*math.Pow(2, float64(max(n, 1)-1))) * (1 - 0.25*min(max(u, 0), 1))
	return time.Duration(sec / speed * float64(time.Second))
}

// RetryWait is how long a request waits before its next attempt after
// its nth consecutive failure o. A 429 or 529 (congestion) with a
// retry-after waits exactly that long, as its lane holds for it
// (Lane.congestion: the server said when to come back; it is already in
// wall time, a server that runs fast scales it). Any other failure waits
// the back-off, or the retry-after when that is longer. A route whose lane
// holds for congestion lets the request take another lane at once
// instead; a route without lanes (the passthrough) waits this.
func RetryWait(o anthropic.Outcome, n int, speed, u float64) time.Duration {
	if Congested(o) && o.HasRetryAfter {
		return o.RetryAfter
	}
	d := Backoff(n, speed, u)
	if o.HasRetryAfter {
		d = max(d, o.RetryAfter)
	}
	return d
}

// ProbeBackoffMax is the longest back-off hold without retry-after, in
// server seconds: a lane sends one probe per hold, so it can be short,
// and a lane resumes within it of a storm's end. At 2 s the probe after
// the storm went out up to 2 s after its end and, a second or two of
// latency later, the first answer came past 3 s (a run's first answer
// 3.5-4.6 API s after a storm of 529s or of 429s without retry-after);
// at 1 s the lane sends at most one request a second into a storm.
const ProbeBackoffMax = 1.0

// ProbeBackoff is the n-th consecutive back-off hold (n ≥ 1) after a 429
// or 529 without retry-after: 0.5, then 1 s of server time, divided by
// speed.
func ProbeBackoff(n int, speed float64) time.Duration {
	sec := math.Min(ProbeBackoffMax, 0.5*math.Pow(2, float64(n-1)))
	return time.Duration(sec / speed * float64(time.Second))
}
