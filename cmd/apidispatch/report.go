package main

import (
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/apidispatch/apidispatch/report"
)

func init() {
	register("report", "render the HTML report of a run or an A/B", runReport)
}

const reportHelp = `usage: apidispatch report RUN_DIR [--out FILE]

Renders RUN_DIR/report.html: one self-contained page (inline CSS and SVG,
no scripts, nothing loaded from the network; it opens from file://) with
completions per second per arm and per org, in-flight and limit per lane,
429s and other retries, cumulative cost, and the headline table.

RUN_DIR is a run directory (summary.json, events.jsonl, as written by
'apidispatch run') or an A/B directory (ab.json, baseline/, dispatcher/, as
written by 'apidispatch ab'). The path written is printed on stdout.
Exit codes: 0 written, 1 usage error or RUN_DIR unreadable.

Flags:
`

func runReport(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	out := fs.String("out", "", "write the page to `FILE` instead of RUN_DIR/report.html")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), reportHelp)
		fs.PrintDefaults()
	}
	fs.SetOutput(stderr)
	for _, a := range args {
		if a == "-h" || a == "-help" || a == "--help" {
			fs.SetOutput(stdout) // asked for: help is the output
		}
	}
	// Accept RUN_DIR before or after the flags.
	var dirs []string
	rest := args
	for {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return exitOK
			}
			return exitUsage
		}
		if fs.NArg() == 0 {
			break
		}
		dirs = append(dirs, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	if len(dirs) != 1 {
		fmt.Fprintln(stderr, "apidispatch report: want exactly one RUN_DIR")
		fs.Usage()
		return exitUsage
	}
	path, err := report.WriteFile(dirs[0], *out)
	if err != nil {
		errf(stderr, "report: %v", err)
		return exitUsage
	}
	fmt.Fprintln(stdout, path)
	return exitOK
}
