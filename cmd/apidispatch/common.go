package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"

	"github.com/apidispatch/apidispatch/apihttp"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/internal/wirelog"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/plan"
	"github.com/apidispatch/apidispatch/upstream"
)

// sendFlags are the flags every sending command understands (docs/design.md §2).
type sendFlags struct {
	gateFlags
	orgsFile string
	baseURL  string
	runDir   string
	out      string
	caps     capsFlag
	maxCost  string
	summary  string
	quiet    bool
	json     bool
	prices   string
	speed    float64
}

func (s *sendFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&s.orgsFile, "orgs", "", "TOML file of orgs (`FILE`); without it, orgs come from ANTHROPIC_API_KEY, ANTHROPIC_API_KEY_<NAME> and ANTHROPIC_BATCH_KEY")
	fs.StringVar(&s.baseURL, "base-url", os.Getenv("ANTHROPIC_BASE_URL"), "API root `URL` (env ANTHROPIC_BASE_URL; default https://api.anthropic.com; http:// only for loopback)")
	fs.StringVar(&s.runDir, "run-dir", "", "run `DIR` for state, results, events, summary and report (default runs/<input-stem>)")
	fs.StringVar(&s.out, "out", "", "results JSONL `FILE` (default RUN_DIR/results.jsonl)")
	fs.Var(&s.caps, "cap", "polite per-key concurrency caps `FAMILY=N,...` (default sonnet=100,haiku=120,opus=40,other=40)")
	fs.StringVar(&s.maxCost, "max-cost", "", "hard spend cap in `USD` for the run directory, one gate over every route (sync, batch, the pilot, a resume); admission stops before it could be passed")
	s.gateFlags.register(fs, "pre-flight gate in `USD`: refuse when the projected cost exceeds budget×(1+tolerance)", "required when the projected cost is ≥ $100 or N ≥ 50,000")
	fs.StringVar(&s.summary, "summary", "", "also write the final summary JSON to `FILE`")
	fs.BoolVar(&s.quiet, "quiet", false, "no progress display")
	fs.BoolVar(&s.json, "json", false, "print the final summary as one JSON line on stdout")
	fs.StringVar(&s.prices, "prices", "", "price table `FILE` overriding the embedded one")
	fs.Float64Var(&s.speed, "speed", 1, "time compression `K` of the server (the simulator's --speed); 1 for the real API")
}

// sent is what a sending command's flags load: the price table, the orgs
// and the dollar amounts.
type sent struct {
	prices          *cost.Table
	orgs            []org.Org
	maxCost, budget cost.Nanos
}

// load reads the price table and the orgs, checks --base-url and parses
// --max-cost and --budget, in that order.
func (s *sendFlags) load(stderr io.Writer) (sent, error) {
	var c sent
	var err error
	if c.prices, err = s.loadPrices(); err != nil {
		return c, err
	}
	if c.orgs, err = s.loadOrgs(stderr); err != nil {
		return c, err
	}
	if s.baseURL != "" {
		if _, err := apihttp.CheckBaseURL(s.baseURL); err != nil {
			return c, err
		}
	}
	if c.maxCost, err = parseUSD("--max-cost", s.maxCost); err != nil {
		return c, err
	}
	c.budget, err = s.gateFlags.parse()
	return c, err
}

// gateFlags are the budget gate's flags of run, plan and ab (docs/design.md
// §7): --budget, --tolerance and --confirm, whose help each command words
// for what it gates.
type gateFlags struct {
	budget    string
	tolerance float64
	confirm   bool
}

func (g *gateFlags) register(fs *flag.FlagSet, budgetUsage, confirmUsage string) {
	fs.StringVar(&g.budget, "budget", "", budgetUsage)
	fs.Float64Var(&g.tolerance, "tolerance", 0.5, "tolerance `F` of the budget gate")
	fs.BoolVar(&g.confirm, "confirm", false, confirmUsage)
}

// parse reads --budget (0 without it).
func (g *gateFlags) parse() (cost.Nanos, error) { return parseUSD("--budget", g.budget) }

// parseUSD reads a positive dollar amount given to flag name; "" is 0.
func parseUSD(name, v string) (cost.Nanos, error) {
	if v == "" {
		return 0, nil
	}
	n, err := cost.ParseUSD(v)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%s %q: want a positive dollar amount", name, v)
	}
	return n, nil
}

// projectionFlags are the projection's flags of run and plan: --limits
// and --expect-output.
type projectionFlags struct {
	limits    string
	expectOut int64
}

func (p *projectionFlags) register(fs *flag.FlagSet, limitsUsage, expectUsage string) {
	fs.StringVar(&p.limits, "limits", "", limitsUsage)
	fs.Int64Var(&p.expectOut, "expect-output", 0, expectUsage)
}

// load reads the limits file (nil without one).
func (p *projectionFlags) load() (*plan.Limits, error) { return loadLimits(p.limits) }

// loadLimits reads a limits file from 'apidispatch probe' (nil for "").
func loadLimits(path string) (*plan.Limits, error) {
	if path == "" {
		return nil, nil
	}
	return plan.LoadLimits(path)
}

func (s *sendFlags) loadPrices() (*cost.Table, error) {
	if s.prices == "" {
		return cost.Default(), nil
	}
	return cost.Load(s.prices)
}

func (s *sendFlags) loadOrgs(stderr io.Writer) ([]org.Org, error) {
	orgs, warns, err := org.Load(s.orgsFile, os.Environ())
	if err != nil {
		return nil, err
	}
	for _, w := range warns {
		fmt.Fprintln(stderr, "warning:", w)
	}
	return orgs, nil
}

// capsFlag parses "sonnet=100,haiku=120,gpt=80" (the families of
// upstream.DefaultCaps).
type capsFlag map[string]int

func (c *capsFlag) String() string {
	if c == nil || *c == nil {
		return ""
	}
	var parts []string
	for k, v := range *c {
		parts = append(parts, k+"="+strconv.Itoa(v))
	}
	return strings.Join(parts, ",")
}

func (c *capsFlag) Set(v string) error {
	if *c == nil {
		*c = capsFlag{}
	}
	for _, part := range strings.Split(v, ",") {
		k, n, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return fmt.Errorf("cap %q: want FAMILY=N", part)
		}
		k = strings.ToLower(strings.TrimSpace(k))
		if _, ok := upstream.DefaultCaps[k]; !ok {
			return fmt.Errorf("cap %q: family must be sonnet, haiku, opus or other (Anthropic), or gpt, gpt-mini, o-series or openai-other (OpenAI)", part)
		}
		i, err := strconv.Atoi(strings.TrimSpace(n))
		if err != nil || i < 1 || i > 10000 {
			return fmt.Errorf("cap %q: N must be a whole number from 1 to 10000", part)
		}
		(*c)[k] = i
	}
	return nil
}

// parseFlags parses args, printing usage on -h (exit 0) or an error (exit 1).
// Flags may come before or after positional arguments ("run FILE --quiet");
// "--" ends the flags. Positional arguments are in Positional after it.
// ok is false when the caller should return code.
func parseFlags(fs *flag.FlagSet, args []string, stderr io.Writer) (code int, ok bool) {
	fs.SetOutput(stderr)
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return exitOK, false
			}
			return exitUsage, false
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	// Leave the positional arguments where fs.Args() finds them.
	fs.Parse(append([]string{"--"}, pos...))
	return 0, true
}

// debugHTTPUsage is the --debug-http flag's help, for every command that has it.
const debugHTTPUsage = "append the request line and headers and the response status and headers of every exchange to `FILE` (keys as fingerprints, no bodies)"

// openWireLog opens the --debug-http file at path for appending and returns
// the transport wrapper that writes every exchange to it, and a function to
// call when the command is done, which closes the file and says on stderr
// if any write failed. With an empty path wrap is nil and done does nothing.
func openWireLog(path string, stderr io.Writer) (wrap func(http.RoundTripper) http.RoundTripper, done func(), err error) {
	if path == "" {
		return nil, func() {}, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("--debug-http: %w", err)
	}
	wl := wirelog.New(f)
	done = func() {
		if err := cmp.Or(wl.Err(), f.Close()); err != nil {
			errf(stderr, "--debug-http: %v; the wire log is incomplete", err)
		}
	}
	return wl.Wrap, done, nil
}

func newLogger(w io.Writer, quiet bool) *slog.Logger {
	lvl := slog.LevelInfo
	if quiet {
		lvl = slog.LevelWarn
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: lvl}))
}

func errf(w io.Writer, format string, a ...any) {
	fmt.Fprintf(w, "apidispatch: "+format+"\n", a...)
}
