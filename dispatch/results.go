package dispatch

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

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
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
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
