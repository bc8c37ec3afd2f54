package main

import (
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestBatchSecondSignalExitsAtOnce: a second signal on the batch route
// exits at once (exit 4, saying so); the run directory stays consistent:
// the same command then completes every item once, none billed twice.
func TestBatchSecondSignalExitsAtOnce(t *testing.T) {
	t.Parallel()
	const n = 1500
	r, input, runDir := slowBatches(t, n)
	args := []string{"run", input, "--route", "batch", "--run-dir", runDir, "--base-url", r.URL, "--speed", "20", "--quiet"}
	c, out, exited := startUntilBatches(t, r, 3, args...)
	time.Sleep(100 * time.Millisecond)
	// Two signals of one kind may merge while pending: the second is a
	// SIGTERM, which the run treats alike.
	c.Process.Signal(os.Interrupt)
	c.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the run did not exit within 10 s of the second SIGINT")
	}
	if code := c.ProcessState.ExitCode(); code != exitIncomplete || !strings.Contains(out.String(), "abandoning: exiting now") {
		t.Fatalf("exit %d; want 4, saying it exits at once:\n%s", code, tail(out.String()))
	}
	if code, _, stderr := runCmdOut(t, r, args...); code != exitOK {
		t.Fatalf("the resumed run: exit %d\n%s", code, tail(stderr))
	}
	requireEachOnce(t, runDir, n)
	if _, billed, twice := batchLedger(r); billed != n || twice != 0 {
		t.Fatalf("billed %d (%d twice); want %d, none twice", billed, twice, n)
	}
}
