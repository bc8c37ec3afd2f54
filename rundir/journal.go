package rundir

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/store"
)

// The attempt journal records, for each attempt of a run, that its request
// was written to the connection and how it ended. It is what lets a run that
// was killed (kill -9, a crash of the process) count the requests the API
// may have billed that the store never heard of: those in flight at the
// kill, the successes received but not yet committed (they are sent again on
// resume), and ambiguous failures whose counter was not yet flushed. Every
// record is one write(2) of one line, with no fsync: the page cache survives
// the death of the process, which is the failure it is for. A crash of the
// whole machine can lose the journal's last lines, and with them part of
// that count (never an item: the store is synced).
//
// A journal that ends with its run is deleted; one found at the start of a
// run was left by a process that died, and is replayed into the store's
// possible_duplicate_billing counter (and the worst case of those requests
// into possible_duplicate_billing_nanos, which a resume's spend gate counts
// as spent), then deleted.
//
// Records (one line each, fields separated by one space):
//
//	S <seq> <attempt> [worst] the request was written to the connection;
//	                          worst: the most it can cost, in nano-USD
//	                          (under --max-cost only)
//	R <seq> <attempt>        a success came back (the API billed it)
//	C <seq> <attempt> <0|1>  the attempt ended otherwise; 1: it may have been billed
const journalGlob = "attempts-*.journal"

// Journal is the writer of one process's journal. Its methods are safe for
// concurrent use and do nothing on a nil *Journal.
type Journal struct {
	mu sync.Mutex
	f  *os.File
	// broken is set by the first failed or short write (a full disk):
	// nothing is written after it, so that a record cut short can only be
	// the last line, which the replay ignores, and never garbage in the
	// middle that would make the journal unreadable.
	broken bool
	path   string
	// key is the store counter holding how many of this journal's C…1
	// records the committer has flushed into CounterMaybeBilled.
	key string
}

// journalKey is the store counter for the journal file at path.
func journalKey(path string) string { return "journal:" + filepath.Base(path) + ":flushed" }

// Key is the store counter in which the run's committer records how many
// of this journal's maybe-billed records (C…1) it has flushed into
// CounterMaybeBilled, so that a replay counts only the rest.
func (j *Journal) Key() string { return j.key }

// OpenJournal creates a new journal in dir.
func OpenJournal(dir string) (*Journal, error) {
	name := fmt.Sprintf("attempts-%s-%d.journal", time.Now().UTC().Format("20060102T150405.000000000"), os.Getpid())
	path := filepath.Join(dir, name)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("creating the attempt journal: %w", err)
	}
	return &Journal{f: f, path: path, key: journalKey(path)}, nil
}

func (j *Journal) write(kind byte, seq, att int64, flag int64) {
	if j == nil {
		return
	}
	var a [64]byte
	b := append(a[:0], kind, ' ')
	b = strconv.AppendInt(b, seq, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, att, 10)
	switch {
	case kind == 'C':
		b = append(b, ' ', byte('0'+flag))
	case kind == 'S' && flag > 0:
		b = append(b, ' ')
		b = strconv.AppendInt(b, flag, 10)
	}
	b = append(b, '\n')
	// A failed write loses only part of the crash-time count, never an
	// item: the run goes on, and a replay counts what was written.
	j.mu.Lock()
	if !j.broken {
		if n, err := j.f.Write(b); err != nil || n != len(b) {
			j.broken = true
		}
	}
	j.mu.Unlock()
}

// Sent records that attempt att of item seq was written to the connection,
// and the most it can cost (0: not priced, no --max-cost).
func (j *Journal) Sent(seq, att int64, worst cost.Nanos) { j.write('S', seq, att, int64(worst)) }

// Succeeded records a success received for attempt att of seq.
func (j *Journal) Succeeded(seq, att int64) { j.write('R', seq, att, 0) }

// Ended records any other end of an attempt; maybeBilled says the API may
// have billed it. Call it before counting the attempt in memory, so that the
// committer never flushes a count the journal does not hold.
func (j *Journal) Ended(seq, att int64, maybeBilled bool) {
	flag := int64(0)
	if maybeBilled {
		flag = 1
	}
	j.write('C', seq, att, flag)
}

// Close closes the journal and, when remove is set (the run ended with
// every attempt accounted for in the store), deletes it.
func (j *Journal) Close(remove bool) error {
	if j == nil {
		return nil
	}
	err := j.f.Close()
	if remove && err == nil {
		err = os.Remove(j.path)
	}
	return err
}

// journalTally is what one replayed journal says.
type journalTally struct {
	path string
	// inFlight: attempts written to the connection with no recorded end;
	// inFlightN their worst cases.
	inFlight  int64
	inFlightN cost.Nanos
	// successes: seqs whose success was received; those the store still
	// has pending were billed and will be sent (and billed) again.
	// successN is the worst case of each seq's success (the largest).
	successes []int64
	successN  map[int64]cost.Nanos
	// maybeBilled: C…1 records; maybeBilledN their worst cases.
	maybeBilled  int64
	maybeBilledN []cost.Nanos
	// torn: a last line cut short by the death of the process (ignored).
	torn bool
}

// readJournal tallies the journal at path.
func readJournal(path string) (journalTally, error) {
	t := journalTally{path: path, successN: map[int64]cost.Nanos{}}
	f, err := os.Open(path)
	if err != nil {
		return t, err
	}
	defer f.Close()
	type key struct{ seq, att int64 }
	open := map[key]cost.Nanos{} // sent, not ended: the worst case
	r := bufio.NewReaderSize(f, 256<<10)
	for line := 1; ; line++ {
		b, err := r.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			return t, fmt.Errorf("%s:%d: not a journal record", path, line)
		}
		if err != nil {
			// EOF: a last line without its newline was cut short.
			t.torn = len(b) > 0
			break
		}
		fields := bytes.Fields(b)
		bad := len(fields) < 3 || len(fields[0]) != 1
		var seq, att int64
		if !bad {
			seq, err = strconv.ParseInt(string(fields[1]), 10, 64)
			bad = err != nil
			att, err = strconv.ParseInt(string(fields[2]), 10, 64)
			bad = bad || err != nil
		}
		if bad {
			return t, fmt.Errorf("%s:%d: not a journal record: %q", path, line, bytes.TrimSpace(b))
		}
		k := key{seq, att}
		switch {
		case fields[0][0] == 'S' && (len(fields) == 3 || len(fields) == 4):
			var worst int64
			if len(fields) == 4 {
				if worst, err = strconv.ParseInt(string(fields[3]), 10, 64); err != nil || worst < 0 {
					return t, fmt.Errorf("%s:%d: not a journal record: %q", path, line, bytes.TrimSpace(b))
				}
			}
			open[k] = cost.Nanos(worst)
		case fields[0][0] == 'R' && len(fields) == 3:
			t.successN[seq] = max(t.successN[seq], open[k])
			delete(open, k)
			t.successes = append(t.successes, seq)
		case fields[0][0] == 'C' && len(fields) == 4 && len(fields[3]) == 1 && (fields[3][0] == '0' || fields[3][0] == '1'):
			if fields[3][0] == '1' {
				t.maybeBilled++
				t.maybeBilledN = append(t.maybeBilledN, open[k])
			}
			delete(open, k)
		default:
			return t, fmt.Errorf("%s:%d: not a journal record: %q", path, line, bytes.TrimSpace(b))
		}
	}
	t.inFlight = int64(len(open))
	for _, w := range open {
		t.inFlightN += w
	}
	return t, nil
}

// Replay replays the journals in dir (replayJournals) and says so in an
// event and the log (nil: none). It returns the worst case replayed.
func Replay(ctx context.Context, dir string, st store.Store, counters map[string]int64, events *EventLog, log *slog.Logger) (cost.Nanos, error) {
	n, nanos, err := replayJournals(ctx, dir, st, counters)
	if err != nil || n == 0 {
		return nanos, err
	}
	events.Emit(EventWarning, fmt.Sprintf("an earlier run of this directory died with requests in flight or unrecorded: %d may have been billed and will be sent again (counted in possible_duplicate_billing)", n), map[string]any{"possible_duplicate_billing": n, "possible_duplicate_billing_usd": nanos.USD()})
	if log != nil {
		log.Warn("an earlier run died with requests in flight or unrecorded", "possible_duplicate_billing", n)
	}
	return nanos, nil
}

// ReplayJournals counts what the attempt journals of processes that died
// on this run directory say may have been billed without the store
// knowing (possible_duplicate_billing and its worst case), once. Call it
// before reading what the run spent (SpentBefore): a resume's spend gate
// then counts it.
func (j *Job) ReplayJournals(ctx context.Context) error {
	agg, err := j.Store.Aggregate(ctx)
	if err != nil {
		return err
	}
	_, err = Replay(ctx, j.Dir, j.Store, agg.Counters, j.Events, nil)
	return err
}

// replayJournals counts what the journals left in dir by processes that
// died say may have been billed without the store knowing, adds it to the
// store's possible_duplicate_billing (and its worst case to
// possible_duplicate_billing_nanos) in one commit, and deletes them.
// counters are the store's counters before the replay. It returns the
// number added and their worst case. A crash during the replay is
// harmless: the commit marks each journal replayed, so a second replay
// skips it.
func replayJournals(ctx context.Context, dir string, st store.Store, counters map[string]int64) (int64, cost.Nanos, error) {
	paths, err := filepath.Glob(filepath.Join(dir, journalGlob))
	if err != nil || len(paths) == 0 {
		return 0, 0, err
	}
	var add int64
	var addN cost.Nanos
	ctr := map[string]int64{}
	for _, p := range paths {
		done := "journal:" + filepath.Base(p) + ":replayed"
		if counters[done] != 0 {
			continue
		}
		t, err := readJournal(p)
		if err != nil {
			return 0, 0, fmt.Errorf("%w; it is only used to count possible duplicate billing, so delete it to go on (that count will then miss what it held)", err)
		}
		unflushed := max(0, t.maybeBilled-counters[journalKey(p)])
		n := t.inFlight + unflushed
		nanos := t.inFlightN
		// Which maybe-billed ends the committer flushed (with their worst
		// case) is not known, only how many: count the largest of the rest.
		slices.Sort(t.maybeBilledN)
		for _, w := range t.maybeBilledN[max(0, int64(len(t.maybeBilledN))-unflushed):] {
			nanos += w
		}
		slices.Sort(t.successes)
		for _, seq := range slices.Compact(t.successes) {
			// Still pending: the success never reached the store, and the
			// item is sent (and billed) again.
			its, err := st.Pending(ctx, seq-1, 1)
			if err != nil {
				return 0, 0, err
			}
			if len(its) == 1 && its[0].Seq == seq {
				n++
				nanos += t.successN[seq]
			}
		}
		add += n
		addN += nanos
		ctr[done] = 1
	}
	if len(ctr) > 0 {
		ctr[CounterMaybeBilled] = add
		if addN > 0 {
			ctr[CounterMaybeBilledNanos] = int64(addN)
		}
		if _, err := st.Commit(ctx, store.Batch{Counters: ctr}); err != nil {
			return 0, 0, fmt.Errorf("recording the attempt journals: %w", err)
		}
	}
	for _, p := range paths {
		if err := os.Remove(p); err != nil {
			return add, addN, err
		}
	}
	return add, addN, nil
}
