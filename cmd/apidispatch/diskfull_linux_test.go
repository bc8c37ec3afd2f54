//go:build long

package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/apidispatch/apidispatch/rundir"
)

// TestFullDiskThenResume fills the disk under a running 'apidispatch run':
// once it is under way, its file size limit (RLIMIT_FSIZE) is set just above
// the largest file in the run directory, so the next write that would grow
// a file past it fails (EFBIG), as on a full disk, whichever file it is
// (state.db's WAL, results.jsonl, the attempt journal, events.jsonl). The run
// must stop with exit 4 and say why; then the same command, with room again,
// completes every custom_id exactly once, its cost equal to what the
// simulator billed for distinct requests, and no more requests billed twice
// than the summary's possible_duplicate_billing.
func TestFullDiskThenResume(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	t.Parallel()
	const n = 4000
	r, input, runDir := simAndInput(t, 50, n)
	args := []string{"run", input, "--run-dir", runDir, "--base-url", r.URL, "--speed", "50", "--quiet"}

	c := cliCmd(r, args...)
	var stderr bytes.Buffer
	c.Stdout, c.Stderr = &stderr, &stderr
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- c.Wait() }()
	for r.Server.LedgerTotals().Requests < n/10 {
		select {
		case err := <-exited:
			t.Fatalf("run ended before the disk filled: %v\n%s", err, stderr.String())
		case <-time.After(2 * time.Millisecond):
		}
	}
	var largest int64
	filepath.WalkDir(runDir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				largest = max(largest, fi.Size())
			}
		}
		return nil
	})
	limit := uint64(largest + 256<<10)
	if err := unix.Prlimit(c.Process.Pid, unix.RLIMIT_FSIZE, &unix.Rlimit{Cur: limit, Max: limit}, nil); err != nil {
		t.Fatalf("prlimit: %v", err)
	}
	err := <-exited
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitIncomplete {
		t.Fatalf("run on a full disk: %v, want exit %d\n%s", err, exitIncomplete, stderr.String())
	}
	if !strings.Contains(stderr.String(), "the run's state could not be written") {
		t.Fatalf("the run did not say which write failed:\n%s", stderr.String())
	}
	billed := r.Server.LedgerTotals().Requests
	if billed >= n {
		t.Fatalf("the simulator billed %d of %d before the disk filled: the test proves nothing", billed, n)
	}
	linesAtStop := len(readIDs(t, filepath.Join(runDir, rundir.ResultsFile)))

	s, dups := resumeAndAudit(t, r, args, runDir, n)
	_, why, _ := strings.Cut(stderr.String(), "apidispatch: ")
	t.Logf("disk full at %d of %d billed (%d result lines): %s; after the resume: %d billed twice, %d counted",
		billed, n, linesAtStop, strings.TrimSpace(why), dups, s.PossibleDuplicateBilling)
}
