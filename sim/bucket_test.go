package sim

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
)

// drive offers requests to p at twice the rate the limit allows, for two
// simulated minutes on a fake clock, and returns how many were admitted in
// each minute. Each admitted request is settled at once with out output
// tokens (reserved as in the given mode).
func drive(p *poolLimiter, perMin float64, in, out, reserve int64) (first, second int) {
	step := time.Duration(float64(time.Minute) / (2 * perMin))
	for now := time.Duration(0); now < 2*time.Minute; now += step {
		if refused, _, _ := p.admit(now, load{}, in, reserve); refused != dimNone {
			continue
		}
		p.settle(now, load{}, out, reserve)
		if now < time.Minute {
			first++
		} else {
			second++
		}
	}
	return first, second
}

func within(t *testing.T, what string, got, want, tol float64) {
	t.Helper()
	if math.Abs(got-want) > tol*want {
		t.Errorf("%s = %v, want %v ± %.0f%%", what, got, want, tol*100)
	}
}

// An org driven at twice a limit for a minute after its burst is spent
// admits the limit, within 2%, for each of the three limits.
func TestBucketAdmitsTheLimitAtTwiceTheRate(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name                 string
		limits               Limits
		in, out, reserve     int64
		perMin               float64 // requests per minute the binding limit allows
		firstMinuteIncludesB bool
	}{
		{"RPM", Limits{RPM: 600, ITPM: 1e9, OTPM: 1e9}, 10, 10, 1, 600, true},
		{"ITPM", Limits{RPM: 1e6, ITPM: 60000, OTPM: 1e9}, 100, 10, 1, 600, true},
		{"OTPM actual", Limits{RPM: 1e6, ITPM: 1e9, OTPM: 30000}, 10, 50, 1, 600, true},
		{"OTPM reserve", Limits{RPM: 1e6, ITPM: 1e9, OTPM: 30000}, 10, 50, 200, 600, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newPoolLimiter(tc.limits, 1, 1)
			first, second := drive(p, tc.perMin, tc.in, tc.out, tc.reserve)
			// Steady state: exactly the limit.
			within(t, "admitted in the second minute", float64(second), tc.perMin, 0.02)
			// First minute: the full bucket (one minute's worth) plus the refill.
			within(t, "admitted in the first minute", float64(first), 2*tc.perMin, 0.02)
		})
	}
}

// At speed K the limit, capacity and refill are all K times larger: the same
// drive admits K times as many per real minute.
func TestBucketSpeedMultipliesLimits(t *testing.T) {
	t.Parallel()
	p := newPoolLimiter(Limits{RPM: 600}, 1, 10)
	_, second := drive(p, 6000, 1, 1, 1)
	within(t, "admitted at K=10", float64(second), 6000, 0.02)
	if v := p.view(0, load{}); v.limit[0] != 6000 {
		t.Errorf("limit %v, want 6000", v.limit[0])
	}
}

func TestBucketBurstFraction(t *testing.T) {
	t.Parallel()
	p := newPoolLimiter(Limits{RPM: 600}, 0.1, 1)
	admitted := 0
	for i := 0; i < 100; i++ {
		if r, _, _ := p.admit(0, load{}, 0, 0); r == dimNone {
			admitted++
		}
	}
	if admitted != 60 {
		t.Errorf("burst admitted %d at once, want 60 (10%% of 600)", admitted)
	}
}

// A refusal says which limit and how long until there is room; nothing is
// charged by a refusal.
func TestBucketRefusalWaitAndNoCharge(t *testing.T) {
	t.Parallel()
	p := newPoolLimiter(Limits{RPM: 60, ITPM: 6000, OTPM: 600}, 1, 1)
	// Spend 5,900 input tokens: 100 left; a 400-token request must wait
	// for 300 tokens at 100/s.
	if r, _, _ := p.admit(0, load{}, 5900, 1); r != dimNone {
		t.Fatal("first request refused")
	}
	r, wait, v := p.admit(0, load{}, 400, 1)
	if r != dimInput || wait != 3*time.Second {
		t.Fatalf("refused %v wait %v, want input tokens and 3s", r, wait)
	}
	if v.level[0] != 59 || v.level[1] != 100 {
		t.Errorf("levels after refusal %v: a refusal must not charge", v.level)
	}
	// Output in actual mode: charged at completion, may go negative, and
	// then refuses until refilled above zero.
	p.settle(0, load{}, 700, 1)
	r, wait, v = p.admit(0, load{}, 1, 1)
	if r != dimOutput || v.level[2] != -100 {
		t.Fatalf("refused %v level %v, want output tokens at -100", r, v.level[2])
	}
	if wait != time.Duration(101*float64(time.Second)/10) {
		t.Errorf("wait %v, want 10.1s (101 tokens at 10/s)", wait)
	}
	if r, _, _ := p.admit(wait, load{}, 1, 1); r != dimNone {
		t.Errorf("still refused after the wait: %v", r)
	}
}

// The honest colleague: its draws come first, a greedy client that drains
// the bucket gets no more than (1−f) of the refill and makes the colleague's
// draws be refused (counted); a polite one that leaves room starves nobody.
// Both for an even colleague and a bursty one of the same mean.
func TestBucketColleagueDrawsFirst(t *testing.T) {
	t.Parallel()
	for _, bursts := range []bool{false, true} {
		f := load{frac: 0.4, bursts: bursts}
		p := newPoolLimiter(Limits{RPM: 600}, 1, 1)
		if v := p.view(time.Second, f); v.level[0] != 600 {
			t.Fatalf("level at first %v, want a full bucket (600): the colleague is seen only by its draws", v.level[0])
		}
		// Drive greedily at twice the limit for four minutes.
		admitted := 0
		var before PoolStats
		for now := time.Second; now < 241*time.Second; now += 50 * time.Millisecond {
			if now == 61*time.Second {
				before = p.stats(now, f, "x")
			}
			if r, _, _ := p.admit(now, f, 0, 0); r == dimNone && now >= 61*time.Second {
				admitted++
			}
		}
		st := p.stats(241*time.Second, f, "x")
		// The colleague took its 40% (its refused draws retried first):
		// we got 60% of 3 minutes at 600/min.
		// Bursts make the colleague's draw over three minutes random.
		tol := 0.03
		if bursts {
			tol = 0.15
		}
		within(t, "greedy client's share", float64(admitted+int(st.ColleagueUsed[0]-before.ColleagueUsed[0])), 1800, 0.01)
		within(t, "colleague's share", float64(st.ColleagueUsed[0]-before.ColleagueUsed[0]), 0.4*1800, tol)
		if refused := float64(st.ColleagueRefused[0]) / float64(st.ColleagueWanted[0]); refused < 0.5 {
			t.Errorf("bursts %v: draining the bucket refused %.0f%% of the colleague's draws, want most", bursts, refused*100)
		}
		// A polite client that keeps 15% free starves nobody.
		p = newPoolLimiter(Limits{RPM: 600}, 1, 1)
		for now := time.Second; now < 241*time.Second; now += 50 * time.Millisecond {
			if p.view(now, f).level[0] >= 0.15*600+1 {
				p.admit(now, f, 0, 0)
			}
		}
		if st := p.stats(241*time.Second, f, "x"); st.ColleagueRefused[0] != 0 || st.ColleagueWanted[0] < 0.9*0.4*2400 {
			t.Errorf("bursts %v polite client: colleague refused %d of %d; want 0 of about 960", bursts, st.ColleagueRefused[0], st.ColleagueWanted[0])
		}
	}
}

// The headers agree with the buckets: limit, remaining (exact below 10k,
// rounded to the thousand above) and reset = now + time to full.
func TestHeadersAgreeWithBuckets(t *testing.T) {
	t.Parallel()
	s := &Server{speed: 1}
	p := newPoolLimiter(Limits{RPM: 600, ITPM: 2000000, OTPM: 8000}, 1, 1)
	p.admit(0, load{}, 123456, 1)
	v := p.settle(0, load{}, 2001, 1)
	h := http.Header{}
	before := time.Now()
	s.rateHeaders(h, v)
	get := func(k string) int64 {
		n, err := strconv.ParseInt(h.Get(k), 10, 64)
		if err != nil {
			t.Fatalf("%s: %q", k, h.Get(k))
		}
		return n
	}
	checks := []struct {
		key  string
		want int64
	}{
		{"anthropic-ratelimit-requests-limit", 600},
		{"anthropic-ratelimit-requests-remaining", 599},
		{"anthropic-ratelimit-input-tokens-limit", 2000000},
		{"anthropic-ratelimit-input-tokens-remaining", 1877000}, // 1,876,544 rounded
		{"anthropic-ratelimit-output-tokens-limit", 8000},
		{"anthropic-ratelimit-output-tokens-remaining", 5999}, // exact below 10k
		{"anthropic-ratelimit-tokens-limit", 2008000},
		{"anthropic-ratelimit-tokens-remaining", 1877000 + 5999},
	}
	for _, c := range checks {
		if got := get(c.key); got != c.want {
			t.Errorf("%s = %d, want %d", c.key, got, c.want)
		}
	}
	resets := map[string]time.Duration{
		"anthropic-ratelimit-requests-reset":      100 * time.Millisecond, // 1 request at 10/s
		"anthropic-ratelimit-input-tokens-reset":  time.Duration(123456 / (2000000 / 60.0) * float64(time.Second)),
		"anthropic-ratelimit-output-tokens-reset": time.Duration(2001 / (8000 / 60.0) * float64(time.Second)),
		"anthropic-ratelimit-tokens-reset":        time.Duration(2001 / (8000 / 60.0) * float64(time.Second)),
	}
	for k, d := range resets {
		at, err := time.Parse(time.RFC3339, h.Get(k))
		if err != nil {
			t.Fatalf("%s: %q: %v", k, h.Get(k), err)
		}
		// Whole seconds at K=1, rounded up.
		lo := before.Add(d).Truncate(time.Second)
		hi := time.Now().Add(d).Add(time.Second)
		if at.Before(lo) || at.After(hi) {
			t.Errorf("%s = %v, want within [%v, %v]", k, at, lo, hi)
		}
	}
	// Remaining never negative.
	p.settle(0, load{}, 100000, 0)
	h = http.Header{}
	s.rateHeaders(h, p.view(0, load{}))
	if got := get("anthropic-ratelimit-output-tokens-remaining"); got != 0 {
		t.Errorf("negative bucket reports remaining %d, want 0", got)
	}
}

// reserve_max_tokens over HTTP: a request reserves max_tokens of output at
// admission, so a bucket with room for fewer is refused before any output.
func TestOTPMReserveModeOverHTTP(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.OTPMMode = OTPMReserveMaxTokens
	cfg.Orgs[0].Limits[anthropic.PoolSonnet4] = Limits{RPM: 600, ITPM: 60000, OTPM: 1000}
	run := startSim(t, cfg)
	// 4,000 reserved > 1,000 capacity: admitted only on a full bucket, and
	// the refund leaves it at 1,000 − actual.
	start := time.Now()
	r := post(t, run, soloKey, judgeBody(1, 4000))
	elapsed := time.Since(start)
	m := r.message(t)
	rem, _ := strconv.ParseInt(r.header.Get("anthropic-ratelimit-output-tokens-remaining"), 10, 64)
	// The bucket refills 1,000 tokens a minute (speed 1) while the request
	// runs: 2 tokens in its first 120 ms, and what the time it measurably
	// took adds (a loaded machine under -race may hold it longer).
	if hi := 1000 - m.Usage.OutputTokens + 2 + int64(math.Ceil(1000.0/60*elapsed.Seconds())); rem < 1000-m.Usage.OutputTokens || rem > hi {
		t.Errorf("output remaining %d after %d tokens, want %d to %d: the reservation refunded (%v elapsed)", rem, m.Usage.OutputTokens, 1000-m.Usage.OutputTokens, hi, elapsed)
	}
	// 990 reserved does not fit in what is left.
	if r := post(t, run, soloKey, judgeBody(2, 990)); r.status != 429 || !strings.Contains(r.envelope(t).Error.Message, "output tokens per minute") {
		t.Errorf("status %d: want an output-token 429", r.status)
	}
}
