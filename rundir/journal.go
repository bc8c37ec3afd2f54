package rundir

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/hex"
	"errors"
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
//	S <seq> <attempt> [worst [tag]] the request was written to the
//	                          connection; worst: the most it can cost, in
//	                          nano-USD (under --max-cost only); tag: whose
//	                          spend it is, hex-encoded (the gateway's client)
//	R <seq> <attempt>        a success came back (the API billed it)
//	C <seq> <attempt> <0|1>  the attempt ended otherwise; 1: it may have been billed
//
// The gateway keeps one too (OpenDurableJournal, in its state directory):
// each reservation is journaled (SentTagged) before its request is sent,
// durably, and ended once its ledger entry is written; OpenAttempts lists
// what a dead gateway's journals hold as sent and never ended. Each S
// record names its spend (seq, attempt, worst case, client), so any
// process that reads the file, a replica of the same gateway among them,
// can reconcile it against its ledger.
const journalGlob = "attempts-*.journal"

// Journal is the writer of one process's journal. Its methods are safe for
// concurrent use and do nothing on a nil *Journal (SentTagged returns
// ErrJournal).
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
	// durable: SentTagged returns once its record is on disk (fsync);
	// concurrent callers share one fsync. written and synced count the
	// records written and made durable; syncing is set while one caller
	// syncs for all; syncDone is signalled when a sync ends (mu guards
	// them all).
	durable         bool
	syncing         bool
	written, synced uint64
	syncDone        *sync.Cond
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

// OpenDurableJournal creates a new journal in dir whose SentTagged records
// are on disk before it returns (the gateway's: a record must outlive a
// crash of the machine, not only of the process). Concurrent callers share
// each fsync.
func OpenDurableJournal(dir string) (*Journal, error) {
	j, err := OpenJournal(dir)
	if err != nil {
		return nil, err
	}
	j.durable = true
	j.syncDone = sync.NewCond(&j.mu)
	return j, nil
}

// ErrJournal: a durable journal could not write or sync a record (a full
// disk, a failed device); the request it was for must not be sent.
var ErrJournal = errors.New("the attempt journal cannot be written")

func (j *Journal) write(kind byte, seq, att int64, flag int64) {
	j.writeTagged(kind, seq, att, flag, "")
}

// writeTagged writes one record and returns whether it was written.
func (j *Journal) writeTagged(kind byte, seq, att int64, flag int64, tag string) bool {
	if j == nil {
		return false
	}
	var a [128]byte
	b := append(a[:0], kind, ' ')
	b = strconv.AppendInt(b, seq, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, att, 10)
	switch {
	case kind == 'C':
		b = append(b, ' ', byte('0'+flag))
	case kind == 'S' && tag != "":
		b = append(b, ' ')
		b = strconv.AppendInt(b, flag, 10)
		b = append(b, ' ')
		b = hex.AppendEncode(b, []byte(tag))
	case kind == 'S' && flag > 0:
		b = append(b, ' ')
		b = strconv.AppendInt(b, flag, 10)
	}
	b = append(b, '\n')
	// A failed write loses only part of the crash-time count, never an
	// item: the run goes on, and a replay counts what was written.
	j.mu.Lock()
	defer j.mu.Unlock()
	if !j.broken {
		if n, err := j.f.Write(b); err != nil || n != len(b) {
			j.broken = true
		}
	}
	j.written++
	return !j.broken
}

// SentTagged records, as Sent, that attempt att of seq is about to be
// sent, that it can cost at most worst, and whose spend it is (tag, any
// string). On a durable journal it returns once the record is on disk, or
// an error wrapping ErrJournal; the request must not be sent without it.
func (j *Journal) SentTagged(seq, att int64, worst cost.Nanos, tag string) error {
	if tag == "" {
		return fmt.Errorf("%w: an empty tag", ErrJournal)
	}
	if !j.writeTagged('S', seq, att, max(int64(worst), 0), tag) {
		return ErrJournal
	}
	if !j.durable {
		return nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	mine := j.written
	for j.synced < mine && !j.broken {
		if j.syncing {
			j.syncDone.Wait()
			continue
		}
		// Sync for every record written so far, this one and those
		// written while the last sync ran: one fsync for the group.
		j.syncing = true
		upto := j.written
		j.mu.Unlock()
		err := j.f.Sync()
		j.mu.Lock()
		j.syncing = false
		if err != nil {
			j.broken = true
		} else {
			j.synced = max(j.synced, upto)
		}
		j.syncDone.Broadcast()
	}
	if j.broken {
		return ErrJournal
	}
	return nil
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
	// inFlightN their worst cases; open the attempts themselves.
	inFlight  int64
	inFlightN cost.Nanos
	open      []OpenAttempt
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
	type sent struct {
		worst cost.Nanos
		tag   string
	}
	open := map[key]sent{} // sent, not ended: the worst case and the tag
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
		case fields[0][0] == 'S' && len(fields) >= 3 && len(fields) <= 5:
			var rec sent
			if len(fields) >= 4 {
				worst, err := strconv.ParseInt(string(fields[3]), 10, 64)
				if err != nil || worst < 0 {
					return t, fmt.Errorf("%s:%d: not a journal record: %q", path, line, bytes.TrimSpace(b))
				}
				rec.worst = cost.Nanos(worst)
			}
			if len(fields) == 5 {
				tag, err := hex.DecodeString(string(fields[4]))
				if err != nil || len(tag) == 0 {
					return t, fmt.Errorf("%s:%d: not a journal record: %q", path, line, bytes.TrimSpace(b))
				}
				rec.tag = string(tag)
			}
			open[k] = rec
		case fields[0][0] == 'R' && len(fields) == 3:
			t.successN[seq] = max(t.successN[seq], open[k].worst)
			delete(open, k)
			t.successes = append(t.successes, seq)
		case fields[0][0] == 'C' && len(fields) == 4 && len(fields[3]) == 1 && (fields[3][0] == '0' || fields[3][0] == '1'):
			if fields[3][0] == '1' {
				t.maybeBilled++
				t.maybeBilledN = append(t.maybeBilledN, open[k].worst)
			}
			delete(open, k)
		default:
			return t, fmt.Errorf("%s:%d: not a journal record: %q", path, line, bytes.TrimSpace(b))
		}
	}
	t.inFlight = int64(len(open))
	for k, rec := range open {
		t.inFlightN += rec.worst
		t.open = append(t.open, OpenAttempt{Seq: k.seq, Attempt: k.att, Worst: rec.worst, Tag: rec.tag})
	}
	slices.SortFunc(t.open, func(a, b OpenAttempt) int {
		return cmp.Or(cmp.Compare(a.Seq, b.Seq), cmp.Compare(a.Attempt, b.Attempt))
	})
	return t, nil
}

// OpenAttempt is an attempt a journal holds as sent with no recorded end:
// the process that wrote it died before it learnt (or recorded) how the
// attempt ended, so the API may have billed it.
type OpenAttempt struct {
	Seq, Attempt int64
	Worst        cost.Nanos // the most it can cost (0: not priced)
	Tag          string     // SentTagged's tag ("" for Sent's records)
}

// OpenAttempts reads the journals left in dir (by processes that died, or
// that ended with attempts not ended) and returns their paths and every
// attempt they hold as sent with no end, in the order of each file's
// records' seq and attempt. The caller counts them and then deletes the
// files (RemoveJournals).
func OpenAttempts(dir string) (paths []string, open []OpenAttempt, err error) {
	paths, err = filepath.Glob(filepath.Join(dir, journalGlob))
	if err != nil {
		return nil, nil, err
	}
	for _, p := range paths {
		t, err := readJournal(p)
		if err != nil {
			return nil, nil, err
		}
		open = append(open, t.open...)
	}
	return paths, open, nil
}

// RemoveJournals deletes the journal files at paths (OpenAttempts').
func RemoveJournals(paths []string) error {
	for _, p := range paths {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
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
