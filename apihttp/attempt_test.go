package apihttp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"
)

// TestAttemptOutlivesAStop: a child process sends one request with an
// AttemptContext of d; once the request has reached the server the child is
// stopped (SIGSTOP), kept stopped until past its deadline by more than
// pausedAfter, the answer is written into its socket, and the child is
// continued. It reads the answer waiting in its socket instead of timing out
// (and, in a real run, sending and paying for it again). With
// context.WithTimeout the child timed out in two runs of three: on resume the
// late timer and the waiting answer race.
//
// Nothing here races a fixed sleep: the stop starts when the server has the
// request, and lasts until the child's own deadline (sent in a header) plus
// pausedAfter plus d. The one thing a loaded machine can spoil is the stop
// landing before the deadline at all; then the case is run again with twice
// the d, and only a child that timed out while stopped in time fails.
func TestAttemptOutlivesAStop(t *testing.T) {
	if url := os.Getenv("APIHTTP_ATTEMPT_CHILD"); url != "" {
		d, err := time.ParseDuration(os.Getenv("APIHTTP_ATTEMPT_D"))
		if err != nil {
			fmt.Println("ERROR", err)
			os.Exit(0)
		}
		ctx, cancel := AttemptContext(context.Background(), d)
		defer cancel()
		due, _ := ctx.Deadline()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		req.Header.Set("X-Attempt-Due", strconv.FormatInt(due.UnixNano(), 10))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Println("ERROR", err)
			os.Exit(0)
		}
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			fmt.Println("ERROR", err)
			os.Exit(0)
		}
		fmt.Println("ANSWER", string(b))
		os.Exit(0)
	}
	for d := 2 * time.Second; ; d *= 2 {
		out, stoppedInTime := stopPastTheDeadline(t, d)
		if stoppedInTime {
			if !strings.Contains(out, "ANSWER billed once") {
				t.Fatalf("the stopped attempt (d %v) did not read its answer: %q", d, out)
			}
			return
		}
		if d >= 16*time.Second {
			t.Fatalf("the child was stopped only after its deadline even with d %v: the machine is too loaded for this test", d)
		}
		t.Logf("the child was stopped only after its %v deadline (a loaded machine); again with %v", d, 2*d)
	}
}

// stopPastTheDeadline runs one child of TestAttemptOutlivesAStop with an
// attempt of d and returns what it printed, and whether the stop began
// before the attempt's deadline (if not, the run proves nothing).
func stopPastTheDeadline(t *testing.T, d time.Duration) (string, bool) {
	t.Helper()
	arrived := make(chan time.Time, 1) // the attempt's deadline, from its header
	release := make(chan struct{})
	written := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ns, err := strconv.ParseInt(r.Header.Get("X-Attempt-Due"), 10, 64)
		if err != nil {
			http.Error(w, "no X-Attempt-Due", http.StatusBadRequest)
			return
		}
		arrived <- time.Unix(0, ns)
		<-release
		io.WriteString(w, "billed once")
		w.(http.Flusher).Flush()
		close(written)
	}))
	defer srv.Close()
	var releaseOnce sync.Once
	answer := func() { releaseOnce.Do(func() { close(release) }) }
	defer answer() // before srv.Close, which waits for the handler

	c := exec.Command(os.Args[0], "-test.run", "^TestAttemptOutlivesAStop$")
	c.Env = append(os.Environ(), "APIHTTP_ATTEMPT_CHILD="+srv.URL, "APIHTTP_ATTEMPT_D="+d.String())
	var out strings.Builder
	c.Stdout = &out
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- c.Wait() }()
	defer func() {
		c.Process.Signal(syscall.SIGCONT)
		c.Process.Kill()
	}()

	var due time.Time
	select {
	case due = <-arrived:
	case err := <-exited:
		t.Fatalf("the child ended before its request arrived: %v %q", err, out.String())
	}
	if err := c.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitStopped(t, c.Process.Pid)
	if stoppedAt := time.Now(); !stoppedAt.Before(due) {
		answer()
		c.Process.Signal(syscall.SIGCONT)
		<-exited
		return out.String(), false
	}
	// Stopped before its deadline: stay stopped until the deadline is
	// pausedAfter+d behind, so its timer fires late by more than pausedAfter
	// whatever the load, and the answer is in the socket before it resumes.
	time.Sleep(time.Until(due.Add(pausedAfter + d)))
	answer()
	<-written
	if err := c.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if err := <-exited; err != nil {
		t.Fatalf("child: %v %q", err, out.String())
	}
	return out.String(), true
}

// waitStopped returns once the process is in the stopped state ('T' in
// /proc/PID/stat), so the time taken after it is a time the process was
// already stopped at.
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	for range 10000 {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			t.Fatal(err)
		}
		// The state follows the command name, which is in parentheses.
		if i := bytes.LastIndexByte(b, ')'); i > 0 && i+2 < len(b) && b[i+2] == 'T' {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("process %d is not stopped 10,000 looks after SIGSTOP", pid)
}

// TestAttemptStillTimesOut: an attempt that is really slow ends at its
// deadline with context.DeadlineExceeded. In a synctest bubble the timer
// fires exactly on time, so the bound is exact and no load can move it.
func TestAttemptStillTimesOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := AttemptContext(context.Background(), 50*time.Millisecond)
		defer cancel()
		t0 := time.Now()
		<-ctx.Done()
		if d := time.Since(t0); d != 50*time.Millisecond {
			t.Fatalf("ended after %v, want 50 ms", d)
		}
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			t.Fatalf("Err = %v, want DeadlineExceeded", ctx.Err())
		}
		ctx2, cancel2 := AttemptContext(context.Background(), time.Hour)
		cancel2()
		if !errors.Is(ctx2.Err(), context.Canceled) {
			t.Fatalf("cancelled: Err = %v, want Canceled", ctx2.Err())
		}
	})
}
