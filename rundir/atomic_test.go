package rundir_test

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/apidispatch/apidispatch/rundir"
)

// TestWriteAtomic: a write that fails part way leaves the target as it was
// and no temporary file; one that succeeds replaces it with perm.
func TestWriteAtomic(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "x.jsonl")
	os.WriteFile(path, []byte("old\n"), 0o644)
	errCut := errors.New("cut short")
	err := rundir.WriteAtomic(path, 0o600, func(w io.Writer) error {
		io.WriteString(w, "half a ")
		return errCut
	})
	if !errors.Is(err, errCut) {
		t.Fatalf("err = %v", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "old\n" {
		t.Errorf("target changed: %q", b)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("%d entries: temporary file left behind", len(ents))
	}
	if err := rundir.WriteFileAtomic(path, []byte("new\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	st, _ := os.Stat(path)
	if string(b) != "new\n" || st.Mode().Perm() != 0o600 {
		t.Errorf("wrote %q with mode %v, want \"new\\n\" and 0600", b, st.Mode().Perm())
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("%d entries after a write", len(ents))
	}
}
