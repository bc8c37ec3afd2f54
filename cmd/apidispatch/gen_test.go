package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/workload"
)

func TestGenStdout(t *testing.T) {
	t.Parallel()
	var out, errb bytes.Buffer
	if code := mainCode([]string{"gen", "--n", "5", "--seed", "3"}, &out, &errb); code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var want bytes.Buffer
	workload.GenerateJudge(&want, 5, 3, workload.GenOptions{})
	if out.String() != want.String() {
		t.Errorf("stdout differs from GenerateJudge(5, 3)")
	}
	if strings.Count(out.String(), "\n") != 5 || !strings.HasPrefix(out.String(), `{"custom_id":"phase6_000000"`) {
		t.Errorf("output:\n%s", out.String())
	}
}

func TestGenOutFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "chat.jsonl")
	var out, errb bytes.Buffer
	args := []string{"gen", "--n", "200", "--shape", "chat", "--seed", "9", "--model", "claude-haiku-4-5",
		"--max-tokens", "64", "--prefix", "c-", "--out", path}
	if code := mainCode(args, &out, &errb); code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if out.Len() != 0 || !strings.Contains(errb.String(), "wrote 200 chat requests") {
		t.Errorf("stdout %q stderr %q", out.String(), errb.String())
	}
	sum, err := workload.Validate(path, workload.ValidateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if m := sum.Models["claude-haiku-4-5"]; sum.N != 200 || m.N != 200 || m.MaxTokens != 200*64 {
		t.Errorf("summary %+v", sum)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("directory holds %d entries; a temp file was left behind", len(ents))
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o644 {
		t.Errorf("mode %v", st.Mode())
	}
}

func TestGenErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "x.jsonl")
	for _, args := range [][]string{
		{"gen", "--shape", "essay", "--out", path},
		{"gen", "--prefix", "bad prefix", "--out", path},
		{"gen", "--n", "-1"},
		{"gen", "--max-tokens", "0"},
		{"gen", "extra"},
		{"gen", "--nope"},
		{"gen", "--out", filepath.Join(dir, "missing-dir", "x.jsonl")},
	} {
		var out, errb bytes.Buffer
		if code := mainCode(args, &out, &errb); code != exitUsage {
			t.Errorf("%v: exit %d, want %d", args, code, exitUsage)
		}
		if errb.Len() == 0 {
			t.Errorf("%v: no message on stderr", args)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("a failed gen left %d files", len(ents))
	}
}

func TestGenHelp(t *testing.T) {
	t.Parallel()
	var out, errb bytes.Buffer
	if code := mainCode([]string{"gen", "--help"}, &out, &errb); code != exitOK {
		t.Fatalf("exit %d", code)
	}
	for _, w := range []string{"--shape", "--seed", "--max-tokens", "--prefix", "--out", "judge", "chat", "renamed"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("help lacks %q", w)
		}
	}
}

// TestGenInterruptedLeavesNothing: a write that fails part way (here an
// interrupt) removes the temporary file and leaves the target untouched.
func TestGenInterruptedLeavesNothing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "x.jsonl")
	os.WriteFile(path, []byte("old\n"), 0o644)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := rundir.WriteAtomic(path, 0o644, func(w io.Writer) error {
		return workload.GenerateJudge(ctxWriter{ctx, w}, 10, 1, workload.GenOptions{})
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "old\n" {
		t.Errorf("target changed: %q", b)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("%d entries: temp file left behind", len(ents))
	}
}
