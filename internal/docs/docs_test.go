package docs

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode"
)

// readmeMaxLines is the most lines README.md may have: what it is, the
// quick start, the same on real keys, the commands, the exit codes and the
// links; everything else belongs in docs/.
const readmeMaxLines = 300

// root is the module's root directory (where go.mod is).
func root(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		up := filepath.Dir(dir)
		if up == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = up
	}
}

// files lists the repository's files (slash-separated, relative to the
// root) that end in one of exts: the files git tracks, or, where git
// cannot tell (no git, not a checkout), every file under the root but
// hidden directories, runs/ and node_modules/.
func files(t *testing.T, dir string, exts ...string) []string {
	t.Helper()
	var all []string
	cmd := exec.Command("git", "ls-files", "-z")
	cmd.Dir = dir
	if out, err := cmd.Output(); err == nil && len(out) > 0 {
		for _, f := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
			if _, err := os.Stat(filepath.Join(dir, filepath.FromSlash(f))); err == nil {
				all = append(all, f) // (a file deleted but not yet committed is gone)
			}
		}
	} else {
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			name := d.Name()
			if d.IsDir() {
				if p != dir && (strings.HasPrefix(name, ".") || name == "runs" || name == "node_modules") {
					return filepath.SkipDir
				}
				return nil
			}
			rel, err := filepath.Rel(dir, p)
			if err != nil {
				return err
			}
			all = append(all, filepath.ToSlash(rel))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	var out []string
	for _, f := range all {
		for _, e := range exts {
			if strings.HasSuffix(f, e) {
				out = append(out, f)
				break
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("no %v files found under %s", exts, dir)
	}
	return out
}

// outsideRefs finds, in one file's text, every reference to a document that
// is not in the repository: the four background documents by name (a
// reference to the repository's own docs/design.md is fine, and so is a
// relative link to it from a file inside docs/) and the
// directory they live in. The names are assembled here so that this file
// does not match itself.
func outsideRefs(file string, text []byte) []string {
	inDocs := strings.HasPrefix(file, "docs/")
	var found []string
	for _, name := range []string{"design", "origin", "anthropic-api", "style"} {
		doc := name + ".md"
		re := regexp.MustCompile(`(?i)(^|[^A-Za-z0-9_-])` + regexp.QuoteMeta(doc))
		for _, m := range re.FindAllIndex(text, -1) {
			at := m[0]
			if m[1]-m[0] > len(doc) {
				at++ // the match includes the character before the name
			}
			before := string(text[max(0, at-5):at])
			ours := name == "design" && (strings.HasSuffix(before, "docs/") ||
				(inDocs && !strings.HasSuffix(before, "/")))
			if !ours {
				found = append(found, fmt.Sprintf("%s:%d: %s", file, lineOf(text, at), doc))
			}
		}
	}
	for _, dir := range []string{".." + "/shared/", "/work" + "/shared"} {
		for off := 0; ; {
			i := bytes.Index(text[off:], []byte(dir))
			if i < 0 {
				break
			}
			found = append(found, fmt.Sprintf("%s:%d: %s", file, lineOf(text, off+i), dir))
			off += i + len(dir)
		}
	}
	return found
}

func lineOf(text []byte, off int) int { return bytes.Count(text[:off], []byte("\n")) + 1 }

// TestNoReferenceOutsideTheRepository: a reader of the code or the docs
// can follow every reference without documents the repository does not
// hold. Code comments cite docs/design.md (or a topic page) instead.
func TestNoReferenceOutsideTheRepository(t *testing.T) {
	dir := root(t)
	var bad []string
	for _, f := range files(t, dir, ".go", ".md") {
		text, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(f)))
		if err != nil {
			t.Fatal(err)
		}
		bad = append(bad, outsideRefs(f, text)...)
	}
	for _, b := range bad {
		t.Errorf("a reference to a document outside the repository: %s", b)
	}
}

// TestOutsideRefsFindsEachForm pins what outsideRefs reports and lets pass.
func TestOutsideRefsFindsEachForm(t *testing.T) {
	d := "design" + ".md"
	cases := []struct {
		file, text string
		want       int
	}{
		{"x.go", "// see " + d + " §7", 1},
		{"x.go", "// see docs/" + d + " §7", 0},
		{"x.go", "// (" + d + " §3 and §12)", 1},
		{"README.md", "[design](" + "docs/" + d + "#7-cost-and-gates)", 0},
		{"README.md", "[design](" + d + ")", 1},
		{"docs/run.md", "[§3](" + d + "#3-file-formats)", 0},
		{"docs/run.md", "[§3](../" + "shared/" + d + ")", 2},
		{"x.go", "// origin" + ".md §4", 1},
		{"docs/x.md", "origin" + ".md", 1},
		{"x.go", "// anthropic-api" + ".md §6", 1},
		{"x.go", "// style" + ".md", 1},
		{"x.go", "// mystyle" + ".md and my-design" + ".md are other files", 0},
		{"x.go", "// /work" + "/shared holds them", 1},
	}
	for _, c := range cases {
		if got := outsideRefs(c.file, []byte(c.text)); len(got) != c.want {
			t.Errorf("outsideRefs(%q, %q) = %q, want %d", c.file, c.text, got, c.want)
		}
	}
}

// TestReadmeIsShort: the README is read in five minutes; the rest is in docs/.
func TestReadmeIsShort(t *testing.T) {
	text, err := os.ReadFile(filepath.Join(root(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	n := bytes.Count(text, []byte("\n"))
	if len(text) > 0 && text[len(text)-1] != '\n' {
		n++
	}
	if n > readmeMaxLines {
		t.Errorf("README.md has %d lines, more than %d: move the detail into a page of docs/", n, readmeMaxLines)
	}
}

// mdLink is an inline Markdown link or image: [text](target) or
// [text](target "title").
var mdLink = regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)

// codeSpan is an inline code span; links inside one are not links.
var codeSpan = regexp.MustCompile("`+[^`]*`+")

// prose returns text without its fenced code blocks (their lines blanked,
// so line numbers stay right).
func prose(text string) []string {
	lines := strings.Split(text, "\n")
	fence := ""
	for i, l := range lines {
		t := strings.TrimLeft(l, " ")
		switch {
		case fence == "" && (strings.HasPrefix(t, "```") || strings.HasPrefix(t, "~~~")):
			fence = t[:3]
			lines[i] = ""
		case fence != "":
			if strings.HasPrefix(t, fence) {
				fence = ""
			}
			lines[i] = ""
		}
	}
	return lines
}

// headingLink is a link inside a heading: its text is what the slug sees.
var headingLink = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)

// slug is the anchor GitHub gives a heading: its text lower-cased, every
// character but letters, digits, spaces, hyphens and underscores dropped,
// spaces turned into hyphens.
func slug(heading string) string {
	h := headingLink.ReplaceAllString(heading, "$1")
	h = strings.ToLower(strings.TrimSpace(h))
	var b strings.Builder
	for _, r := range h {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.Mn, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns the anchors of a Markdown file's headings, numbered as
// GitHub numbers repeated ones (-1, -2, …).
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, l := range prose(text) {
		t := strings.TrimLeft(l, " ")
		if !strings.HasPrefix(t, "#") {
			continue
		}
		level := len(t) - len(strings.TrimLeft(t, "#"))
		if level > 6 || (len(t) > level && t[level] != ' ') {
			continue
		}
		s := slug(strings.TrimRight(strings.TrimSpace(t[level:]), "#"))
		a := s
		if n := seen[s]; n > 0 {
			a = fmt.Sprintf("%s-%d", s, n)
		}
		seen[s]++
		out[a] = true
	}
	return out
}

// TestSlug pins slug against anchors GitHub gives.
func TestSlug(t *testing.T) {
	for h, want := range map[string]string{
		"Quick start":                                      "quick-start",
		"9. The A/B harness (`ab`)":                        "9-the-ab-harness-ab",
		"The pilot and `--max-cost`":                       "the-pilot-and---max-cost",
		"The operator's view: `status --gateway`":          "the-operators-view-status---gateway",
		"The batch arm: `--arms legacy,dispatcher,batch`":  "the-batch-arm---arms-legacydispatcherbatch",
		"count_tokens and models":                          "count_tokens-and-models",
		"The simulator ([`sim/CALIBRATION.md`](x) has it)": "the-simulator-simcalibrationmd-has-it",
		"Politeness — lanes, caps":                         "politeness--lanes-caps",
	} {
		if got := slug(h); got != want {
			t.Errorf("slug(%q) = %q, want %q", h, got, want)
		}
	}
}

// deadLinks checks every relative link of one Markdown file (file is
// slash-separated, relative to dir): the file it names exists, and an
// anchor names a heading of that file.
func deadLinks(dir, file string, text string, anchorsOf func(string) (map[string]bool, error)) []string {
	var bad []string
	for i, l := range prose(text) {
		l = codeSpan.ReplaceAllString(l, "")
		for _, m := range mdLink.FindAllStringSubmatch(l, -1) {
			target := m[1]
			if u := strings.Index(target, ":"); u > 0 && !strings.ContainsAny(target[:u], "/#.") {
				continue // a scheme: https:, mailto:, …
			}
			p, anchor, _ := strings.Cut(target, "#")
			dest := file
			if p != "" {
				if strings.HasPrefix(p, "/") {
					bad = append(bad, fmt.Sprintf("%s:%d: %s: an absolute path; link relative to the file", file, i+1, target))
					continue
				}
				dest = path.Clean(path.Join(path.Dir(file), p))
				if dest == ".." || strings.HasPrefix(dest, "../") {
					bad = append(bad, fmt.Sprintf("%s:%d: %s: outside the repository", file, i+1, target))
					continue
				}
				if _, err := os.Stat(filepath.Join(dir, filepath.FromSlash(dest))); err != nil {
					bad = append(bad, fmt.Sprintf("%s:%d: %s: no such file", file, i+1, target))
					continue
				}
			}
			if anchor == "" {
				continue
			}
			if !strings.HasSuffix(dest, ".md") {
				continue // an anchor into a non-Markdown file (a line of code) is not ours to check
			}
			as, err := anchorsOf(dest)
			if err != nil {
				bad = append(bad, fmt.Sprintf("%s:%d: %s: %v", file, i+1, target, err))
				continue
			}
			if !as[anchor] {
				bad = append(bad, fmt.Sprintf("%s:%d: %s: no heading with the anchor #%s in %s", file, i+1, target, anchor, dest))
			}
		}
	}
	return bad
}

// TestRelativeLinksResolve: every relative link in every Markdown file
// points to a file that exists, and every #anchor to a heading there.
func TestRelativeLinksResolve(t *testing.T) {
	dir := root(t)
	cache := map[string]map[string]bool{}
	anchorsOf := func(f string) (map[string]bool, error) {
		if a, ok := cache[f]; ok {
			return a, nil
		}
		text, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(f)))
		if err != nil {
			return nil, err
		}
		cache[f] = anchors(string(text))
		return cache[f], nil
	}
	links := 0
	for _, f := range files(t, dir, ".md") {
		text, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(f)))
		if err != nil {
			t.Fatal(err)
		}
		links += len(mdLink.FindAllString(string(text), -1))
		for _, b := range deadLinks(dir, f, string(text), anchorsOf) {
			t.Errorf("dead link: %s", b)
		}
	}
	if links < 50 {
		t.Errorf("only %d links found in the Markdown files: is the link pattern still right?", links)
	}
}

// TestDeadLinksFindsEachKind runs deadLinks over a small tree.
func TestDeadLinksFindsEachKind(t *testing.T) {
	dir := t.TempDir()
	for f, text := range map[string]string{
		"README.md":    "# Top\n\n## Exit codes\n\n[ok](docs/a.md#first-part) [ok](#exit-codes) [ok](https://example.com/x.md)\n",
		"docs/a.md":    "# A\n\n## First part\n\n```\n## Not a heading\n```\n[up](../README.md#top) `[code](nowhere.md)` ![img](pic.png)\n",
		"docs/pic.png": "",
	} {
		p := filepath.Join(dir, filepath.FromSlash(f))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	anchorsOf := func(f string) (map[string]bool, error) {
		text, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(f)))
		return anchors(string(text)), err
	}
	for _, f := range []string{"README.md", "docs/a.md"} {
		text, _ := os.ReadFile(filepath.Join(dir, filepath.FromSlash(f)))
		if bad := deadLinks(dir, f, string(text), anchorsOf); len(bad) > 0 {
			t.Errorf("%s: good links reported dead: %q", f, bad)
		}
	}
	for _, c := range []string{
		"[gone](docs/b.md)",
		"[gone](docs/a.md#second-part)",
		"[gone](#not-a-heading)",
		"[gone](../../etc/passwd)",
		"[gone](/docs/a.md)",
		"![gone](docs/missing.png)",
	} {
		if bad := deadLinks(dir, "README.md", c+"\n", anchorsOf); len(bad) != 1 {
			t.Errorf("%s: got %q, want one dead link", c, bad)
		}
	}
}

// declared is every top-level name of the module's packages, keyed by the
// package's directory name ("apidispatch" for cmd/apidispatch, "sqlite"
// for store/sqlite): functions, types, variables, constants as "Name",
// methods as "Type.Method". Test files are left out: the walks are through
// the program.
func declared(t *testing.T, dir string) map[string]map[string]bool {
	t.Helper()
	declMu.Lock()
	defer declMu.Unlock()
	if declCache == nil {
		declCache = map[string]map[string]map[string]bool{}
	}
	if d, ok := declCache[dir]; ok {
		return d
	}
	out := map[string]map[string]bool{}
	fset := token.NewFileSet()
	for _, f := range files(t, dir, ".go") {
		if strings.HasSuffix(f, "_test.go") || slices.Contains(strings.Split(f, "/"), "testdata") {
			continue
		}
		af, err := parser.ParseFile(fset, filepath.Join(dir, filepath.FromSlash(f)), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		pkg := path.Base(path.Dir(f))
		if out[pkg] == nil {
			out[pkg] = map[string]bool{}
		}
		names := out[pkg]
		for _, d := range af.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil || len(d.Recv.List) == 0 {
					names[d.Name.Name] = true
					continue
				}
				names[recvType(d.Recv.List[0].Type)+"."+d.Name.Name] = true
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						names[s.Name.Name] = true
					case *ast.ValueSpec:
						for _, n := range s.Names {
							names[n.Name] = true
						}
					}
				}
			}
		}
	}
	declCache[dir] = out
	return out
}

// declCache keeps declared's answer per root: two tests read it.
var (
	declMu    sync.Mutex
	declCache map[string]map[string]map[string]bool
)

// recvType is the name of a method's receiver type: T of T, *T, T[P], *T[P].
func recvType(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

// qualified is a code span naming pkg.Name or pkg.Type.Method.
var qualified = regexp.MustCompile("^`([a-z][a-z0-9]*)\\.([A-Za-z_][A-Za-z0-9_]*)(?:\\.([A-Za-z_][A-Za-z0-9_]*))?`$")

// fileLike are the extensions of file names, which look like pkg.Name in a
// code span but are not.
var fileLike = []string{"go", "md", "db", "json", "jsonl", "toml", "html", "journal", "png", "mjs", "py", "txt", "env", "token", "cache"}

// walkNames returns the pkg.Name and pkg.Type.Method code spans of the
// section of text under the heading title (up to the next heading of the
// same level or above), with their line numbers.
func walkNames(text, title string) (names []string, lines []int, ok bool) {
	ls := prose(text)
	in, level := false, 0
	for i, l := range ls {
		if strings.HasPrefix(l, "#") {
			n := len(l) - len(strings.TrimLeft(l, "#"))
			if in && n <= level {
				break
			}
			if strings.TrimSpace(l[n:]) == title {
				in, level, ok = true, n, true
				continue
			}
		}
		if !in {
			continue
		}
		for _, span := range codeSpan.FindAllString(l, -1) {
			m := qualified.FindStringSubmatch(span)
			if m == nil {
				continue
			}
			last := m[2]
			if m[3] != "" {
				last = m[3]
			}
			if slices.Contains(fileLike, last) {
				continue
			}
			names = append(names, strings.Trim(span, "`"))
			lines = append(lines, i+1)
		}
	}
	return names, lines, ok
}

// TestArchitectureWalksNameRealFunctions: every pkg.Func and
// pkg.Type.Method that ARCHITECTURE.md's "Reading the source" names is
// declared in the module, so the walk can be followed in an editor.
func TestArchitectureWalksNameRealFunctions(t *testing.T) {
	dir := root(t)
	text, err := os.ReadFile(filepath.Join(dir, "ARCHITECTURE.md"))
	if err != nil {
		t.Fatal(err)
	}
	names, lines, ok := walkNames(string(text), "Reading the source")
	if !ok {
		t.Fatal(`ARCHITECTURE.md has no "## Reading the source" section`)
	}
	if len(names) < 40 {
		t.Fatalf("ARCHITECTURE.md's walks name only %d functions: is the pattern still right?", len(names))
	}
	decl := declared(t, dir)
	for i, n := range names {
		if why := resolve(decl, n); why != "" {
			t.Errorf("ARCHITECTURE.md:%d: `%s`: %s", lines[i], n, why)
		}
	}
}

// resolve reports why name (pkg.Name or pkg.Type.Method) is not declared,
// or "" when it is.
func resolve(decl map[string]map[string]bool, name string) string {
	pkg, rest, _ := strings.Cut(name, ".")
	names, ok := decl[pkg]
	if !ok {
		return "no package " + pkg + " in the module"
	}
	if !names[rest] {
		return pkg + " declares no " + rest
	}
	return ""
}

// TestResolve checks the lookup against this module's own declarations.
func TestResolve(t *testing.T) {
	decl := declared(t, root(t))
	for name, want := range map[string]bool{
		"dispatch.Engine.Run":       true,
		"dispatch.Engine.send":      true,
		"gate.Lane.TryAdmit":        true,
		"sqlite.Store.Commit":       true,
		"apidispatch.runCmd":        true,
		"runner.StopKind.ExitCode":  true,
		"runner.ExitNeedsPerson":    true,
		"dispatch.Engine.Fly":       false,
		"dispatch.NoSuchFunc":       false,
		"nosuchpkg.Run":             false,
		"gate.TryAdmit":             false,
		"anthropic.Classify.Method": false,
	} {
		if got := resolve(decl, name) == ""; got != want {
			t.Errorf("resolve(%s): declared %v, want %v", name, got, want)
		}
	}
}
