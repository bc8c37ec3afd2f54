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

// Entry is one priced answer in the ledger.
type Entry struct {
	Client string     `json:"client"`
	Cost   cost.Nanos `json:"cost_nanos"`
	// Unread is the part of Cost that is a worst case: attempts the API
	// may have billed whose answers were never read (a connection reset
	// or a body cut after the request went out, a stream cut before its
	// message_stop, a request in flight when a gateway died). Cost less
	// Unread is what the answers that were read cost, to the nano-dollar.
	Unread    cost.Nanos `json:"unread_nanos,omitempty"`
	Org       string     `json:"org,omitempty"`
	Model     string     `json:"model,omitempty"`
	RequestID string     `json:"request_id,omitempty"`
	Route     string     `json:"route,omitempty"` // sync or batch
	BatchID   string     `json:"batch_id,omitempty"`
	Abandoned bool       `json:"abandoned,omitempty"`
	// Estimated: the model has no price in the table; Cost is at its
	// pool's most expensive known model's prices (unknown.go).
	Estimated bool      `json:"estimated,omitempty"`
	TS        time.Time `json:"ts"`
}

// account is one client's (or the gateway's) spend in the ledger.
type account struct {
	spent, unread      cost.Nanos
	requests, abandond int64
	byOrg              map[string]cost.Nanos
}

// Ledger is the durable record of what the gateway spent: every priced
// answer and every ended gateway batch, one Entry a line of ledger.jsonl
// in the state directory, summed again at start to seed the spend gates
// (package spend), so caps hold across restarts. The gates decide; the
// ledger records. It is safe for concurrent use.
type Ledger struct {
	mu      sync.Mutex
	clients map[string]*account
	total   account
	batches map[string]bool // gateway batches billed
	// pend holds the lines recorded since the last Flush, in order; mu
	// guards it. Flush writes them with fmu held and mu released, so a
	// write to the file never holds up the requests being recorded.
	pend []byte
	// full is signalled when pend passes ledgerPendMax, so the owner
	// writes it before the next tick (as a 64 KB write buffer did).
	full chan struct{}
	fmu  sync.Mutex
	f    *os.File
	werr error // the first write error; guarded by fmu
}

// OpenLedger opens (creating) the ledger file at path ("" for none) and
// sums what it holds.
func OpenLedger(path string) (*Ledger, error) {
	l := &Ledger{clients: map[string]*account{}, batches: map[string]bool{}, full: make(chan struct{}, 1)}
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
	l.f = f
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
	a.unread += e.Unread
	a.requests++
	if e.Cost != 0 {
		org := e.Org
		if org == "" {
			org = OrgGatewayBatches // a gateway batch spans orgs
		}
		for _, acc := range []*account{a, &l.total} {
			if acc.byOrg == nil {
				acc.byOrg = map[string]cost.Nanos{}
			}
			acc.byOrg[org] += e.Cost
		}
	}
	l.total.spent += e.Cost
	l.total.unread += e.Unread
	l.total.requests++
	if e.Abandoned {
		a.abandond++
		l.total.abandond++
	}
}

// billed reports whether gateway batch id is in the ledger.
func (l *Ledger) billed(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.batches[id]
}

// record adds e for client without a reservation.
func (l *Ledger) record(client string, e Entry) {
	e.Client = client
	if e.TS.IsZero() {
		e.TS = time.Now().UTC()
	}
	var b []byte
	if l.f != nil {
		b, _ = json.Marshal(e) // outside the lock: it is most of the cost
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.addLocked(e)
	if b != nil {
		l.pend = append(append(l.pend, b...), '\n')
		if len(l.pend) >= ledgerPendMax {
			select {
			case l.full <- struct{}{}:
			default:
			}
		}
	}
}

// ledgerPendMax is how many bytes of entries wait for the file at most
// before the gateway's flush loop is woken early.
const ledgerPendMax = 64 << 10

// Flush writes the entries recorded so far to the file.
func (l *Ledger) Flush() error {
	if l.f == nil {
		return nil
	}
	l.fmu.Lock()
	defer l.fmu.Unlock()
	l.mu.Lock()
	b := l.pend
	l.pend = nil
	l.mu.Unlock()
	if len(b) > 0 && l.werr == nil {
		if _, err := l.f.Write(b); err != nil {
			l.werr = err
		}
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

// ClientSpend is one client's line of Totals. CapUSD and InFlight are
// the client's spend gate's (filled in by Gateway.Status).
type ClientSpend struct {
	Client   string  `json:"client"`
	SpentUSD float64 `json:"spent_usd"`
	// UnreadUSD is the part of SpentUSD that is the worst case of answers
	// never read (Entry.Unread): the API may have billed less.
	UnreadUSD float64 `json:"unread_usd,omitempty"`
	CapUSD    float64 `json:"max_cost_usd,omitempty"`
	InFlight  float64 `json:"reserved_usd"`
	Requests  int64   `json:"requests"`
	Abandoned int64   `json:"abandoned"`
	// ByOrg is the client's spend by org in US dollars (gateway batches,
	// which span orgs, under OrgGatewayBatches).
	ByOrg map[string]float64 `json:"spend_by_org_usd,omitempty"`
	// Shared is the client's budget (the total's: the gateway's) in the
	// spend budget every gateway on the Redis shares (--shared); nil
	// without --shared.
	Shared *SharedSpend `json:"shared,omitempty"`
}

// SharedSpend is one budget of the shared spend budget (--shared), for
// every gateway on the Redis: the cap (CapUSD of the same line) is judged
// against SpentUSD + ReservedUSD. When Redis could not be read in time,
// Unavailable says why and the figures are zero.
type SharedSpend struct {
	SpentUSD float64 `json:"spent_usd"`
	// ReservedUSD is the worst case of every gateway's requests and
	// batches in flight, HeldUSD included.
	ReservedUSD float64 `json:"reserved_usd"`
	// HeldUSD is the part of ReservedUSD counted for good: the worst case
	// of work whose cost will never be known (answers never read).
	HeldUSD     float64 `json:"held_usd,omitempty"`
	Unavailable string  `json:"unavailable,omitempty"`
}

func usdByOrg(m map[string]cost.Nanos) map[string]float64 {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]float64, len(m))
	for k, v := range m {
		out[k] = v.USD()
	}
	return out
}

// Totals returns every client's spend in the ledger, sorted by name, and
// the gateway's.
func (l *Ledger) Totals() ([]ClientSpend, ClientSpend) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []ClientSpend
	for c, a := range l.clients {
		out = append(out, ClientSpend{Client: c, SpentUSD: a.spent.USD(), UnreadUSD: a.unread.USD(), Requests: a.requests, Abandoned: a.abandond, ByOrg: usdByOrg(a.byOrg)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Client < out[j].Client })
	t := l.total
	return out, ClientSpend{Client: "*", SpentUSD: t.spent.USD(), UnreadUSD: t.unread.USD(), Requests: t.requests, Abandoned: t.abandond}
}

// clientNames returns the clients the ledger holds spend of.
func (l *Ledger) clientNames() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, 0, len(l.clients))
	for c := range l.clients {
		out = append(out, c)
	}
	return out
}

// spent is what the ledger holds for client.
func (l *Ledger) spent(client string) cost.Nanos {
	l.mu.Lock()
	defer l.mu.Unlock()
	if a := l.clients[client]; a != nil {
		return a.spent
	}
	return 0
}

// OrgGatewayBatches is the key of ByOrg (and Status.OrgSpend) under which
// gateway batches are counted: a batch spans orgs. Its parentheses keep it
// apart from any org's name.
const OrgGatewayBatches = "(gateway batches)"

// ByOrg returns what the ledger holds by org (sync answers) and, under
// OrgGatewayBatches, what gateway batches cost.
func (l *Ledger) ByOrg() map[string]cost.Nanos {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]cost.Nanos, len(l.total.byOrg))
	for k, v := range l.total.byOrg {
		out[k] = v
	}
	return out
}

// totalSpent is what the ledger holds for every client.
func (l *Ledger) totalSpent() cost.Nanos {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total.spent
}

// ErrStateDirBusy: another gateway holds the state directory.
var ErrStateDirBusy = errors.New("gateway: state directory in use by another gateway")
