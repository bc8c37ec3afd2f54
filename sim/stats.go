package sim

import (
	"strconv"
	"time"
)

// SeriesPoint is one real second of one org's traffic, for plots.
type SeriesPoint struct {
	T           int64   `json:"t"`     // real seconds since server start
	APIT        float64 `json:"api_t"` // the same instant in API-equivalent seconds
	Admitted    int64   `json:"admitted"`
	Completions int64   `json:"completions"`
	RateLimited int64   `json:"rate_limited"`
	Errors      int64   `json:"errors"`        // other non-200 answers
	InFlight    int64   `json:"in_flight"`     // at the end of the second (now for the last)
	InFlightMax int64   `json:"in_flight_max"` // highest during the second
}

// OrgStats is the traffic of one org since the server started.
type OrgStats struct {
	Name string `json:"name"`
	ID   string `json:"id"`
	// Requests counts every authenticated request to the org, by status;
	// 499 is a request the client abandoned while it was being processed.
	Requests       int64            `json:"requests"`
	ByStatus       map[string]int64 `json:"by_status"`
	RateLimited429 int64            `json:"rate_limited_429"`
	InFlight       int64            `json:"in_flight"`
	MaxInFlight    int64            `json:"max_in_flight"`
	// Completions counts billed requests; the rates are over the server's
	// whole life in real seconds and in API-equivalent minutes.
	Completions          int64         `json:"completions"`
	CompletionsPerS      float64       `json:"completions_per_s"`
	CompletionsPerAPIMin float64       `json:"completions_per_api_min"`
	CostNanos            int64         `json:"cost_nanos"`
	CostUSD              float64       `json:"cost_usd"`
	Pools                []PoolStats   `json:"pools"`
	Series               []SeriesPoint `json:"series,omitempty"`
}

// Stats is a snapshot of the simulator: per-org traffic, bucket minima and
// time series, and the ledger totals. Time is given both in real seconds and
// in API-equivalent seconds (real × Speed).
type Stats struct {
	Speed       float64      `json:"speed"`
	ElapsedS    float64      `json:"elapsed_s"`
	APIElapsedS float64      `json:"api_elapsed_s"`
	Orgs        []OrgStats   `json:"orgs"`
	Billed      LedgerTotals `json:"billed"`
}

// Org returns the stats of the named org, or the zero OrgStats.
func (s Stats) Org(name string) OrgStats {
	for _, o := range s.Orgs {
		if o.Name == name {
			return o
		}
	}
	return OrgStats{}
}

// statuses the simulator answers, for per-status counters.
var statusCodes = [...]int{200, 400, 401, 404, 405, 413, 429, 499, 500, 529}

func statusIndex(code int) int {
	for i, c := range statusCodes {
		if c == code {
			return i
		}
	}
	return len(statusCodes)
}

func (o *orgState) stats(now time.Duration, speed float64, faults *faultSet, withSeries bool) OrgStats {
	st := OrgStats{Name: o.name, ID: o.id, ByStatus: map[string]int64{}}
	for i := range o.status {
		n := o.status[i].Load()
		if n == 0 {
			continue
		}
		st.Requests += n
		k := "other"
		if i < len(statusCodes) {
			k = strconv.Itoa(statusCodes[i])
		}
		st.ByStatus[k] = n
	}
	st.RateLimited429 = o.status[statusIndex(429)].Load()
	st.CostNanos = o.costNanos.Load()
	st.CostUSD = nanosToUSD(st.CostNanos)
	o.mu.Lock()
	st.InFlight = o.inFlight
	st.MaxInFlight = o.maxInFlight
	st.Completions = o.completions
	if withSeries {
		o.pointLocked(now, speed)
		st.Series = append([]SeriesPoint(nil), o.series...)
	}
	o.mu.Unlock()
	if sec := now.Seconds(); sec > 0 {
		st.CompletionsPerS = float64(st.Completions) / sec
		st.CompletionsPerAPIMin = float64(st.Completions) / (sec * speed / 60)
	}
	api := time.Duration(float64(now) * speed)
	for _, p := range o.poolOrder {
		if lim := o.pools[p]; lim != nil {
			st.Pools = append(st.Pools, lim.stats(now, faults.colleague(o.idx, p, api), string(p)))
		}
	}
	return st
}

// pointLocked returns the series point of the real second now falls in,
// extending the series (carrying the in-flight count over quiet seconds).
// o.mu must be held. Callers change o.inFlight before they call it and
// then set the point's figures: the seconds it adds start at the level the
// last point ended with, which held through them (the new level, carried
// back, showed a request admitted now as in flight in the quiet seconds
// before it).
func (o *orgState) pointLocked(now time.Duration, speed float64) *SeriesPoint {
	sec := int64(now / time.Second)
	var level int64
	if n := len(o.series); n > 0 {
		level = o.series[n-1].InFlight
	}
	for int64(len(o.series)) <= sec {
		t := int64(len(o.series))
		o.series = append(o.series, SeriesPoint{T: t, APIT: float64(t) * speed, InFlight: level, InFlightMax: level})
	}
	return &o.series[sec]
}
