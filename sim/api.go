package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"time"
)

// SetFaults replaces every fault with faults. Each fault's window is placed
// on the API-time axis now (see Fault.FromNow); a fault without ID gets one.
// It returns an error, and changes nothing, if a fault is invalid or names
// an unknown org.
func (s *Server) SetFaults(faults ...Fault) error {
	return s.changeFaults(true, faults)
}

// AddFault adds faults to those active and returns them with their ids.
func (s *Server) AddFault(faults ...Fault) ([]Fault, error) {
	if err := s.changeFaults(false, faults); err != nil {
		return nil, err
	}
	fs := s.faults.Load().list
	out := make([]Fault, 0, len(faults))
	for _, f := range fs[len(fs)-len(faults):] {
		out = append(out, f.Fault)
	}
	return out, nil
}

// ClearFaults removes the faults with the given ids, or every fault when
// called without ids.
func (s *Server) ClearFaults(ids ...string) {
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	if len(ids) == 0 {
		s.faults.Store(&faultSet{})
		return
	}
	drop := map[string]bool{}
	for _, id := range ids {
		drop[id] = true
	}
	next := &faultSet{}
	for _, f := range s.faults.Load().list {
		if !drop[f.ID] {
			next.list = append(next.list, f)
			next.kinds |= kindBit(f.Kind)
		}
	}
	s.faults.Store(next)
}

// Faults returns the faults currently configured (active or scheduled).
func (s *Server) Faults() []Fault {
	var out []Fault
	for _, f := range s.faults.Load().list {
		out = append(out, f.Fault)
	}
	return out
}

func (s *Server) changeFaults(replace bool, faults []Fault) error {
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	_, now := s.Elapsed()
	next := &faultSet{}
	if !replace {
		next.list = append(next.list, s.faults.Load().list...)
		next.kinds = s.faults.Load().kinds
	}
	for _, f := range faults {
		if err := f.check(); err != nil {
			return fmt.Errorf("%w: %v", ErrConfig, err)
		}
		af := activeFault{Fault: f, org: -1, from: f.Start, to: math.MaxInt64}
		if f.Org != "" {
			o := s.byName[f.Org]
			if o == nil {
				return fmt.Errorf("%w: fault %s names unknown org %q", ErrConfig, f.Kind, f.Org)
			}
			af.org = o.idx
		}
		if f.FromNow {
			af.from = now + f.Start
		}
		if f.Duration > 0 {
			af.to = af.from + f.Duration
		}
		af.capNanos = int64(math.Round(f.SpendCapUSD * 1e9))
		if af.ID == "" {
			s.faultN++
			af.ID = "f" + strconv.Itoa(s.faultN)
		}
		next.list = append(next.list, af)
		next.kinds |= kindBit(f.Kind)
	}
	s.faults.Store(next)
	return nil
}

// Ledger returns every billed request kept in memory (see
// Config.LedgerRetain), in billing order.
func (s *Server) Ledger() []LedgerEntry { return s.LedgerSince(0) }

// LedgerSince returns the billed requests with Seq > seq, in billing order.
// With Mark it isolates one phase of a run (one arm of an A/B).
func (s *Server) LedgerSince(seq int64) []LedgerEntry {
	s.settleBatches()
	var out []LedgerEntry
	for _, o := range s.orgs {
		o.mu.Lock()
		for i := range o.ledger {
			if o.ledger[i].Seq > seq {
				out = append(out, o.ledger[i])
			}
		}
		o.mu.Unlock()
	}
	sortBySeq(out)
	return out
}

// Mark returns the sequence number of the last billed request so far.
func (s *Server) Mark() int64 {
	s.settleBatches()
	return s.seq.Load()
}

// LedgerTotals returns the totals of every billed request since the start
// (whatever LedgerRetain keeps), per org and per key fingerprint, with the
// duplicate billings.
func (s *Server) LedgerTotals() LedgerTotals {
	s.settleBatches()
	t := LedgerTotals{ByOrg: map[string]Totals{}, ByKey: map[string]Totals{}}
	for _, o := range s.orgs {
		var ot Totals
		o.mu.Lock()
		for _, k := range o.keys {
			t.ByKey[k.fp] = k.totals
			ot.merge(k.totals)
		}
		o.mu.Unlock()
		t.ByOrg[o.name] = ot
		t.merge(ot)
	}
	t.DuplicateBodies = s.dupBodies.Load()
	return t
}

// Stats returns a snapshot of every org's traffic with its time series.
func (s *Server) Stats() Stats { return s.stats(true) }

func (s *Server) stats(withSeries bool) Stats {
	real, api := s.Elapsed()
	st := Stats{Speed: s.speed, ElapsedS: real.Seconds(), APIElapsedS: api.Seconds()}
	fs := s.faults.Load()
	for _, o := range s.orgs {
		st.Orgs = append(st.Orgs, o.stats(real, s.speed, fs, withSeries))
	}
	st.Billed = s.LedgerTotals()
	return st
}

// admin serves /sim/stats, /sim/ledger and /sim/faults. They need no key:
// the simulator listens on loopback only.
func (s *Server) admin(c *call) {
	bad := func(status int, msg string) {
		s.writeError(c, nil, &apiError{status: status, typ: "invalid_request_error", msg: msg})
	}
	q := c.r.URL.Query()
	switch c.r.URL.Path {
	case "/sim/stats":
		if c.r.Method != http.MethodGet {
			bad(http.StatusMethodNotAllowed, "use GET")
			return
		}
		b, _ := json.Marshal(s.stats(q.Get("series") != "0"))
		writeJSON(c, http.StatusOK, b)
	case "/sim/ledger":
		if c.r.Method != http.MethodGet {
			bad(http.StatusMethodNotAllowed, "use GET")
			return
		}
		since, _ := strconv.ParseInt(q.Get("since"), 10, 64)
		c.h[hContentType] = []string{"application/x-ndjson"}
		WriteLedgerJSONL(c.w, s.LedgerSince(since))
	case "/sim/faults":
		var err error
		switch c.r.Method {
		case http.MethodGet:
		case http.MethodPost, http.MethodPut:
			var fs []Fault
			fs, err = readFaults(c.r.Body)
			if err == nil && c.r.Method == http.MethodPut {
				err = s.SetFaults(fs...)
			} else if err == nil {
				_, err = s.AddFault(fs...)
			}
		case http.MethodDelete:
			if id := q.Get("id"); id != "" {
				s.ClearFaults(id)
			} else {
				s.ClearFaults()
			}
		default:
			bad(http.StatusMethodNotAllowed, "use GET, POST, PUT or DELETE")
			return
		}
		if err != nil {
			bad(http.StatusBadRequest, err.Error())
			return
		}
		b, _ := json.Marshal(struct {
			Faults []Fault `json:"faults"`
			APIS   float64 `json:"api_s"`
		}{s.Faults(), s.apiNow().Seconds()})
		writeJSON(c, http.StatusOK, b)
	}
}

func (s *Server) apiNow() time.Duration {
	_, api := s.Elapsed()
	return api
}

// readFaults reads one fault object, an array of them, or {"faults":[...]}.
func readFaults(r io.Reader) ([]Fault, error) {
	b, err := io.ReadAll(io.LimitReader(r, 1<<20))
	if err != nil {
		return nil, err
	}
	var list []Fault
	if json.Unmarshal(b, &list) == nil {
		return list, nil
	}
	var wrap struct {
		Faults []Fault `json:"faults"`
	}
	if err := strictUnmarshal(b, &wrap); err == nil && wrap.Faults != nil {
		return wrap.Faults, nil
	}
	var one Fault
	if err := json.Unmarshal(b, &one); err != nil {
		return nil, fmt.Errorf("faults: want a fault object, an array of them, or {\"faults\":[...]}: %v", err)
	}
	return []Fault{one}, nil
}
