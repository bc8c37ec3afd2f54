package ab

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func section(body string) []byte {
	return []byte(StatusStart + "\n" + body + "\n" + StatusEnd + "\n")
}

func TestReplaceSectionKeepsOtherContent(t *testing.T) {
	t.Parallel()
	before := "# Project status\n\nSome notes the team wrote.\n"
	after := "\n## Later section\n\n- keep me\n- and me, exactly\n"
	doc := []byte(before + string(section("old table")) + after)
	out, err := ReplaceSection(doc, section("new table"))
	if err != nil {
		t.Fatal(err)
	}
	want := before + string(section("new table")) + after
	if string(out) != want {
		t.Fatalf("got:\n%q\nwant:\n%q", out, want)
	}
	// Replacing again is idempotent and still touches nothing else.
	out2, err := ReplaceSection(out, section("new table"))
	if err != nil || string(out2) != want {
		t.Fatalf("second replacement changed the file: %q, %v", out2, err)
	}
}

func TestReplaceSectionAppendsWhenAbsent(t *testing.T) {
	t.Parallel()
	out, err := ReplaceSection([]byte("notes without a newline"), section("x"))
	if err != nil {
		t.Fatal(err)
	}
	want := "notes without a newline\n\n" + string(section("x"))
	if string(out) != want {
		t.Fatalf("got %q, want %q", out, want)
	}
	out, err = ReplaceSection(nil, section("x"))
	if err != nil || string(out) != string(section("x")) {
		t.Fatalf("empty doc: %q, %v", out, err)
	}
}

func TestReplaceSectionRefusesUnbalancedMarkers(t *testing.T) {
	t.Parallel()
	for _, doc := range []string{
		"a\n" + StatusStart + "\nb\n",
		"a\n" + StatusEnd + "\nb\n",
		StatusEnd + "\n" + StatusStart + "\n",
	} {
		if _, err := ReplaceSection([]byte(doc), section("x")); !errors.Is(err, ErrStatusMarkers) {
			t.Errorf("%q: err %v, want ErrStatusMarkers", doc, err)
		}
	}
}

func TestWriteStatusSectionFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "status.md")
	if err := WriteStatusSection(path, section("first")); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	if string(b) != string(section("first")) {
		t.Fatalf("created file: %q", b)
	}
	// The user adds text around it; a rerun replaces only the section.
	os.WriteFile(path, []byte("top\n\n"+string(b)+"\nbottom\n"), 0o600)
	os.Chmod(path, 0o600)
	if err := WriteStatusSection(path, section("second")); err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(path)
	if want := "top\n\n" + string(section("second")) + "\nbottom\n"; string(b) != want {
		t.Fatalf("got %q, want %q", b, want)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Errorf("mode changed to %v", st.Mode().Perm())
	}
	if strings.Count(string(b), StatusStart) != 1 {
		t.Errorf("section duplicated")
	}
}
