package gateway

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/apidispatch/apidispatch/cost"
)

// ErrConfig: a token file, clients file or listen address is unusable.
var ErrConfig = errors.New("gateway: configuration")

// ErrTokenFileExposed: a file holding gateway tokens may be read by its
// group or by others (refused, as ssh refuses such a key, unless the
// caller allows it).
var ErrTokenFileExposed = errors.New("gateway: a token file readable by others")

// checkPrivate refuses a file of tokens that its group or others may read,
// unless insecure: a gateway token is a key to every org behind it. The
// error names the file, its mode and both ways out.
func checkPrivate(path, flag string, insecure bool) error {
	if insecure || runtime.GOOS == "windows" { // no Unix modes to judge there
		return nil
	}
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("%w: %s %s: %w", ErrConfig, flag, path, err)
	}
	if m := fi.Mode().Perm(); m&0o077 != 0 {
		return fmt.Errorf("%w: %w: %s %s has mode %#o: its group or others can read the tokens in it; chmod 600 it, or pass --insecure-token-file to use it as it is",
			ErrConfig, ErrTokenFileExposed, flag, path, m)
	}
	return nil
}

// TokenFile reads the gateway token at path, or creates the file (mode
// 0600) with a fresh random token when it does not exist. created reports
// the latter. A file its group or others may read is refused
// (ErrTokenFileExposed) unless insecure.
func TokenFile(path string, insecure bool) (tok string, created bool, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		tok = NewToken()
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return "", false, fmt.Errorf("%w: --token-file %s: %w", ErrConfig, path, err)
		}
		if _, err := f.WriteString(tok + "\n"); err != nil {
			f.Close()
			return "", false, fmt.Errorf("%w: --token-file %s: %w", ErrConfig, path, err)
		}
		return tok, true, f.Close()
	}
	if err != nil {
		return "", false, fmt.Errorf("%w: --token-file %s: %w", ErrConfig, path, err)
	}
	if err := checkPrivate(path, "--token-file", insecure); err != nil {
		return "", false, err
	}
	tok = strings.TrimSpace(string(b))
	if len(tok) < 16 || strings.ContainsAny(tok, " \t\r\n") {
		return "", false, fmt.Errorf("%w: --token-file %s: want one token of at least 16 characters without spaces", ErrConfig, path)
	}
	return tok, false, nil
}

// clientsDoc is the clients file:
//
//	[[client]]
//	name = "alice"
//	token = "…"          # or token_file = "path" (created 0600 when absent)
//	max_cost = 25        # USD, optional
//	weight = 2           # share against its class's other clients, default 1
//	priority = "bulk"    # or "interactive" (the default)
//	max_in_flight = 10   # optional hard share: requests admitted at once
type clientsDoc struct {
	Client []struct {
		Name        string   `toml:"name"`
		Token       string   `toml:"token"`
		TokenFile   string   `toml:"token_file"`
		MaxCost     float64  `toml:"max_cost"`
		Weight      *float64 `toml:"weight"`
		Priority    *string  `toml:"priority"`
		MaxInFlight *int64   `toml:"max_in_flight"`
	} `toml:"client"`
}

// maxWeight bounds a client's weight: beyond it the others' shares are
// below what the lanes can tell apart.
const maxWeight = 1000

// LoadClients reads a clients file; errors name the client and field. A
// clients file that holds tokens itself, and each token_file, is refused
// when its group or others may read it (ErrTokenFileExposed), unless
// insecure.
func LoadClients(path string, insecure bool) ([]Client, error) {
	var doc clientsDoc
	md, err := toml.DecodeFile(path, &doc)
	if err != nil {
		return nil, fmt.Errorf("%w: --clients %s: %w", ErrConfig, path, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		return nil, fmt.Errorf("%w: --clients %s: unknown field %s", ErrConfig, path, und[0])
	}
	if len(doc.Client) == 0 {
		return nil, fmt.Errorf("%w: --clients %s: no [[client]] entries", ErrConfig, path)
	}
	var out []Client
	seenTok := map[string]string{}
	for i, c := range doc.Client {
		where := fmt.Sprintf("--clients %s: client %d", path, i+1)
		if c.Name == "" {
			return nil, fmt.Errorf("%w: %s: name is required", ErrConfig, where)
		}
		where += " (" + c.Name + ")"
		tok := c.Token
		if tok != "" {
			if err := checkPrivate(path, "--clients", insecure); err != nil {
				return nil, fmt.Errorf("%s: %w", where, err)
			}
		}
		switch {
		case tok != "" && c.TokenFile != "":
			return nil, fmt.Errorf("%w: %s: give token or token_file, not both", ErrConfig, where)
		case c.TokenFile != "":
			if tok, _, err = TokenFile(c.TokenFile, insecure); err != nil {
				return nil, fmt.Errorf("%s: %w", where, err)
			}
		case len(tok) < 16:
			return nil, fmt.Errorf("%w: %s: token must have at least 16 characters", ErrConfig, where)
		}
		if other, dup := seenTok[tok]; dup {
			return nil, fmt.Errorf("%w: %s: same token as client %s", ErrConfig, where, other)
		}
		seenTok[tok] = c.Name
		if c.MaxCost < 0 {
			return nil, fmt.Errorf("%w: %s: max_cost must be positive", ErrConfig, where)
		}
		var mc cost.Nanos
		if c.MaxCost > 0 {
			if mc, err = cost.ParseUSD(strconv.FormatFloat(c.MaxCost, 'f', -1, 64)); err != nil {
				return nil, fmt.Errorf("%w: %s: max_cost: %w", ErrConfig, where, err)
			}
		}
		cl := Client{Name: c.Name, Token: tok, MaxCost: mc, Weight: 1}
		at := func(key string) string { return fmt.Sprintf("%s, line %d", where, fieldLine(path, i, key)) }
		if w := c.Weight; w != nil {
			if !(*w > 0 && *w <= maxWeight) { // NaN too
				return nil, fmt.Errorf("%w: %s: weight must be above 0 and at most %d, not %v", ErrConfig, at("weight"), maxWeight, *w)
			}
			cl.Weight = *w
		}
		if p := c.Priority; p != nil {
			if cl.Priority, err = ParseClass(*p); err != nil {
				return nil, fmt.Errorf("%w: %s: %w", ErrConfig, at("priority"), err)
			}
		}
		if m := c.MaxInFlight; m != nil {
			if *m < 1 || *m > math.MaxInt32 {
				return nil, fmt.Errorf("%w: %s: max_in_flight must be at least 1 (leave it out for no cap), not %d", ErrConfig, at("max_in_flight"), *m)
			}
			cl.MaxInFlight = int(*m)
		}
		out = append(out, cl)
	}
	return out, nil
}

// fieldLine is the line (from 1) of key in the i-th (from 0) [[client]]
// table of the clients file at path, for errors; 0 when it cannot tell.
func fieldLine(path string, i int, key string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	table := -1
	for n, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "[[client]]"):
			table++
		case strings.HasPrefix(line, "["):
			if table == i {
				return 0
			}
		case table == i:
			if k, _, ok := strings.Cut(line, "="); ok && strings.Trim(strings.TrimSpace(k), `"'`) == key {
				return n + 1
			}
		}
	}
	return 0
}

// IsLoopback reports whether a listen address is on loopback only.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
