package apihttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestAttemptOutlivesAStop: a child process sends one request with a 1 s
// AttemptContext to a server that answers after 1.5 s; the child is
// stopped (SIGSTOP) 100 ms in, for 2.5 s, past its deadline and past the
// answer, then continued. It reads the answer waiting in its socket
// instead of timing out (and, in a real run, sending and paying for it
// again). With context.WithTimeout the child timed out in two runs of
// three: on resume the late timer and the waiting answer race.
func TestAttemptOutlivesAStop(t *testing.T) {
	if url := os.Getenv("APIHTTP_ATTEMPT_CHILD"); url != "" {
		ctx, cancel := AttemptContext(context.Background(), time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Println("ERROR", err)
			os.Exit(0)
		}
		b, _ := io.ReadAll(resp.Body)
		fmt.Println("ANSWER", string(b))
		os.Exit(0)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(1500 * time.Millisecond)
		io.WriteString(w, "billed once")
	}))
	defer srv.Close()
	c := exec.Command(os.Args[0], "-test.run", "^TestAttemptOutlivesAStop$")
	c.Env = append(os.Environ(), "APIHTTP_ATTEMPT_CHILD="+srv.URL)
	var out strings.Builder
	c.Stdout = &out
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	c.Process.Signal(syscall.SIGSTOP)
	time.Sleep(2500 * time.Millisecond)
	c.Process.Signal(syscall.SIGCONT)
	if err := c.Wait(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "ANSWER billed once") {
		t.Fatalf("the stopped attempt did not read its answer: %q", out.String())
	}
}

// TestAttemptStillTimesOut: an attempt that is really slow ends at its
// deadline with context.DeadlineExceeded.
func TestAttemptStillTimesOut(t *testing.T) {
	ctx, cancel := AttemptContext(context.Background(), 50*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	<-ctx.Done()
	if d := time.Since(t0); d < 50*time.Millisecond || d > time.Second {
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
}
