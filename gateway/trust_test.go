package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"

	"github.com/apidispatch/apidispatch/cache"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/sim"
)

// A client's Host header never reaches results_url: it is built from the
// address the gateway was reached at (its listener), or from PublicURL
// when one is configured. A batch request with Host: evil.example.com
// used to be answered with a results_url on evil.example.com, where an
// SDK would have sent the client's gateway token to fetch the results.
func TestResultsURLNeverFromHost(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 1000, nil)
	for _, public := range []string{"", "https://gw.example.org:8443"} {
		_, srv := startGW(t, run, func(c *Config) { c.PublicURL = public })
		ca := sdkClient(srv.URL, tokA)
		b, err := ca.Messages.Batches.New(context.Background(), sdk.MessageBatchNewParams{Requests: []sdk.MessageBatchNewParamsRequest{batchReq("x", 1)}})
		if err != nil {
			t.Fatal(err)
		}
		waitEnded(t, &ca, b.ID)
		want := srv.URL + "/v1/messages/batches/" + b.ID + "/results"
		if public != "" {
			want = public + "/v1/messages/batches/" + b.ID + "/results"
		}
		for _, path := range []string{"/v1/messages/batches/" + b.ID, "/v1/messages/batches"} {
			req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
			req.Host = "evil.example.com"
			req.Header.Set("x-api-key", tokA)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || strings.Contains(string(body), "evil.example.com") || !strings.Contains(string(body), `"results_url":"`+want+`"`) {
				t.Errorf("public URL %q, GET %s with Host evil.example.com: %d %s; want results_url %s", public, path, resp.StatusCode, body, want)
			}
		}
	}
}

// A token file that its group or others may read is refused, as ssh
// refuses such a key, unless the caller says it is insecure on purpose;
// the error names the file, its mode and the way out. 0600 and 0400 are
// taken; a token file created by the gateway is 0600.
func TestTokenFileReadableByOthersIsRefused(t *testing.T) {
	dir := t.TempDir()
	const tok = "sk-gw-test-token-file-000001"
	for _, c := range []struct {
		mode os.FileMode
		ok   bool
	}{{0o600, true}, {0o400, true}, {0o644, false}, {0o640, false}, {0o604, false}} {
		path := filepath.Join(dir, "tok-"+c.mode.String())
		if err := os.WriteFile(path, []byte(tok+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, c.mode); err != nil {
			t.Fatal(err)
		}
		got, _, err := TokenFile(path, false)
		switch {
		case c.ok && (err != nil || got != tok):
			t.Errorf("mode %v: %q %v, want the token", c.mode, got, err)
		case !c.ok && (err == nil || !errors.Is(err, ErrTokenFileExposed) || !strings.Contains(err.Error(), path) ||
			!strings.Contains(err.Error(), "--insecure-token-file") || !strings.Contains(err.Error(), fmt.Sprintf("mode %#o", c.mode))):
			t.Errorf("mode %v: %q %v, want ErrTokenFileExposed naming the file, its mode and --insecure-token-file", c.mode, got, err)
		}
		if got, _, err := TokenFile(path, true); err != nil || got != tok {
			t.Errorf("mode %v with insecure allowed: %q %v", c.mode, got, err)
		}
		// The same rule for a client's token_file and for a clients file
		// that holds tokens itself.
		clients := filepath.Join(dir, "clients-"+c.mode.String()+".toml")
		os.WriteFile(clients, []byte("[[client]]\nname = \"a\"\ntoken_file = \""+path+"\"\n"), 0o600)
		if _, err := LoadClients(clients, false); (err == nil) != c.ok {
			t.Errorf("mode %v: clients file with token_file: %v", c.mode, err)
		}
		inline := filepath.Join(dir, "inline-"+c.mode.String()+".toml")
		os.WriteFile(inline, []byte("[[client]]\nname = \"a\"\ntoken = \""+tok+"\"\n"), 0o600)
		os.Chmod(inline, c.mode)
		if _, err := LoadClients(inline, false); (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrTokenFileExposed)) {
			t.Errorf("mode %v: clients file with an inline token: %v", c.mode, err)
		}
		if _, err := LoadClients(inline, true); err != nil {
			t.Errorf("mode %v: clients file, insecure allowed: %v", c.mode, err)
		}
	}
	created := filepath.Join(dir, "new")
	if _, made, err := TokenFile(created, false); err != nil || !made {
		t.Fatalf("creating a token file: %v", err)
	}
	if fi, err := os.Stat(created); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("created token file: %v %v", fi, err)
	}
}

// Cache hits are the client's own by default: bob sending alice's exact
// prompt is sent upstream and answered as a miss (he used to get
// x-apidispatch-cached: true, learning that she had sent it), and alice's
// repeat is her hit. With the shared scope every client reads every
// client's answers.
func TestCacheHitsScopedPerClient(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	for _, scope := range []string{"", CacheScopeClient, CacheScopeShared} {
		cc := openCache(t, filepath.Join(t.TempDir(), "c.db"))
		g, srv := startGW(t, run, func(c *Config) {
			c.Cache, c.CacheMode, c.CacheScope = cc, cache.ModeReadWrite, scope
		})
		before := run.Server.LedgerTotals().Requests
		if a := postMessage(t, srv.URL, tokA, judgeBody(7, "")); a.status != 200 || a.header.Get(headerCached) != "" {
			t.Fatalf("scope %q: alice's first: %d %s", scope, a.status, a.body)
		}
		bob := postMessage(t, srv.URL, tokB, judgeBody(7, ""))
		sent := run.Server.LedgerTotals().Requests - before
		shared := scope == CacheScopeShared
		if bob.status != 200 || (bob.header.Get(headerCached) == "true") != shared || sent != map[bool]int64{false: 2, true: 1}[shared] {
			t.Errorf("scope %q: bob sends alice's prompt: %d cached=%q, %d sent upstream", scope, bob.status, bob.header.Get(headerCached), sent)
		}
		if a := postMessage(t, srv.URL, tokA, judgeBody(7, "")); a.status != 200 || a.header.Get(headerCached) != "true" {
			t.Errorf("scope %q: alice's repeat: %d cached=%q", scope, a.status, a.header.Get(headerCached))
		}
		if st := g.Status().Cache; st == nil || st.Scope != map[bool]string{false: CacheScopeClient, true: CacheScopeShared}[shared] {
			t.Errorf("scope %q: status %+v", scope, st)
		}
	}
	if _, err := New(Config{Orgs: run.Server.Orgs(), BaseURL: run.URL, Clients: []Client{{Name: "a", Token: tokA}}, StateDir: t.TempDir(),
		Cache: openCache(t, filepath.Join(t.TempDir(), "c.db")), CacheScope: "everyone"}); err == nil || !strings.Contains(err.Error(), "everyone") {
		t.Errorf("an unknown cache scope: %v", err)
	}
}
