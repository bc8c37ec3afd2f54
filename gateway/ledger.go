package gateway

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/apidispatch/apidispatch/cost"
)

// Spend is the per-client spend check the gateway consumes: before a
// request is sent, its worst case is reserved against the client's and the
// gateway's caps; once it is answered the reservation is settled at the
// actual cost. Ledger is the in-process implementation; the run-wide
// spend gate (package spend) can take its place.
type Spend interface {
	// Reserve holds worst for client, or returns an error wrapping
	// ErrOverCap (an *OverCapError) when a cap would be passed.
	Reserve(client string, worst cost.Nanos) (Hold, error)
}

// Hold is one reservation of Spend.
type Hold interface {
	// Settle replaces the reservation by what the request cost; abandoned
	// marks a request whose client went away before the answer.
	Settle(e Entry)
}

// Entry is one priced answer in the ledger.
type Entry struct {
	Client    string     `json:"client"`
	Cost      cost.Nanos `json:"cost_nanos"`
	Org       string     `json:"org,omitempty"`
	Model     string     `json:"model,omitempty"`
	RequestID string     `json:"request_id,omitempty"`
	Route     string     `json:"route,omitempty"` // sync or batch
	BatchID   string     `json:"batch_id,omitempty"`
	Abandoned bool       `json:"abandoned,omitempty"`
	TS        time.Time  `json:"ts"`
}

// ErrOverCap: a request would pass a client's or the gateway's max_cost.
var ErrOverCap = errors.New("gateway: max cost reached")

// OverCapError says which cap a request would pass.
type OverCapError struct {
	Who      string // "client NAME" or "the gateway"
	Cap      cost.Nanos
	Spent    cost.Nanos
	Reserved cost.Nanos
	Worst    cost.Nanos
}

func (e *OverCapError) Error() string {
	return fmt.Sprintf("%s: max_cost %s would be passed: %s spent, %s reserved by requests in flight, this request may cost up to %s",
		e.Who, e.Cap, e.Spent, e.Reserved, e.Worst)
}

// Is makes errors.Is(err, ErrOverCap) true.
func (e *OverCapError) Is(target error) bool { return target == ErrOverCap }

// account is one client's (or the gateway's) spend.
type account struct {
	cap                cost.Nanos
	spent, reserved    cost.Nanos
	requests, abandond int64
}

// Ledger prices every answer into a per-client account, persisted as
// ledger.jsonl (one Entry a line) in the gateway's state directory and
// summed again at start, so caps hold across restarts. It is safe for
// concurrent use.
type Ledger struct {
	mu      sync.Mutex
	clients map[string]*account
	total   account
	batches map[string]bool // gateway batches billed
	w       *bufio.Writer
	f       *os.File
	werr    error
}

// OpenLedger opens (creating) the ledger file at path, sums what it holds,
// and sets the caps: caps by client name, and gatewayCap for all (0: none).
func OpenLedger(path string, caps map[string]cost.Nanos, gatewayCap cost.Nanos) (*Ledger, error) {
	l := &Ledger{clients: map[string]*account{}, batches: map[string]bool{}}
	l.total.cap = gatewayCap
	for c, v := range caps {
		l.clients[c] = &account{cap: v}
	}
	if path == "" {
		return l, nil
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("gateway: ledger: %w", err)
	}
	r := bufio.NewReader(f)
	for n := 1; ; n++ {
		line, err := r.ReadBytes('\n')
		if len(line) > 0 && line[len(line)-1] == '\n' {
			var e Entry
			if json.Unmarshal(line, &e) != nil {
				f.Close()
				return nil, fmt.Errorf("gateway: ledger %s line %d is not a ledger entry", path, n)
			}
			l.addLocked(e)
		}
		// A last line without its newline was cut by a crash: it is
		// overwritten by the next entry's newline-first write below.
		if err == io.EOF {
			if len(line) > 0 && line[len(line)-1] != '\n' {
				f.Write([]byte("\n"))
			}
			break
		}
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("gateway: ledger: %w", err)
		}
	}
	l.f, l.w = f, bufio.NewWriterSize(f, 64<<10)
	return l, nil
}

func (l *Ledger) acct(client string) *account {
	a := l.clients[client]
	if a == nil {
		a = &account{}
		l.clients[client] = a
	}
	return a
}

func (l *Ledger) addLocked(e Entry) {
	a := l.acct(e.Client)
	if e.BatchID != "" {
		l.batches[e.BatchID] = true
	}
	a.spent += e.Cost
	a.requests++
	l.total.spent += e.Cost
	l.total.requests++
	if e.Abandoned {
		a.abandond++
		l.total.abandond++
	}
}

// Reserve implements Spend.
func (l *Ledger) Reserve(client string, worst cost.Nanos) (Hold, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	a := l.acct(client)
	if a.cap > 0 && a.spent+a.reserved+worst > a.cap {
		return nil, &OverCapError{Who: "client " + client, Cap: a.cap, Spent: a.spent, Reserved: a.reserved, Worst: worst}
	}
	if l.total.cap > 0 && l.total.spent+l.total.reserved+worst > l.total.cap {
		return nil, &OverCapError{Who: "the gateway (--max-cost)", Cap: l.total.cap, Spent: l.total.spent, Reserved: l.total.reserved, Worst: worst}
	}
	a.reserved += worst
	l.total.reserved += worst
	return &ledgerHold{l: l, client: client, worst: worst}, nil
}

type ledgerHold struct {
	l      *Ledger
	client string
	worst  cost.Nanos
	done   bool
}

// Settle implements Hold. A zero-cost entry without a request id (nothing
// was answered) only frees the reservation.
func (h *ledgerHold) Settle(e Entry) {
	l := h.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if h.done {
		return
	}
	h.done = true
	a := l.acct(h.client)
	a.reserved -= h.worst
	l.total.reserved -= h.worst
	if e.Cost == 0 && e.RequestID == "" && e.BatchID == "" {
		return
	}
	e.Client = h.client
	l.appendLocked(e)
}

// billed reports whether gateway batch id is in the ledger.
func (l *Ledger) billed(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.batches[id]
}

// record adds e for client without a reservation.
func (l *Ledger) record(client string, e Entry) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e.Client = client
	l.appendLocked(e)
}

func (l *Ledger) appendLocked(e Entry) {
	if e.TS.IsZero() {
		e.TS = time.Now().UTC()
	}
	l.addLocked(e)
	if l.w != nil && l.werr == nil {
		b, _ := json.Marshal(e)
		l.w.Write(b)
		if err := l.w.WriteByte('\n'); err != nil {
			l.werr = err
		}
	}
}

// Flush writes buffered entries to the file.
func (l *Ledger) Flush() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.w == nil {
		return nil
	}
	if err := l.w.Flush(); err != nil && l.werr == nil {
		l.werr = err
	}
	return l.werr
}

// Close flushes and closes the file.
func (l *Ledger) Close() error {
	err := l.Flush()
	if l.f != nil {
		if cerr := l.f.Close(); err == nil {
			err = cerr
		}
	}
	return err
}

// ClientSpend is one client's line of Totals.
type ClientSpend struct {
	Client    string  `json:"client"`
	SpentUSD  float64 `json:"spent_usd"`
	CapUSD    float64 `json:"max_cost_usd,omitempty"`
	InFlight  float64 `json:"reserved_usd"`
	Requests  int64   `json:"requests"`
	Abandoned int64   `json:"abandoned"`
}

// Totals returns every client's spend, sorted by name, and the gateway's.
func (l *Ledger) Totals() ([]ClientSpend, ClientSpend) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []ClientSpend
	for c, a := range l.clients {
		out = append(out, ClientSpend{Client: c, SpentUSD: a.spent.USD(), CapUSD: a.cap.USD(), InFlight: a.reserved.USD(), Requests: a.requests, Abandoned: a.abandond})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Client < out[j].Client })
	t := l.total
	return out, ClientSpend{Client: "*", SpentUSD: t.spent.USD(), CapUSD: t.cap.USD(), InFlight: t.reserved.USD(), Requests: t.requests, Abandoned: t.abandond}
}

// ErrStateDirBusy: another gateway holds the state directory.
var ErrStateDirBusy = errors.New("gateway: state directory in use by another gateway")
