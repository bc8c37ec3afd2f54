package main

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/internal/syncbuf"
	"github.com/apidispatch/apidispatch/sim"
)

func TestSimCommandServesAndFlushesLedger(t *testing.T) {
	dir := t.TempDir()
	ledger := filepath.Join(dir, "ledger.jsonl")
	keys := filepath.Join(dir, "keys.env")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncbuf.Buffer
	done := make(chan int, 1)
	go func() {
		done <- runSim(ctx, []string{"--preset", "origin-3org", "--listen", "127.0.0.1:0", "--speed", "50",
			"--ledger", ledger, "--keys-env", keys, "--seed", "3"}, &stdout, &stderr)
	}()
	var base, key string
	deadline := time.Now().Add(10 * time.Second)
	for base == "" || key == "" {
		if time.Now().After(deadline) {
			t.Fatalf("no URL and key printed; stdout %q stderr %q", stdout.String(), stderr.String())
		}
		for _, l := range strings.Split(stdout.String(), "\n") {
			if v, ok := strings.CutPrefix(l, "ANTHROPIC_BASE_URL="); ok {
				base = v
			}
			if v, ok := strings.CutPrefix(l, "ANTHROPIC_API_KEY_HIGH_PRIO="); ok {
				key = v
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, org := range []string{"HIGH_PRIO", "BATCH", "LOW_PRIO"} {
		if !strings.Contains(stdout.String(), "ANTHROPIC_API_KEY_"+org+"=sk-ant-sim-") {
			t.Errorf("no key line for %s in %q", org, stdout.String())
		}
	}
	st, err := os.Stat(keys)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("keys env file: %v, mode %v; want 0600", err, st.Mode())
	}
	b, _ := os.ReadFile(keys)
	if !strings.Contains(string(b), "ANTHROPIC_API_KEY_HIGH_PRIO="+key) || !strings.Contains(string(b), "ANTHROPIC_BASE_URL="+base+"\n") {
		t.Errorf("keys file %q lacks the printed key or base URL", b)
	}

	req, _ := http.NewRequest("POST", base+"/v1/messages", strings.NewReader(
		`{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{"role":"user","content":"hello"}]}`))
	req.Header.Set("x-api-key", key)
	req.Header.Set("anthropic-version", "2023-06-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}

	cancel()
	select {
	case code := <-done:
		if code != exitOK {
			t.Fatalf("exit %d; stderr %q", code, stderr.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("sim did not stop on cancel")
	}
	f, err := os.Open(ledger)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	entries, err := sim.ReadLedgerJSONL(f)
	if err != nil || len(entries) != 1 || entries[0].Org != "high_prio" {
		t.Fatalf("ledger %+v, %v: want one high_prio entry", entries, err)
	}
	if strings.Contains(stdout.String()[strings.Index(stdout.String(), "stopped"):], key) {
		t.Error("totals print the key")
	}
	if !strings.Contains(stdout.String(), "billed 1 requests") {
		t.Errorf("no totals in %q", stdout.String())
	}
}

func TestSimCommandRefusesNonLoopback(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:8080", ":8080", "192.168.1.2:80", "example.com:80"} {
		var stdout, stderr syncbuf.Buffer
		code := runSim(context.Background(), []string{"--listen", addr}, &stdout, &stderr)
		if code != exitUsage || !strings.Contains(stderr.String(), "loopback") {
			t.Errorf("--listen %s: exit %d, stderr %q; want a loopback refusal", addr, code, stderr.String())
		}
	}
}

func TestSimCommandHelpAndBadFlags(t *testing.T) {
	var stdout, stderr syncbuf.Buffer
	if code := runSim(context.Background(), []string{"--help"}, &stdout, &stderr); code != exitOK {
		t.Fatalf("--help exit %d", code)
	}
	for _, want := range []string{"--preset", "--listen", "--speed", "--ledger", "--config", "--keys-env", "--seed", "origin-3org", "build-3org", "colleague", "/sim/faults"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("--help does not mention %s", want)
		}
	}
	for _, args := range [][]string{{"--preset", "nope"}, {"--speed", "-1"}, {"extra"}, {"--config", "/does/not/exist"}} {
		var o, e syncbuf.Buffer
		if code := runSim(context.Background(), append(args, "--listen", "127.0.0.1:0"), &o, &e); code != exitUsage {
			t.Errorf("%v: exit %d, want %d", args, code, exitUsage)
		}
	}
}
