package cost

import (
	_ "embed"
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/BurntSushi/toml"
)

//go:embed prices.toml
var embeddedPrices []byte

var defaultTable = sync.OnceValue(func() *Table {
	entries, err := parsePrices("prices.toml (embedded)", embeddedPrices)
	if err != nil {
		panic(err) // the embedded file is covered by tests
	}
	return newTable(entries)
})

// Default returns the embedded price table (prices.toml in this package).
// It is shared and immutable.
func Default() *Table { return defaultTable() }

// Load reads a TOML price file in the format of the embedded prices.toml and
// returns the embedded table extended and overridden by it. Each model in the
// file replaces the embedded entry that has that id or alias (all of its
// fields; its names now point at the new entry) and adds its own aliases;
// new ids extend the table. Errors name the file and the line or key at
// fault.
func Load(path string) (*Table, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cost: %w", err)
	}
	over, err := parsePrices(path, data)
	if err != nil {
		return nil, err
	}
	base := Default()
	merged := append([]*Price(nil), base.models...)
	for _, p := range over {
		names := map[string]bool{}
		for _, n := range append([]string{p.Model}, p.Aliases...) {
			if old, ok := base.byName[n]; ok {
				names[old.Model] = true
				for _, a := range old.Aliases {
					names[a] = true
				}
			}
		}
		for _, a := range p.Aliases {
			names[a] = true
		}
		delete(names, p.Model)
		p.Aliases = sortedKeys(names)
		merged = append(merged, p)
	}
	return newTable(merged), nil
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// fileDoc is the TOML document: [models."<id>"] tables.
type fileDoc struct {
	Models map[string]fileModel `toml:"models"`
}

type fileModel struct {
	Aliases         []string   `toml:"aliases"`
	Input           usdPerMTok `toml:"input"`
	Output          usdPerMTok `toml:"output"`
	CacheWrite5m    usdPerMTok `toml:"cache_write_5m"`
	CacheWrite1h    usdPerMTok `toml:"cache_write_1h"`
	CacheRead       usdPerMTok `toml:"cache_read"`
	BatchMultiplier multiplier `toml:"batch_multiplier"`
	LongContext     *fileLong  `toml:"long_context"`
}

type fileLong struct {
	Threshold    *int64     `toml:"threshold"`
	Input        usdPerMTok `toml:"input"`
	Output       usdPerMTok `toml:"output"`
	CacheWrite5m usdPerMTok `toml:"cache_write_5m"`
	CacheWrite1h usdPerMTok `toml:"cache_write_1h"`
	CacheRead    usdPerMTok `toml:"cache_read"`
}

// usdPerMTok is a price in USD per million tokens, decoded exactly into
// nano-dollars per token. It accepts a TOML integer, float or string.
type usdPerMTok struct {
	set bool
	n   Nanos
}

// UnmarshalTOML implements toml.Unmarshaler; its errors reach the caller
// with the line and key.
func (p *usdPerMTok) UnmarshalTOML(v any) error {
	s, err := decimalText(v)
	if err != nil {
		return err
	}
	// $1 per million tokens is 1,000 nano-dollars per token: scale 3.
	n, err := parseDecimal(s, 3)
	if err != nil {
		return fmt.Errorf("price %s USD per million tokens: %v (at most 3 decimals, so that a token costs a whole number of nano-dollars)", s, err)
	}
	if n > 1_000_000 { // $1,000 per million tokens: far above any model
		return fmt.Errorf("price %s USD per million tokens is implausibly high", s)
	}
	p.set, p.n = true, Nanos(n)
	return nil
}

// multiplier is a factor in (0, 1] with at most 3 decimals, kept in
// thousandths.
type multiplier struct {
	set      bool
	permille int64
}

// UnmarshalTOML implements toml.Unmarshaler.
func (m *multiplier) UnmarshalTOML(v any) error {
	s, err := decimalText(v)
	if err != nil {
		return err
	}
	n, err := parseDecimal(s, 3)
	if err != nil || n <= 0 || n > 1000 {
		return fmt.Errorf("multiplier %s must be in (0, 1] with at most 3 decimals", s)
	}
	m.set, m.permille = true, n
	return nil
}

// decimalText turns a TOML number or string into decimal text without
// rounding: a float prints as the shortest decimal that reads back as it,
// which is the literal the file had for any price with few digits.
func decimalText(v any) (string, error) {
	switch x := v.(type) {
	case int64:
		if x < 0 {
			return "", fmt.Errorf("negative value %d", x)
		}
		return strconv.FormatInt(x, 10), nil
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) || x < 0 {
			return "", fmt.Errorf("invalid value %v", x)
		}
		return strconv.FormatFloat(x, 'f', -1, 64), nil
	case string:
		s := strings.TrimSpace(x)
		if strings.HasPrefix(s, "-") {
			return "", fmt.Errorf("negative value %q", x)
		}
		return s, nil
	}
	return "", fmt.Errorf("want a number, got %T", v)
}

// parsePrices decodes and validates one price file.
func parsePrices(name string, data []byte) ([]*Price, error) {
	var doc fileDoc
	md, err := toml.Decode(string(data), &doc)
	if err != nil {
		return nil, fmt.Errorf("cost: %s: %w", name, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		return nil, fmt.Errorf("cost: %s: unknown key %s", name, strings.Join(keys, ", "))
	}
	ids := make([]string, 0, len(doc.Models))
	for id := range doc.Models {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	owner := map[string]string{} // name -> model id that claims it
	var out []*Price
	for _, id := range ids {
		fm := doc.Models[id]
		where := fmt.Sprintf("cost: %s: models.%q", name, id)
		if strings.TrimSpace(id) == "" {
			return nil, fmt.Errorf("cost: %s: empty model id", name)
		}
		for _, n := range append([]string{id}, fm.Aliases...) {
			if n == "" {
				return nil, fmt.Errorf("%s: empty alias", where)
			}
			if o, dup := owner[n]; dup {
				return nil, fmt.Errorf("%s: name %q is already used by models.%q", where, n, o)
			}
			owner[n] = id
		}
		p := &Price{Model: id, Aliases: append([]string(nil), fm.Aliases...)}
		permille := int64(500)
		if fm.BatchMultiplier.set {
			permille = fm.BatchMultiplier.permille
		}
		p.Standard, err = buildRates(fm.Input, fm.Output, fm.CacheWrite5m, fm.CacheWrite1h, fm.CacheRead)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		if p.Batch, err = scaleRates(p.Standard, permille); err != nil {
			return nil, fmt.Errorf("%s: batch_multiplier: %w", where, err)
		}
		if lc := fm.LongContext; lc != nil {
			where += ".long_context"
			if lc.Threshold == nil || *lc.Threshold <= 0 {
				return nil, fmt.Errorf("%s: threshold (total input tokens) is required and must be positive", where)
			}
			l := &LongContext{Threshold: *lc.Threshold}
			if l.Standard, err = buildRates(lc.Input, lc.Output, lc.CacheWrite5m, lc.CacheWrite1h, lc.CacheRead); err != nil {
				return nil, fmt.Errorf("%s: %w", where, err)
			}
			if l.Batch, err = scaleRates(l.Standard, permille); err != nil {
				return nil, fmt.Errorf("%s: batch_multiplier: %w", where, err)
			}
			p.LongContext = l
		}
		out = append(out, p)
	}
	return out, nil
}

// buildRates checks the required prices and fills the cache prices that were
// left out from the input price with the standard multipliers (write 5 m
// ×1.25, write 1 h ×2, read ×0.1), exactly or not at all.
func buildRates(in, out, w5, w1, rd usdPerMTok) (Rates, error) {
	if !in.set {
		return Rates{}, fmt.Errorf("input price is required")
	}
	if !out.set {
		return Rates{}, fmt.Errorf("output price is required")
	}
	r := Rates{Input: in.n, Output: out.n, CacheWrite5m: w5.n, CacheWrite1h: w1.n, CacheRead: rd.n}
	if !w5.set {
		if in.n*5%4 != 0 {
			return Rates{}, fmt.Errorf("cache_write_5m not given and input × 1.25 is not a whole number of nano-dollars per token; give it")
		}
		r.CacheWrite5m = in.n * 5 / 4
	}
	if !w1.set {
		r.CacheWrite1h = in.n * 2
	}
	if !rd.set {
		if in.n%10 != 0 {
			return Rates{}, fmt.Errorf("cache_read not given and input × 0.1 is not a whole number of nano-dollars per token; give it")
		}
		r.CacheRead = in.n / 10
	}
	return r, nil
}

// scaleRates multiplies every rate by permille/1000, refusing a result that
// is not a whole number of nano-dollars.
func scaleRates(r Rates, permille int64) (Rates, error) {
	var err error
	f := func(what string, n Nanos) Nanos {
		if int64(n)*permille%1000 != 0 && err == nil {
			err = fmt.Errorf("%s %d n$/token × %d/1000 is not a whole number of nano-dollars", what, n, permille)
		}
		return Nanos(int64(n) * permille / 1000)
	}
	out := Rates{
		Input:        f("input", r.Input),
		Output:       f("output", r.Output),
		CacheWrite5m: f("cache_write_5m", r.CacheWrite5m),
		CacheWrite1h: f("cache_write_1h", r.CacheWrite1h),
		CacheRead:    f("cache_read", r.CacheRead),
	}
	return out, err
}
