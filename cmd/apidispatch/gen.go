package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/workload"
)

func init() {
	register("gen", "write a synthetic workload (judge shape by default)", runGen)
}

const genHelp = `usage: apidispatch gen [--n N] [--shape judge|chat] [--seed S] [--model M]
                       [--max-tokens K] [--prefix P] [--out FILE]

Writes N requests in the Message Batches request format (one JSON object a
line), ready for 'apidispatch run' or 'apidispatch plan'.

Shapes:
  judge  the Phase 6 judge item: a ~720-character grading rubric as a system
         text block with cache_control ephemeral, and a ~364-character user
         message "Question asked to the AI: ... AI's response: ... Provide
         your evaluation as a JSON object." that differs for every item.
         Ids phase6_000000, phase6_000001, ...
  chat   short generic prompts of one to eight sentences (some with a system
         prompt). Ids chat_000000, ...

The output depends only on the flags: the same seed writes the same bytes,
and the first K items of a run of N are a run of K. Without --out it goes to
stdout; with --out it is written to a temporary file in the same directory
and renamed into place when complete, so FILE is never half-written.

Flags:
`

func runGen(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gen", flag.ContinueOnError)
	n := fs.Int("n", 1000, "number of requests `N`")
	shape := fs.String("shape", string(workload.ShapeJudge), "workload `SHAPE`: judge or chat")
	seed := fs.Int64("seed", 1, "random `SEED`; the same seed writes the same file")
	model := fs.String("model", workload.DefaultModel, "`MODEL` id of every request")
	maxTokens := fs.Int("max-tokens", workload.DefaultMaxTokens, "max_tokens `K` of every request")
	prefix := fs.String("prefix", "", "custom_id `PREFIX` (default phase6_ for judge, chat_ for chat)")
	out := fs.String("out", "", "write to `FILE` instead of stdout (atomically)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), genHelp)
		fs.PrintDefaults()
	}
	fs.SetOutput(stderr)
	for _, a := range args {
		if a == "-h" || a == "-help" || a == "--help" {
			fs.SetOutput(stdout) // asked for: help is the output
		}
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "apidispatch gen: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
	}
	if *n < 0 {
		fmt.Fprintf(stderr, "apidispatch gen: --n must not be negative\n")
		return exitUsage
	}
	if *maxTokens <= 0 {
		fmt.Fprintf(stderr, "apidispatch gen: --max-tokens must be positive\n")
		return exitUsage
	}
	opts := workload.GenOptions{Model: *model, MaxTokens: *maxTokens, Prefix: *prefix}
	write := func(w io.Writer) error {
		return workload.Generate(w, workload.Shape(*shape), *n, *seed, opts)
	}
	// Reject bad options before creating any file.
	if err := workload.Generate(io.Discard, workload.Shape(*shape), 0, *seed, opts); err != nil {
		fmt.Fprintf(stderr, "apidispatch gen: %v\n", err)
		return exitUsage
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *out == "" {
		if err := write(ctxWriter{ctx, stdout}); err != nil {
			fmt.Fprintf(stderr, "apidispatch gen: %v\n", err)
			return exitUsage
		}
		return exitOK
	}
	if err := rundir.WriteAtomic(*out, 0o644, func(w io.Writer) error { return write(ctxWriter{ctx, w}) }); err != nil {
		fmt.Fprintf(stderr, "apidispatch gen: %v\n", err)
		return exitUsage
	}
	fmt.Fprintf(stderr, "wrote %d %s requests (seed %d) to %s\n", *n, *shape, *seed, *out)
	return exitOK
}

// ctxWriter fails writes once ctx is done, so an interrupted gen stops at
// its next buffer flush and cleans up.
type ctxWriter struct {
	ctx context.Context
	w   io.Writer
}

func (c ctxWriter) Write(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, fmt.Errorf("interrupted: %w", err)
	}
	return c.w.Write(p)
}
