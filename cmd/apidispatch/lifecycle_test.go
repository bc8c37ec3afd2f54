package main

import (
	"bytes"
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/runner"
)

// The run's signal goroutine ends when the command does: done returns once
// it has exited, with or without a signal seen. (It used to loop for ever.)
func TestWatchSignalsEnds(t *testing.T) {
	for _, signals := range []int{0, 1, 2} {
		sigs := make(chan os.Signal, 2)
		ctx, stop := context.WithCancel(context.Background())
		var stderr bytes.Buffer
		done := watchSignals(sigs, stop, &runner.Aborter{}, false, &stderr)
		for range signals {
			sigs <- syscall.SIGTERM
		}
		if signals > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Second):
				t.Fatalf("%d signals: the first did not stop the run", signals)
			}
		}
		ended := make(chan struct{})
		go func() { done(); close(ended) }()
		select {
		case <-ended:
		case <-time.After(5 * time.Second):
			t.Fatalf("%d signals: done did not return: the signal goroutine outlives the command", signals)
		}
		if signals == 0 && ctx.Err() != nil {
			t.Error("no signal, yet the run was stopped")
		}
		stop()
	}
}

// maxCommandLines is the longest a function of this package may be: the
// commands parse flags, wire signals and print; the lifecycle is runner's.
const maxCommandLines = 80

// No function of the command package is over maxCommandLines lines.
func TestCommandFunctionSizes(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	seen := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			seen++
			n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
			if n > maxCommandLines {
				t.Errorf("%s: %s is %d lines, over %d: move its logic to the library packages", f, fd.Name.Name, n, maxCommandLines)
			}
		}
	}
	if seen < 20 {
		t.Fatalf("parsed only %d functions: not the command package?", seen)
	}
}
