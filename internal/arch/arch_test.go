package arch

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/apidispatch/apidispatch"

// goList runs go list in the module's root with args and returns its
// output lines.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		// The go command that runs the tests need not be on the PATH.
		gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
		if _, serr := os.Stat(gobin); serr != nil {
			t.Fatalf("no go command to list the packages with: %v; %v", err, serr)
		}
	}
	cmd := exec.Command(gobin, append([]string{"list"}, args...)...)
	cmd.Dir = filepath.Join("..", "..")
	out, err := cmd.Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, msg)
	}
	return strings.Fields(string(out))
}

// Layers: what a package may not depend on, even through another. The
// run directory, the gate types, the batch route, the shared budget and
// the metrics sit below the sync engine; the run directory and the gate
// types sit below every route. A provider's wire package (anthropic,
// openai) is a leaf: it knows no other provider and nothing above it.
// The upstream layer (the same-organisation rule, the cap table) sits
// below every route, and plan takes its defaults from it, not from the
// engine.
func TestLayers(t *testing.T) {
	below := map[string][]string{
		"upstream": {"dispatch", "batch", "runner", "gateway", "rundir", "plan", "shared", "ab"},
		"plan":     {"dispatch", "gateway"},
		"batch":    {"dispatch"},
		"shared":   {"dispatch"},
		"metrics":  {"dispatch"},
		"rundir":   {"dispatch", "batch", "runner", "gateway", "ab", "shared", "plan"},
		"gate":     {"dispatch", "rundir", "shared", "metrics", "batch"},
		"openai": {"anthropic", "dispatch", "batch", "runner", "gateway", "rundir", "gate", "ratelimit",
			"cost", "sim", "store", "org"},
		"anthropic": {"openai", "dispatch", "batch", "runner", "gateway", "rundir", "gate", "ratelimit", "cost", "sim"},
	}
	for pkg, not := range below {
		deps := goList(t, "-deps", "./"+pkg)
		for _, n := range not {
			if slices.Contains(deps, module+"/"+n) {
				t.Errorf("%s depends on %s (go list -deps ./%s)", pkg, n, pkg)
			}
		}
	}
}

// Only the run directory opens the store: every other package reaches
// SQLite through rundir and the store interface. Tests may open a real
// SQLite file themselves.
func TestOnlyRundirImportsSQLite(t *testing.T) {
	const sqlite = module + "/store/sqlite"
	allowed := []string{module + "/rundir"}
	lines := goList(t, "-f", `{{.ImportPath}}:{{join .Imports ","}}`, "./...")
	seen := false
	for _, l := range lines {
		pkg, imports, _ := strings.Cut(l, ":")
		if !slices.Contains(strings.Split(imports, ","), sqlite) {
			continue
		}
		seen = true
		if !slices.Contains(allowed, pkg) {
			t.Errorf("%s imports store/sqlite; open a run's store through rundir", pkg)
		}
	}
	if !seen {
		t.Error("no package imports store/sqlite: the check would pass on anything")
	}
}

// The gateway takes nothing from the engine but the engine itself, for
// its batches' sync route (batches.go): its caps, its retry policy and
// its same-organisation rule come from upstream and gate, as the
// engine's do. A second file importing dispatch fails here.
func TestGatewayImportsTheEngineOnlyForItsBatches(t *testing.T) {
	lines := goList(t, "-f", `{{range .GoFiles}}{{.}} {{end}}`, "./gateway")
	files := 0
	for _, f := range lines {
		files++
		src, err := os.ReadFile(filepath.Join("..", "..", "gateway", f))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(src), `"`+module+`/dispatch"`) && f != "batches.go" {
			t.Errorf("gateway/%s imports dispatch: take defaults from upstream (caps) or gate (the retry policy)", f)
		}
	}
	if files < 10 {
		t.Fatalf("go list found %d files in gateway: the check would pass on anything", files)
	}
}

// The attempt (the size-limited read of an answer, the cut-2xx rule, its
// classification) exists once, in upstream (Send, Begin, Finish): a file
// of the engine or the gateway that both limits an answer's read and
// classifies it is a second copy of it.
func TestOneAttemptImplementation(t *testing.T) {
	routeSources(t, func(pkg, f, s string) {
		if strings.Contains(s, "io.LimitReader(") && (strings.Contains(s, "anthropic.Classify(") || strings.Contains(s, "openai.Classify(")) {
			t.Errorf("%s/%s reads an answer (io.LimitReader) and classifies it (anthropic.Classify): a second attempt; use upstream.Send or upstream.Begin/Finish", pkg, f)
		}
	})
}

// A provider is a seam of the upstream layer: its classifier is called
// by upstream (the Provider of each org) and nowhere else, so every route
// acts on one outcome through the one attempt. A non-test file of another
// package that calls openai.Classify is a second classification.
func TestOpenAIClassifiedOnlyByTheUpstreamSeam(t *testing.T) {
	lines := goList(t, "-f", `{{.Dir}}:{{.ImportPath}}:{{join .GoFiles ","}}`, "./...")
	seen := false
	for _, l := range lines {
		parts := strings.SplitN(l, ":", 3)
		if len(parts) != 3 || parts[2] == "" {
			continue
		}
		dir, pkg := parts[0], parts[1]
		for _, f := range strings.Split(parts[2], ",") {
			src, err := os.ReadFile(filepath.Join(dir, f))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(src), "openai.Classify(") {
				continue
			}
			if pkg == module+"/upstream" {
				seen = true
				continue
			}
			t.Errorf("%s/%s calls openai.Classify: classify through upstream.OpenAI (the provider seam)", pkg, f)
		}
	}
	if !seen {
		t.Error("upstream does not call openai.Classify: the check would pass on anything")
	}
}

// routeSources calls check with each non-test source file of the routes
// (dispatch and gateway): its package, name and text.
func routeSources(t *testing.T, check func(pkg, file, src string)) {
	t.Helper()
	for _, pkg := range []string{"dispatch", "gateway"} {
		files := goList(t, "-f", `{{range .GoFiles}}{{.}} {{end}}`, "./"+pkg)
		if len(files) < 5 {
			t.Fatalf("go list found %d files in %s: the check would pass on anything", len(files), pkg)
		}
		for _, f := range files {
			src, err := os.ReadFile(filepath.Join("..", "..", pkg, f))
			if err != nil {
				t.Fatal(err)
			}
			check(pkg, f, string(src))
		}
	}
}

// One back-off formula: the routes wait gate.Backoff or gate.RetryWait
// (gate/retry.go). An exponential of their own in dispatch or gateway is
// a second retry policy (a gateway batch's re-run once waited 2^n s up to
// 60 s beside the requests' 0.5-8 s).
func TestOneBackoffFormula(t *testing.T) {
	routeSources(t, func(pkg, f, s string) {
		if strings.Contains(s, "math.Pow(") || strings.Contains(s, "math.Exp2(") || strings.Contains(s, "<< attempt") {
			t.Errorf("%s/%s computes a back-off of its own: use gate.Backoff or gate.RetryWait", pkg, f)
		}
	})
}

// The gateway and the engines of its batches send through one set of
// lanes, upstream.Lanes, the gateway's own passed as dispatch.Config.Lanes:
// a gateway that hands an engine gates of its making (Config.NewGate, or
// a same-organisation rule of its own: Config.SameOrg) is a second lane
// set-up bridged to the first.
func TestGatewayBatchesShareTheUpstreamLanes(t *testing.T) {
	files := goList(t, "-f", `{{range .GoFiles}}{{.}} {{end}}`, "./gateway")
	if len(files) < 10 {
		t.Fatalf("go list found %d files in gateway: the check would pass on anything", len(files))
	}
	configs := 0
	for _, f := range files {
		path := filepath.Join("..", "..", "gateway", f)
		file, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CompositeLit:
				sel, ok := n.Type.(*ast.SelectorExpr)
				if !ok || sel.Sel.Name != "Config" {
					return true
				}
				if x, ok := sel.X.(*ast.Ident); !ok || x.Name != "dispatch" {
					return true
				}
				configs++
				lanes := false
				for _, el := range n.Elts {
					kv, ok := el.(*ast.KeyValueExpr)
					if !ok {
						continue
					}
					switch k, _ := kv.Key.(*ast.Ident); {
					case k == nil:
					case k.Name == "NewGate" || k.Name == "SameOrg":
						t.Errorf("gateway/%s: dispatch.Config sets %s: the engine must send through the gateway's upstream.Lanes (Config.Lanes), not gates of the gateway's making", f, k.Name)
					case k.Name == "Lanes":
						lanes = true
					}
				}
				if !lanes {
					t.Errorf("gateway/%s: dispatch.Config without Lanes: the engine would make lanes of its own beside the gateway's", f)
				}
			case *ast.AssignStmt:
				for _, l := range n.Lhs {
					if sel, ok := l.(*ast.SelectorExpr); ok && (sel.Sel.Name == "NewGate" || sel.Sel.Name == "SameOrg") {
						t.Errorf("gateway/%s: assigns .%s: the engine must send through the gateway's upstream.Lanes", f, sel.Sel.Name)
					}
				}
			}
			return true
		})
	}
	if configs == 0 {
		t.Fatal("no dispatch.Config literal in gateway: the check would pass on anything")
	}
}
