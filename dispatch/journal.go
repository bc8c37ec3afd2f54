package dispatch

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

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
// possible_duplicate_billing counter, then deleted.
//
// Records (one line each, fields separated by one space):
//
//	S <seq> <attempt>        the request was written to the connection
//	R <seq> <attempt>        a success came back (the API billed it)
//	C <seq> <attempt> <0|1>  the attempt ended otherwise; 1: it may have been billed
const journalGlob = "attempts-*.journal"

// journal is the writer of one process's journal. Its methods are safe for
// concurrent use and do nothing on a nil journal.
type journal struct {
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

// openJournal creates a new journal in dir.
func openJournal(dir string) (*journal, error) {
	name := fmt.Sprintf("attempts-%s-%d.journal", time.Now().UTC().Format("20060102T150405.000000000"), os.Getpid())
	path := filepath.Join(dir, name)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("creating the attempt journal: %w", err)
	}
	return &journal{f: f, path: path, key: journalKey(path)}, nil
}

func (j *journal) write(kind byte, seq, att int64, flag int) {
	if j == nil {
		return
	}
	var a [64]byte
	b := append(a[:0], kind, ' ')
	b = strconv.AppendInt(b, seq, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, att, 10)
	if kind == 'C' {
		b = append(b, ' ', byte('0'+flag))
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

// sent records that attempt att of item seq was written to the connection.
func (j *journal) sent(seq, att int64) { j.write('S', seq, att, 0) }

// succeeded records a success received for attempt att of seq.
func (j *journal) succeeded(seq, att int64) { j.write('R', seq, att, 0) }

// ended records any other end of an attempt; maybeBilled says the API may
// have billed it. Call it before counting the attempt in memory, so that the
// committer never flushes a count the journal does not hold.
func (j *journal) ended(seq, att int64, maybeBilled bool) {
	flag := 0
	if maybeBilled {
		flag = 1
	}
	j.write('C', seq, att, flag)
}

// close closes the journal and, when remove is set (the run ended with
// every attempt accounted for in the store), deletes it.
func (j *journal) close(remove bool) error {
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
	// inFlight: attempts written to the connection with no recorded end.
	inFlight int64
	// successes: seqs whose success was received; those the store still
	// has pending were billed and will be sent (and billed) again.
	successes []int64
	// maybeBilled: C…1 records.
	maybeBilled int64
	// torn: a last line cut short by the death of the process (ignored).
	torn bool
}

// readJournal tallies the journal at path.
func readJournal(path string) (journalTally, error) {
	t := journalTally{path: path}
	f, err := os.Open(path)
	if err != nil {
		return t, err
	}
	defer f.Close()
	type key struct{ seq, att int64 }
	open := map[key]struct{}{}
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
		case fields[0][0] == 'S' && len(fields) == 3:
			open[k] = struct{}{}
		case fields[0][0] == 'R' && len(fields) == 3:
			delete(open, k)
			t.successes = append(t.successes, seq)
		case fields[0][0] == 'C' && len(fields) == 4 && len(fields[3]) == 1 && (fields[3][0] == '0' || fields[3][0] == '1'):
			delete(open, k)
			if fields[3][0] == '1' {
				t.maybeBilled++
			}
		default:
			return t, fmt.Errorf("%s:%d: not a journal record: %q", path, line, bytes.TrimSpace(b))
		}
	}
	t.inFlight = int64(len(open))
	return t, nil
}

// replayJournals counts what the journals left in dir by processes that
// died say may have been billed without the store knowing, adds it to the
// store's possible_duplicate_billing in one commit, and deletes them.
// counters are the store's counters before the replay. It returns the
// number added. A crash during the replay is harmless: the commit marks
// each journal replayed, so a second replay skips it.
func replayJournals(ctx context.Context, dir string, st store.Store, counters map[string]int64) (int64, error) {
	paths, err := filepath.Glob(filepath.Join(dir, journalGlob))
	if err != nil || len(paths) == 0 {
		return 0, err
	}
	var add int64
	ctr := map[string]int64{}
	for _, p := range paths {
		done := "journal:" + filepath.Base(p) + ":replayed"
		if counters[done] != 0 {
			continue
		}
		t, err := readJournal(p)
		if err != nil {
			return 0, fmt.Errorf("%w; it is only used to count possible duplicate billing, so delete it to go on (that count will then miss what it held)", err)
		}
		n := t.inFlight + max(0, t.maybeBilled-counters[journalKey(p)])
		slices.Sort(t.successes)
		for _, seq := range slices.Compact(t.successes) {
			// Still pending: the success never reached the store, and the
			// item is sent (and billed) again.
			its, err := st.Pending(ctx, seq-1, 1)
			if err != nil {
				return 0, err
			}
			if len(its) == 1 && its[0].Seq == seq {
				n++
			}
		}
		add += n
		ctr[done] = 1
	}
	if len(ctr) > 0 {
		ctr[CounterMaybeBilled] = add
		if _, err := st.Commit(ctx, store.Batch{Counters: ctr}); err != nil {
			return 0, fmt.Errorf("recording the attempt journals: %w", err)
		}
	}
	for _, p := range paths {
		if err := os.Remove(p); err != nil {
			return add, err
		}
	}
	return add, nil
}
