package gate

import "time"

// FirstAnswerWait is how long, in API time, an in-process lane that has
// had no answer waits on its first request in flight before it sends one
// more. Until the first answer such a lane sends one request at a time
// (its buckets are unknown before it); but a first request that hangs (an
// API slow for a while: answers minutes late) would hold it to that one
// request for its whole latency while work waits. Past this bound it
// sends one more request for each bound its first has been out, so one
// that answers soon ends the wait. It is a few times a short request's
// latency: a prompt first answer comes well within it. A shared lane
// (package shared) does not do this, nor does a key whose organisation is
// not known yet (upstream.Orgs).
const FirstAnswerWait = 10 * time.Second

// firstAnswerAllows is how many requests a lane with no answer yet may
// have in flight at now when its oldest went out at since and wait (real
// time: FirstAnswerWait divided by the speed factor) is the bound: one,
// and one more for each wait that has passed; and how long until it may
// have one more.
func firstAnswerAllows(since, now time.Time, wait time.Duration) (n int, next time.Duration) {
	if wait <= 0 {
		wait = FirstAnswerWait
	}
	out := max(now.Sub(since), 0)
	k := out / wait
	return 1 + int(k), (k+1)*wait - out
}

// firstAnswerWaitAt is FirstAnswerWait in wall time at speed (the
// simulator's speed factor; 0: 1).
func firstAnswerWaitAt(speed float64) time.Duration {
	if speed <= 0 {
		speed = 1
	}
	return time.Duration(float64(FirstAnswerWait) / speed)
}
