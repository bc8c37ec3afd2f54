package rundir

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/apidispatch/apidispatch/store"
)

// resultsFile is results.jsonl: line k is the item given result number k by
// the store. It is only ever appended after a commit, so it can never hold a
// result the store does not; after a crash it may hold fewer, and open
// rebuilds the missing tail from the store.
type resultsFile struct {
	f     *os.File
	w     *bufio.Writer
	lines int64
}

// openResults opens path, drops a torn last line, checks it against the
// store and appends the results the store holds beyond it.
func openResults(ctx context.Context, path string, st store.Store, storeResults int64) (*resultsFile, int64, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, FilePerm)
	if err != nil {
		return nil, 0, err
	}
	lines, good, err := countLines(f)
	if err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("reading %s: %w", path, err)
	}
	if err := f.Truncate(good); err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("dropping a torn last line of %s: %w", path, err)
	}
	if _, err := f.Seek(good, io.SeekStart); err != nil {
		f.Close()
		return nil, 0, err
	}
	if lines > storeResults {
		f.Close()
		return nil, 0, fmt.Errorf("%s has %d results but the run's state has %d: it was written by another run; move it away", path, lines, storeResults)
	}
	rf := &resultsFile{f: f, w: bufio.NewWriterSize(f, 256<<10), lines: lines}
	rebuilt := int64(0)
	if lines < storeResults {
		err := st.Results(ctx, lines, func(rseq int64, line []byte) error {
			if rseq != rf.lines+1 {
				return fmt.Errorf("store result numbers are not consecutive at %d", rseq)
			}
			rebuilt++
			return rf.append(line)
		})
		if err == nil {
			err = rf.w.Flush()
		}
		if err != nil {
			f.Close()
			return nil, 0, fmt.Errorf("rebuilding %s from the run's state: %w", path, err)
		}
	}
	return rf, rebuilt, nil
}

// Sink is a run's results.jsonl bound to its store: the one place outcomes
// become durable and their lines are appended, in the store's result-number
// order. The sync engine and the batch route of one run share one Sink. It
// is safe for concurrent use.
type Sink struct {
	mu sync.Mutex
	st store.Store
	rf *resultsFile
	// Rebuilt is how many lines opening it restored from the store.
	Rebuilt int64
}

// OpenSink opens the results file at path for st: a torn last line is
// dropped and lines the store holds beyond the file are appended.
func OpenSink(ctx context.Context, path string, st store.Store) (*Sink, error) {
	agg, err := st.Aggregate(ctx)
	if err != nil {
		return nil, err
	}
	rf, rebuilt, err := openResults(ctx, path, st, agg.Results)
	if err != nil {
		return nil, err
	}
	return &Sink{st: st, rf: rf, Rebuilt: rebuilt}, nil
}

// Commit makes b durable, then appends the line of every outcome the store
// took (RSeq != 0) and flushes. When the store commit failed nothing was
// written; when an append failed the store holds the outcomes and the
// file is rebuilt from it when it is next opened.
func (s *Sink) Commit(ctx context.Context, b store.Batch) (store.Committed, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	res, err := s.st.Commit(ctx, b)
	if err != nil {
		return res, err
	}
	for i, o := range b.Outcomes {
		if res.RSeq[i] == 0 {
			continue // already terminal: never a second line
		}
		if err := s.rf.append(o.Line); err != nil {
			return res, err
		}
	}
	return res, s.rf.flush()
}

// Close flushes and closes the file.
func (s *Sink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rf.close()
}

func (r *resultsFile) append(line []byte) error {
	if _, err := r.w.Write(line); err != nil {
		return err
	}
	r.lines++
	return r.w.WriteByte('\n')
}

func (r *resultsFile) flush() error { return r.w.Flush() }

func (r *resultsFile) close() error {
	err := r.w.Flush()
	if cerr := r.f.Close(); err == nil {
		err = cerr
	}
	return err
}

// countLines counts newline-terminated lines and returns the byte length of
// that complete prefix.
func countLines(f *os.File) (lines, good int64, err error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return 0, 0, err
	}
	buf := make([]byte, 1<<20)
	var off int64
	for {
		n, rerr := f.Read(buf)
		chunk := buf[:n]
		for {
			i := bytes.IndexByte(chunk, '\n')
			if i < 0 {
				break
			}
			lines++
			good = off + int64(i) + 1
			off += int64(i) + 1
			chunk = chunk[i+1:]
		}
		off += int64(len(chunk))
		if errors.Is(rerr, io.EOF) {
			return lines, good, nil
		}
		if rerr != nil {
			return 0, 0, rerr
		}
	}
}
