// Command apidispatch completes large batches of Anthropic Messages API calls
// fast and politely across several organisations' keys, and ships the
// simulator, planner and A/B harness that prove it. See README.md.
//
// This package wires flags, signals and exit codes to the library packages;
// it holds no logic of its own.
package main

import (
	"fmt"
	"io"
	"os"
	"sort"

	"github.com/apidispatch/apidispatch/runner"
	"github.com/apidispatch/apidispatch/shared"
)

// Exit codes (docs/design.md §10).
const (
	exitOK         = runner.ExitOK
	exitUsage      = runner.ExitUsage
	exitPaused     = runner.ExitPaused
	exitRefused    = runner.ExitRefused
	exitIncomplete = runner.ExitIncomplete
	exitDataLoss   = runner.ExitDataLoss
	// exitNeedsPerson: a failure every resume would repeat (docs/design.md §13).
	exitNeedsPerson = runner.ExitNeedsPerson
)

// command is one subcommand. run receives the arguments after the command
// name and returns the process exit code.
type command struct {
	summary string
	run     func(args []string, stdout, stderr io.Writer) int
}

// commands is filled by each command file's init.
var commands = map[string]command{}

func register(name, summary string, run func(args []string, stdout, stderr io.Writer) int) {
	commands[name] = command{summary: summary, run: run}
}

func main() {
	shared.QuietRedisLog()
	os.Exit(mainCode(os.Args[1:], os.Stdout, os.Stderr))
}

func mainCode(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "apidispatch: unknown command %q\n\n", args[0])
		usage(stderr)
		return exitUsage
	}
	return c.run(args[1:], stdout, stderr)
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: apidispatch COMMAND [flags]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "commands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-8s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run 'apidispatch COMMAND --help' for a command's flags.")
}
