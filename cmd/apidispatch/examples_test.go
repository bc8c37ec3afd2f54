//go:build sdkexamples

package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/sim"
)

// The Python SDK example (examples/python/judge.py) runs against
// 'apidispatch serve' in front of the simulator with only ANTHROPIC_BASE_URL
// and ANTHROPIC_API_KEY set, and every check passes. It needs the anthropic
// Python package, which CI cannot install (no PyPI), so it builds only with
// the tag: python3 must import anthropic, found as python3 finds any
// package, so PYTHONPATH names a directory that holds the SDK's sources
// and their pure-Python dependencies (anthropic, httpx, httpcore, anyio,
// sniffio, h11, idna, certifi, distro, docstring_parser, and a jiter: the
// SDK calls only jiter.from_json, on streamed tool input; pydantic and
// typing_extensions installed or there too); a missing SDK fails it. The
// script checks what each call returns, and validates every answer's body
// against the SDK's own types (which the SDK itself does not: it builds
// its objects without validation), and every answer's request-id header;
// it prints how many differ and fails unless none does. Its TypeScript
// twin, examples/ts/judge.mjs, runs in every test run
// (TestExampleJudgeMJS), and examples/python/judge_csv.py, which needs
// nothing but python3, in TestExampleJudgeCSV.
//
//	PYTHONPATH=/path/to/sdk-site go test -tags sdkexamples -run TestSDKExamplesAgainstServe -v ./cmd/apidispatch
func TestSDKExamplesAgainstServe(t *testing.T) {
	root, err := filepath.Abs("../../examples")
	if err != nil {
		t.Fatal(err)
	}
	for _, ex := range []struct {
		name, dir string
		probe     []string
		run       []string
	}{
		{"python", filepath.Join(root, "python"), []string{"python3", "-c", "import anthropic"}, []string{"python3", "judge.py"}},
	} {
		t.Run(ex.name, func(t *testing.T) {
			probe := exec.Command(ex.probe[0], ex.probe[1:]...)
			probe.Dir = ex.dir
			if out, err := probe.CombinedOutput(); err != nil {
				t.Fatalf("the %s SDK is not installed here, nor on PYTHONPATH=%q (%v %s)", ex.name, os.Getenv("PYTHONPATH"), err, out)
			}
			run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
			dir := t.TempDir()
			_, base, token := startServe(t, run, "--speed", "200", "--token-file", filepath.Join(dir, "token"), "--state-dir", filepath.Join(dir, "state"))
			c := exec.Command(ex.run[0], ex.run[1:]...)
			c.Dir = ex.dir
			for _, kv := range os.Environ() {
				if !strings.HasPrefix(kv, "ANTHROPIC_") {
					c.Env = append(c.Env, kv)
				}
			}
			c.Env = append(c.Env, "ANTHROPIC_BASE_URL="+base, "ANTHROPIC_API_KEY="+token)
			out, err := c.CombinedOutput()
			if err != nil || strings.Contains(string(out), "FAIL") || strings.Count(string(out), "\nok ") < 17 {
				t.Fatalf("%s: %v\n%s", strings.Join(ex.run, " "), err, out)
			}
			t.Logf("%s", out)
		})
	}
}
