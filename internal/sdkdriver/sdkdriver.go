// Package sdkdriver finds what the official SDKs' conformance drivers
// (sim/testdata/openai-node, sim/testdata/openai-python) need to run, for
// the tests that run them against the simulator and through serve.
package sdkdriver

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Node returns the path of node, with the driver directory dir's pinned
// npm packages installed (npm ci on first use). Without node the test is
// skipped, except under CI=true (which .ci/run sets), where it fails: CI
// must run the npm SDK's driver.
func Node(t testing.TB, dir string) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("node is not installed: CI must run the npm SDK's conformance driver")
		}
		t.Skip("node is not installed")
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "openai", "package.json")); err != nil {
		npm, lerr := exec.LookPath("npm")
		if lerr != nil {
			t.Fatalf("npm is not installed to install the openai SDK: %v", lerr)
		}
		cmd := exec.Command(npm, "ci", "--no-audit", "--no-fund")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
		}
	}
	return node
}

// Python fails the test unless python3, run in the driver directory dir,
// imports the openai SDK (installed, or on PYTHONPATH). It runs from dir:
// from one holding a directory named openai (as the repository's root
// does), "import openai" would find that as a namespace package.
func Python(t testing.TB, dir string) {
	t.Helper()
	probe := exec.Command("python3", "-c", "import openai; print(openai.__version__, openai.OpenAI.__name__)")
	probe.Dir = dir
	if out, err := probe.CombinedOutput(); err != nil {
		t.Fatalf("the openai Python SDK is not installed here, nor on PYTHONPATH=%q (%v %s)", os.Getenv("PYTHONPATH"), err, out)
	}
}
