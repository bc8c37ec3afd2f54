package main

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/workload"
)

// The examples a user pastes (examples/): the judge scripts against 'apidispatch
// serve' and the request-file generator for 'apidispatch run', each run here
// as a user would. They need python3, and node with examples/ts's 'npm
// install'; where one is missing the test skips on a workstation and fails in
// CI (CI is set), which installs both.

// needRuntime skips t, or fails it in CI, unless the example's runtime is here.
func needRuntime(t *testing.T, what, hint string, probe ...string) {
	t.Helper()
	out, err := exec.Command(probe[0], probe[1:]...).CombinedOutput()
	if err == nil {
		return
	}
	msg := fmt.Sprintf("%s is not available (%v %s); %s", what, err, bytes.TrimSpace(out), hint)
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg + " (CI fails here)")
}

func examplesDir(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../../examples")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// csvIDs are the ids of a CSV of prompts, read by Go's encoding/csv.
func csvIDs(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range recs[1:] {
		ids = append(ids, r[0])
	}
	return ids
}

// writePromptsCSV writes n prompts to dir/name with the columns id and prompt.
func writePromptsCSV(t *testing.T, dir, name string, n int) string {
	t.Helper()
	var b bytes.Buffer
	w := csv.NewWriter(&b)
	w.Write([]string{"id", "prompt"})
	for i := range n {
		w.Write([]string{fmt.Sprintf("p%04d", i), fmt.Sprintf("Question asked to the AI: what is %d squared? AI's response: %d. Provide your evaluation as a JSON object.", i, i*i)})
	}
	w.Flush()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// verdict is one line a judge script writes.
type verdict struct {
	ID    string `json:"id"`
	OK    bool   `json:"ok"`
	Text  string `json:"text"`
	Error string `json:"error"`
	Usage struct {
		InputTokens  int64 `json:"input_tokens"`
		OutputTokens int64 `json:"output_tokens"`
	} `json:"usage"`
}

var inFlightRE = regexp.MustCompile(`at most (\d+) in flight`)

// exampleGateway is 'apidispatch serve' in front of its own simulator, for the
// judge scripts of one language.
type exampleGateway struct {
	sim         *sim.Running
	base, token string
}

// exampleSpeed is the simulator's speed for the judge scripts: an answer
// takes a few tenths of a second, so the async mode's 200 are in flight
// together whatever the machine's load, and a batch's queue wait (cut to
// 8 API seconds) is a second.
const exampleSpeed = 8

func startGateway(t *testing.T) exampleGateway {
	t.Helper()
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, exampleSpeed, func(c *sim.Config) {
		for i := range c.Orgs {
			c.Orgs[i].Batch.QueueWaitS = exampleSpeed
		}
	})
	state := t.TempDir()
	_, base, token := startServe(t, run, "--speed", strconv.Itoa(exampleSpeed),
		"--token-file", filepath.Join(state, "token"), "--state-dir", filepath.Join(state, "state"))
	return exampleGateway{run, base, token}
}

// judgeRun runs a judge script in one mode on csvPath through gw and checks
// what every mode must hold: exit 0, one good verdict per prompt, the
// summary line, every prompt billed once upstream and none twice, the token
// never printed. It returns the verdicts by id and the peak in flight the
// script reports (0 if none).
func judgeRun(t *testing.T, gw exampleGateway, dir string, argv []string, mode, csvPath string) (map[string]verdict, int) {
	t.Helper()
	mark := gw.sim.Server.Mark()
	out := filepath.Join(t.TempDir(), "verdicts.jsonl")
	c := exec.Command(argv[0], append(argv[1:], csvPath, "--mode", mode, "--poll", "0.2", "--out", out)...)
	c.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ANTHROPIC_") {
			c.Env = append(c.Env, kv)
		}
	}
	c.Env = append(c.Env, "ANTHROPIC_BASE_URL="+gw.base, "ANTHROPIC_API_KEY="+gw.token)
	var stderr bytes.Buffer
	c.Stderr = &stderr
	if err := c.Run(); err != nil {
		t.Fatalf("%s %s --mode %s: %v\n%s", strings.Join(argv, " "), filepath.Base(csvPath), mode, err, stderr.String())
	}
	if strings.Contains(stderr.String(), gw.token) {
		t.Errorf("the script printed the gateway token")
	}
	ids := csvIDs(t, csvPath)
	if want := fmt.Sprintf("judged %d prompts (%s): %d ok, 0 errors", len(ids), mode, len(ids)); !strings.Contains(stderr.String(), want) {
		t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]verdict{}
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		var v verdict
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		if _, dup := got[v.ID]; dup {
			t.Errorf("%s: judged twice", v.ID)
		}
		if !v.OK || v.Text == "" || v.Usage.OutputTokens <= 0 || v.Usage.InputTokens <= 0 {
			t.Errorf("%s: %+v", v.ID, v)
		}
		got[v.ID] = v
	}
	for _, id := range ids {
		if _, ok := got[id]; !ok {
			t.Errorf("%s: no verdict", id)
		}
	}
	if len(got) != len(ids) {
		t.Errorf("%d verdicts for %d prompts", len(got), len(ids))
	}
	// Every prompt billed once upstream, none twice.
	bodies := map[sim.BodyHash]bool{}
	billed := gw.sim.Server.LedgerSince(mark)
	for _, e := range billed {
		bodies[e.BodySHA256] = true
	}
	if len(billed) != len(ids) || len(bodies) != len(ids) {
		t.Errorf("the simulator billed %d requests (%d distinct) for %d prompts", len(billed), len(bodies), len(ids))
	}
	peak := 0
	if m := inFlightRE.FindStringSubmatch(stderr.String()); m != nil {
		peak, _ = strconv.Atoi(m[1])
	}
	return got, peak
}

// TestExampleJudgeCSV runs examples/python/judge_csv.py (standard library
// only) and examples/ts/judge_csv.mjs (the official TypeScript SDK) in each
// mode against 'apidispatch serve' in front of the simulator: sync and batch
// on examples/prompts.csv (quoted commas, quotes, newlines, non-ASCII), async
// on 300 prompts with 200 in flight. Each prompt is judged once and billed
// once upstream, and the two languages read the CSV alike (the simulator
// counts a prompt's input tokens from its length, so each prompt's count is
// the same in both).
func TestExampleJudgeCSV(t *testing.T) {
	t.Parallel()
	root := examplesDir(t)
	sample := filepath.Join(root, "prompts.csv")
	many := writePromptsCSV(t, t.TempDir(), "many.csv", 300)
	var mu sync.Mutex
	syncs := map[string]map[string]verdict{}
	t.Run("lang", func(t *testing.T) {
		for _, lang := range []struct {
			name, dir, what, hint string
			probe, argv           []string
		}{
			{"python", filepath.Join(root, "python"), "python3", "install python3",
				[]string{"python3", "--version"}, []string{"python3", "judge_csv.py"}},
			{"typescript", filepath.Join(root, "ts"), "node with @anthropic-ai/sdk", "install Node.js and run 'npm install' in examples/ts",
				[]string{"node", "--input-type=module", "-e", `import "@anthropic-ai/sdk"`}, []string{"node", "judge_csv.mjs"}},
		} {
			t.Run(lang.name, func(t *testing.T) {
				t.Parallel()
				needRuntime(t, lang.what, lang.hint, append([]string{"sh", "-c", `cd "$0" && exec "$@"`, lang.dir}, lang.probe...)...)
				gw := startGateway(t)
				t.Run("sync", func(t *testing.T) {
					got, _ := judgeRun(t, gw, lang.dir, lang.argv, "sync", sample)
					mu.Lock()
					syncs[lang.name] = got
					mu.Unlock()
				})
				t.Run("async", func(t *testing.T) {
					_, peak := judgeRun(t, gw, lang.dir, lang.argv, "async", many)
					var upstream int64
					for _, o := range gw.sim.Server.Stats().Orgs {
						upstream += o.MaxInFlight
					}
					t.Logf("at most %d in flight at the client, %d summed over the orgs upstream", peak, upstream)
					// Never above --concurrency 200; more than one at a
					// time (how many depends on how fast a loaded machine
					// starts the client's threads against the answers:
					// 200 when quiet, 73 at load 44).
					if peak < 2 || peak > 200 {
						t.Errorf("at most %d requests in flight, want 2 to 200 (--concurrency 200)", peak)
					}
					if upstream <= 3 {
						t.Errorf("the orgs saw at most %d requests at once in all: the requests were not concurrent", upstream)
					}
				})
				t.Run("batch", func(t *testing.T) {
					judgeRun(t, gw, lang.dir, lang.argv, "batch", sample)
				})
			})
		}
	})
	py, ts := syncs["python"], syncs["typescript"]
	if py == nil || ts == nil {
		return
	}
	for id, v := range py {
		if ts[id].Usage.InputTokens != v.Usage.InputTokens {
			t.Errorf("%s: %d input tokens from python, %d from typescript: they read different prompts", id, v.Usage.InputTokens, ts[id].Usage.InputTokens)
		}
	}
}

// TestExampleRequestsFromCSV: examples/python/requests_from_csv.py turns
// examples/prompts.csv into a request file that 'apidispatch run' takes as
// it is and completes, every custom_id once; a bad CSV stops it with the
// line and the problem, and writes nothing.
func TestExampleRequestsFromCSV(t *testing.T) {
	t.Parallel()
	needRuntime(t, "python3", "install python3", "python3", "--version")
	root := examplesDir(t)
	script := filepath.Join(root, "python", "requests_from_csv.py")
	sample := filepath.Join(root, "prompts.csv")
	dir := t.TempDir()
	reqs := filepath.Join(dir, "requests.jsonl")
	out, err := exec.Command("python3", script, sample, "--model", "claude-haiku-4-5", "--max-tokens", "128", "--out", reqs).CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	ids := csvIDs(t, sample)
	sum, err := workload.Validate(reqs, workload.ValidateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if m := sum.Models["claude-haiku-4-5"]; sum.N != int64(len(ids)) || m.MaxTokens != int64(len(ids))*128 {
		t.Fatalf("summary %+v for %d rows", sum, len(ids))
	}

	r, _ := simtest.Start(t, sim.PresetOrigin3Org, 100, nil)
	runDir := filepath.Join(dir, "run")
	resumeAndAudit(t, r, []string{"run", reqs, "--run-dir", runDir, "--base-url", r.URL, "--speed", "100", "--quiet", "--confirm"}, runDir, len(ids))
	got := readIDs(t, filepath.Join(runDir, "results.jsonl"))
	for _, id := range ids {
		if got[id] != 1 {
			t.Errorf("%s: %d results", id, got[id])
		}
	}

	// Without an id column the rows are numbered; a bad row is named.
	noID := filepath.Join(dir, "noid.csv")
	os.WriteFile(noID, []byte("prompt,system\nfirst,be brief\n\"second, with a comma\",\n"), 0o644)
	b, err := exec.Command("python3", script, noID, "--prefix", "r").Output()
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"custom_id":"r000000","params":{"model":"claude-sonnet-4-5","max_tokens":256,"messages":[{"role":"user","content":"first"}],"system":"be brief"}}` + "\n" +
		`{"custom_id":"r000001","params":{"model":"claude-sonnet-4-5","max_tokens":256,"messages":[{"role":"user","content":"second, with a comma"}]}}` + "\n"; string(b) != want {
		t.Errorf("without an id column:\n%s\nwant\n%s", b, want)
	}
	for name, c := range map[string]struct{ csv, want string }{
		"duplicate id": {"id,prompt\na,x\nb,y\na,z\n", `:4: id 'a' is a duplicate of line 2`},
		"bad id":       {"id,prompt\nhas space,x\n", `:2: id 'has space' must be 1 to 64 characters`},
		"empty prompt": {"id,prompt\na,x\nb,\n", `:3: id 'b' has an empty prompt`},
		"no prompt":    {"id,text\na,x\n", `has no prompt column`},
		"max_tokens":   {"id,prompt,max_tokens\na,x,lots\n", `:2: max_tokens 'lots' is not a positive integer`},
	} {
		in := filepath.Join(dir, "bad.csv")
		os.WriteFile(in, []byte(c.csv), 0o644)
		bad := filepath.Join(dir, "bad.jsonl")
		out, err := exec.Command("python3", script, in, "--out", bad).CombinedOutput()
		if err == nil || !strings.Contains(string(out), c.want) {
			t.Errorf("%s: %v %q, want an error with %q", name, err, out, c.want)
		}
		if _, err := os.Stat(bad); err == nil {
			t.Errorf("%s: --out was written", name)
		}
	}
}

// TestExampleJudgeMJS runs examples/ts/judge.mjs, every call a judge script
// makes with the official TypeScript SDK (create, stream, count_tokens,
// models, two Message Batches to their end, a wrong token), against
// 'apidispatch serve' with only ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY set:
// every one of its checks passes.
func TestExampleJudgeMJS(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(examplesDir(t), "ts")
	needRuntime(t, "node with @anthropic-ai/sdk", "install Node.js and run 'npm install' in examples/ts",
		"sh", "-c", `cd "$0" && exec node --input-type=module -e 'import "@anthropic-ai/sdk"'`, dir)
	gw := startGateway(t)
	c := exec.Command("node", "judge.mjs")
	c.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ANTHROPIC_") {
			c.Env = append(c.Env, kv)
		}
	}
	c.Env = append(c.Env, "ANTHROPIC_BASE_URL="+gw.base, "ANTHROPIC_API_KEY="+gw.token)
	out, err := c.CombinedOutput()
	if err != nil || strings.Contains(string(out), "FAIL") || strings.Count(string(out), "\nok ") < 15 {
		t.Fatalf("node judge.mjs: %v\n%s", err, out)
	}
}
