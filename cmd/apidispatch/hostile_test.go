package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/workload"
)

// dirHashes maps every file under dir (by relative path) to the SHA-256 of
// its bytes.
func dirHashes(t *testing.T, dir string) map[string][32]byte {
	t.Helper()
	m := map[string][32]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		m[rel] = sha256.Sum256(b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// sameDir fails t unless dir holds exactly the files of before, byte for byte.
func sameDir(t *testing.T, dir string, before map[string][32]byte) {
	t.Helper()
	after := dirHashes(t, dir)
	for p, h := range before {
		switch a, ok := after[p]; {
		case !ok:
			t.Errorf("run dir: %s was removed", p)
		case a != h:
			t.Errorf("run dir: %s was changed", p)
		}
	}
	for p := range after {
		if _, ok := before[p]; !ok {
			t.Errorf("run dir: %s was created", p)
		}
	}
}

// copyDir copies the regular files of src into a new directory.
func copyDir(t *testing.T, src string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), filepath.Base(src))
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

// nothingSent fails t if the simulator saw a request.
func nothingSent(t *testing.T, r *sim.Running) {
	t.Helper()
	if led := r.Server.LedgerTotals(); led.Requests != 0 {
		t.Errorf("%d requests billed", led.Requests)
	}
	for _, o := range r.Server.Stats().Orgs {
		if o.Requests != 0 {
			t.Errorf("org %s received %d requests", o.Name, o.Requests)
		}
	}
}

// judgeLines returns n valid request lines (ids phase6_000000, ...).
func judgeLines(t *testing.T, n int) []string {
	t.Helper()
	var b bytes.Buffer
	if err := workload.GenerateJudge(&b, n, 3, workload.GenOptions{}); err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
}

// edit decodes a request line, lets f change it, and encodes it again.
func edit(t *testing.T, line string, f func(req map[string]any, params map[string]any)) string {
	t.Helper()
	var req map[string]any
	if err := json.Unmarshal([]byte(line), &req); err != nil {
		t.Fatal(err)
	}
	params, _ := req["params"].(map[string]any)
	f(req, params)
	b, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func joinLines(lines ...string) []byte { return []byte(strings.Join(lines, "\n") + "\n") }

// TestHostileInput feeds 'apidispatch run' (a real child process) files a
// user or a broken pipeline could hand it. Each refused file: exit 1, an
// error naming the line (or, for an empty file, saying so), nothing sent
// (the simulator's ledger and request counters stay at zero), and an
// existing run directory given as --run-dir left byte for byte as it was.
// A UTF-8 BOM and CRLF line endings are accepted: the run succeeds with the
// right custom_ids, and the same file against the existing run directory
// (made from another input) is refused without touching it. Last, the
// input changed between a run and its resume: refused, run dir untouched.
func TestHostileInput(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	t.Parallel()
	cfg, err := sim.Preset(sim.PresetOrigin3Org)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Speed = 50
	start := func(t *testing.T) *sim.Running {
		t.Helper()
		r, err := sim.Start(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return r
	}

	// The existing run directory: a successful small run of file A.
	dir := t.TempDir()
	inputA := filepath.Join(dir, "a.jsonl")
	writeJudge(t, inputA, 30)
	existing := filepath.Join(dir, "run")
	{
		r := start(t)
		c := cliCmd(r, "run", inputA, "--run-dir", existing, "--base-url", r.URL, "--speed", "50", "--quiet")
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("the first run: %v\n%s", err, out)
		}
	}

	good := judgeLines(t, 4)
	garbage := make([]byte, 4096)
	rng := rand.New(rand.NewPCG(6, 6))
	for i := range garbage {
		garbage[i] = byte(rng.UintN(256))
	}
	garbage[0] = 0xff // never valid UTF-8, never the start of an object

	tests := []struct {
		name    string
		content func(t *testing.T) []byte
		want    []string // in stderr
		// accepted files run to completion with these custom_ids.
		accepted []string
	}{
		{"malformed JSON", func(*testing.T) []byte {
			return joinLines(good[0], `{"custom_id":"x","params":{"model":`, good[2])
		}, []string{"line 2:", "malformed JSON"}, nil},
		{"not an object", func(*testing.T) []byte {
			return joinLines(good[0], `["custom_id","params"]`, good[2])
		}, []string{"line 2:", "not a JSON object"}, nil},
		{"a number", func(*testing.T) []byte { return joinLines(good[0], good[1], `42`) }, []string{"line 3:", "not a JSON object"}, nil},
		{"missing custom_id", func(t *testing.T) []byte {
			return joinLines(good[0], good[1], edit(t, good[2], func(r, _ map[string]any) { delete(r, "custom_id") }))
		}, []string{"line 3:", "missing custom_id"}, nil},
		{"custom_id with bad characters", func(t *testing.T) []byte {
			return joinLines(good[0], edit(t, good[1], func(r, _ map[string]any) { r["custom_id"] = "item 1/é" }), good[2])
		}, []string{"line 2:", "custom_id", "characters"}, nil},
		{"custom_id of 65 characters", func(t *testing.T) []byte {
			return joinLines(good[0], edit(t, good[1], func(r, _ map[string]any) { r["custom_id"] = strings.Repeat("a", 65) }), good[2])
		}, []string{"line 2:", "65 characters"}, nil},
		{"duplicate custom_id", func(t *testing.T) []byte {
			return joinLines(good[0], good[1], good[2], edit(t, good[3], func(r, _ map[string]any) { r["custom_id"] = "phase6_000001" }))
		}, []string{"line 4:", "duplicate of line 2"}, nil},
		{"params without model", func(t *testing.T) []byte {
			return joinLines(good[0], edit(t, good[1], func(_, p map[string]any) { delete(p, "model") }))
		}, []string{"line 2:", "params.model"}, nil},
		{"params without max_tokens", func(t *testing.T) []byte {
			return joinLines(good[0], edit(t, good[1], func(_, p map[string]any) { delete(p, "max_tokens") }))
		}, []string{"line 2:", "params.max_tokens"}, nil},
		{"params without messages", func(t *testing.T) []byte {
			return joinLines(good[0], edit(t, good[1], func(_, p map[string]any) { delete(p, "messages") }))
		}, []string{"line 2:", "params.messages"}, nil},
		{"unknown model with no price and no cap", func(t *testing.T) []byte {
			return joinLines(good[0], good[1], edit(t, good[2], func(_, p map[string]any) { p["model"] = "claude-fable-5" }))
			// No cap: priced by estimate with a warning, then refused here only
			// for the other input (runner.TestRunModelMissingFromPriceTable:
			// refused naming the line under --max-cost).
		}, []string{"claude-fable-5", "estimate", "different input"}, nil},
		{"empty file", func(*testing.T) []byte { return nil }, []string{"no requests"}, nil},
		{"only blank lines", func(*testing.T) []byte { return []byte("\n\r\n  \n") }, []string{"no requests"}, nil},
		{"a line over 32 MB", func(*testing.T) []byte {
			long := `{"custom_id":"huge","params":{"model":"claude-sonnet-4-5-20250929","max_tokens":16,"messages":[{"role":"user","content":"` +
				strings.Repeat("x", workload.MaxLineBytes+1024) + `"}]}}`
			return joinLines(good[0], long, good[2])
		}, []string{"line 2:"}, nil},
		{"binary garbage", func(*testing.T) []byte { return garbage }, []string{"line 1:"}, nil},
		{"binary after good lines", func(*testing.T) []byte {
			return append(joinLines(good[0], good[1]), garbage...)
		}, []string{"line 3:"}, nil},
		{"UTF-8 BOM", func(*testing.T) []byte {
			return append([]byte("\xef\xbb\xbf"), joinLines(good...)...)
		}, nil, []string{"phase6_000000", "phase6_000001", "phase6_000002", "phase6_000003"}},
		{"CRLF line endings", func(*testing.T) []byte {
			return []byte(strings.Join(good, "\r\n") + "\r\n")
		}, nil, []string{"phase6_000000", "phase6_000001", "phase6_000002", "phase6_000003"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			input := filepath.Join(t.TempDir(), "hostile.jsonl")
			if err := os.WriteFile(input, tc.content(t), 0o644); err != nil {
				t.Fatal(err)
			}
			if tc.accepted != nil {
				r := start(t)
				runDir := filepath.Join(t.TempDir(), "fresh")
				out, err := cliCmd(r, "run", input, "--run-dir", runDir, "--base-url", r.URL, "--speed", "50", "--quiet").CombinedOutput()
				if err != nil {
					t.Fatalf("refused: %v\n%s", err, out)
				}
				ids := readIDs(t, filepath.Join(runDir, rundir.ResultsFile))
				if len(ids) != len(tc.accepted) {
					t.Errorf("result ids %v, want %v", ids, tc.accepted)
				}
				for _, id := range tc.accepted {
					if ids[id] != 1 {
						t.Errorf("result id %q appears %d times; all: %v", id, ids[id], ids)
					}
				}
				if n := r.Server.LedgerTotals().Requests; n != int64(len(tc.accepted)) {
					t.Errorf("%d requests billed, want %d", n, len(tc.accepted))
				}
			}

			// Against the existing run directory: refused, untouched, nothing sent.
			r := start(t)
			runDir := copyDir(t, existing)
			before := dirHashes(t, runDir)
			c := cliCmd(r, "run", input, "--run-dir", runDir, "--base-url", r.URL, "--speed", "50", "--quiet")
			var stdout, stderr bytes.Buffer
			c.Stdout, c.Stderr = &stdout, &stderr
			c.Run()
			if code := c.ProcessState.ExitCode(); code != exitUsage {
				t.Errorf("exit %d, want %d\nstdout: %s\nstderr: %s", code, exitUsage, stdout.String(), tail(stderr.String()))
			}
			want := tc.want
			if tc.accepted != nil {
				want = []string{"different input"}
			}
			for _, w := range want {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, tail(stderr.String()))
				}
			}
			if len(stderr.String()) > 64<<10 {
				t.Errorf("stderr is %d bytes: the error should be short", stderr.Len())
			}
			nothingSent(t, r)
			sameDir(t, runDir, before)
		})
	}

	t.Run("input changed between a run and its resume", func(t *testing.T) {
		// Subtests above run after this one returns; this one is not
		// parallel, so it has file A to itself.
		r := start(t)
		// Control: the unchanged input resumes (a finished run: nothing to send).
		out, err := cliCmd(r, "run", inputA, "--run-dir", copyDir(t, existing), "--base-url", r.URL, "--speed", "50", "--quiet").CombinedOutput()
		if err != nil {
			t.Fatalf("resuming with the unchanged input: %v\n%s", err, out)
		}
		nothingSent(t, r)

		b, err := os.ReadFile(inputA)
		if err != nil {
			t.Fatal(err)
		}
		changed := bytes.Replace(b, []byte("Question asked"), []byte("Question posed"), 1)
		if bytes.Equal(changed, b) {
			t.Fatal("the edit changed nothing")
		}
		if err := os.WriteFile(inputA, changed, 0o644); err != nil {
			t.Fatal(err)
		}
		runDir := copyDir(t, existing)
		before := dirHashes(t, runDir)
		c := cliCmd(r, "run", inputA, "--run-dir", runDir, "--base-url", r.URL, "--speed", "50", "--quiet")
		var stderr bytes.Buffer
		c.Stderr = &stderr
		c.Run()
		if code := c.ProcessState.ExitCode(); code != exitUsage {
			t.Errorf("exit %d, want %d\n%s", code, exitUsage, stderr.String())
		}
		for _, w := range []string{"different input", "changed"} {
			if !strings.Contains(stderr.String(), w) {
				t.Errorf("stderr lacks %q:\n%s", w, stderr.String())
			}
		}
		nothingSent(t, r)
		sameDir(t, runDir, before)
	})
}
