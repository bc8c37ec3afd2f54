package sqlite

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/store"
	"github.com/apidispatch/apidispatch/store/storetest"
)

// crashChildEnv, when set to a store path, turns TestCrashMidCommit into the
// child that commits in a loop until it is killed.
const crashChildEnv = "APIDISPATCH_STORE_CRASH_CHILD"

const (
	crashItems = 3000
	crashBatch = 64
)

// TestCrashMidCommit kills (SIGKILL) a process that commits batches in a
// loop, at a random moment just after it entered Commit, reopens the store
// and checks that every batch is all there or not there at all: result
// numbers 1..max each once, no terminal item without a result, counters
// equal to the committed rows, every acknowledged batch present.
func TestCrashMidCommit(t *testing.T) {
	if path := os.Getenv(crashChildEnv); path != "" {
		crashChild(path)
		return
	}
	if testing.Short() {
		t.Skip("starts and kills child processes")
	}
	t.Parallel()
	path := filepath.Join(t.TempDir(), "state.db")
	s := openInit(t, path, defaultConfig())
	if err := s.AddItems(t.Context(), testItems(1, crashItems)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	var acked int64 // highest rseq a child reported as committed
	insideCommit := 0
	const rounds = 4
	for round := range rounds {
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashMidCommit$", "-test.count=1")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+path)
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := make(chan string)
		go func() {
			defer close(lines)
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				lines <- sc.Text()
			}
		}()
		// Let it complete a few batches, then kill it a random moment after
		// it announced the next Commit.
		commits, killAt := 0, 1+r.IntN(5)
		timeout := time.After(60 * time.Second)
	read:
		for {
			select {
			case line, ok := <-lines:
				if !ok {
					t.Fatalf("round %d: the child exited before it was killed", round)
				}
				f := strings.Fields(line)
				if len(f) < 2 || f[0] != "crash-child:" {
					continue
				}
				switch f[1] {
				case "committed":
					n, _ := strconv.ParseInt(f[2], 10, 64)
					acked = max(acked, n)
					commits++
				case "done":
					break read
				case "begin":
					if commits >= killAt {
						time.Sleep(time.Duration(r.IntN(3000)) * time.Microsecond)
						break read
					}
				case "error":
					t.Fatalf("round %d: child: %s", round, line)
				}
			case <-timeout:
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("round %d: the child made no progress", round)
			}
		}
		if err := cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		// What the child printed before it died tells whether the kill landed
		// inside Commit (the usual case) or just after it.
		last := ""
		for line := range lines {
			last = line
		}
		cmd.Wait()
		if !strings.Contains(last, "committed") {
			insideCommit++
		}
		checkCrashed(t, path, acked)
	}
	t.Logf("%d of %d kills landed inside Commit; %d results acknowledged", insideCommit, rounds, acked)
}

// crashChild commits the pending items in order, crashBatch at a time,
// announcing each Commit before and after, until it is killed.
func crashChild(path string) {
	ctx := context.Background()
	fail := func(err error) {
		fmt.Printf("crash-child: error %v\n", err)
		os.Exit(2)
	}
	s, err := Open(path)
	if err != nil {
		fail(err)
	}
	if _, err := s.Init(ctx, testMeta); err != nil {
		fail(err)
	}
	for {
		its, err := s.Pending(ctx, 0, crashBatch)
		if err != nil {
			fail(err)
		}
		if len(its) == 0 {
			fmt.Println("crash-child: done")
			select {} // wait for the kill
		}
		b := store.Batch{Counters: map[string]int64{"committed": int64(len(its))}}
		for _, it := range its {
			o := testOutcome(it.Seq, 600+int(it.Seq%400))
			o.Attempts = 1 + it.Seq%3
			b.Outcomes = append(b.Outcomes, o)
			b.Counters["attempts"] += o.Attempts
		}
		fmt.Println("crash-child: begin")
		c, err := s.Commit(ctx, b)
		if err != nil {
			fail(err)
		}
		fmt.Printf("crash-child: committed %d\n", c.RSeq[len(c.RSeq)-1])
	}
}

// checkCrashed reopens the store a killed child left and checks it.
func checkCrashed(t *testing.T, path string, acked int64) {
	t.Helper()
	ctx := t.Context()
	s, err := Open(path)
	if err != nil {
		t.Fatalf("reopen after kill: %v", err)
	}
	defer s.Close()
	if err := storetest.Check(ctx, s); err != nil {
		t.Fatalf("after kill: %v", err)
	}
	a, err := s.Aggregate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if a.Results < acked {
		t.Fatalf("after kill: %d results, but the child was told %d were committed", a.Results, acked)
	}
	if a.Succeeded%crashBatch != 0 {
		t.Fatalf("after kill: %d succeeded, not a whole number of %d-outcome batches", a.Succeeded, crashBatch)
	}
	if a.Counters["committed"] != a.Succeeded {
		t.Fatalf("after kill: counter committed=%d but %d items succeeded", a.Counters["committed"], a.Succeeded)
	}
	var done int64 // the child completes items in seq order: what is done is a prefix
	if err := s.r.QueryRowContext(ctx, `SELECT coalesce(max(seq), 0) FROM results`).Scan(&done); err != nil || done != a.Succeeded {
		t.Fatalf("after kill: highest completed seq %d (%v), but %d completed", done, err, a.Succeeded)
	}
	var attempts int64
	if err := s.r.QueryRowContext(ctx, `SELECT coalesce(sum(attempts), 0) FROM results`).Scan(&attempts); err != nil || attempts != a.Counters["attempts"] {
		t.Fatalf("after kill: counter attempts=%d, committed rows hold %d (%v)", a.Counters["attempts"], attempts, err)
	}
	s.Close()
	checkFile(t, path)
}
