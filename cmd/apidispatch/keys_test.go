package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/soak"
)

// leakMarker is in every canary key and nowhere else.
const leakMarker = "LEAKCANARY"

// canaryKeys gives each org of cfg a recognisable fake key,
// sk-ant-LEAKCANARY-<org>-<32 random hex digits>, and returns them by org.
func canaryKeys(t *testing.T, cfg *sim.Config) map[string]string {
	t.Helper()
	keys := map[string]string{}
	for i := range cfg.Orgs {
		b := make([]byte, 16)
		if _, err := rand.Read(b); err != nil {
			t.Fatal(err)
		}
		k := "sk-ant-" + leakMarker + "-" + cfg.Orgs[i].Name + "-" + hex.EncodeToString(b)
		cfg.Orgs[i].Keys = []string{k}
		keys[cfg.Orgs[i].Name] = k
	}
	return keys
}

// leakScanner looks for any part of the canary keys in bytes: the whole
// key, its middle 12 and last 12 characters (a truncated or elided key),
// and the marker every canary holds.
type leakScanner struct {
	needles []needle
	scanned int // outputs scanned, to prove the scan saw something
}

type needle struct {
	what string
	b    []byte
}

func newLeakScanner(keys map[string]string) *leakScanner {
	s := &leakScanner{needles: []needle{{"the canary marker " + leakMarker, []byte(leakMarker)}}}
	for _, name := range sortedNames(keys) {
		k := keys[name]
		mid := (len(k) - 12) / 2
		s.needles = append(s.needles,
			needle{"the key of org " + name, []byte(k)},
			needle{"the middle 12 characters of org " + name + "'s key", []byte(k[mid : mid+12])},
			needle{"the last 12 characters of org " + name + "'s key", []byte(k[len(k)-12:])})
	}
	return s
}

// byLength returns the needles longest first, so that a whole key is
// redacted before its fragments.
func (s *leakScanner) byLength() []needle {
	ns := slices.Clone(s.needles)
	slices.SortStableFunc(ns, func(a, b needle) int { return len(b.b) - len(a.b) })
	return ns
}

// check fails t if b holds any needle; where names the output.
func (s *leakScanner) check(t *testing.T, where string, b []byte) {
	t.Helper()
	s.scanned++
	for _, nd := range s.needles {
		if i := bytes.Index(b, nd.b); i >= 0 {
			lo, hi := max(0, i-60), min(len(b), i+len(nd.b)+60)
			ctx := string(b[lo:hi])
			for _, n := range s.byLength() {
				ctx = strings.ReplaceAll(ctx, string(n.b), "<REDACTED>")
			}
			t.Errorf("LEAK: %s holds %s at byte %d: …%q…", where, nd.what, i, ctx)
		}
	}
}

// checkTree scans every file under root.
func (s *leakScanner) checkTree(t *testing.T, root string) {
	t.Helper()
	files := 0
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		files++
		s.check(t, p, b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files == 0 {
		t.Fatalf("no file under %s to scan", root)
	}
}

// childResult is one finished child apidispatch.
type childResult struct {
	code           int
	stdout, stderr string
}

// runChild runs the test binary as apidispatch with args, in an environment
// holding none of the parent's ANTHROPIC_* variables plus extra.
func runChild(t *testing.T, extra []string, args ...string) childResult {
	t.Helper()
	c := exec.Command(os.Args[0], append([]string{"-test.run=^$", "--"}, args...)...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ANTHROPIC_") {
			c.Env = append(c.Env, kv)
		}
	}
	c.Env = append(append(c.Env, "APIDISPATCH_AS_CLI=1"), extra...)
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	err := c.Run()
	if err != nil && c.ProcessState == nil {
		t.Fatal(err)
	}
	return childResult{c.ProcessState.ExitCode(), out.String(), errb.String()}
}

// TestKeysNeverLeak runs every command that takes keys, as a real child
// process, with recognisable fake keys (see canaryKeys) against the
// simulator: 'run' plain, 'run' under faults with invalid requests mixed in
// (errors, retries and events), 'run' with a revoked key and a spend cap
// (lane-fatal reasons printed), 'plan --count-tokens', 'probe', 'ab' against
// the simulator playing the live API, 'report' on every run directory, and
// the refusals: http:// to a non-loopback host (flag and environment), a key
// file readable by others (a warning naming the file), a key written into
// the orgs file. Keys come from the environment, key_env and key_file.
// Every byte of stdout and stderr and of every file written under the run
// and output directories (results.jsonl, events.jsonl, summary.json,
// report.html, the limits file, ab.json, the status file, state.db and its
// journal files, the --debug-http wire logs of 'run' and 'probe') is
// searched for the keys, their middle and last 12 characters, and the
// canary marker. Where a command names a key it must
// be by fingerprint. The simulator's own output is not part of this: it
// prints its keys by design.
func TestKeysNeverLeak(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	t.Parallel()
	const k = 50
	base, err := sim.Preset(sim.PresetOrigin3Org)
	if err != nil {
		t.Fatal(err)
	}
	base.Speed = k
	keys := canaryKeys(t, &base)
	scan := newLeakScanner(keys)
	fps := map[string]string{}
	for name, key := range keys {
		fps[name] = org.Fingerprint(key)
	}
	start := func(t *testing.T, faults ...sim.Fault) *sim.Running {
		t.Helper()
		cfg := base
		cfg.Faults = faults
		r, err := sim.Start(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return r
	}
	// The keys reached the simulator: the test proves something only if
	// the canaries were really sent.
	sent := func(t *testing.T, r *sim.Running) {
		t.Helper()
		byKey := r.Server.LedgerTotals().ByKey
		for name, fp := range fps {
			if byKey[fp].Requests == 0 && r.Server.Stats().Org(name).Requests == 0 {
				t.Errorf("org %s's canary key (%s) never reached the simulator", name, fp)
			}
		}
	}

	out := t.TempDir()     // everything the commands write: scanned
	secrets := t.TempDir() // key files and orgs files: not scanned
	input := filepath.Join(out, "req.jsonl")
	writeJudge(t, input, 300)
	poisoned := filepath.Join(out, "poisoned.jsonl")
	writeJudge(t, poisoned, 300)
	poisonLines(t, poisoned)

	// The orgs file: high_prio from key_env, the others from 0600 key files;
	// batch's key is over 90 days old, so a rotation reminder is due.
	var toml strings.Builder
	keyEnv := []string{"LEAKTEST_HIGH_PRIO_KEY=" + keys["high_prio"]}
	for _, name := range sortedNames(keys) {
		fmt.Fprintf(&toml, "[[org]]\nname = %q\n", name)
		if name == "high_prio" {
			toml.WriteString("key_env = \"LEAKTEST_HIGH_PRIO_KEY\"\n\n")
			continue
		}
		kf := filepath.Join(secrets, name+".key")
		if err := os.WriteFile(kf, []byte(keys[name]+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&toml, "key_file = %q\n", kf)
		if name == "batch" {
			toml.WriteString("rotated = 2020-01-01\n")
		}
		toml.WriteString("\n")
	}
	orgsTOML := filepath.Join(secrets, "orgs.toml")
	if err := os.WriteFile(orgsTOML, []byte(toml.String()), 0o600); err != nil {
		t.Fatal(err)
	}

	// check scans a child's output and fails unless it exited want.
	check := func(t *testing.T, what string, res childResult, want int) {
		t.Helper()
		scan.check(t, what+" stdout", []byte(res.stdout))
		scan.check(t, what+" stderr", []byte(res.stderr))
		if res.code != want {
			t.Errorf("%s: exit %d, want %d\nstdout: %s\nstderr: %s", what, res.code, want, tail(res.stdout), tail(res.stderr))
		}
	}
	has := func(t *testing.T, where, text string, want ...string) {
		t.Helper()
		for _, w := range want {
			if !strings.Contains(text, w) {
				t.Errorf("%s lacks %q:\n%s", where, w, tail(text))
			}
		}
	}
	readFile := func(t *testing.T, p string) string {
		t.Helper()
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	env := func(r *sim.Running) []string { return r.Server.EnvLines() }
	var runDirs []string

	t.Run("run", func(t *testing.T) {
		r := start(t)
		dir := filepath.Join(out, "run")
		runDirs = append(runDirs, dir)
		res := runChild(t, env(r), "run", input, "--run-dir", dir, "--base-url", r.URL, "--speed", "50",
			"--summary", filepath.Join(out, "run-summary-copy.json"), "--out", filepath.Join(out, "run-results-elsewhere.jsonl"))
		check(t, "run", res, exitOK)
		sent(t, r)
		sum := readFile(t, filepath.Join(dir, rundir.SummaryFile))
		for _, fp := range fps {
			has(t, "summary.json", sum, `"key_fingerprint": "`+fp+`"`)
		}
	})

	t.Run("run with faults", func(t *testing.T) {
		faults := []sim.Fault{
			{Kind: sim.FaultOverloaded, Probability: 0.05},
			{Kind: sim.FaultServerError, Probability: 0.03},
			{Kind: sim.FaultServerErrorHTML, Probability: 0.03},
			{Kind: sim.FaultConnectionReset, Probability: 0.03},
			{Kind: sim.FaultTruncatedBody, Probability: 0.03},
		}
		r := start(t, faults...)
		dir := filepath.Join(out, "run-faults")
		runDirs = append(runDirs, dir)
		// The storm starts with the run's first billed request, however
		// long the child takes to start (under -race, longer than a storm
		// timed from the simulator's start would last).
		storm := sim.Fault{Kind: sim.FaultRateLimitStorm, Duration: 20 * time.Second, RetryAfter: 2 * time.Second, FromNow: true}
		stormCtx, stopStorm := context.WithCancel(context.Background())
		defer stopStorm()
		go soak.AddWhenBilled(stormCtx, r.Server, 1, time.Millisecond, storm)
		wire := filepath.Join(out, "wire-faults.log")
		res := runChild(t, keyEnv, "run", poisoned, "--orgs", orgsTOML, "--run-dir", dir, "--base-url", r.URL, "--speed", "50", "--confirm",
			"--debug-http", wire)
		check(t, "run with faults", res, exitOK)
		sent(t, r)
		// The wire log names every key by fingerprint and holds what the
		// API said; checkTree scans it with the rest of out.
		wl := readFile(t, wire)
		for _, fp := range fps {
			has(t, "the --debug-http log", wl, "> X-Api-Key: [key "+fp+"]")
		}
		has(t, "the --debug-http log", wl, "< 429 Too Many Requests", "< Retry-After: ", "< Anthropic-Ratelimit-Requests-Remaining: ", "\n! ")
		// The reminder names batch's key by fingerprint.
		has(t, "stderr", res.stderr, "reminder: the key of org batch ("+fps["batch"]+")")
		ev := readFile(t, filepath.Join(dir, rundir.EventsFile))
		sum := readFile(t, filepath.Join(dir, rundir.SummaryFile))
		has(t, "summary.json", sum, `"invalid_request_error"`)
		if !strings.Contains(ev, `"kind":"completed"`) {
			t.Errorf("events.jsonl lacks the completion:\n%s", tail(ev))
		}
	})

	t.Run("run with a revoked key and a spend cap", func(t *testing.T) {
		r := start(t,
			sim.Fault{Kind: sim.FaultKeyRevoked, Org: "high_prio"},
			sim.Fault{Kind: sim.FaultSpendCap, Org: "batch"})
		dir := filepath.Join(out, "run-revoked")
		runDirs = append(runDirs, dir)
		wire := filepath.Join(out, "wire-revoked.log")
		res := runChild(t, env(r), "run", input, "--run-dir", dir, "--base-url", r.URL, "--speed", "50", "--debug-http", wire)
		check(t, "run with a revoked key", res, exitOK)
		sent(t, r)
		has(t, "the --debug-http log", readFile(t, wire), "< 401 Unauthorized", "> X-Api-Key: [key "+fps["high_prio"]+"]")
		// The lane-fatal reasons are printed, naming the keys by fingerprint.
		has(t, "stderr", res.stderr, "org stopped", fps["high_prio"], fps["batch"])
		has(t, "events.jsonl", readFile(t, filepath.Join(dir, rundir.EventsFile)), "high_prio")
	})

	t.Run("plan --count-tokens", func(t *testing.T) {
		r := start(t)
		res := runChild(t, keyEnv, "plan", input, "--orgs", orgsTOML, "--base-url", r.URL, "--count-tokens", "--count-sample", "20", "--speed", "50")
		check(t, "plan --count-tokens", res, exitOK)
		// The first org of the file counts, and is named by fingerprint.
		has(t, "stderr", res.stderr, "key "+fps["batch"])
		has(t, "stdout", res.stdout, "count_tokens on 20 of 300")
	})

	t.Run("probe", func(t *testing.T) {
		r := start(t)
		wire := filepath.Join(out, "wire-probe.log")
		res := runChild(t, env(r), "probe", "--base-url", r.URL, "--out", filepath.Join(out, "limits.json"), "--debug-http", wire)
		check(t, "probe", res, exitOK)
		sent(t, r)
		wl := readFile(t, wire)
		for _, fp := range fps {
			has(t, "probe's table", res.stdout, fp)
			has(t, "limits.json", readFile(t, filepath.Join(out, "limits.json")), fp)
			has(t, "probe's --debug-http log", wl, "> X-Api-Key: [key "+fp+"]")
		}
		has(t, "probe's --debug-http log", wl, "< Anthropic-Ratelimit-Output-Tokens-Limit: ")
	})

	t.Run("ab", func(t *testing.T) {
		// ab --sim ignores configured keys (both arms use the embedded
		// simulator's own); with the keys in the environment and
		// --base-url at a simulator, ab runs as live and sends with them.
		r := start(t)
		dir := filepath.Join(out, "ab")
		res := runChild(t, env(r), "ab", "--n", "200", "--base-url", r.URL, "--speed", "50", "--dir", dir,
			"--status-file", filepath.Join(out, "ab-status.md"), "--out", filepath.Join(out, "ab-result.json"), "--quiet")
		scan.check(t, "ab stdout", []byte(res.stdout))
		scan.check(t, "ab stderr", []byte(res.stderr))
		if res.code != exitOK {
			t.Fatalf("ab exited %d (no key leaked in its output, but the rest of its output went unchecked):\n%s", res.code, tail(res.stderr))
		}
		sent(t, r)
		for name, fp := range fps {
			has(t, "ab's reminder", res.stderr, name+" ("+fp+")")
		}
		runDirs = append(runDirs, dir)
	})

	t.Run("report", func(t *testing.T) {
		for _, dir := range runDirs {
			res := runChild(t, nil, "report", dir)
			check(t, "report "+filepath.Base(dir), res, exitOK)
		}
		page := readFile(t, filepath.Join(out, "run", "report.html"))
		for _, fp := range fps {
			has(t, "run/report.html", page, fp)
		}
	})

	t.Run("refusals", func(t *testing.T) {
		r := start(t)
		// http:// to a host that is not loopback: refused before sending.
		for _, tc := range []struct {
			name  string
			extra []string
			args  []string
		}{
			{"run --base-url", env(r), []string{"run", input, "--run-dir", filepath.Join(out, "insecure"), "--base-url", "http://api.example.com"}},
			{"run ANTHROPIC_BASE_URL", append(env(r), "ANTHROPIC_BASE_URL=http://10.1.2.3:8080"), []string{"run", input, "--run-dir", filepath.Join(out, "insecure-env")}},
			{"probe --base-url", env(r), []string{"probe", "--base-url", "http://api.example.com", "--out", filepath.Join(out, "insecure-limits.json")}},
			{"plan --count-tokens --base-url", env(r), []string{"plan", input, "--count-tokens", "--base-url", "http://192.0.2.1"}},
		} {
			res := runChild(t, tc.extra, tc.args...)
			check(t, tc.name, res, exitUsage)
			has(t, tc.name+" stderr", res.stderr, "loopback")
		}

		// A key file readable by others: a warning naming the file, never the key.
		loose := filepath.Join(secrets, "loose.key")
		if err := os.WriteFile(loose, []byte(keys["low_prio"]), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(loose, 0o644); err != nil { // whatever the umask
			t.Fatal(err)
		}
		looseTOML := filepath.Join(secrets, "loose.toml")
		os.WriteFile(looseTOML, fmt.Appendf(nil, "[[org]]\nname = \"low_prio\"\nkey_file = %q\n", loose), 0o600)
		small := filepath.Join(out, "small.jsonl")
		writeJudge(t, small, 20)
		res := runChild(t, nil, "run", small, "--orgs", looseTOML, "--run-dir", filepath.Join(out, "loose"), "--base-url", r.URL, "--speed", "50")
		check(t, "run with a loose key file", res, exitOK)
		has(t, "stderr", res.stderr, "warning:", loose, "readable by others")

		// A key written into the orgs file: refused, and not echoed.
		inline := filepath.Join(secrets, "inline.toml")
		os.WriteFile(inline, fmt.Appendf(nil, "[[org]]\nname = \"high_prio\"\nkey = %q\n", keys["high_prio"]), 0o600)
		res = runChild(t, nil, "run", small, "--orgs", inline, "--run-dir", filepath.Join(out, "inline"), "--base-url", r.URL)
		check(t, "run with a key in the orgs file", res, exitUsage)
		has(t, "stderr", res.stderr, "must not be written in the orgs file")
		if n := r.Server.Stats().Org("high_prio").Requests; n != 0 {
			t.Errorf("the refused run sent %d requests", n)
		}
	})

	// Every file every command wrote.
	scan.checkTree(t, out)
	t.Logf("scanned %d outputs for %d key fragments", scan.scanned, len(scan.needles))
}

// TestKeyPastedIntoOrgsFileNotEchoed: a key pasted where the orgs file
// wants the name of an environment variable (key_env) or of a file
// (key_file) — a likely slip — is refused with exit 1, and the error does
// not repeat it.
func TestKeyPastedIntoOrgsFileNotEchoed(t *testing.T) {
	t.Parallel()
	cfg, _ := sim.Preset(sim.PresetOrigin3Org)
	keys := canaryKeys(t, &cfg)
	scan := newLeakScanner(keys)
	dir := t.TempDir()
	input := filepath.Join(dir, "req.jsonl")
	writeJudge(t, input, 5)
	for _, field := range []string{"key_env", "key_file"} {
		t.Run(field, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "orgs.toml")
			os.WriteFile(p, fmt.Appendf(nil, "[[org]]\nname = \"high_prio\"\n%s = %q\n", field, keys["high_prio"]), 0o600)
			code, stdout, stderr := runCLI("plan", input, "--orgs", p)
			if code != exitUsage {
				t.Errorf("exit %d, want %d", code, exitUsage)
			}
			scan.check(t, field+": stdout", []byte(stdout))
			scan.check(t, field+": stderr", []byte(stderr))
		})
	}
}

// TestMalformedKeyRefused: a key that cannot be sent in a header — a key
// file holding a second line, or an environment variable set from one —
// is refused when the orgs are loaded (exit 1, nothing sent, the key not
// echoed), rather than failing every request as if the connection had
// broken and retrying until a deadline.
func TestMalformedKeyRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	t.Parallel()
	var keys map[string]string
	r, input, _ := simWith(t, 50, 10, func(c *sim.Config) { keys = canaryKeys(t, c) })
	scan := newLeakScanner(keys)
	dir := filepath.Dir(input)
	kf := filepath.Join(dir, "two-lines.key")
	os.WriteFile(kf, []byte(keys["high_prio"]+"\nsecond line\n"), 0o600)
	orgs := filepath.Join(dir, "orgs.toml")
	os.WriteFile(orgs, fmt.Appendf(nil, "[[org]]\nname = \"high_prio\"\nkey_file = %q\n", kf), 0o600)
	for _, tc := range []struct {
		name  string
		extra []string
		args  []string
	}{
		{"key file with two lines", nil, []string{"--orgs", orgs}},
		// export ANTHROPIC_API_KEY_HIGH_PRIO="$(cat two-lines.key)"
		{"environment key with two lines", []string{"ANTHROPIC_API_KEY_HIGH_PRIO=" + keys["high_prio"] + "\nsecond line"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// --deadline bounds the run if the key is not refused up front.
			args := append([]string{"run", input, "--run-dir", filepath.Join(t.TempDir(), "run"), "--base-url", r.URL,
				"--speed", "50", "--quiet", "--deadline", "3s"}, tc.args...)
			res := runChild(t, tc.extra, args...)
			scan.check(t, "stdout", []byte(res.stdout))
			scan.check(t, "stderr", []byte(res.stderr))
			if res.code != exitUsage {
				t.Errorf("exit %d, want %d (refused when loading the orgs)\nstdout: %s\nstderr: %s", res.code, exitUsage, tail(res.stdout), tail(res.stderr))
			}
		})
	}
	if n := r.Server.Stats().Org("high_prio").Requests; n != 0 {
		t.Errorf("the simulator received %d requests", n)
	}
}

// poisonLines rewrites every tenth request so the API refuses it with a
// 400 (max_tokens above the model's maximum): terminal errors mixed in.
func poisonLines(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	for i := range lines {
		if i%10 == 3 {
			lines[i] = bytes.Replace(lines[i], []byte(`"max_tokens":256`), []byte(`"max_tokens":9999999`), 1)
		}
	}
	if err := os.WriteFile(path, append(bytes.Join(lines, []byte("\n")), '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
}
