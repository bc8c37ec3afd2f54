package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// serve --help names every flag of the gateway's edges, and says what a
// shared cache scope reveals.
func TestServeHelpNamesTheEdgeFlags(t *testing.T) {
	code, _, errOut := runCLI("serve", "--help")
	if code != exitOK {
		t.Fatalf("serve --help: exit %d", code)
	}
	for _, want := range []string{"-drain", "-max-conns", "-max-conns-per-ip", "-header-timeout", "-body-timeout", "-write-timeout",
		"-public-url", "-insecure-token-file", "-cache-scope", "a hit reveals that someone sent the same request", "second signal"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("serve --help does not mention %q", want)
		}
	}
}

// A token file its group or others may read is refused before anything
// starts, naming the way out; so is a --cache-scope that is not one, and
// a --max-conns with no headroom under the file limit.
func TestServeRefusesBadEdgeSettings(t *testing.T) {
	orgs := orgsFile(t, map[string]string{"a": "sk-ant-test-a"})
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	if err := os.WriteFile(tok, []byte("sk-gw-test-exposed-token-0001\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Chmod(tok, 0o644)
	base := []string{"serve", "--orgs", orgs, "--listen", "127.0.0.1:0", "--state-dir", filepath.Join(dir, "state")}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--token-file", tok}, "--insecure-token-file"},
		{[]string{"--token-file", filepath.Join(dir, "new"), "--cache-scope", "everyone"}, `cache scope "everyone"`},
		{[]string{"--token-file", filepath.Join(dir, "new"), "--max-conns", "1000000000"}, "headroom"},
		{[]string{"--token-file", filepath.Join(dir, "new"), "--public-url", "ftp://x"}, "public URL"},
	} {
		code, _, errOut := runCLI(append(base, c.args...)...)
		if code != exitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d %s; want %d naming %q", c.args, code, errOut, exitUsage, c.want)
		}
	}
}
