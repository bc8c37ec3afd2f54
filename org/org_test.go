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

// OpenAI keys come from OPENAI_API_KEY (org "openai", with the SDKs'
// OPENAI_ORG_ID and OPENAI_PROJECT_ID) and OPENAI_API_KEY_<NAME> (org
// "openai-<name>"), beside the Anthropic ones.
func TestFromEnvOpenAI(t *testing.T) {
	t.Parallel()
	orgs, err := FromEnv([]string{"ANTHROPIC_API_KEY=a", "OPENAI_API_KEY=sk-proj-aaaaaaaaaaaa", "OPENAI_ORG_ID=org-abc",
		"OPENAI_PROJECT_ID=proj_x", "OPENAI_API_KEY_LAB=sk-proj-bbbbbbbbbbbb", "ANTHROPIC_API_KEY_LAB=c"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Org{}
	for _, o := range orgs {
		got[o.Name] = o
	}
	if len(got) != 4 || got["default"].ProviderName() != Anthropic || got["lab"].ProviderName() != Anthropic {
		t.Fatalf("orgs %+v", orgs)
	}
	if o := got["openai"]; o.Provider != OpenAI || o.Organization != "org-abc" || o.Project != "proj_x" || o.Key.Reveal() != "sk-proj-aaaaaaaaaaaa" {
		t.Fatalf("openai org %+v", o)
	}
	if o := got["openai-lab"]; o.Provider != OpenAI || o.Organization != "" || o.Key.Reveal() != "sk-proj-bbbbbbbbbbbb" {
		t.Fatalf("openai-lab org %+v", o)
	}
	if _, err := FromEnv([]string{"OPENAI_API_KEY=k", "OPENAI_ORG_ID=sk-proj-pastedkey"}); err == nil || strings.Contains(err.Error(), "pastedkey") {
		t.Fatalf("a key pasted as the organisation id: %v", err)
	}
}

func TestFromFileOpenAI(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(body string) string {
		p := filepath.Join(dir, fmt.Sprintf("orgs%d.toml", len(body)))
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	env := func(string) string { return "sk-proj-0123456789abcdef" }
	orgs, _, err := FromFile(write(`
[[org]]
name = "claude"
key_env = "A"

[[org]]
name = "gpt"
provider = "openai"
key_env = "B"
organization = "org-AbC123"
project = "proj_judge"
`), env)
	if err != nil {
		t.Fatal(err)
	}
	if orgs[0].ProviderName() != Anthropic || orgs[1].Provider != OpenAI || orgs[1].Organization != "org-AbC123" || orgs[1].Project != "proj_judge" {
		t.Fatalf("orgs %+v", orgs)
	}
	for _, c := range []struct{ body, want string }{
		{"[[org]]\nname = \"x\"\nprovider = \"gemini\"\nkey_env = \"A\"\n", `provider "gemini"`},
		{"[[org]]\nname = \"x\"\nkey_env = \"A\"\norganization = \"org-1\"\n", "organization and project are for provider"},
		{"[[org]]\nname = \"x\"\nprovider = \"openai\"\nkey_env = \"A\"\nproject = \"proj x\"\n", "project must be an OpenAI id"},
		{"[[org]]\nname = \"x\"\nkey_env = \"A\"\n[[org]]\nname = \"x\"\nprovider = \"openai\"\nkey_env = \"B\"\n", `org "x" appears twice`},
	} {
		if _, _, err := FromFile(write(c.body), env); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want %q", c.body, err, c.want)
		}
	}
}

// Scrub redacts OpenAI keys as well as Anthropic ones.
func TestScrubOpenAIKeys(t *testing.T) {
	t.Parallel()
	for _, k := range []string{"sk-proj-AbCdEf0123456789_xyz", "sk-svcacct-0123456789abcdef", "sk-0123456789abcdefABCDEF", secret} {
		s := Scrub("header Bearer " + k + " refused")
		if strings.Contains(s, k) || !strings.Contains(s, "[redacted]") {
			t.Errorf("Scrub left %q in %q", k, s)
		}
	}
	if s := Scrub("uses sk-learn and disk-usage-report"); s != "uses sk-learn and disk-usage-report" {
		t.Errorf("Scrub changed plain text: %q", s)
	}
}
