package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/apidispatch/apidispatch/cache"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/plan"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/runner"
)

func init() {
	register("cache", "inspect a result cache file: stats, export, prune --older-than D", cacheCmd)
}

// cacheFlags are the result cache's flags of run, ab and plan.
type cacheFlags struct {
	path    string
	mode    string
	sampled bool
}

func (c *cacheFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.path, "cache", os.Getenv("APIDISPATCH_CACHE"), "result cache `FILE` (SQLite) shared across runs and processes: a request answered before by the same API (origin) is not sent again; sync route only (env APIDISPATCH_CACHE, which a batch or auto run leaves out with a note)")
	fs.StringVar(&c.mode, "cache-mode", "readwrite", "`MODE` of --cache: readwrite, read (answer hits, store nothing), write (store successes, answer nothing) or off")
	fs.BoolVar(&c.sampled, "cache-sampled", false, "also cache requests with temperature above 0 or unset (the API's default is 1.0): their answer is one sample of many")
}

// forRoute drops a cache that only the environment (APIDISPATCH_CACHE)
// asked for when the run's route is not sync, with a one-line note: the
// cache serves the sync route only, and a default from the environment
// should not refuse a route the user chose. A --cache given on the command
// line with another route is still refused (by runner.Run).
func (c *cacheFlags) forRoute(fs *flag.FlagSet, route string, stderr io.Writer) {
	if route == runner.RouteSync || c.path == "" {
		return
	}
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "cache" })
	if given {
		return
	}
	fmt.Fprintf(stderr, "note: APIDISPATCH_CACHE=%s is not used: the result cache serves --route sync only, and this run is --route %s\n", c.path, route)
	c.path = ""
}

// open opens the cache the flags name; nil when there is none or it is
// off, or (unless create) when the file does not exist yet.
func (c *cacheFlags) open(create bool) (*cache.Cache, cache.Mode, error) {
	mode, err := cache.ParseMode(c.mode)
	if err != nil {
		return nil, "", fmt.Errorf("--cache-mode: %w", err)
	}
	if c.path == "" || mode == cache.ModeOff {
		return nil, cache.ModeOff, nil
	}
	if _, err := os.Stat(c.path); err != nil && !create {
		return nil, cache.ModeOff, nil
	}
	cc, err := cache.Open(c.path)
	return cc, mode, err
}

// project narrows a projection's input to what the cache does not answer
// for a run against baseURL (only that API's answers are hits).
func (c *cacheFlags) project(ctx context.Context, cc *cache.Cache, mode cache.Mode, input string, in *plan.Input, baseURL string) error {
	return runner.ProjectCache(ctx, input, in, cc, mode, c.sampled, baseURL)
}

// wire sets a dispatcher's cache.
func (c *cacheFlags) wire(cfg *dispatch.Config, cc *cache.Cache, mode cache.Mode) {
	if cc != nil {
		cfg.Cache, cfg.CacheMode, cfg.CacheSampled = cc, mode, c.sampled
	}
}

func cacheCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("cache", flag.ContinueOnError)
	path := fs.String("cache", os.Getenv("APIDISPATCH_CACHE"), "the cache `FILE` (env APIDISPATCH_CACHE)")
	olderThan := fs.String("older-than", "", "prune: delete entries stored more than `D` ago (Go duration, or days as 30d)")
	jsonOut := fs.Bool("json", false, "stats: print one JSON object")
	out := fs.String("out", "", "export: write to `FILE` instead of stdout")
	fs.Usage = func() {
		fmt.Fprintln(stderr, `usage: apidispatch cache stats  [--cache FILE] [--json]
       apidispatch cache export [--cache FILE] [--out FILE]
       apidispatch cache prune  [--cache FILE] --older-than D

stats prints the file's entries (by model and by origin), sizes, what the
stored requests cost and the oldest and newest entry. An entry records its
origin, the scheme and host of the API that answered ("sim:" before the
simulator's; "unknown" for entries stored before origins were recorded):
a run is answered only by its own origin's entries. export writes every
entry as one JSON line (key, model, origin, simulated, org, request_id,
cost_usd, tokens, created_at, response).
prune deletes entries older than D (e.g. 720h or 30d).

flags:`)
		fs.PrintDefaults()
	}
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return code
	}
	if fs.NArg() != 1 || *path == "" {
		fs.Usage()
		return exitUsage
	}
	sub := fs.Arg(0)
	if sub != "stats" && sub != "export" && sub != "prune" {
		fs.Usage()
		return exitUsage
	}
	var cutoff time.Time
	if sub == "prune" {
		d, err := parseAge(*olderThan)
		if err != nil {
			errf(stderr, "--older-than: %v", err)
			return exitUsage
		}
		cutoff = time.Now().Add(-d)
	}
	if _, err := os.Stat(*path); err != nil {
		errf(stderr, "cache %s: %v", *path, err)
		return exitUsage
	}
	c, err := cache.Open(*path)
	if err != nil {
		errf(stderr, "%v", err)
		return exitUsage
	}
	defer c.Close()
	ctx := context.Background()
	var code int
	switch sub {
	case "stats":
		code = cacheStats(ctx, c, *jsonOut, stdout, stderr)
	case "export":
		code = cacheExport(ctx, c, *out, stdout, stderr)
	case "prune":
		code = cachePrune(ctx, c, cutoff, stdout, stderr)
	}
	return code
}

// cacheStats is 'cache stats'.
func cacheStats(ctx context.Context, c *cache.Cache, jsonOut bool, stdout, stderr io.Writer) int {
	s, err := c.Stats(ctx)
	if err != nil {
		errf(stderr, "%v", err)
		return exitUsage
	}
	if jsonOut {
		b, _ := json.Marshal(s)
		fmt.Fprintln(stdout, string(b))
		return exitOK
	}
	fmt.Fprintf(stdout, "%s: format %d, %d entries, %d bytes of responses, %d bytes on disk, stored requests cost $%.6f\n", s.Path, s.Format, s.Entries, s.BodyBytes, s.FileBytes, s.CostUSD)
	for m, n := range s.ByModel {
		fmt.Fprintf(stdout, "  %-36s %d\n", m, n)
	}
	fmt.Fprintln(stdout, "by origin (a run is answered only by its own origin's entries):")
	for _, o := range slices.Sorted(maps.Keys(s.ByOrigin)) {
		fmt.Fprintf(stdout, "  %-36s %d\n", o, s.ByOrigin[o])
	}
	if s.Oldest != nil {
		fmt.Fprintf(stdout, "oldest %s, newest %s\n", s.Oldest.Format(time.RFC3339), s.Newest.Format(time.RFC3339))
	}
	return exitOK
}

// cacheExport is 'cache export': to out, or stdout without it.
func cacheExport(ctx context.Context, c *cache.Cache, out string, stdout, stderr io.Writer) int {
	w := stdout
	if out != "" {
		f, err := os.OpenFile(out, os.O_RDWR|os.O_CREATE|os.O_TRUNC, rundir.FilePerm)
		if err != nil {
			errf(stderr, "%v", err)
			return exitUsage
		}
		defer f.Close()
		w = f
	}
	n, err := c.Export(ctx, w)
	if err != nil {
		errf(stderr, "%v", err)
		return exitUsage
	}
	fmt.Fprintf(stderr, "exported %d entries\n", n)
	return exitOK
}

// cachePrune is 'cache prune': entries stored before cutoff go.
func cachePrune(ctx context.Context, c *cache.Cache, cutoff time.Time, stdout, stderr io.Writer) int {
	n, err := c.Prune(ctx, cutoff)
	if err != nil {
		errf(stderr, "%v", err)
		return exitUsage
	}
	fmt.Fprintf(stdout, "pruned %d entries stored before %s\n", n, cutoff.UTC().Format(time.RFC3339))
	return exitOK
}

// parseAge reads a Go duration or a whole number of days ("30d").
func parseAge(s string) (time.Duration, error) {
	if s == "" {
		return 0, fmt.Errorf("required, e.g. 720h or 30d")
	}
	if days, ok := strings.CutSuffix(s, "d"); ok {
		var n int
		if _, err := fmt.Sscanf(days, "%d", &n); err == nil && n >= 0 && fmt.Sprint(n) == days {
			return time.Duration(n) * 24 * time.Hour, nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%q is not a duration like 720h or 30d", s)
	}
	return d, nil
}
