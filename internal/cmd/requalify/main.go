// Command requalify moves references to exported names from one package to
// another, in place, keeping comments and layout. It is the script of the
// package splits of issue 23, kept so that code written against the old
// package (a branch merged later) can be moved the same way:
//
//	go run ./internal/cmd/requalify -old OLDPATH -new NEWPATH -names A,B,C FILES...
//
// In a file of the old package itself (its package clause names it and it
// does not import it), an unqualified A becomes new.A; in any other file
// that imports the old package, old.A becomes new.A (A in a file of the
// new package itself). The new package is
// imported where it is used, and the old one's import is dropped where it
// no longer is. It is purely syntactic, so it also runs on code that no
// longer compiles because the names moved: selectors' field names,
// composite-literal keys, declared names and names the file itself
// declares at top level are left alone. Check the result with go build.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
)

func main() {
	oldPath := flag.String("old", "", "import path the names leave")
	newPath := flag.String("new", "", "import path the names go to")
	names := flag.String("names", "", "comma-separated exported names that moved")
	flag.Parse()
	if *oldPath == "" || *newPath == "" || *names == "" {
		flag.Usage()
		os.Exit(2)
	}
	set := map[string]bool{}
	for _, n := range strings.Split(*names, ",") {
		set[strings.TrimSpace(n)] = true
	}
	failed := false
	for _, f := range flag.Args() {
		if err := rewrite(f, *oldPath, *newPath, set); err != nil {
			fmt.Fprintln(os.Stderr, err)
			failed = true
		}
	}
	if failed {
		os.Exit(1)
	}
}

type edit struct {
	off, end int
	text     string
}

func rewrite(file, oldPath, newPath string, names map[string]bool) error {
	src, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, src, parser.ParseComments)
	if err != nil {
		return err
	}
	newName := path.Base(newPath)
	oldName := path.Base(oldPath)
	oldLocal := "" // the old package's name in this file, when imported
	for _, im := range f.Imports {
		p, _ := strconv.Unquote(im.Path.Value)
		if p == oldPath {
			oldLocal = oldName
			if im.Name != nil {
				oldLocal = im.Name.Name
			}
		}
	}
	self := oldLocal == "" && f.Name.Name == oldName
	if !self && oldLocal == "" {
		return nil
	}
	// A file of the new package itself names the moved names bare.
	inNew := !self && f.Name.Name == newName
	declared := map[string]bool{}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil {
				declared[d.Name.Name] = true
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					declared[s.Name.Name] = true
				case *ast.ValueSpec:
					for _, n := range s.Names {
						declared[n.Name] = true
					}
				}
			}
		}
	}
	off := func(p token.Pos) int { return fset.Position(p).Offset }
	var edits []edit
	oldUses := 0
	skip := map[*ast.Ident]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.SelectorExpr:
			skip[n.Sel] = true
			if x, ok := n.X.(*ast.Ident); ok && !self && x.Name == oldLocal {
				switch {
				case names[n.Sel.Name] && inNew:
					edits = append(edits, edit{off(x.Pos()), off(n.Sel.Pos()), ""})
				case names[n.Sel.Name]:
					edits = append(edits, edit{off(x.Pos()), off(x.End()), newName})
				default:
					oldUses++
				}
				skip[x] = true
			}
		case *ast.CompositeLit:
			if _, isMap := n.Type.(*ast.MapType); isMap {
				break // a map literal's keys are values
			}
			for _, e := range n.Elts {
				if kv, ok := e.(*ast.KeyValueExpr); ok {
					if k, ok := kv.Key.(*ast.Ident); ok {
						skip[k] = true
					}
				}
			}
		case *ast.Field:
			for _, id := range n.Names {
				skip[id] = true
			}
		case *ast.FuncDecl:
			skip[n.Name] = true
		case *ast.TypeSpec:
			skip[n.Name] = true
		case *ast.ValueSpec:
			for _, id := range n.Names {
				skip[id] = true
			}
		case *ast.LabeledStmt:
			skip[n.Label] = true
		case *ast.BranchStmt:
			if n.Label != nil {
				skip[n.Label] = true
			}
		case *ast.Ident:
			if self && !skip[n] && names[n.Name] && !declared[n.Name] {
				edits = append(edits, edit{off(n.Pos()), off(n.Pos()), newName + "."})
			}
		}
		return true
	})
	// Idents are visited after their parents, so skip is complete for
	// them; the package clause's name is not an expression.
	edits = slices.DeleteFunc(edits, func(e edit) bool { return e.off == off(f.Name.Pos()) })
	if len(edits) == 0 {
		return nil
	}
	slices.SortFunc(edits, func(a, b edit) int { return b.off - a.off })
	out := slices.Clone(src)
	for _, e := range edits {
		out = slices.Concat(out[:e.off], []byte(e.text), out[e.end:])
	}
	out, err = fixImports(file, out, oldPath, newPath, !self && oldUses == 0, !inNew)
	if err != nil {
		return err
	}
	return os.WriteFile(file, out, 0o644)
}

// fixImports adds newPath to the file's imports (unless there) and drops
// oldPath when dropOld, then formats the file (which sorts the imports).
func fixImports(file string, src []byte, oldPath, newPath string, dropOld, addNew bool) ([]byte, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, src, parser.ImportsOnly|parser.ParseComments)
	if err != nil {
		return nil, err
	}
	have := false
	var oldSpec *ast.ImportSpec
	for _, im := range f.Imports {
		p, _ := strconv.Unquote(im.Path.Value)
		if p == newPath {
			have = true
		}
		if p == oldPath {
			oldSpec = im
		}
	}
	out := src
	if dropOld && oldSpec != nil {
		// Drop the spec's whole line.
		start := fset.Position(oldSpec.Pos()).Offset
		end := fset.Position(oldSpec.End()).Offset
		for start > 0 && out[start-1] != '\n' {
			start--
		}
		for end < len(out) && out[end] != '\n' {
			end++
		}
		if end < len(out) {
			end++
		}
		out = slices.Concat(out[:start], out[end:])
	}
	if !have && addNew {
		spec := strconv.Quote(newPath)
		fset2 := token.NewFileSet()
		f2, err := parser.ParseFile(fset2, file, out, parser.ImportsOnly)
		if err != nil {
			return nil, err
		}
		var gd *ast.GenDecl
		for _, d := range f2.Decls {
			if d, ok := d.(*ast.GenDecl); ok && d.Tok == token.IMPORT {
				gd = d
				break
			}
		}
		switch {
		case gd == nil:
			at := fset2.Position(f2.Name.End()).Offset
			out = slices.Concat(out[:at], []byte("\n\nimport "+spec+"\n"), out[at:])
		case gd.Lparen.IsValid():
			// Put it with the last group (the module's own packages come
			// last here), or in a group of its own after the standard
			// library's.
			at := fset2.Position(gd.Rparen).Offset
			text := "\t" + spec + "\n"
			if n := len(gd.Specs); n > 0 {
				last, _ := strconv.Unquote(gd.Specs[n-1].(*ast.ImportSpec).Path.Value)
				if !strings.Contains(strings.Split(last, "/")[0], ".") {
					text = "\n" + text
				}
			}
			out = slices.Concat(out[:at], []byte(text), out[at:])
		default:
			s, e := fset2.Position(gd.Pos()).Offset, fset2.Position(gd.End()).Offset
			old := strings.TrimSpace(string(out[s+len("import") : e]))
			sep := "\n\t"
			if p, _ := strconv.Unquote(gd.Specs[0].(*ast.ImportSpec).Path.Value); !strings.Contains(strings.Split(p, "/")[0], ".") {
				sep = "\n\n\t" // the standard library's group, then ours
			}
			out = slices.Concat(out[:s], []byte("import ("+"\n\t"+old+sep+spec+"\n)"), out[e:])
		}
	}
	res, err := format.Source(out)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return bytes.Clone(res), nil
}
