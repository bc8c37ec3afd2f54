package org

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const secret = "sk-ant-test-NOTAREALKEY-0123456789"

func TestKeyNeverPrints(t *testing.T) {
	t.Parallel()
	k := NewKey(secret)
	for _, s := range []string{fmt.Sprint(k), fmt.Sprintf("%v %+v %#v %s %q", k, k, k, k, k), k.String()} {
		if strings.Contains(s, "NOTAREALKEY") {
			t.Fatalf("key printed: %s", s)
		}
	}
	b, _ := k.MarshalJSON()
	if strings.Contains(string(b), "NOTAREALKEY") || k.Reveal() != secret {
		t.Fatal("marshal leaked or reveal lost the key")
	}
}

func TestFromEnv(t *testing.T) {
	t.Parallel()
	orgs, err := FromEnv([]string{"ANTHROPIC_API_KEY_LOW_PRIO=b", "ANTHROPIC_API_KEY=a", "ANTHROPIC_BATCH_KEY=c", "ANTHROPIC_API_KEY_EMPTY= ", "OTHER=x"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, o := range orgs {
		names = append(names, o.Name)
	}
	if strings.Join(names, ",") != "default,batch,low_prio" {
		t.Fatalf("orgs %v", names)
	}
	if _, err := FromEnv(nil); err != ErrNoOrgs {
		t.Fatalf("no keys: %v", err)
	}
}

// TestMultiLineKeyRefused: a key with a second line cannot be sent in a
// header; it is refused when loaded, and the error does not echo it.
func TestMultiLineKeyRefused(t *testing.T) {
	t.Parallel()
	_, err := FromEnv([]string{"ANTHROPIC_API_KEY=" + secret + "\nsecond"})
	if err == nil || strings.Contains(err.Error(), "NOTAREALKEY") {
		t.Fatalf("env: %v", err)
	}
	dir := t.TempDir()
	kf := filepath.Join(dir, "k")
	os.WriteFile(kf, []byte(secret+"\nsecond\n"), 0o600)
	f := filepath.Join(dir, "orgs.toml")
	os.WriteFile(f, fmt.Appendf(nil, "[[org]]\nname = \"a\"\nkey_file = %q\n", kf), 0o600)
	if _, _, err := FromFile(f, os.Getenv); err == nil || strings.Contains(err.Error(), "NOTAREALKEY") {
		t.Fatalf("file: %v", err)
	}
}

func TestFromFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	kf := filepath.Join(dir, "k")
	os.WriteFile(kf, []byte(secret+"\n"), 0o644)
	f := filepath.Join(dir, "orgs.toml")
	os.WriteFile(f, fmt.Appendf(nil, "[[org]]\nname = \"high_prio\"\nkey_file = %q\nrotated = 2026-01-01\n\n[[org]]\nname = \"low\"\nkey_env = \"K2\"\n", kf), 0o600)
	orgs, warns, err := FromFile(f, func(k string) string { return map[string]string{"K2": "sk-two"}[k] })
	if err != nil {
		t.Fatal(err)
	}
	if len(orgs) != 2 || len(warns) != 1 || strings.Contains(string(warns[0]), "NOTAREALKEY") {
		t.Fatalf("orgs %v warns %v", orgs, warns)
	}
	if !orgs[0].NeedsRotation(time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)) || orgs[1].NeedsRotation(time.Now()) {
		t.Fatal("rotation reminder wrong")
	}
	os.WriteFile(f, []byte("[[org]]\nname = \"a\"\nkey = \"sk-inline\"\n"), 0o600)
	if _, _, err := FromFile(f, os.Getenv); err == nil || !strings.Contains(err.Error(), "must not be written") || strings.Contains(err.Error(), "sk-inline") {
		t.Fatalf("inline key: %v", err)
	}
}
