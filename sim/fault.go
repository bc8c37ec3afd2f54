package sim

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
)

// FaultKind names a fault the simulator can inject.
type FaultKind string

// Fault kinds. Unless said otherwise a fault affects POST /v1/messages only.
const (
	// FaultRateLimitStorm answers 429 rate_limit_error with the full
	// rate-limit header set and x-should-retry: true, with retry-after
	// (and retry-after-ms when K > 1) when Fault.RetryAfter > 0 and without
	// when it is 0. Nothing is charged to the buckets.
	FaultRateLimitStorm FaultKind = "storm_429"
	// FaultOverloaded answers 529 overloaded_error "Overloaded" with
	// details null and no retry-after.
	FaultOverloaded FaultKind = "overloaded_529"
	// FaultServerError answers 500 api_error with the JSON envelope.
	FaultServerError FaultKind = "server_error_500"
	// FaultServerErrorHTML answers 500 with an HTML page (a proxy's error).
	FaultServerErrorHTML FaultKind = "server_error_500_html"
	// FaultConnectionReset processes and bills the request, then resets the
	// connection instead of answering.
	FaultConnectionReset FaultKind = "connection_reset"
	// FaultTruncatedBody processes and bills the request, sends the headers
	// with the full Content-Length and half the body, then closes.
	FaultTruncatedBody FaultKind = "truncated_body"
	// FaultSlow adds Fault.ExtraLatency (API time) to the request.
	FaultSlow FaultKind = "slow"
	// FaultKeyRevoked answers 401 authentication_error for the org's keys
	// (or only Fault.KeyFingerprint), on every endpoint.
	FaultKeyRevoked FaultKind = "key_revoked"
	// FaultSpendCap answers the monthly spend-cap 429: no retry-after,
	// error.details.error_code "enforced_spend_limit_reached", and a message
	// naming the resume time (00:00 UTC on the 1st of next month). With
	// Fault.SpendCapUSD > 0 it fires only once the org's billed cost has
	// reached that amount. On an OpenAI org it answers the billing 429
	// insufficient_quota instead (no retry-after), to chat completions and
	// to batch creates.
	FaultSpendCap FaultKind = "spend_cap"
	// FaultAcceleration answers 429 to an org whose request rate over the
	// last Window (default 5 s) exceeds both FloorRPM (default 1,000) and
	// Factor (default 3) times its rate over the Baseline before it (default
	// 60 s). Rates are admitted requests per API-minute across the org's
	// pools. retry-after is Fault.RetryAfter, default the Window.
	FaultAcceleration FaultKind = "acceleration"
	// FaultColleague makes colleagues use Fraction of the org's budget in
	// every bucket (see the bucket model): remaining shows it, our own
	// throughput loses it, and colleague demand our use starves is counted
	// in PoolStats.ColleagueRefused.
	FaultColleague FaultKind = "colleague"
	// FaultStreamOverloaded strikes streaming requests only: after
	// message_start and the first content_block_start it sends an error
	// event (overloaded_error "Overloaded") and ends the stream, as the API
	// can after a 200. The request is not billed and its output is not
	// charged; stats count it as a 529.
	FaultStreamOverloaded FaultKind = "stream_overloaded"
	// FaultBetaForbidden answers 403 permission_error, on every endpoint,
	// to a request whose anthropic-beta header names Fault.Beta: a beta
	// the org may not use (a research preview it is not enrolled in). The
	// key itself stays good: the same request without that beta is served.
	// Nothing is billed or charged to the buckets.
	FaultBetaForbidden FaultKind = "beta_forbidden"

	// Message Batches faults (batch.go). They match on org and key; pool is
	// ignored except by the batch_errored_* kinds, which match the pool of
	// each request's model.

	// FaultBatchCreateLost500 creates the batch, then answers the create
	// with 500 api_error: the batch exists but the client never learns its id.
	FaultBatchCreateLost500 FaultKind = "batch_create_lost_500"
	// FaultBatchCreateLostReset creates the batch, then resets the
	// connection instead of answering.
	FaultBatchCreateLostReset FaultKind = "batch_create_lost_reset"
	// FaultBatchNotFound makes a batch created while it is active invisible
	// for Window (API time, default 60 s, the grace the origin needed) after
	// its creation: retrieve,
	// cancel, delete and results answer 404 not_found_error and lists omit
	// it (eventual consistency).
	FaultBatchNotFound FaultKind = "batch_not_found"
	// FaultBatchPoll404 answers 404 not_found_error to a retrieve of an
	// existing batch while it is active (the origin saw such 404s for up to
	// ~3 min in the middle of polling).
	FaultBatchPoll404 FaultKind = "batch_poll_404"
	// FaultBatchStall makes a batch created while it is active stop after
	// Fraction (in [0, 1), default 0) of its requests, so that it does not
	// finish within 24 h: it ends at expires_at with the rest expired.
	FaultBatchStall FaultKind = "batch_stall"
	// FaultBatchErroredAPI, FaultBatchErroredOverloaded and
	// FaultBatchErroredInvalid turn Probability of the valid requests
	// processed while they are active into errored results of type
	// api_error, overloaded_error or invalid_request_error (not billed).
	FaultBatchErroredAPI        FaultKind = "batch_errored_api"
	FaultBatchErroredOverloaded FaultKind = "batch_errored_overloaded"
	FaultBatchErroredInvalid    FaultKind = "batch_errored_invalid"
	// FaultBatchResultsCut sends the first half of a results stream (a
	// message batch's results, an OpenAI batch's output or error file),
	// then cuts the connection. It strikes each download on its own, at
	// Probability, as a network cut would: the results stay whole.
	FaultBatchResultsCut FaultKind = "batch_results_cut"
)

var faultKinds = []FaultKind{
	FaultRateLimitStorm, FaultOverloaded, FaultServerError, FaultServerErrorHTML,
	FaultConnectionReset, FaultTruncatedBody, FaultSlow, FaultKeyRevoked,
	FaultSpendCap, FaultAcceleration, FaultColleague, FaultStreamOverloaded, FaultBetaForbidden,
	FaultBatchCreateLost500, FaultBatchCreateLostReset, FaultBatchNotFound, FaultBatchPoll404, FaultBatchStall,
	FaultBatchErroredAPI, FaultBatchErroredOverloaded, FaultBatchErroredInvalid, FaultBatchResultsCut,
}

// Fault is one injected fault: a kind, whom it hits (an org, a pool, a key),
// when (a window in API-equivalent time) and how often (a probability).
// Times are API-equivalent: at speed K they pass K times faster.
//
// JSON form (durations as Go duration strings or numbers of seconds):
//
//	{"kind":"storm_429", "org":"high_prio", "pool":"sonnet-4",
//	 "start":"30s", "from_now":false, "duration":"10s", "probability":0.5,
//	 "retry_after":"2s"}
//
// plus, by kind, "extra_latency" (slow), "key_fingerprint" (key_revoked),
// "spend_cap_usd" (spend_cap), "fraction" (colleague), "factor",
// "floor_rpm", "window", "baseline" (acceleration), "beta" (beta_forbidden).
type Fault struct {
	// ID names the fault for ClearFaults; the server assigns "f<n>" when empty.
	ID   string
	Kind FaultKind
	// Org is the org name it hits; empty hits every org.
	Org string
	// Pool is the model pool it hits; empty hits every pool.
	Pool anthropic.Pool
	// KeyFingerprint limits key_revoked to one key (org.Fingerprint).
	KeyFingerprint string
	// Start is when it begins, from server start, or from when it is added
	// if FromNow. Duration is how long it lasts; 0 means until cleared.
	Start    time.Duration
	FromNow  bool
	Duration time.Duration
	// Probability is the fraction of matching requests it hits; 0 means all.
	Probability float64
	// RetryAfter is the retry-after of storm_429 (0: none) and acceleration.
	RetryAfter time.Duration
	// Exhausted makes storm_429's headers show the requests bucket empty,
	// as a 429 of a drained bucket's does (without it they show the
	// buckets as they are: a storm no bucket explains).
	Exhausted bool
	// ExtraLatency is added by slow.
	ExtraLatency time.Duration
	// SpendCapUSD is the spend_cap threshold (0: fires at once).
	SpendCapUSD float64
	// Fraction is the colleague share of the budget, in [0, 1).
	Fraction float64
	// Bursts makes a colleague draw in random bursts (at four times its
	// mean rate, a quarter of the time) instead of evenly; the mean is the
	// same.
	Bursts bool
	// Factor, FloorRPM, Window and Baseline tune acceleration (windows are
	// whole API seconds, at least 1; shorter means the default).
	Factor   float64
	FloorRPM float64
	Window   time.Duration
	Baseline time.Duration
	// Beta is the anthropic-beta value beta_forbidden refuses.
	Beta string
}

type faultJSON struct {
	ID             string         `json:"id,omitempty"`
	Kind           FaultKind      `json:"kind"`
	Org            string         `json:"org,omitempty"`
	Pool           anthropic.Pool `json:"pool,omitempty"`
	KeyFingerprint string         `json:"key_fingerprint,omitempty"`
	Start          jsonDuration   `json:"start,omitempty"`
	FromNow        bool           `json:"from_now,omitempty"`
	Duration       jsonDuration   `json:"duration,omitempty"`
	Probability    float64        `json:"probability,omitempty"`
	RetryAfter     jsonDuration   `json:"retry_after,omitempty"`
	Exhausted      bool           `json:"exhausted,omitempty"`
	ExtraLatency   jsonDuration   `json:"extra_latency,omitempty"`
	SpendCapUSD    float64        `json:"spend_cap_usd,omitempty"`
	Fraction       float64        `json:"fraction,omitempty"`
	Factor         float64        `json:"factor,omitempty"`
	FloorRPM       float64        `json:"floor_rpm,omitempty"`
	Window         jsonDuration   `json:"window,omitempty"`
	Baseline       jsonDuration   `json:"baseline,omitempty"`
	Bursts         bool           `json:"bursts,omitempty"`
	Beta           string         `json:"beta,omitempty"`
}

// MarshalJSON writes the JSON form shown on Fault.
func (f Fault) MarshalJSON() ([]byte, error) {
	return json.Marshal(faultJSON{f.ID, f.Kind, f.Org, f.Pool, f.KeyFingerprint,
		jsonDuration(f.Start), f.FromNow, jsonDuration(f.Duration), f.Probability,
		jsonDuration(f.RetryAfter), f.Exhausted, jsonDuration(f.ExtraLatency), f.SpendCapUSD,
		f.Fraction, f.Factor, f.FloorRPM, jsonDuration(f.Window), jsonDuration(f.Baseline), f.Bursts, f.Beta})
}

// UnmarshalJSON reads the JSON form shown on Fault; unknown fields are an error.
func (f *Fault) UnmarshalJSON(b []byte) error {
	var j faultJSON
	if err := strictUnmarshal(b, &j); err != nil {
		return err
	}
	*f = Fault{j.ID, j.Kind, j.Org, j.Pool, j.KeyFingerprint, time.Duration(j.Start),
		j.FromNow, time.Duration(j.Duration), j.Probability, time.Duration(j.RetryAfter), j.Exhausted,
		time.Duration(j.ExtraLatency), j.SpendCapUSD, j.Fraction, j.Bursts, j.Factor, j.FloorRPM,
		time.Duration(j.Window), time.Duration(j.Baseline), j.Beta}
	return nil
}

// jsonDuration is a duration written as a Go duration string and read from
// one or from a number of seconds.
type jsonDuration time.Duration

func (d jsonDuration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

func (d *jsonDuration) UnmarshalJSON(b []byte) error {
	s := strings.TrimSpace(string(b))
	if strings.HasPrefix(s, `"`) {
		var str string
		if err := json.Unmarshal(b, &str); err != nil {
			return err
		}
		v, err := time.ParseDuration(str)
		if err != nil {
			return err
		}
		*d = jsonDuration(v)
		return nil
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsInf(v, 0) || math.IsNaN(v) || math.Abs(v) > 1e9 {
		return fmt.Errorf("duration %s: want a string like \"5s\" or a number of seconds", s)
	}
	*d = jsonDuration(seconds(v))
	return nil
}

func (f *Fault) check() error {
	known := false
	for _, k := range faultKinds {
		known = known || f.Kind == k
	}
	if !known {
		return fmt.Errorf("unknown fault kind %q", f.Kind)
	}
	if f.Start < 0 || f.Duration < 0 || f.RetryAfter < 0 || f.ExtraLatency < 0 || f.Window < 0 || f.Baseline < 0 {
		return fmt.Errorf("%s: durations must not be negative", f.Kind)
	}
	if f.Probability < 0 || f.Probability > 1 || math.IsNaN(f.Probability) {
		return fmt.Errorf("%s: probability %v must be in [0, 1]", f.Kind, f.Probability)
	}
	if f.Kind == FaultColleague && (f.Fraction <= 0 || f.Fraction >= 1) {
		return fmt.Errorf("colleague: fraction %v must be in (0, 1)", f.Fraction)
	}
	if f.Kind == FaultBatchStall && (f.Fraction < 0 || f.Fraction >= 1) {
		return fmt.Errorf("batch_stall: fraction %v must be in [0, 1)", f.Fraction)
	}
	if f.Kind == FaultBetaForbidden && (f.Beta == "" || strings.ContainsAny(f.Beta, ", \t")) {
		return fmt.Errorf("beta_forbidden: beta %q must name one beta (no commas or spaces)", f.Beta)
	}
	if f.SpendCapUSD < 0 || f.Factor < 0 || f.FloorRPM < 0 {
		return fmt.Errorf("%s: spend_cap_usd, factor and floor_rpm must not be negative", f.Kind)
	}
	if f.Kind == FaultAcceleration && f.Window+f.Baseline > accelSlots*time.Second {
		return fmt.Errorf("acceleration: window + baseline must be at most %d s", accelSlots)
	}
	return nil
}

// activeFault is a Fault placed on the server's API-time axis.
type activeFault struct {
	Fault
	org      int // org index, -1 for all
	from, to time.Duration
	capNanos int64
}

// faultSet is an immutable snapshot; the server swaps it atomically.
type faultSet struct {
	list  []activeFault
	kinds uint32 // bit per kind index present
}

func kindBit(k FaultKind) uint32 {
	for i, kk := range faultKinds {
		if kk == k {
			return 1 << i
		}
	}
	return 0
}

func (fs *faultSet) has(k FaultKind) bool { return fs != nil && fs.kinds&kindBit(k) != 0 }

// match returns the first fault of kind k hitting org/pool/key at API time
// now, drawing one number from r per candidate with a probability.
func (fs *faultSet) match(k FaultKind, org int, pool anthropic.Pool, keyFP string, now time.Duration, r *rng) *activeFault {
	if !fs.has(k) {
		return nil
	}
	for i := range fs.list {
		f := &fs.list[i]
		if f.Kind != k || (f.org >= 0 && f.org != org) || (f.Pool != "" && pool != "" && f.Pool != pool) ||
			(f.KeyFingerprint != "" && f.KeyFingerprint != keyFP) {
			continue
		}
		if now < f.from || now >= f.to {
			continue
		}
		if f.Probability > 0 && f.Probability < 1 && r.float() >= f.Probability {
			continue
		}
		return f
	}
	return nil
}

// matchBeta returns the beta_forbidden fault refusing beta for org and key
// at API time now, if any (it hits every matching request).
func (fs *faultSet) matchBeta(org int, keyFP, beta string, now time.Duration) *activeFault {
	for i := range fs.list {
		f := &fs.list[i]
		if f.Kind == FaultBetaForbidden && f.Beta == beta && (f.org < 0 || f.org == org) &&
			(f.KeyFingerprint == "" || f.KeyFingerprint == keyFP) && now >= f.from && now < f.to {
			return f
		}
	}
	return nil
}

// colleague returns the colleague load for org/pool at API time now
// (the largest of the matching faults).
func (fs *faultSet) colleague(org int, pool anthropic.Pool, now time.Duration) load {
	if !fs.has(FaultColleague) {
		return load{}
	}
	var l load
	for i := range fs.list {
		f := &fs.list[i]
		if f.Kind == FaultColleague && (f.org < 0 || f.org == org) && (f.Pool == "" || f.Pool == pool) && now >= f.from && now < f.to && f.Fraction > l.frac {
			l = load{frac: f.Fraction, bursts: f.Bursts}
		}
	}
	return l
}
