// Package org loads the organisations a run may send to: one API key each,
// from the environment or from a TOML file that names environment variables
// or key files (never the key itself).
//
// A key is held in a Key value that prints, formats and marshals only as its
// fingerprint, so a key cannot reach a log, a result or an error message by
// accident. Only Key.Reveal returns the secret; the HTTP layer calls it to set
// the x-api-key header and nothing else should.
package org

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// Key is an API key. Its zero value is the empty key. Printing it in any way
// shows its fingerprint, never the secret.
type Key struct{ secret string }

// NewKey wraps a secret.
func NewKey(secret string) Key { return Key{secret: secret} }

// Reveal returns the secret, for the x-api-key header only.
func (k Key) Reveal() string { return k.secret }

// Empty reports whether the key is blank.
func (k Key) Empty() bool { return strings.TrimSpace(k.secret) == "" }

// Fingerprint is the first 8 hex digits of the key's SHA-256.
func (k Key) Fingerprint() string { return Fingerprint(k.secret) }

// String returns "key:" and the fingerprint.
func (k Key) String() string { return "key:" + k.Fingerprint() }

// GoString is String, so %#v does not reveal the secret either.
func (k Key) GoString() string { return k.String() }

// Format makes every verb print the fingerprint form.
func (k Key) Format(f fmt.State, _ rune) { fmt.Fprint(f, k.String()) }

// MarshalJSON writes the fingerprint.
func (k Key) MarshalJSON() ([]byte, error) { return []byte(`"` + k.Fingerprint() + `"`), nil }

// MarshalText writes the fingerprint (slog and encoders that use it).
func (k Key) MarshalText() ([]byte, error) { return []byte(k.Fingerprint()), nil }

// checkKey refuses a key that cannot travel in an HTTP header: one holding
// white space or control characters (a key file with a second line, say).
// The error names where the key came from, never the key.
func checkKey(secret, source string) error {
	for i := 0; i < len(secret); i++ {
		if c := secret[i]; c <= ' ' || c == 0x7f {
			return fmt.Errorf("org: the key from %s contains white space or a control character (is it more than one line?); a key is a single token", source)
		}
	}
	return nil
}

// Fingerprint is the first 8 hex digits of the SHA-256 of secret.
func Fingerprint(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:4])
}

// keyLike matches text that looks like an API key: Anthropic's
// ("sk-ant-…") and OpenAI's ("sk-proj-…", "sk-svcacct-…", "sk-admin-…" and
// the older bare "sk-…"), with at least 8 characters after "sk-" and not
// inside a word, so that "sk-learn" and "disk-usage-report" stay.
var keyLike = regexp.MustCompile(`\bsk-[A-Za-z0-9_\-]{8,}`)

// Scrub returns s with any text that looks like an API key (Anthropic's
// or OpenAI's) replaced by "[redacted]". It is a second line of defence
// for text that comes from outside (inputs, headers, error texts); keys
// held in a Key never need it.
func Scrub(s string) string {
	if !strings.Contains(s, "sk-") {
		return s
	}
	return keyLike.ReplaceAllString(s, "[redacted]")
}

// Providers an org may belong to (Org.Provider).
const (
	Anthropic = "anthropic"
	OpenAI    = "openai"
)

// Org is one organisation: a name and the key that reaches it.
type Org struct {
	Name string `json:"name"`
	Key  Key    `json:"key_fingerprint"`
	// Provider is the API the key is for: Anthropic ("" means Anthropic
	// too) or OpenAI.
	Provider string `json:"provider,omitempty"`
	// Organization and Project are an OpenAI key's organisation and
	// project ids, sent as OpenAI-Organization and OpenAI-Project when
	// set ("" for an Anthropic org).
	Organization string `json:"organization,omitempty"`
	Project      string `json:"project,omitempty"`
	// Source says where the key came from ("env ANTHROPIC_API_KEY", "file k.txt").
	Source string `json:"source"`
	// Rotated is when the key was last rotated (zero when unknown).
	Rotated time.Time `json:"rotated,omitzero"`
}

// ProviderName is o's provider, Anthropic when unset.
func (o Org) ProviderName() string {
	if o.Provider == "" {
		return Anthropic
	}
	return o.Provider
}

// RotationAge is the key age after which a rotation reminder is due.
const RotationAge = 90 * 24 * time.Hour

// NeedsRotation reports whether the key is known to be older than RotationAge at now.
func (o Org) NeedsRotation(now time.Time) bool {
	return !o.Rotated.IsZero() && now.Sub(o.Rotated) > RotationAge
}

// Errors.
var (
	ErrNoOrgs = errors.New("org: no API keys configured (set ANTHROPIC_API_KEY or ANTHROPIC_API_KEY_<NAME>, OPENAI_API_KEY or OPENAI_API_KEY_<NAME>, or pass --orgs FILE)")
)

var (
	nameRE = regexp.MustCompile(`^[a-z0-9_-]{1,64}$`)
	// idRE is an OpenAI organisation or project id: "org-…", "proj_…".
	idRE     = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)
	envVarRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)
)

// looksLikeKey reports whether a value that should name a variable or a
// path is more likely a pasted key: it must then never be echoed.
func looksLikeKey(v string) bool {
	return strings.HasPrefix(v, "sk-") || strings.Contains(v, "sk-ant")
}

// FromEnv reads orgs from environment entries ("NAME=value"):
// ANTHROPIC_API_KEY is org "default", ANTHROPIC_API_KEY_<NAME> is org
// "<name>" (lower-cased), ANTHROPIC_BATCH_KEY is org "batch";
// OPENAI_API_KEY is the OpenAI org "openai" (with OPENAI_ORG_ID and
// OPENAI_PROJECT_ID, as the official SDKs read them) and
// OPENAI_API_KEY_<NAME> the OpenAI org "openai-<name>": the prefix keeps
// org names unique across providers. Blank values are absent. The result
// is sorted with "default" first, then by name.
func FromEnv(environ []string) ([]Org, error) {
	var orgs []Org
	seen := map[string]bool{}
	env := map[string]string{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = strings.TrimSpace(v)
		}
	}
	for _, kv := range environ {
		name, val, ok := strings.Cut(kv, "=")
		if !ok || strings.TrimSpace(val) == "" {
			continue
		}
		var on, provider string
		switch {
		case name == "ANTHROPIC_API_KEY":
			on = "default"
		case name == "ANTHROPIC_BATCH_KEY":
			on = "batch"
		case strings.HasPrefix(name, "ANTHROPIC_API_KEY_"):
			on = strings.ToLower(strings.TrimPrefix(name, "ANTHROPIC_API_KEY_"))
		case name == "OPENAI_API_KEY":
			on, provider = "openai", OpenAI
		case strings.HasPrefix(name, "OPENAI_API_KEY_"):
			on, provider = "openai-"+strings.ToLower(strings.TrimPrefix(name, "OPENAI_API_KEY_")), OpenAI
		default:
			continue
		}
		if !nameRE.MatchString(on) {
			return nil, fmt.Errorf("org: environment variable %s gives org name %q: use letters, digits, _ or -", name, on)
		}
		if seen[on] {
			return nil, fmt.Errorf("org: two environment variables name org %q", on)
		}
		seen[on] = true
		secret := strings.TrimSpace(val)
		if err := checkKey(secret, "environment variable "+name); err != nil {
			return nil, err
		}
		o := Org{Name: on, Key: NewKey(secret), Source: "env " + name, Provider: provider}
		if name == "OPENAI_API_KEY" {
			o.Organization, o.Project = env["OPENAI_ORG_ID"], env["OPENAI_PROJECT_ID"]
			for v, id := range map[string]string{"OPENAI_ORG_ID": o.Organization, "OPENAI_PROJECT_ID": o.Project} {
				if id != "" && (looksLikeKey(id) || !idRE.MatchString(id)) {
					return nil, fmt.Errorf("org: environment variable %s is not an OpenAI id (letters, digits, _ or -)", v)
				}
			}
		}
		orgs = append(orgs, o)
	}
	sort.SliceStable(orgs, func(i, j int) bool {
		if (orgs[i].Name == "default") != (orgs[j].Name == "default") {
			return orgs[i].Name == "default"
		}
		return orgs[i].Name < orgs[j].Name
	})
	if len(orgs) == 0 {
		return nil, ErrNoOrgs
	}
	return orgs, nil
}

type fileOrg struct {
	Name         string    `toml:"name"`
	Provider     string    `toml:"provider"`
	Organization string    `toml:"organization"`
	Project      string    `toml:"project"`
	KeyEnv       string    `toml:"key_env"`
	KeyFile      string    `toml:"key_file"`
	Key          string    `toml:"key"`
	Rotated      time.Time `toml:"rotated"`
}

type fileDoc struct {
	Org []fileOrg `toml:"org"`
}

// Warning is a non-fatal observation made while loading (a key file readable
// by others). It never contains the key.
type Warning string

// FromFile reads orgs from a TOML file:
//
//	[[org]]
//	name = "high_prio"
//	key_env = "ANTHROPIC_API_KEY"   # or key_file = "path" (mode 0600)
//	rotated = 2026-06-27            # optional
//
//	[[org]]
//	name = "gpt_lab"
//	provider = "openai"             # default "anthropic"
//	key_env = "OPENAI_API_KEY"
//	organization = "org-…"          # optional: sent as OpenAI-Organization
//	project = "proj_…"              # optional: sent as OpenAI-Project
//
// getenv resolves key_env. A key written into the file itself is refused.
// Names are unique across providers.
func FromFile(path string, getenv func(string) string) ([]Org, []Warning, error) {
	var doc fileDoc
	md, err := toml.DecodeFile(path, &doc)
	if err != nil {
		return nil, nil, fmt.Errorf("org: reading %s: %w", path, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		return nil, nil, fmt.Errorf("org: %s: unknown key %q", path, und[0].String())
	}
	var warns []Warning
	var orgs []Org
	seen := map[string]bool{}
	for i, fo := range doc.Org {
		where := fmt.Sprintf("%s: org #%d", path, i+1)
		if fo.Key != "" {
			return nil, nil, fmt.Errorf("%s: a key must not be written in the orgs file; use key_env or key_file", where)
		}
		if !nameRE.MatchString(fo.Name) {
			return nil, nil, fmt.Errorf("%s: name %q must be 1-64 of a-z, 0-9, _ or -", where, fo.Name)
		}
		if seen[fo.Name] {
			return nil, nil, fmt.Errorf("%s: org %q appears twice", where, fo.Name)
		}
		seen[fo.Name] = true
		o := Org{Name: fo.Name}
		switch fo.Provider {
		case "", Anthropic:
			if fo.Organization != "" || fo.Project != "" {
				return nil, nil, fmt.Errorf("%s (%s): organization and project are for provider %q orgs", where, fo.Name, OpenAI)
			}
		case OpenAI:
			o.Provider, o.Organization, o.Project = OpenAI, fo.Organization, fo.Project
			for what, id := range map[string]string{"organization": fo.Organization, "project": fo.Project} {
				if id != "" && (looksLikeKey(id) || !idRE.MatchString(id)) {
					return nil, nil, fmt.Errorf("%s (%s): %s must be an OpenAI id (letters, digits, _ or -, as org-… or proj_…)", where, fo.Name, what)
				}
			}
		default:
			return nil, nil, fmt.Errorf("%s (%s): provider %q: use %q or %q", where, fo.Name, fo.Provider, Anthropic, OpenAI)
		}
		switch {
		case fo.KeyEnv != "" && fo.KeyFile != "":
			return nil, nil, fmt.Errorf("%s (%s): give key_env or key_file, not both", where, fo.Name)
		case fo.KeyEnv != "" && (looksLikeKey(fo.KeyEnv) || !envVarRE.MatchString(fo.KeyEnv)):
			return nil, nil, fmt.Errorf("%s (%s): key_env must name an environment variable, and this value is not a variable name (a pasted key? fingerprint %s); put the key in the environment and name the variable", where, fo.Name, Fingerprint(fo.KeyEnv))
		case fo.KeyFile != "" && looksLikeKey(fo.KeyFile):
			return nil, nil, fmt.Errorf("%s (%s): key_file must be a path, and this value looks like a key (fingerprint %s); put the key in a file (mode 0600) and name the file", where, fo.Name, Fingerprint(fo.KeyFile))
		case fo.KeyEnv != "":
			v := strings.TrimSpace(getenv(fo.KeyEnv))
			if v == "" {
				return nil, nil, fmt.Errorf("%s (%s): environment variable %s is not set", where, fo.Name, fo.KeyEnv)
			}
			if err := checkKey(v, "environment variable "+fo.KeyEnv); err != nil {
				return nil, nil, fmt.Errorf("%s (%s): %w", where, fo.Name, err)
			}
			o.Key, o.Source = NewKey(v), "env "+fo.KeyEnv
		case fo.KeyFile != "":
			st, err := os.Stat(fo.KeyFile)
			if err != nil {
				return nil, nil, fmt.Errorf("%s (%s): key file: %w", where, fo.Name, err)
			}
			if st.Mode().Perm()&0o077 != 0 {
				warns = append(warns, Warning(fmt.Sprintf("key file %s for org %s is readable by others (mode %04o); chmod 600 it", fo.KeyFile, fo.Name, st.Mode().Perm())))
			}
			b, err := os.ReadFile(fo.KeyFile)
			if err != nil {
				return nil, nil, fmt.Errorf("%s (%s): key file: %w", where, fo.Name, err)
			}
			v := strings.TrimSpace(string(b))
			if v == "" {
				return nil, nil, fmt.Errorf("%s (%s): key file %s is empty", where, fo.Name, fo.KeyFile)
			}
			if err := checkKey(v, "key file "+fo.KeyFile); err != nil {
				return nil, nil, fmt.Errorf("%s (%s): %w", where, fo.Name, err)
			}
			o.Key, o.Source = NewKey(v), "file "+fo.KeyFile
		default:
			return nil, nil, fmt.Errorf("%s (%s): needs key_env or key_file", where, fo.Name)
		}
		if !fo.Rotated.IsZero() {
			o.Rotated = fo.Rotated
		}
		orgs = append(orgs, o)
	}
	if len(orgs) == 0 {
		return nil, nil, fmt.Errorf("org: %s defines no [[org]]", path)
	}
	return orgs, warns, nil
}

// Load reads orgs from path when it is not empty, else from the environment.
func Load(path string, environ []string) ([]Org, []Warning, error) {
	if path == "" {
		o, err := FromEnv(environ)
		return o, nil, err
	}
	env := map[string]string{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	return FromFile(path, func(k string) string { return env[k] })
}
